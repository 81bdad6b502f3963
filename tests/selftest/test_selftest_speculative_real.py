"""The `speculative` step against the real llama-server (ROCKY_LLAMA_BIN_DIR) with the tiny GGUF:
plain decode, the pin's n-gram modes and a draft model (the tiny model is its own draft: the same
vocabulary), each a real server; then the choice the board's server derives from it, and the
host report reading the section back.

Stand-in, said here: for the GPU placement (lavapipe) the document so far gives the GPU checks
and a GPU-winning placement (they need the board). On this host no mode wins with a random tiny
model; the timings say nothing about the Mali-G610 (docs/verification/speculative.md)."""

from __future__ import annotations

import json

import pytest
from rocky_selftest.bench import Deadline
from rocky_selftest.serve_settings import derive, server_command
from rocky_selftest.settings import load_settings
from rocky_selftest.speculation import GOAL, WIN_MIN
from rocky_selftest.speculation_bench import REQUESTS, speculative
from rocky_vulkan.host.result_doc import _Checker
from rocky_vulkan.host.spec_doc import spec_section

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.selftest import TINY_TEXT_ONLY, make_tiny_model, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.needs_llama_bin]

GENERATED = 48
GPU_DOC = {
    "checks": [{"name": n, "status": "PASS", "evidence": "stand-in: needs the board"}
               for n in ("gpu_driver", "vulkan_device", "sweep", "output_match")],
    "placement": {"modes": {"gpu": {"status": "PASS", "pp_tps": 500.0, "tg_tps": 50.0}}},
}  # fmt: skip


def _settings(tmp, model, draft: str, gpu: bool):
    cfg = write_config(
        tmp / "config.json",
        model_path=str(model),
        bin_dir=BIN_DIR,
        results_dir=str(tmp / "results"),
        env=VK_ENV if gpu else {},
        serve_listen="localhost",
        serve_request_generated_tokens=GENERATED,
        serve_context_tokens=2048,  # the requests' prompts are byte tokens for the tiny model
        serve_parallel=1,
        serving_logit_bias=TINY_TEXT_ONLY,
        spec_draft_model_path=draft,
    )
    return load_settings(str(cfg))


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def measured(request, tmp_path_factory):
    gpu = request.param == "gpu"
    if gpu and not vulkan_device():
        pytest.skip("no Vulkan device here (lavapipe: GGML_VK_VISIBLE_DEVICES=0)")
    model = make_tiny_model(tmp_path_factory)
    s = _settings(tmp_path_factory.mktemp("spec"), model, str(model), gpu)
    log: list[str] = []
    doc = GPU_DOC if gpu else {"checks": []}
    check, data = speculative(s, Deadline(800), doc, log=log.append)
    print("\n".join(log))
    print(f"{check.status} speculative: {check.evidence}")
    json.dumps(data, allow_nan=False)  # strict JSON, as result.json is written
    return s, doc, check, data, request.param


def test_every_mode_runs_the_typical_requests_on_its_own_server(measured):
    s, _, _, data, placement = measured
    assert data["placement"] == placement
    assert list(data["modes"]) == ["off", "ngram-simple", "ngram-mod", "draft"]
    for mode, entry in data["modes"].items():
        assert entry["status"] == "PASS", entry
        assert [r["request"] for r in entry["runs"]] == [name for name, _ in REQUESTS]
        for run in entry["runs"]:
            assert run["predicted_n"] == GENERATED and run["decode_tps"] > 0, run
            assert run["predicted_ms"] > 0
            if run["draft_n"]:
                assert 0 <= run["draft_n_accepted"] <= run["draft_n"]
        cmd = entry["cmd"]
        assert ("--spec-type" in cmd) == (mode in ("ngram-simple", "ngram-mod"))
        if "--spec-type" in cmd:
            assert cmd[cmd.index("--spec-type") + 1] == mode
        assert ("--model-draft" in cmd) == (mode == "draft")
        if mode == "draft":
            assert cmd[cmd.index("--model-draft") + 1] == s.spec_draft_model_path
            device = "Vulkan0" if placement == "gpu" else "none"
            assert cmd[cmd.index("--spec-draft-device") + 1] == device
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    # batched verification may round differently: recorded, not judged
    assert all(isinstance(r["same_text"], bool)
               for m, e in data["modes"].items() if m != "off" for r in e["runs"])  # fmt: skip


def test_the_choice_and_the_goal_follow_the_measured_times(measured):
    _, _, check, data, _ = measured
    plain = sum(r["predicted_ms"] for r in data["modes"]["off"]["runs"])
    ratios = {m: plain / sum(r["predicted_ms"] for r in e["runs"])
              for m, e in data["modes"].items() if m != "off"}  # fmt: skip
    assert data["speedups"] == pytest.approx(ratios, rel=1e-3)
    took = {m: sum(r["draft_n_accepted"] or 0 for r in data["modes"][m]["runs"]) for m in ratios}
    able = [m for m in ratios if ratios[m] >= WIN_MIN and took[m] > 0]
    chosen = max(able, key=ratios.get) if able else "off"
    assert data["chosen"] == chosen
    ratio = ratios.get(chosen, 1.0)
    assert data["goal_met"] == (ratio >= GOAL)
    assert check.status == "PASS" and data["reason"] in check.evidence
    assert ("NOT met" in check.evidence) != data["goal_met"]


def test_the_servers_settings_take_the_measured_choice(measured):
    s, doc, _, data, _ = measured
    plan = derive(s, doc={**doc, "speculative": data})
    value = plan["settings"]["speculative"]["value"]
    assert (value or {"mode": "off"})["mode"] == data["chosen"]
    argv, _ = server_command(s, plan, "/run/credentials")
    assert ("--spec-type" in argv or "--model-draft" in argv) == (data["chosen"] != "off")


def test_the_host_report_reads_the_section_as_the_board_wrote_it(measured):
    *_, data, _ = measured
    c = _Checker()
    section = spec_section(json.loads(json.dumps(data)), c)
    assert c.problems == [] and section["state"] == "ok"
    assert section["chosen"] == data["chosen"] and section["goal_met"] == data["goal_met"]


def test_a_draft_model_that_is_not_a_gguf_fails_its_mode_only(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec-bad")
    model = make_tiny_model(tmp_path_factory)
    junk = tmp / "draft.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 4096)  # a header's magic, then nonsense
    s = _settings(tmp, model, str(junk), gpu=False)
    check, data = speculative(s, Deadline(600), {"checks": []}, log=print)
    draft = data["modes"]["draft"]
    assert draft["status"] == "FAIL" and draft["runs"] == []
    assert "exited" in draft["reason"] and draft["log_tail"], draft
    assert all(data["modes"][m]["status"] == "PASS" for m in ("off", "ngram-simple", "ngram-mod"))
    assert check.status == "FAIL" and "draft: llama-server exited" in check.evidence
    assert data["chosen"] != "draft" and "draft" not in data["speedups"]
