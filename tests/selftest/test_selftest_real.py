"""The whole self-test against real llama.cpp binaries and the tiny GGUF.

Needs ROCKY_LLAMA_BIN_DIR: a llama.cpp bin/ with llama-bench, llama-perplexity and llama-simple
(.ci/llama.sh builds one). With a Vulkan device there (lavapipe: GGML_VK_VISIBLE_DEVICES=0 makes
it Vulkan0) the GPU runs must really run on it; without one they must fail instead of silently
using the CPU. The stack checks are left out (they need the board; test_selftest_stack covers
them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rocky_selftest.cli import main
from rocky_selftest.stack import sha256_file

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.selftest import TINY_TEXT_ONLY, make_tiny_model, write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.needs_llama_bin,
]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    model = make_tiny_model(tmp_path_factory)
    device = vulkan_device()
    cfg = write_config(
        tmp / "config.json",
        model_path=str(model),
        model_sha256=sha256_file(str(model)),
        ubatch_sizes=[16, 64],
        prompt_tokens=64,
        repetitions=2,
        match_tokens=16,
        run_timeout_s=600,
        deadline_s=1500,
        bin_dir=BIN_DIR,
        results_dir=str(tmp / "results"),
        motd_path=str(tmp / "motd"),
        gpu_name=device or "no Vulkan device on this host",
        env=VK_ENV,
        skip_checks=["gpu_driver", "csf_firmware", "no_vendor_driver", "vulkan_device"],
        # the server steps at sizes for CI (the board: 2048 + 256, 2048 and 8192)
        serve_request_prompt_tokens=64,
        serve_request_generated_tokens=16,
        serve_context_tokens=512,
        serve_parallel=1,
        serving_prompt_tokens=[64],
        serving_generated_tokens=8,
        serving_logit_bias=TINY_TEXT_ONLY,
    )
    rc = main(["--config", str(cfg), "run"])
    doc = json.loads((tmp / "results/result.json").read_text())
    return rc, doc, device


def _checks(doc):
    return {c["name"]: c for c in doc["checks"]}


def test_cpu_runs_measure_real_throughput(result):
    _, doc, _ = result
    cpu = [r for r in doc["sweep"] if r["mode"] == "cpu"]
    assert [r["ubatch"] for r in cpu] == [16, 64]
    for run in cpu:
        assert run["status"] == "PASS", run
        assert run["avg_ts"] > 0 and run["n_ubatch"] == run["ubatch"]
        assert run["devices"] in ("none", None)
    assert _checks(doc)["model_sha256"]["status"] == "PASS"


def test_gpu_runs_use_the_gpu_or_fail_loudly(result):
    rc, doc, device = result
    gpu = [r for r in doc["sweep"] if r["mode"] != "cpu"]
    if device:
        for run in gpu:
            assert run["status"] == "PASS", run
            assert device in run["gpu_info"] and run["devices"] == "Vulkan0"
            # Recorded from ggml-vulkan's own log (llama-bench -v): lavapipe is not panvk, so
            # the product's auto choice and the stock switch both give the stock tiles.
            assert run["tiles"] == "stock", run
    else:
        # -dev Vulkan0 without the device: exit 1, never a silent CPU run counted as GPU.
        assert all(r["status"] == "FAIL" for r in gpu)
        assert all("exit status 1" in r["reason"] for r in gpu)
        assert doc["verdict"] == "FAIL" and rc == 1


def test_ratio_verdict_follows_the_measured_numbers(result):
    _, doc, device = result
    check = _checks(doc)["ratio"]
    if not device:
        assert check["status"] == "FAIL" and "run failed" in check["evidence"]
        return
    r = doc["ratio"]
    need = r["stock_tps"] * doc["thresholds"]["tuned_vs_stock_ratio"]
    need *= 1 - doc["thresholds"]["ratio_tolerance"]
    expected = r["tuned_tps"] >= need and r["tuned_tps"] > r["cpu_tps"]
    assert (check["status"] == "PASS") == expected
    assert len(r["runs"]) == 3 * 2 and [x["mode"] for x in r["runs"][:3]] == [
        "tuned", "stock", "cpu"
    ]  # fmt: skip


def test_output_match_is_the_kld_check_with_greedy_text_as_information(result):
    _, doc, device = result
    check = _checks(doc)["output_match"]
    out = doc["output_match"]
    cpu_base, greedy_cpu = out["kld"]["cpu"], out["greedy"]["cpu"]
    assert greedy_cpu.get("prompt_tokens", 0) > 64 and greedy_cpu.get("decoded", 0) > 0
    assert greedy_cpu["offloaded"] is None or greedy_cpu["offloaded"].startswith("0/")
    if not (Path(BIN_DIR) / "llama-perplexity").exists():
        # A bin dir without llama-perplexity: the check fails and says why, never passes.
        assert check["status"] == "FAIL" and "cannot start" in check["evidence"], check
        return
    assert "reason" not in cpu_base and cpu_base["base_bytes"] > 0, cpu_base
    if device:
        gpu = out["kld"]["gpu"]
        assert check["status"] == "PASS", check
        assert gpu["mean_kld"] <= doc["thresholds"]["kld_max_mean"]
        assert gpu["same_top_p"] >= doc["thresholds"]["kld_min_same_top_p"]
        assert gpu["tiles"] in ("mali", "stock") and f"tiles {gpu['tiles']}" in check["evidence"]
        assert out["greedy"]["summary"] in check["evidence"]  # shown, but not deciding
    else:
        assert check["status"] == "FAIL" and "gpu llama-perplexity run" in check["evidence"]


def test_the_server_steps_read_the_run_so_far(result):
    """The stack checks are left out here (they need the board), so the GPU checks are not all
    PASS: the placement is measured but FAILs naming them, and the server would run on the
    CPU; the serving step then runs the CPU server only (test_selftest_serving_real.py runs
    both servers)."""
    _, doc, _ = result
    checks = _checks(doc)
    assert list(checks)[-4:] == ["placement", "serving", "speculative", "cluster"]
    # No cluster in this config: the head-only step says so, and nothing is recorded.
    assert checks["cluster"]["status"] == "SKIP" and doc["cluster"] is None
    assert checks["cluster"]["evidence"].startswith("no cluster in the config")
    place = doc["placement"]
    assert checks["placement"]["status"] == "FAIL"
    assert "gpu_driver" in checks["placement"]["evidence"] and place["chosen"] == "cpu"
    assert place["modes"]["cpu"]["status"] == "PASS" and place["modes"]["cpu"]["tg_tps"] > 0
    runs = {r["server"]: r for r in doc["serving"]["runs"]}
    assert runs["gpu"]["status"] == "FAIL" and "serves on the CPU" in runs["gpu"]["reason"]
    if (Path(BIN_DIR) / "llama-server").exists():
        assert runs["cpu"]["status"] == "PASS" and runs["cpu"]["ttft_s"] > 0, runs["cpu"]
    else:
        assert runs["cpu"]["status"] == "FAIL" and "cannot start" in runs["cpu"]["reason"]
    assert checks["serving"]["status"] == "FAIL"


def test_the_speculative_step_runs_in_the_whole_self_test(result):
    """On the CPU placement the step still measures every draft-free mode against plain decode
    (test_selftest_speculative_real.py covers the draft model and lavapipe)."""
    _, doc, _ = result
    check = _checks(doc)["speculative"]
    section = doc["speculative"]
    if not (Path(BIN_DIR) / "llama-server").exists():
        assert check["status"] == "FAIL" and "plain decode was not measured" in check["evidence"]
        return
    assert set(section["modes"]) == {"off", "ngram-simple", "ngram-mod"}  # no draft configured
    assert all(e["status"] == "PASS" for e in section["modes"].values()), section
    assert check["status"] == "PASS" and section["reason"] in check["evidence"]
    assert section["draft_model"] is None and "no draft model" in section["goal_why"]
