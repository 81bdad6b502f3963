"""`rocky-vulkan report` shows the tile tuning: t/s per candidate, registers/spills, 28.1 marked.

The tune section comes from a real `rocky-selftest tune` run whose llama-bench is the fake timing
source of tests/helpers/fake_tuner.py (the t/s are test inputs, not measurements)."""

from __future__ import annotations

import json
import subprocess
import sys

from rocky_selftest.outcome import base_doc
from rocky_selftest.results import write_result
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.host.result_doc import checked
from rocky_vulkan.tiles.report import sim_by_spec, tune_rows

from tests.helpers.fake_tuner import _setup
from tests.helpers.project import ROOT

REF = load_config(ROOT / "rocky-vulkan.yaml").selftest.reference


def _tuned_result(tmp_path, tps):
    env = _setup(tmp_path, tps, n=len(tps))
    # A PASS with its passing check: the tuner records only into a result the self-test writes.
    passed = [{"name": "sweep", "status": "PASS", "evidence": "a run"}]
    doc = base_doc("PASS", "2026-12-03T00:00:00Z") | {"checks": passed, "finished_at": "x"}
    write_result(str(env["results"]), doc)
    cmd = [sys.executable, "-m", "rocky_selftest", "--config", str(env["config"]), "tune"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return env["results"] / "result.json", env


def test_rows_fastest_first_with_the_reference_in_place(tmp_path):
    path, env = _tuned_result(tmp_path, [27.0, 31.5, 12.0, 29.0])
    tune = checked(json.loads(path.read_text()))["tune"]
    rows = tune_rows(tune, REF, sim_by_spec())
    names = [r[0] for r in rows]
    ref_at = names.index("reference (hand-picked tile)")
    assert [r[1] for r in rows][: ref_at + 2] == ["31.50", "29.00", "28.1", "27.00"]
    assert rows[ref_at][-1] == "ref"
    # the built-in (candidate 0, 27 t/s) is chosen: the faster two failed the KLD check (no
    # llama-perplexity here)
    assert names[ref_at + 1] == "builtin (built-in) * chosen"
    # the shipped list is pruned: registers and spills/fills as measured on the simulated G610
    sims = sim_by_spec()
    top = sims[next(c["spec"] for c in tune["candidates"] if rows[0][0].startswith(c["name"]))]
    pipes = top["sim"]["pipelines"].values()
    assert rows[0][3] == str(max(p["registers"] for p in pipes))
    assert rows[0][4] == f"{sum(p['spills'] for p in pipes)}/{sum(p['fills'] for p in pipes)}"
    # an unpruned list: the register count is the estimate, spills unknown
    bare = {spec: {k: v for k, v in e.items() if k != "sim"} for spec, e in sims.items()}
    est = tune_rows(tune, REF, bare)
    assert est[0][3].endswith("(est.)") and est[0][4] == "not pruned"
    assert all(r[2] == "3" for r in rows[:2])  # the top 3 were repeated


def test_report_prints_the_tuning_table_and_plot(tmp_path, capsys, monkeypatch):
    path, _ = _tuned_result(tmp_path, [27.0, 31.5, 12.0])
    monkeypatch.setenv("COLUMNS", "200")
    main(["--config", str(ROOT / "rocky-vulkan.yaml"), "report", str(path)])
    out = capsys.readouterr().out
    assert "tile tuning (done" in out and "reference (hand-picked tile)" in out
    png = path.with_name("result-tune.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_tune_section_is_a_problem_not_a_crash():
    doc = base_doc("PASS", "x") | {"checks": [], "tune": {"candidates": [{"tps": ["fast"]}]}}
    clean = checked(doc)
    assert any("tune.candidates[0].tps[0]" in p for p in clean["problems"])
    assert clean["tune"]["candidates"][0]["runs"] == 0
