"""`rocky-vulkan tiles prune`: reading the simulated G610's pipeline statistics, judging each
candidate, and the shipped tile_candidates.json.

The logs below are ggml-vulkan's real output format (ggml_vk_create_pipeline with panvk's
statistic names, as recorded in docs/verification/sim.md and tests/sim/test_sim.py). The tile-spec
lines are the patch's (docs/dev/formats.md, "Tile spec"); text, not a run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rocky_selftest import tune_spec
from rocky_vulkan.tiles import CANDIDATES_PATH
from rocky_vulkan.tiles import prune as tiles_prune
from rocky_vulkan.tiles import space as tilespace

from tests.helpers import project

BUILTIN = project.candidates()[0]
OTHER = project.candidates()[5]


def _log(spec: str, q4k_spills: int, q6k_spills: int = 0) -> str:
    return f"""\
ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = Mali-G610 MC4 (panvk) | uma: 1 | fp16: 1 | warp size: 16 | int dot: 1
ggml_vulkan: using Mali matmul warptiles (spec: {spec}) ({tune_spec.ENV_VAR}=0 to disable)
ggml_vulkan: pipeline stats for matmul_q4_k_q8_1_l:
ggml_vulkan:   Spills: {q4k_spills}
ggml_vulkan:   Fills: 9
ggml_vulkan:   Registers used: 62
ggml_vulkan:   Threads: 1
ggml_vulkan:   Spill cost: 150
llama_model_loader: loaded meta data
ggml_vulkan: pipeline stats for matmul_q6_k_q8_1_l:
ggml_vulkan:   Spills: {q6k_spills}
ggml_vulkan:   Fills: 0
ggml_vulkan:   Registers used: 64
ggml_vulkan: pipeline stats for matmul_q4_k_q8_1_m:
ggml_vulkan:   Spills: 3
"""


def test_large_pipelines_only_and_their_numbers():
    pipes = tiles_prune.large_pipelines(_log(OTHER.spec, 6))
    assert set(pipes) == {"matmul_q4_k_q8_1_l", "matmul_q6_k_q8_1_l"}  # not the _m one
    assert pipes["matmul_q4_k_q8_1_l"] == {"registers": 62, "spills": 6, "fills": 9}


def test_judge_keeps_spill_free_and_drops_spilling():
    kept = tiles_prune.judge(OTHER, 0, _log(OTHER.spec, 0))
    assert kept["status"] == "kept" and kept["max_registers"] == 64
    spilled = tiles_prune.judge(OTHER, 0, _log(OTHER.spec, 6))
    assert spilled["status"] == "spills" and "6 spill" in spilled["reason"]
    assert tiles_prune.judge(OTHER, 0, _log(OTHER.spec, 6), max_spills=8)["status"] == "kept"


def test_judge_names_the_rejected_rule():
    log = (
        f"ggml_vulkan: {tune_spec.ENV_VAR} spec rejected: int_k: (BM/WM)*(BN/WN) == "
        "BLOCK_SIZE/WARP broken (8 != 16); using the built-in Mali tiles\n" + _log(BUILTIN.spec, 0)
    )
    rec = tiles_prune.judge(OTHER, 0, log)
    assert rec["status"] == "rejected"
    assert rec["reason"].endswith("int_k: (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP broken (8 != 16)")


def test_judge_refuses_runs_that_do_not_prove_the_spec_ran():
    # The built-in tiles ran, not the candidate: the info line names another spec.
    assert tiles_prune.judge(OTHER, 0, _log(BUILTIN.spec, 0))["status"] == "failed"
    old = f"ggml_vulkan: ignoring {tune_spec.ENV_VAR}=x (use 0 or force)\n" + _log(OTHER.spec, 0)
    assert "old patch" in tiles_prune.judge(OTHER, 0, old)["reason"]
    crashed = tiles_prune.judge(OTHER, 134, _log(OTHER.spec, 0) + "terminate called\n")
    assert crashed["status"] == "failed" and "exit 134" in crashed["reason"]
    no_stats = "ggml_vulkan: using Mali matmul warptiles (spec: " + OTHER.spec + ")\n"
    assert "no statistics" in tiles_prune.judge(OTHER, 0, no_stats)["reason"]


def test_prune_document_keeps_the_builtin_and_writes_atomically(tmp_path):
    cands = [BUILTIN, OTHER]
    logs = {BUILTIN.spec: _log(BUILTIN.spec, 6), OTHER.spec: _log(OTHER.spec, 0)}
    records = tiles_prune.prune(cands, lambda spec: (0, logs[spec]), log=lambda _: None)
    doc = tiles_prune.document(cands, project.builtin_tiles(), records, {"model": "m.gguf"})
    assert [e["kept"] for e in doc["candidates"]] == [True, True]
    assert doc["candidates"][0]["sim"]["status"] == "spills"  # kept anyway: the reference
    out = tmp_path / "tile_candidates.json"
    tiles_prune.write_document(doc, out)
    assert json.loads(out.read_text())["pruning"]["status"] == "pruned"
    assert [p.name for p in tmp_path.iterdir()] == ["tile_candidates.json"]  # no temp left


def test_shipped_list_matches_the_space_and_the_patch():
    doc = json.loads(CANDIDATES_PATH.read_text())
    assert doc["schema"] == tiles_prune.SCHEMA and doc["schema_version"] == 1
    builtin = project.builtin_tiles()
    assert doc["builtin"] == {k: list(v) for k, v in builtin.items()}
    space = {c.spec: c for c in tilespace.candidates(builtin)}
    assert doc["pruning"]["status"] in ("pruned", "unpruned")
    for entry in doc["candidates"]:
        assert entry["spec"] in space, entry["name"]
        tune_spec.check_spec(entry["spec"], builtin)
    if doc["pruning"]["status"] == "unpruned":
        assert [e["spec"] for e in doc["candidates"]] == list(space)
        assert all(e["kept"] for e in doc["candidates"])


def test_prune_command_names_a_missing_root(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    done = subprocess.run(
        [sys.executable, "-m", "rocky_vulkan.cli", "tiles", "prune", "--sim-root",
         str(tmp_path / "none"), "--llama-bench", "/opt/x/llama-bench", "--model", str(model),
         "--logs", str(tmp_path / "logs"), "--out", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "sim setup" in done.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_candidates_command_lists_the_space(fmt):
    argv = [sys.executable, "-m", "rocky_vulkan.cli", "tiles", "candidates"]
    done = subprocess.run(
        argv + (["--json"] if fmt == "json" else []), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    n = len(project.candidates())
    if fmt == "json":
        assert len(json.loads(done.stdout)) == n
    else:
        assert f"{n} candidates" in done.stdout and BUILTIN.spec in done.stdout


def _prune_panvk(tmp_path, root) -> tuple[int, str]:
    from rocky_vulkan.cli import main

    argv = ["tiles", "prune", "--panvk-root", str(root), "--model", "/work/model/m.gguf"]
    argv += ["--llama-bench", "/work/llama-x/bin/llama-bench", "--logs", str(tmp_path / "logs")]
    argv += ["--out", str(tmp_path / "out.json")]
    return main(argv)


def test_prune_in_a_panvk_root_without_a_driver_bundle_says_to_run_sim_prove(tmp_path, capsys):
    assert _prune_panvk(tmp_path, tmp_path / "root") != 0
    err = capsys.readouterr().err
    assert "no driver bundle 'patched'" in err and "sim prove" in err
    assert not (tmp_path / "out.json").exists()


def test_prune_in_a_panvk_root_needs_the_bench_and_model_inside_it(tmp_path, capsys):
    root = tmp_path / "root"
    (root / "work/drivers/patched").mkdir(parents=True)
    (root / "work/drivers/patched/panfrost_icd.json").write_text("{}")
    assert _prune_panvk(tmp_path, root) != 0
    assert "/work/llama-x/bin/llama-bench: not in" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
