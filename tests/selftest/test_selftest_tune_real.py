"""`rocky-selftest tune` with real binaries: a spec-capable llama.cpp build on lavapipe.

Needs ROCKY_LLAMA_BIN_DIR: a llama.cpp bin/ built with our patch at a revision that knows
GGML_VK_MALI_WARPTILE=<spec> (llama-bench, llama-perplexity, llama-quantize), and a Vulkan device
(lavapipe: GGML_VK_VISIBLE_DEVICES=0). The build's test-only hook
GGML_VK_TEST_INT_DOT_UNACCELERATED=1 lets lavapipe run the integer-dot pipelines the candidates
change. Lavapipe's t/s say nothing about the board: what this proves is that every candidate is
accepted and runs, that the log shows the spec in use, that a broken spec is rejected with the
patch's line, and that the winner goes through the real KLD check before it is written.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from rocky_selftest import tune, tune_files
from rocky_selftest.settings import load_settings
from rocky_vulkan.tiles import prune as tiles_prune
from rocky_vulkan.tiles import space as tilespace

from tests.helpers import project
from tests.helpers.llama_bin import BIN_DIR, vulkan_device
from tests.helpers.selftest import make_tiny_model, write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.needs_llama_bin,
]
VK_ENV = {"GGML_VK_VISIBLE_DEVICES": "0", "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1"}
BROKEN = "int_k=128,64,64,32,16,16,1,2,2,1,16,2"  # (64/16)*(64/16) = 16 warp tiles, 8 warps


def _tool(name: str) -> str:
    path = Path(BIN_DIR) / name
    if not path.exists():
        pytest.skip(f"no {name} in {BIN_DIR}")
    return str(path)


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory) -> Path:
    """The tiny random-weight llama, quantized to Q4_K_M: its matmuls run the int_k family."""
    f16 = make_tiny_model(tmp_path_factory)
    out = f16.with_name("tiny-q4_k_m.gguf")
    done = subprocess.run(
        [_tool("llama-quantize"), str(f16), str(out), "Q4_K_M"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def settings(tmp_path_factory, q4k_model):
    device = vulkan_device()
    if not device:
        pytest.skip("no Vulkan device (lavapipe) in this llama.cpp build")
    # ggml-vulkan logs the tile line (or the old build's warning) only once a device is set up,
    # verbose: a short real run, not --list-devices.
    probe = subprocess.run(
        [_tool("llama-bench"), "-m", str(q4k_model), "-p", "16", "-n", "0", "-r", "1", "-v",
         "-ngl", "99", "-dev", "Vulkan0"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, **VK_ENV, "GGML_VK_MALI_WARPTILE": project.candidates()[1].spec},
    )  # fmt: skip
    if "ignoring GGML_VK_MALI_WARPTILE" in probe.stderr:
        pytest.skip("this llama.cpp build predates GGML_VK_MALI_WARPTILE=<spec>")
    assert "(spec: " in probe.stderr, probe.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("tune-real")
    builtin = project.builtin_tiles()
    every = tilespace.candidates(builtin)
    # the built-in, a 512-thread 64x64 tile and a 128x64 one: three shapes of the space
    picked = [every[0], next(c for c in every if "b512" in c.name and c.name.startswith("64x64"))]
    picked.append(next(c for c in every if c.name.startswith("128x64")))
    cand_file = tmp / "tile_candidates.json"
    tiles_prune.write_document(tiles_prune.document(picked, builtin, None, {}), cand_file)
    cfg = write_config(
        tmp / "config.json",
        model_path=str(q4k_model),
        bin_dir=BIN_DIR,
        results_dir=str(tmp / "results"),
        gpu_name=device,
        env=VK_ENV,
        prompt_tokens=128,
        run_timeout_s=900,
        tune_budget_s=3000,
        tune_candidates=str(cand_file),
    )
    return load_settings(str(cfg)), picked


def test_a_spec_that_breaks_a_rule_is_rejected_with_the_patch_line(settings):
    s, _ = settings
    rec = tune.tune_bench(s, BROKEN, s.run_timeout_s)
    print(rec)
    assert rec.get("rejected") is True, rec
    assert "rejected by ggml-vulkan: int_k: (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP" in rec["reason"]


def test_every_candidate_runs_and_the_winner_passes_the_real_kld_check(settings):
    s, picked = settings
    os.makedirs(s.results_dir, exist_ok=True)
    summary = tune.Tuner(s, log=print).run()
    rows = {r["name"]: r for r in summary["candidates"]}
    for cand in picked:
        row = rows[cand.name]
        assert row["status"] == "ok", row  # accepted, ran, spec in ggml-vulkan's info line
        assert len(row["tps"]) == 3  # three candidates: all in the top 3, all repeated
    assert summary["phase"] == "done" and not summary["budget_exhausted"]
    winner = summary["winner"]
    assert winner is not None, summary
    v = rows[winner]["validation"]
    assert v["ok"], v
    choice = tune_files.read_choice(s.results_dir)
    if rows[winner]["builtin"]:
        assert choice is None
    else:
        assert "mean KLD" in v["evidence"]  # the real llama-perplexity ran with the spec
        assert choice == rows[winner]["spec"]


def test_verify_keeps_a_valid_choice(settings):
    s, picked = settings
    s = replace(s, results_dir=str(Path(s.results_dir).parent / "verify"))
    os.makedirs(s.results_dir, exist_ok=True)
    tune_files.write_choice(s.results_dir, picked[1].spec, "test")
    verdict = tune.verify_choice(s, log=print)
    assert verdict["ok"] and not verdict["fallback"], verdict
    assert tune_files.read_choice(s.results_dir) == picked[1].spec
