"""The placement and serving steps' parsing and decisions, with small hand-written inputs (hostile
ones too). The real llama-bench and llama-server runs are in test_selftest_serving_real.py.

Fakes here, each only to inject a fault nothing real produces on demand: a llama-server stand-in
that never becomes healthy (and ignores SIGTERM, with a child in its group), one that exits at
once, an in-process HTTP server that streams forever or never answers, and `run_mode` replaced by
canned records to drive the placement decision."""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rocky_selftest import placement_bench, serving
from rocky_selftest.bench import Deadline
from rocky_selftest.placement_bench import DECODE_TOKENS, parse_pp_tg, summarize
from rocky_selftest.serve_client import Api, consume_sse, parse_timings, stream_completion
from rocky_selftest.settings import Settings, SettingsError, load_settings

from tests.helpers.selftest import write_config

pytestmark = pytest.mark.timeout(120)

P = 64


def entry(n_prompt: int, n_gen: int, avg: object = 10.0, **kw) -> dict:
    return {
        "n_prompt": n_prompt, "n_gen": n_gen, "avg_ts": avg, "samples_ts": [avg],
        "n_gpu_layers": 99, "n_ubatch": 128, "n_threads": 2, "build_number": 9101,
        "gpu_info": "Mali-G610 MC4", "devices": "Vulkan0", **kw,
    }  # fmt: skip


# --- llama-bench's two entries (-p P -n 128) -------------------------------------------------


def test_pp_and_tg_entries_are_told_apart_by_n_prompt_and_n_gen():
    for order in ([entry(P, 0, 50.0), entry(0, DECODE_TOKENS, 5.0)],
                  [entry(0, DECODE_TOKENS, 5.0), entry(P, 0, 50.0)]):  # fmt: skip
        found, why = parse_pp_tg(json.dumps(order), P)
        assert why is None
        assert found["pp"]["avg_ts"] == 50.0 and found["tg"]["avg_ts"] == 5.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[\n", "invalid JSON"),
        ("{}", "not a list"),
        (json.dumps([entry(P, 0)]), "no tg entry"),
        (json.dumps([]), "no pp / tg entry"),
        (json.dumps([entry(P, 0), entry(P, 0), entry(0, 128)]), "two pp entries"),
        (json.dumps([entry(P, 0), "x"]), "entry 1 is not an object"),
        (json.dumps([entry(512, 0), entry(0, 128)]), "neither pp64 nor tg128"),
        (json.dumps([entry(P, 0), entry(0, True)]), "n_gen is True, not a count"),
        (json.dumps([entry(P, 0), entry("0", 128)]), "not a count"),
        (json.dumps([entry(P, 0, avg="fast"), entry(0, 128)]), "malformed pp entry: avg_ts"),
        (json.dumps([entry(P, 0), entry(0, 128, avg=0)]), "not a positive rate"),
        ('[{"n_prompt": 64, "n_gen": 0, "avg_ts": NaN}, ' + json.dumps(entry(0, 128)) + "]",
         "not a finite number"),
        (json.dumps([entry(P, 0), entry(0, 128, samples_ts="x")]), "samples_ts"),
    ],
)  # fmt: skip
def test_hostile_llama_bench_json_is_a_reason_never_an_exception(text, expected):
    found, why = parse_pp_tg(text, P)
    assert found is None and expected in why


def test_hybrid_and_gpu_runs_must_have_used_what_they_claim():
    s = Settings(model_path="m", model_sha256=None, ubatch_sizes=(64,))
    dp = placement_bench.device_problem
    assert dp(s, "gpu", entry(P, 0)) is None
    assert "n_gpu_layers 0" in dp(s, "gpu", entry(P, 0, n_gpu_layers=0))
    assert "expected 0" in dp(s, "hybrid", entry(P, 0, devices="auto"))
    assert dp(s, "hybrid", entry(P, 0, n_gpu_layers=0, devices="auto")) is None
    assert "does not name" in dp(s, "hybrid", entry(P, 0, n_gpu_layers=0, gpu_info=""))
    assert "CPU run used" in dp(s, "cpu", entry(P, 0))
    assert dp(s, "cpu", entry(P, 0, devices="none", n_gpu_layers=0)) is None
    # experts-cpu: the GPU as for gpu, and llama-bench must say it kept every layer's experts
    assert dp(s, "experts-cpu", entry(P, 0, n_cpu_moe=2), 2) is None
    assert "of 0 layers on the CPU, not 2" in dp(s, "experts-cpu", entry(P, 0, n_cpu_moe=0), 2)
    assert "None layers" in dp(s, "experts-cpu", entry(P, 0), 2)  # a build that ignored -ncmoe
    assert "n_gpu_layers 0" in dp(s, "experts-cpu", entry(P, 0, n_gpu_layers=0, n_cpu_moe=2), 2)


# --- the placement decision --------------------------------------------------------------------


def rec(mode: str, pp: float, tg: float, status: str = "PASS", reason: str = "") -> dict:
    r = {"mode": mode, "status": status, "pp_tps": pp, "tg_tps": tg}
    return r | ({"reason": reason} if reason else {})


def test_summary_is_the_median_and_the_request_time():
    runs = [rec("gpu", 100, 4), rec("gpu", 120, 5), rec("gpu", 110, 6), rec("cpu", 20, 7)]
    gpu = summarize(runs, "gpu", 2048, 256)
    assert gpu["status"] == "PASS" and gpu["pp_tps"] == 110 and gpu["tg_tps"] == 5
    assert gpu["request_s"] == pytest.approx(2048 / 110 + 256 / 5, abs=1e-3)
    bad = summarize([*runs, rec("cpu", 0, 0, "FAIL", "exit status 1")], "cpu", 2048, 256)
    assert bad["status"] == "FAIL" and bad["reason"] == "exit status 1" and "pp_tps" not in bad


GPU_CHECKS = ("gpu_driver", "vulkan_device", "sweep", "output_match")
GPU_PASSED = {"checks": [{"name": n, "status": "PASS"} for n in GPU_CHECKS]}


def _placement(monkeypatch, rates: dict, doc: dict, model: str = "m", layers: list | None = None):
    """FAKE: run_mode returns canned records (the real runs: test_selftest_serving_real.py)."""

    def fake(s, mode, ubatch, deadline, n_layer=0):
        if layers is not None:
            layers.append((mode, n_layer))
        pp, tg, *fail = rates[mode]
        return rec(mode, pp, tg, *(("FAIL", fail[0]) if fail else ())) | {"ubatch": ubatch}

    monkeypatch.setattr(placement_bench, "run_mode", fake)
    s = Settings(model_path=model, model_sha256=None, ubatch_sizes=(64,), repetitions=2)
    return placement_bench.placement(s, Deadline(60), doc, log=lambda _: None)


def test_a_moe_model_is_also_measured_with_its_experts_on_the_cpu(monkeypatch, tmp_path):
    from rocky_vulkan.llama.testmodel import write_preset

    moe = str(write_preset("tiny-moe", tmp_path / "moe.gguf", n_layer=3))
    rates = {"gpu": (100, 4), "cpu": (20, 6.8), "hybrid": (100, 6.8), "experts-cpu": (90, 9)}
    layers: list = []
    check, data = _placement(monkeypatch, rates, GPU_PASSED, model=moe, layers=layers)
    # 2048/90 + 256/9 = 51.2 s beats hybrid's 58 s
    assert check.status == "PASS" and data["chosen"] == "experts-cpu", check
    assert set(data["modes"]) == {"gpu", "cpu", "hybrid", "experts-cpu"}
    assert data["experts_per_layer"] == 8 and ("experts-cpu", 3) in layers
    # the same rates on a dense model: experts-cpu is not a mode it has
    dense = str(write_preset("tiny", tmp_path / "dense.gguf"))
    check, data = _placement(monkeypatch, rates, GPU_PASSED, model=dense)
    assert set(data["modes"]) == {"gpu", "cpu", "hybrid"} and data["chosen"] == "hybrid"
    assert data["experts_per_layer"] == 0


def test_a_failed_experts_cpu_run_fails_the_step(monkeypatch, tmp_path):
    from rocky_vulkan.llama.testmodel import write_preset

    moe = str(write_preset("tiny-moe", tmp_path / "moe.gguf"))
    why = "kept the experts of None layers on the CPU, not 2"
    rates = {"gpu": (100, 4), "cpu": (20, 6.8), "hybrid": (100, 6.8), "experts-cpu": (0, 0, why)}
    check, data = _placement(monkeypatch, rates, GPU_PASSED, model=moe)
    assert check.status == "FAIL" and "experts-cpu not measured" in check.evidence
    assert data["chosen"] == "hybrid"


def test_placement_chooses_the_least_time_for_the_typical_request(monkeypatch):
    # 2048 + 256: gpu 2048/100 + 256/4 = 84.5 s; cpu 102.4 + 37.6 = 140 s; hybrid 20.5 + 37.6 = 58 s
    check, data = _placement(
        monkeypatch, {"gpu": (100, 4), "cpu": (20, 6.8), "hybrid": (100, 6.8)}, GPU_PASSED
    )
    assert check.status == "PASS" and data["chosen"] == "hybrid", check
    assert data["request"] == {"prompt_tokens": 2048, "generated_tokens": 256}
    assert set(data["modes"]) == {"gpu", "cpu", "hybrid"}
    assert len(data["modes"]["gpu"]["runs"]) == 2
    assert data["modes"]["cpu"]["request_s"] == pytest.approx(2048 / 20 + 256 / 6.8, abs=1e-3)
    json.dumps(data, allow_nan=False)  # strict JSON


def test_a_failed_gpu_mode_is_never_hidden_by_a_cpu_choice(monkeypatch):
    check, data = _placement(
        monkeypatch,
        {"gpu": (0, 0, "aborted (exit 134)"), "cpu": (20, 6.8), "hybrid": (30, 6.8)},
        GPU_PASSED,
    )
    assert check.status == "FAIL" and "gpu not measured" in check.evidence
    assert "exit 134" in check.evidence and data["modes"]["gpu"]["status"] == "FAIL"
    assert data["chosen"] == "hybrid"  # what the server would do with what was measured


def test_placement_fails_when_the_gpu_checks_did_not_pass(monkeypatch):
    doc = {"checks": [*GPU_PASSED["checks"][:3], {"name": "output_match", "status": "FAIL"}]}
    check, data = _placement(monkeypatch, {m: (100, 10) for m in ("gpu", "cpu", "hybrid")}, doc)
    assert check.status == "FAIL" and "output_match" in check.evidence
    assert data["chosen"] == "cpu"


def test_the_placement_runs_use_the_servers_ub_and_name_the_gpu():
    s = Settings(model_path="m.gguf", model_sha256=None, ubatch_sizes=(64,),
                 serve_request_prompt_tokens=2048, env={"X": "1"})  # fmt: skip
    tuned = {"mode": "tuned", "status": "PASS"}
    doc = {
        "sweep": [tuned | {"ubatch": 256, "avg_ts": 30.0}, tuned | {"ubatch": 512, "avg_ts": 20.0}]
    }
    assert placement_bench.ubatch_for("gpu", doc) == 256
    assert placement_bench.ubatch_for("hybrid", doc) == 256
    assert placement_bench.ubatch_for("cpu", doc) == 512
    gpu, env = placement_bench.bench_command(s, "gpu", 256)
    assert gpu[gpu.index("-p") + 1] == "2048" and gpu[gpu.index("-n") + 1] == "128"
    assert gpu[gpu.index("-ngl") + 1] == "99" and gpu[gpu.index("-dev") + 1] == "Vulkan0"
    assert gpu[gpu.index("-ub") + 1] == "256" and env["X"] == "1"
    assert env["GGML_VK_MALI_WARPTILE"] is None  # the product's tiles, not the stock switch
    cpu, _ = placement_bench.bench_command(s, "cpu", 512)
    assert cpu[cpu.index("-dev") + 1] == "none" and cpu[cpu.index("-ngl") + 1] == "0"
    assert gpu[gpu.index("-m") + 1] == "m.gguf"
    other = replace(s, serve_model_path="served.gguf")
    assert "served.gguf" in placement_bench.bench_command(other, "gpu", 256)[0]
    hybrid, _ = placement_bench.bench_command(s, "hybrid", 256)
    assert "-dev" not in hybrid and hybrid[hybrid.index("-ngl") + 1] == "0"
    experts, _ = placement_bench.bench_command(s, "experts-cpu", 256, n_layer=48)
    assert experts[experts.index("-ngl") + 1] == "99" and "-dev" in experts
    assert experts[experts.index("-ncmoe") + 1] == "48"
    with pytest.raises(ValueError, match="layer count"):
        placement_bench.bench_command(s, "experts-cpu", 256)


# --- the event stream --------------------------------------------------------------------------

TIMINGS = {"cache_n": 0, "prompt_n": 64, "prompt_ms": 500.0, "prompt_per_second": 128.0,
           "predicted_n": 3, "predicted_ms": 300.0, "predicted_per_second": 10.0}  # fmt: skip


def chunk(text: str, finish=None, **extra) -> bytes:
    body = {"choices": [{"text": text, "index": 0, "finish_reason": finish}], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def sse(*parts: bytes) -> io.BytesIO:
    return io.BytesIO(b"".join(parts))


class Clock:
    """Advances one second per reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def read(stream: io.BytesIO, end: float = 1e9):
    return consume_sse(stream.readline, Clock(), end)


def test_a_normal_stream_gives_first_and_last_token_and_the_servers_timings():
    stats, why = read(sse(b": ping\n\n", chunk("a"), chunk("b"), chunk("c"),
                          chunk("", "length", timings=TIMINGS), b"data: [DONE]\n\n"))  # fmt: skip
    assert why is None and stats["chunks"] == 3 and stats["done"]
    assert stats["first_at"] < stats["last_at"]
    assert stats["timings"]["prompt_n"] == 64 and stats["timings"]["predicted_per_second"] == 10.0


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (sse(chunk("a"), chunk("", "length")), "no chunk carried the server's timings"),
        (sse(chunk("", "length", timings=TIMINGS)), "no token arrived"),
        (sse(chunk("a"), b'data: {"choices": [], "timings": {"prompt_n": NaN}}\n\n'),
         "not JSON"),
        (sse(chunk("a"), chunk("", "length", timings={**TIMINGS, "prompt_n": "64"})),
         "timings.prompt_n is '64', not a count"),
        (sse(chunk("a"), chunk("", "length", timings={**TIMINGS, "prompt_ms": -5})),
         "not a duration"),
        (sse(chunk("a"), b'data: {"choices": [], "timings": {"prompt_ms": Infinity}}\n\n'),
         "not JSON"),
        (sse(chunk("a"), chunk("", "length", timings=[1, 2])), "not an object"),
        (sse(b"data: {not json\n\n"), "not JSON"),
        (sse(b"data: [1, 2]\n\n"), "not a JSON object"),
        (sse(b'data: {"error": {"code": 500, "message": "boom"}}\n\n'), "server error: "),
        (sse(b"error: out of memory\n\n"), "server error event"),
        (sse(b'data: {"choices": [{"text": 5}]}\n\n'), "not a string"),
        (sse(b"data: " + b"x" * (2 << 20) + b"\n"), "size limit"),
    ],
)  # fmt: skip
def test_hostile_streams_are_a_reason_never_an_exception(stream, expected):
    _, why = read(stream)
    assert why is not None and expected in why, why


def test_a_stream_that_never_ends_stops_at_its_deadline():
    endless = io.BytesIO(chunk("a") * 100_000)
    stats, why = read(endless, end=50.0)
    assert why == "the stream did not end in time" and stats["chunks"] < 50


def test_timings_with_zero_rates_parse_as_not_measurable():
    timings, why = parse_timings({**TIMINGS, "predicted_per_second": 0, "prompt_per_second": None})
    assert why is None and timings["predicted_per_second"] is None


# --- sizes, ratios, the CPU plan ---------------------------------------------------------------


def test_sizes_fit_the_slots_context_or_are_clamped_or_left_out():
    s = Settings(model_path="m", model_sha256=None, ubatch_sizes=(64,))
    assert s.serving_prompt_tokens == (2048, 8192)
    sizes = serving._sizes(s, 8192, 128)
    assert sizes[0] == (2048, 2048, None)
    assert sizes[1][:2] == (8192, 8064) and "exceed the slot's context 8192" in sizes[1][2]
    small = serving._sizes(s, 2048, 128)
    assert small[0][:2] == (2048, 1920) and small[1][1] is None and "left out" in small[1][2]


def test_the_goal_is_decided_at_the_first_size():
    def run(server, ttft, decode, status="PASS"):
        return {"server": server, "requested_tokens": 2048, "prompt_tokens": 2048,
                "ttft_s": ttft, "decode_tps": decode, "status": status}  # fmt: skip

    ratios, why = serving.verdict([run("gpu", 8.0, 5.0), run("cpu", 10.0, 5.0)], 2048)
    assert why is None and ratios["ttft_ratio"] == 0.8 and ratios["decode_ratio"] == 1.0
    _, why = serving.verdict([run("gpu", 8.0, 5.0), run("cpu", 0, 0, "FAIL") | {"reason": "x"}],
                             2048)  # fmt: skip
    assert why == "cpu server at 2048 tokens not measured: x"


def test_the_cpu_server_is_the_same_plan_on_the_cpu_only():
    plan = {"settings": {"placement": {"value": "gpu", "reason": "r"},
                         "ubatch": {"value": 256, "reason": "r"},
                         "tiles": {"value": "int=1", "reason": "r"},
                         "context_per_slot": {"value": 4096, "reason": "r"}}}  # fmt: skip
    cpu = serving.cpu_plan(plan)
    assert cpu["settings"]["placement"]["value"] == "cpu"
    assert cpu["settings"]["ubatch"]["value"] == 512 and cpu["settings"]["tiles"]["value"] is None
    assert cpu["settings"]["context_per_slot"]["value"] == 4096
    assert plan["settings"]["placement"]["value"] == "gpu"  # a copy


def test_serving_settings_are_checked(tmp_path):
    good = load_settings(str(write_config(tmp_path / "c.json", model_path="m",
                                          serving_prompt_tokens=[32, 96])))  # fmt: skip
    assert good.serving_prompt_tokens == (32, 96)
    for bad in ({"serving_prompt_tokens": []}, {"serving_prompt_tokens": 2048},
                {"serving_prompt_tokens": [0]}, {"serving_prompt_tokens": [True]},
                {"serving_generated_tokens": 1}, {"serving_generated_tokens": "128"},
                {"serving_logit_bias": {"x": -100}}, {"serving_logit_bias": {"1": "-100"}},
                {"serving_logit_bias": [1]}):  # fmt: skip
        with pytest.raises(SettingsError, match="serving_"):
            load_settings(str(write_config(tmp_path / "c.json", model_path="m", **bad)))


# --- a llama-server that never becomes healthy, or dies ----------------------------------------

NEVER_HEALTHY = """#!{python}
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
if os.fork() == 0:  # a helper in the same process group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
open({pidfile!r}, "w").write(str(os.getpid()))
time.sleep(3600)
"""


def _fake_server(tmp_path: Path, body: str) -> Settings:
    script = tmp_path / "llama-server"
    script.write_text(body.format(python=sys.executable, pidfile=str(tmp_path / "pid")))
    script.chmod(0o755)
    return Settings(model_path=str(tmp_path / "m.gguf"), model_sha256=None, ubatch_sizes=(64,),
                    llama_server=str(script), run_timeout_s=3,
                    serving_prompt_tokens=(32, 64))  # fmt: skip


PLAN = {"settings": {"placement": {"value": "gpu", "reason": "r"},
                     "ubatch": {"value": 64, "reason": "r"}, "tiles": {"value": None, "reason": ""},
                     "context_per_slot": {"value": 512, "reason": ""},
                     "parallel": {"value": 1, "reason": ""}}}  # fmt: skip


def _key_dir(tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir()
    serving._credentials(str(work))
    return str(work)


def test_a_server_that_never_becomes_healthy_fails_and_leaves_nothing_running(tmp_path):
    """FAKE llama-server: never listens, ignores SIGTERM, and has a child in its group."""
    s = _fake_server(tmp_path, NEVER_HEALTHY)
    t0 = time.monotonic()
    runs, info = serving.run_server(s, "gpu", PLAN, Deadline(60), _key_dir(tmp_path), log=print)
    took = time.monotonic() - t0
    assert [r["status"] for r in runs] == ["FAIL", "FAIL"]
    assert all("not healthy after 3 s" in r["reason"] for r in runs)
    assert info["exit_code"] == -signal.SIGKILL  # SIGTERM was ignored: killed after the grace
    assert took < 3 + serving.STOP_GRACE_S + 10
    pid = int((tmp_path / "pid").read_text())
    assert not _alive_in_group(pid)  # the whole group is gone, the helper too


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (init reaps those)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = (Path("/proc") / entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


def test_a_server_that_exits_at_once_is_named(tmp_path):
    """FAKE llama-server: prints a line and exits 1, as a bad model path makes it."""
    s = _fake_server(tmp_path, "#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    runs, info = serving.run_server(s, "cpu", PLAN, Deadline(60), _key_dir(tmp_path), log=print)
    assert all("exited (status 1) before it was healthy" in r["reason"] for r in runs)
    assert "failed to load model" in info["log_tail"]


def test_a_missing_server_binary_is_a_failed_run_not_a_crash(tmp_path):
    s = replace(_fake_server(tmp_path, ""), llama_server=str(tmp_path / "nope"))
    runs, info = serving.run_server(s, "gpu", PLAN, Deadline(60), _key_dir(tmp_path), log=print)
    assert all("cannot start" in r["reason"] for r in runs) and info["exit_code"] is None


def test_the_deadline_stops_the_serving_step_before_it_starts_a_server(tmp_path):
    s = _fake_server(tmp_path, NEVER_HEALTHY)
    runs, _ = serving.run_server(s, "gpu", PLAN, Deadline(0), _key_dir(tmp_path), log=print)
    assert all(r["reason"] == "not run: the self-test's deadline passed" for r in runs)
    assert not (tmp_path / "pid").exists()


# --- a hostile HTTP peer -----------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "endless"

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        if self.mode == "silent":
            time.sleep(30)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            while True:
                self.wfile.write(chunk("a"))
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass


@pytest.fixture
def peer():
    """FAKE HTTP peer (stdlib http.server): streams tokens forever, or never answers."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("mode", "expected"), [("endless", "did not end in time"),
                                                ("silent", "timed out")])  # fmt: skip
def test_a_peer_that_streams_forever_or_never_answers_is_cut_off(peer, mode, expected):
    _Handler.mode = mode
    api = Api("127.0.0.1", peer.server_address[1], "k")
    t0 = time.monotonic()
    _, why = stream_completion(api, {"prompt": [1]}, timeout_s=2)
    assert expected in why and time.monotonic() - t0 < 6


def test_with_the_server_off_both_steps_are_skipped():
    s = Settings(model_path="m", model_sha256=None, ubatch_sizes=(64,), serve_listen="off")
    check, _ = placement_bench.placement(s, Deadline(60), GPU_PASSED, log=print)
    assert check.status == "SKIP"
    check, data = serving.serving(s, Deadline(60), GPU_PASSED, log=print)
    assert check.status == "SKIP" and data["goal"]["ttft_ratio_max"] == 0.8
