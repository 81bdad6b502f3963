"""The server's settings from the board's measurements (rocky_selftest.serve_settings,
placement, gguf): every input hostile, every fallback safe and said."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from rocky_selftest.gguf import GgufError, model_shape
from rocky_selftest.placement import choose, request_seconds
from rocky_selftest.serve_settings import (
    best_ubatch,
    derive,
    gpu_ok,
    memory_plan,
    server_command,
)
from rocky_selftest.settings import Settings

from tests.helpers.selftest import make_tiny_model

# As the self-test writes them (read_result refuses a check without its evidence).
GOOD_CHECKS = [
    {"name": n, "status": "PASS", "evidence": "synthetic"}
    for n in ("gpu_driver", "vulkan_device", "sweep", "output_match")
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory)


def settings(tmp_path: Path, model: Path, **extra) -> Settings:
    s = Settings(model_path=str(model), model_sha256=None, ubatch_sizes=(64,))
    return replace(s, results_dir=str(tmp_path), **extra)


def write_result(folder: Path, doc: dict) -> None:
    head = {"schema": "rocky-selftest-result", "schema_version": 1, "verdict": "PASS"}
    (folder / "result.json").write_text(json.dumps({**head, **doc}))


def meminfo(tmp_path: Path, gib: float) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {int(gib * (1 << 20))} kB\nMemFree: 1 kB\n")
    return str(path)


# --- placement: the least time for the typical request wins ---


def test_decode_bound_request_goes_where_decode_is_fastest():
    # RK3588-like: GPU prefill 28 t/s, CPU 22; CPU decode a bit faster (memory-bound).
    modes = {
        "gpu": {"pp_tps": 28.1, "tg_tps": 6.0},
        "cpu": {"pp_tps": 22.0, "tg_tps": 6.8},
        "hybrid": {"pp_tps": 27.0, "tg_tps": 6.7},
    }
    assert choose(modes, 2048, 256, gpu_ok=True)[0] == "hybrid"
    assert choose(modes, 64, 2048, gpu_ok=True)[0] == "cpu"  # decode dominates: CPU's tg
    modes["hybrid"]["status"] = "FAIL"
    assert choose(modes, 2048, 16, gpu_ok=True)[0] == "gpu"


def test_request_time_is_prompt_over_pp_plus_generated_over_tg():
    assert request_seconds(20.0, 5.0, 2000, 50) == pytest.approx(110.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0, "28", None, True, [28.0], 10**400])
def test_unusable_rates_never_win_and_fall_back_to_the_cpu(bad):
    modes = {"gpu": {"pp_tps": bad, "tg_tps": 6.0}}
    mode, reason = choose(modes, 2048, 256, gpu_ok=True)
    assert mode == "cpu" and "no usable placement measurement" in reason


@pytest.mark.parametrize("modes", [None, [], "gpu", {"gpu": "fast"}, {"tpu": {"pp_tps": 1e9}}])
def test_malformed_placement_sections_fall_back_to_the_cpu(modes):
    assert choose(modes, 2048, 256, gpu_ok=True)[0] == "cpu"


def test_failed_gpu_checks_serve_on_the_cpu_whatever_the_rates_say():
    modes = {"gpu": {"pp_tps": 1000.0, "tg_tps": 1000.0}}
    mode, reason = choose(modes, 2048, 256, gpu_ok=False)
    assert mode == "cpu" and "GPU checks did not pass" in reason


# --- the self-test's verdicts and the sweep ---


def test_gpu_ok_needs_every_gpu_check_passed():
    assert gpu_ok({"checks": GOOD_CHECKS})[0]
    bad = [dict(c, status="FAIL") if c["name"] == "output_match" else c for c in GOOD_CHECKS]
    ok, why = gpu_ok({"checks": bad})
    assert not ok and "output_match" in why
    for doc in (None, [], {"checks": "PASS"}, {"checks": [None, 5]}, {}):
        assert not gpu_ok(doc)[0]


def test_best_ubatch_is_the_fastest_crash_free_gpu_run():
    runs = [
        {"mode": "tuned", "ubatch": 64, "status": "PASS", "avg_ts": 20.0},
        {"mode": "tuned", "ubatch": 256, "status": "PASS", "avg_ts": 28.1},
        {"mode": "tuned", "ubatch": 512, "status": "FAIL", "avg_ts": 99.0},  # crashed
        {"mode": "cpu", "ubatch": 1024, "status": "PASS", "avg_ts": 50.0},  # not the GPU
        {"mode": "tuned", "ubatch": 2**70, "status": "PASS", "avg_ts": 60.0},  # hostile
        {"mode": "tuned", "ubatch": 128, "status": "PASS", "avg_ts": math.nan},
    ]
    ub, why = best_ubatch({"sweep": runs})
    assert ub == 256 and "28.10 t/s at ub 256" in why
    assert best_ubatch({"sweep": "x"})[0] == 512


# --- the model's shape and the RAM plan ---


def test_model_shape_reads_the_gguf_metadata(tiny):
    shape = model_shape(str(tiny))
    assert shape.architecture == "llama"
    assert shape.context_length == 4096
    # 2 layers x 4 KV heads x (64 + 64) x 2 bytes (tiny: n_embd 256, 4 heads)
    assert shape.kv_bytes_per_token == 2 * 4 * 128 * 2
    assert (shape.n_layer, shape.n_expert) == (2, 0)


def test_model_shape_counts_a_moe_model_s_experts(tmp_path):
    from rocky_vulkan.llama.testmodel import write_preset

    shape = model_shape(str(write_preset("tiny-moe", tmp_path / "moe.gguf", n_layer=3)))
    assert (shape.n_layer, shape.n_expert) == (3, 8)


def test_a_moe_model_placed_experts_cpu_serves_with_them_in_ram(tmp_path, tiny):
    modes = {"gpu": {"pp_tps": 28.0, "tg_tps": 4.0}, "experts-cpu": {"pp_tps": 25.0, "tg_tps": 9.0}}
    write_result(tmp_path, {"checks": GOOD_CHECKS, "placement": {"modes": modes}})
    s = settings(tmp_path, tiny, hostname="head", cluster=CLUSTER)
    plan = derive(s, meminfo(tmp_path, 16), cluster={"value": ["10.77.0.2:50052"], "reason": "t"})
    assert plan["settings"]["placement"]["value"] == "experts-cpu"
    argv, _ = server_command(s, plan, "/creds")
    assert "--cpu-moe" in argv and argv[argv.index("-ngl") + 1] == "99"
    # its experts stay in this board's RAM: no worker is asked to hold layers
    assert argv[argv.index("-dev") + 1] == "Vulkan0" and "--rpc" not in argv


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"GGML" + b"\0" * 20,
        b"GGUF" + struct.pack("<IQQ", 7, 0, 0),  # unknown version
        b"GGUF" + struct.pack("<IQQ", 3, 0, 10**12),  # absurd key count
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40),  # huge string
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"abc",  # cut short
        b"GGUF" + struct.pack("<IQQ", 3, 0, 0),  # no architecture
    ],
)
def test_hostile_gguf_headers_are_refused_quickly(tmp_path, data):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GgufError):
        model_shape(str(path))


def test_memory_plan_keeps_the_config_when_it_fits(tmp_path, tiny):
    s = settings(tmp_path, tiny, serve_context_tokens=2048, serve_parallel=2)
    ctx, slots, why = memory_plan(s, 8 << 30)
    assert (ctx, slots) == (2048, 2) and "fits" in why


def test_memory_plan_lowers_slots_then_context_on_a_small_board(tmp_path, tiny):
    s = settings(tmp_path, tiny, serve_context_tokens=4096, serve_parallel=4)
    kv_token = model_shape(str(tiny)).kv_bytes_per_token
    size = tiny.stat().st_size
    # Room for exactly 1 x 2048 tokens beside the model and the reserve.
    from rocky_selftest.serve_settings import RESERVE_BYTES

    ctx, slots, why = memory_plan(s, size + RESERVE_BYTES + 2048 * kv_token)
    assert (ctx, slots) == (2048, 1) and "lowered from 4096 x 4" in why


def test_memory_plan_caps_the_context_at_what_the_model_was_trained_for(tmp_path, tiny):
    s = settings(tmp_path, tiny, serve_context_tokens=32768, serve_parallel=1)
    ctx, _, why = memory_plan(s, 64 << 30)
    assert ctx == 4096 and "trained for 4096" in why


# --- the whole derivation and llama-server's command line ---


def test_derive_serves_on_the_gpu_with_the_measured_settings(tmp_path, tiny):
    write_result(
        tmp_path,
        {
            "checks": GOOD_CHECKS,
            "sweep": [{"mode": "tuned", "ubatch": 256, "status": "PASS", "avg_ts": 28.0}],
            "placement": {"modes": {"gpu": {"pp_tps": 28.0, "tg_tps": 7.0}}},
        },
    )
    spec = "int=256,64,64,32,16,16,2,2,2,1,16,2"
    (tmp_path / "tuned-tiles.env").write_text(f"# tuned\nGGML_VK_MALI_WARPTILE={spec}\n")
    s = settings(tmp_path, tiny, serve_context_tokens=1024, serve_parallel=2)
    plan = derive(s, meminfo(tmp_path, 16))
    assert plan["warnings"] == []
    argv, env = server_command(s, plan, "/run/credentials/rocky-llm.service")
    assert argv[argv.index("-ngl") + 1] == "99" and argv[argv.index("-dev") + 1] == "Vulkan0"
    assert argv[argv.index("--ubatch-size") + 1] == "256"
    assert argv[argv.index("--ctx-size") + 1] == "2048"  # 2 slots of 1024
    assert argv[argv.index("--parallel") + 1] == "2"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "--ssl-cert-file" in argv and "--api-key-file" in argv and "--no-slots" in argv
    assert env == {"GGML_VK_MALI_WARPTILE": spec, "GGML_NO_BACKTRACE": "1"}


def test_derive_says_so_when_the_gpu_failed(tmp_path, tiny):
    bad = [dict(c, status="FAIL") if c["name"] == "sweep" else c for c in GOOD_CHECKS]
    write_result(tmp_path, {"checks": bad, "placement": {"modes": {"gpu": {"pp_tps": 99}}}})
    s = settings(tmp_path, tiny, serve_listen="localhost")
    plan = derive(s, meminfo(tmp_path, 8))
    assert plan["settings"]["placement"]["value"] == "cpu"
    assert plan["warnings"] and "serving on the CPU, not the GPU" in plan["warnings"][0]
    argv, _ = server_command(s, plan, "/creds")
    assert argv[argv.index("-dev") + 1] == "none"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--ssl-key-file" not in argv


@pytest.mark.parametrize(
    "content", ["{", "[]", '"PASS"', "\x1b[2J", json.dumps({"checks": [{"name": 5}]})]
)
def test_derive_never_raises_on_a_hostile_result(tmp_path, tiny, content):
    (tmp_path / "result.json").write_text(content)
    (tmp_path / "tuned-tiles.env").write_text("GGML_VK_MALI_WARPTILE=$(reboot)\n")
    plan = derive(settings(tmp_path, tiny), meminfo(tmp_path, 4))
    assert plan["settings"]["placement"]["value"] == "cpu"
    assert plan["settings"]["tiles"]["value"] is None
    assert "ignored" in plan["settings"]["tiles"]["reason"]


# ---- a cluster's head (issue 32): --rpc for the workers that answer, no -dev -----------------

GPU_WINS = {
    "checks": GOOD_CHECKS,
    "sweep": [{"mode": "tuned", "ubatch": 256, "status": "PASS", "avg_ts": 28.0}],
    "placement": {"modes": {"gpu": {"pp_tps": 28.0, "tg_tps": 7.0}}},
}
CLUSTER = {"subnet": "10.77.0.0/24", "head": "head", "workers": ["w1", "w2"]}


def test_a_head_uses_the_workers_that_answer_and_names_no_device(tmp_path, tiny):
    import socket

    write_result(tmp_path, GPU_WINS)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    # w1 answers at 10.77.0.2 on a real board; here the endpoint is patched to a listener.
    s = settings(tmp_path, tiny, hostname="head", cluster={**CLUSTER, "rpc_port": port})
    import rocky_selftest.serve_settings as ss

    real = ss.reachable
    seen = []

    def via_loopback(endpoints, timeout_s=3.0):
        seen.extend(endpoints)
        ups, downs = real([e.replace("10.77.0.2", "127.0.0.1") for e in endpoints], timeout_s=1)
        return [e.replace("127.0.0.1", "10.77.0.2") for e in ups], downs

    ss.reachable = via_loopback
    try:
        plan = derive(s, meminfo(tmp_path, 16))
    finally:
        ss.reachable = real
        listener.close()
    item = plan["settings"]["cluster"]
    assert seen == [f"10.77.0.2:{port}", f"10.77.0.3:{port}"]
    assert item["value"] == [f"10.77.0.2:{port}"], item
    assert item["reason"].startswith("1 of 2 workers answer") and "10.77.0.3" in item["reason"]
    argv, _ = server_command(s, plan, "/creds")
    assert argv[argv.index("--rpc") + 1] == f"10.77.0.2:{port}" and "-dev" not in argv


@pytest.mark.parametrize("who", ["w1", "stranger"])
def test_a_worker_or_another_board_serves_alone(tmp_path, tiny, who):
    write_result(tmp_path, GPU_WINS)
    s = settings(tmp_path, tiny, hostname=who, cluster=CLUSTER)
    plan = derive(s, meminfo(tmp_path, 16))
    item = plan["settings"]["cluster"]
    assert item["value"] == [] and "this board alone" in item["reason"], item
    argv, _ = server_command(s, plan, "/creds")
    assert "--rpc" not in argv and argv[argv.index("-dev") + 1] == "Vulkan0"


def test_a_plan_from_before_clusters_still_serves(tmp_path, tiny):
    write_result(tmp_path, GPU_WINS)
    s = settings(tmp_path, tiny)
    plan = derive(s, meminfo(tmp_path, 16))
    del plan["settings"]["cluster"]
    argv, _ = server_command(s, plan, "/creds")
    assert "--rpc" not in argv and "-dev" in argv


def test_rm_says_so_when_the_server_cannot_be_asked_about_requests():
    # A port nothing listens on: the real refusal `rm` meets when the router is down.
    from rocky_selftest.router import drain
    from rocky_selftest.serve_client import Api

    from tests.helpers.serve import free_port

    said = drain(Api("127.0.0.1", free_port(), "k"), "second", timeout_s=5)
    assert said.startswith("could not ask the server about requests on second (")
    assert said.endswith("): not waited for")
    assert drain(None, "second") == ""  # the server is off: nothing to wait for


@pytest.mark.parametrize(("who", "cluster", "why"), [
    ("head", None, "no cluster in the config"),
    ("w1", CLUSTER, "this board is a worker"),
    ("stranger", CLUSTER, "this board is a stranger"),
])  # fmt: skip
def test_the_cluster_step_is_a_head_s_only(tmp_path, tiny, who, cluster, why):
    from rocky_selftest.bench import Deadline
    from rocky_selftest.cluster_step import cluster as cluster_step

    extra = {"cluster": cluster} if cluster else {}
    s = settings(tmp_path, tiny, hostname=who, **extra)
    check, data = cluster_step(s, Deadline(60), {})
    assert (check.status, data) == ("SKIP", None)
    assert check.evidence == f"{why}: only a cluster's head measures it"


def test_a_head_whose_workers_do_not_answer_skips_and_says_how_to_measure_later(tmp_path, tiny):
    from rocky_selftest.bench import Deadline
    from rocky_selftest.cluster_step import cluster as cluster_step

    from tests.helpers.serve import free_port

    # The workers' addresses are not on this machine: the real connect fails (at first boot
    # they are not paired yet).
    s = settings(tmp_path, tiny, hostname="head", cluster={**CLUSTER, "rpc_port": free_port()})
    check, data = cluster_step(s, Deadline(60), {})
    assert (check.status, data) == ("SKIP", None)
    assert "no worker's rpc-server answers" in check.evidence, check.evidence
    assert check.evidence.endswith("then `rocky-llm cluster bench` measures it")


def _measured(alone: tuple, cluster: tuple, tensor: tuple | None = None,
              speed: tuple | None = None, shares: object = "0.600/0.400",
              workers: tuple = ("10.77.0.2:50052",)) -> dict:  # fmt: skip
    def mode(rates):
        pp, tg, *status = rates
        return {"status": status[0] if status else "PASS", "pp_tps": pp, "tg_tps": tg}

    modes = {"alone": mode(alone), "cluster": mode(cluster)}
    if tensor is not None:
        modes["tensor"] = mode(tensor)
    if speed is not None:
        modes["speed"] = mode(speed)
    return {"cluster": {"workers": list(workers), "modes": modes, "tensor_split": shares}}


# Typical request 2048+256 tokens: 28/7 t/s = 109.7 s, 20/5 = 153.6 s, 32/9 = 92.4 s.
@pytest.mark.parametrize(
    ("measured", "ram_gib", "workers", "split", "said"),
    [
        (_measured((28.0, 7.0), (20.0, 5.0)), 16, False, "layer",
         "alone 109.7 s, whole layers 153.6 s, and the model fits here: this board alone"),
        (_measured((20.0, 5.0), (28.0, 7.0)), 16, True, "layer", "whole layers 109.7 s: llama"),
        (_measured((28.0, 7.0), (20.0, 5.0)), 0.001, True, "layer", "whole layers 153.6 s:"),
        (_measured((28.0, 7.0), (0, 0, "FAIL")), 16, True, "layer", "not measured with the"),
        ({}, 16, True, "layer", "not measured with the workers"),  # first boot, not paired
        ({"cluster": {"modes": {"alone": "x", "cluster": None}}}, 16, True, "layer", "not mea"),
        # tensor parallelism the fastest: it serves, also where alone fits
        (_measured((28.0, 7.0), (20.0, 5.0), (32.0, 9.0)), 16, True, "tensor",
         "alone 109.7 s, whole layers 153.6 s, tensor parallel 92.4 s: tensor parallelism"),
        # a failed or slower tensor run is never taken
        (_measured((20.0, 5.0), (28.0, 7.0), (0, 0, "FAIL")), 16, True, "layer", "layers 109.7"),
        (_measured((20.0, 5.0), (28.0, 7.0), (20.0, 5.0)), 16, True, "layer", "parallel 153.6"),
        (_measured((28.0, 7.0), (20.0, 5.0), (28.0, 7.0)), 16, False, "layer", "this board alone"),
        (_measured((28.0, 7.0), (20.0, 5.0), (-1.0, 5.0)), 0.001, True, "layer", "layers 153.6 s:"),
        # layers by each device's speed the fastest: --tensor-split with the measured shares
        (_measured((20.0, 5.0), (28.0, 7.0), None, (32.0, 9.0)), 16, True, "layer",
         "layers by speed 92.4 s: whole layers, each device's share by its own decode rate"),
        # ... but only over the workers it was measured with, and with well-formed shares
        (_measured((20.0, 5.0), (28.0, 7.0), None, (32.0, 9.0), workers=("10.77.0.3:50052",)),
         16, True, "layer", "whole layers 109.7 s: llama"),
        (_measured((20.0, 5.0), (28.0, 7.0), None, (32.0, 9.0), shares="1/1;rm -rf"),
         16, True, "layer", "whole layers 109.7 s: llama"),
        (_measured((20.0, 5.0), (28.0, 7.0), None, (32.0, 9.0), shares=[0.5, 0.5]),
         16, True, "layer", "whole layers 109.7 s: llama"),
    ],
)  # fmt: skip
def test_a_head_serves_as_its_self_test_measured_fastest(
    tmp_path, tiny, monkeypatch, measured, ram_gib, workers, split, said
):
    """Alone only where it fits; whole layers or tensor parallelism by the measured typical
    request time; llama.cpp's default split where nothing was measured."""
    import rocky_selftest.serve_settings as ss

    monkeypatch.setattr(  # w1 answers, w2 does not (the real probe: the test above)
        ss, "reachable", lambda eps, timeout_s=3.0: (eps[:1], [f"{eps[1]}: refused"])
    )
    write_result(tmp_path, {**GPU_WINS, **measured})
    s = settings(tmp_path, tiny, hostname="head", cluster=CLUSTER, serve_context_tokens=1024,
                 serve_parallel=1)  # fmt: skip
    plan = derive(s, meminfo(tmp_path, ram_gib))
    item, mode = plan["settings"]["cluster"], plan["settings"]["split_mode"]
    assert bool(item["value"]) == workers and mode["value"] == split, (item, mode)
    assert item["reason"].startswith("1 of 2 workers answer"), item
    assert said in (mode["reason"] if workers else item["reason"]), (item, mode)
    argv, _ = server_command(s, plan, "/creds")
    assert ("--rpc" in argv) == workers and ("-dev" in argv) != workers, argv
    assert (argv[argv.index("--split-mode") + 1] if "--split-mode" in argv else "layer") == split
    speed = "layers by speed" in said
    assert plan["settings"]["tensor_split"]["value"] == ("0.600/0.400" if speed else None)
    assert argv[argv.index("--tensor-split") + 1] if speed else "--tensor-split" not in argv
    if speed:
        assert argv[argv.index("--tensor-split") + 1] == "0.600/0.400", argv


@pytest.mark.parametrize(
    ("split", "shares", "line"),
    [
        ("tensor", None, "split-mode = tensor"),
        ("layer", None, None),
        ("layer", "0.700/0.300", None),
    ],
)
def test_the_router_preset_carries_the_workers_and_the_split(split, shares, line):
    import configparser

    from rocky_selftest.router import preset_ini

    values = {"placement": "gpu", "ubatch": 64, "context_per_slot": 512, "parallel": 1,
              "model": "/m/ref.gguf", "speculative": None, "cluster": ["10.77.0.2:50052"],
              "split_mode": split, "tensor_split": shares}  # fmt: skip
    plan = {"settings": {k: {"value": v, "reason": "test"} for k, v in values.items()}}
    text = preset_ini({"models": {"reference": plan}, "gpu_device": "Vulkan0",
                       "loaded_at_start": "reference"})  # fmt: skip
    ini = configparser.ConfigParser()
    ini.read_string(text)
    ref = ini["reference"]
    assert ref["rpc"] == "10.77.0.2:50052" and "device" not in ref, text
    assert ref.get("split-mode") == (split if line else None), text
    assert ref.get("tensor-split") == shares, text


# --- the RAM under the server's sandbox (ProcSubset=pid: no /proc/meminfo) ---


def test_ram_comes_from_sysinfo_where_meminfo_is_missing(tmp_path):
    from rocky_selftest.serve_settings import mem_total_bytes

    real = mem_total_bytes()
    assert real and real > 64 << 20
    assert mem_total_bytes(str(tmp_path / "absent")) == real  # sysinfo(2), same RAM
    assert mem_total_bytes(meminfo(tmp_path, 8)) == 8 << 30  # a MemTotal line wins
    garbled = tmp_path / "garbled"
    garbled.write_text("MemTotal: lots\n")
    assert mem_total_bytes(str(garbled)) is None  # present but unreadable: unknown, not guessed


def test_ram_is_known_inside_a_proc_mounted_as_procsubset_pid_mounts_it():
    """What rocky-llm.service's ProcSubset=pid gives the server: a /proc without meminfo. The
    plan must still state the RAM (issue 40: one slot, one model, "RAM size unknown")."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    code = (
        "import os; from rocky_selftest.serve_settings import mem_total_bytes as m; "
        "print(os.path.exists('/proc/meminfo'), m())"
    )
    script = f'mount -o remount,subset=pid /proc && exec {sys.executable} -c "{code}"'
    proc = subprocess.run(
        ["unshare", "-m", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2] / "tools",
    )
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    exists, ram = proc.stdout.split()
    assert exists == "False"  # the sandbox's /proc really lacks meminfo
    assert int(ram) > 64 << 20
