"""A tuner run with a FAKE llama-bench (a script that sleeps and prints the t/s a plan gives each
spec): the bin dir, the candidates, the plan and the config. Why a fake: the docstring of
tests/selftest/test_selftest_tune.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rocky_selftest.tune_spec import ENV_VAR
from rocky_vulkan.tiles import prune as tiles_prune
from rocky_vulkan.tiles import space as tilespace

from tests.helpers import project
from tests.helpers.selftest import write_config

FAKE_BENCH = f"""#!{sys.executable}
import json, os, sys, time
spec = os.environ.get("{ENV_VAR}", "")
plan = json.load(open(os.environ["ROCKY_FAKE_PLAN"]))
step = plan.get(spec, {{}})
with open(os.environ["ROCKY_FAKE_CALLS"], "a") as fh:
    fh.write(spec + "\\n")
time.sleep(step.get("sleep", plan.get("default_sleep", 0.05)))
if "reject" in step:
    print("ggml_vulkan: {ENV_VAR} spec rejected: " + step["reject"]
          + " broken (1 != 2); using the built-in Mali tiles", file=sys.stderr)
    print("ggml_vulkan: using Mali matmul warptiles ({ENV_VAR}=0 to disable)", file=sys.stderr)
else:
    print("ggml_vulkan: using Mali matmul warptiles (spec: " + spec + ") ({ENV_VAR}=0 to disable)",
          file=sys.stderr)
tps = step.get("tps", 20.0)
print(json.dumps([{{"avg_ts": tps, "samples_ts": [tps], "n_gpu_layers": 99, "n_ubatch": 512,
                   "devices": "Vulkan0", "gpu_info": "Mali-G610 MC4 (panvk)"}}]))
"""


def _setup(tmp_path: Path, tps: list[float], n: int = 6, sleep: float = 0.05, **cfg) -> dict:
    """Bin dir with the fake llama-bench, a candidate list of the first n real candidates (the
    built-in first), a plan giving candidate i tps[i], and a config."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    bench = bindir / "llama-bench"
    bench.write_text(FAKE_BENCH)
    bench.chmod(0o755)
    builtin = project.builtin_tiles()
    cands = tilespace.candidates(builtin)[:n]
    cand_file = tmp_path / "tile_candidates.json"
    tiles_prune.write_document(tiles_prune.document(cands, builtin, None, {}), cand_file)
    plan = {"default_sleep": sleep}
    plan.update({c.spec: {"tps": t} for c, t in zip(cands, tps, strict=False)})
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    results = tmp_path / "results"
    results.mkdir()
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    config = write_config(
        tmp_path / "config.json",
        model_path=str(model),
        bin_dir=str(bindir),
        results_dir=str(results),
        tune_candidates=str(cand_file),
        run_timeout_s=30,
        **cfg,
    )
    os.environ["ROCKY_FAKE_PLAN"] = str(plan_file)
    os.environ["ROCKY_FAKE_CALLS"] = str(calls)
    return {
        "cands": cands,
        "plan": plan,
        "plan_file": plan_file,
        "calls": calls,
        "results": results,
        "config": config,
        "builtin": builtin,
    }
