"""`rocky-selftest tune`: budget, resume after a kill, ranking and repeats, the atomic choice and
the fall back to the built-in tiles.

FAKE llama-bench: the tuner's logic is about time (which run to start, what the budget allows,
what survives a kill), and no spec-capable llama-bench runs here (the board's t/s cannot be had
anywhere but on the board). So llama-bench is a script that sleeps, prints the t/s a plan gives
each spec, and prints ggml-vulkan's tile line, or, as an injected fault, its rejection line. It
is the timing source only: the KLD check runs the real path, and with no llama-perplexity here
it fails, which is itself the "KLD fails -> built-in tiles" case. The run with real binaries is
tests/selftest/test_selftest_tune_real.py (lavapipe, skip-gated on ROCKY_LLAMA_BIN_DIR).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rocky_selftest import tune, tune_files
from rocky_selftest.settings import load_settings
from rocky_selftest.tune_spec import ENV_VAR

from tests.helpers import project
from tests.helpers.fake_tuner import _setup
from tests.helpers.selftest import write_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("ROCKY_FAKE_PLAN", raising=False)
    monkeypatch.delenv("ROCKY_FAKE_CALLS", raising=False)
    yield
    for key in ("ROCKY_FAKE_PLAN", "ROCKY_FAKE_CALLS"):
        os.environ.pop(key, None)


def _calls(env: dict) -> list[str]:
    return env["calls"].read_text().splitlines()


def _progress(env: dict) -> dict:
    return json.loads((env["results"] / tune_files.PROGRESS_NAME).read_text())


def test_every_candidate_once_top3_repeated_ranked_by_median(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0, 25.0, 12.0, 29.0, 18.0])
    s = load_settings(str(env["config"]))
    summary = tune.Tuner(s, log=lambda _: None).run()
    calls = _calls(env)
    runs = {c.spec: calls.count(c.spec) for c in env["cands"]}
    specs = [c.spec for c in env["cands"]]
    # top 3 by t/s: 31 (1), 29 (4), 25 (2): three runs each, the rest one
    assert [runs[specs[i]] for i in range(6)] == [1, 3, 3, 1, 3, 1]
    rows = {r["name"]: r for r in summary["candidates"]}
    assert rows[env["cands"][1].name]["tps"] == [31.0, 31.0, 31.0]
    assert all(r["status"] == "ok" for r in rows.values())
    # no llama-perplexity here: the KLD check fails for all three, the built-in (4th) is not in
    # the top 3, so nothing is chosen and llama.cpp keeps the built-in tiles
    assert summary["winner"] is None and summary["phase"] == "done"
    assert all(
        "KLD check did not run" in rows[env["cands"][i].name]["validation"]["evidence"]
        for i in (1, 2, 4)
    )
    assert not (env["results"] / tune_files.ENV_NAME).exists()


def test_kld_failure_falls_back_to_the_builtin_and_removes_an_old_choice(tmp_path):
    env = _setup(tmp_path, [30.0, 35.0, 10.0, 11.0, 12.0, 13.0])
    old = tune_files.write_choice(str(env["results"]), env["cands"][3].spec, "an old tune")
    s = load_settings(str(env["config"]))
    summary = tune.Tuner(s, log=lambda _: None).run()
    assert summary["winner"] == "builtin"  # the faster one failed the KLD check
    assert not os.path.exists(old)


def test_rejected_spec_is_never_chosen_however_fast(tmp_path):
    env = _setup(tmp_path, [20.0, 99.0, 25.0, 12.0], n=4)
    env["plan"][env["cands"][1].spec]["reject"] = "int_k: BLOCK_SIZE % WARP == 0"
    env["plan_file"].write_text(json.dumps(env["plan"]))
    s = load_settings(str(env["config"]))
    summary = tune.Tuner(s, log=lambda _: None).run()
    row = next(r for r in summary["candidates"] if r["name"] == env["cands"][1].name)
    assert (
        row["status"] == "failed" and "rejected by ggml-vulkan: int_k: BLOCK_SIZE" in row["reason"]
    )
    assert _calls(env).count(env["cands"][1].spec) == 1  # not repeated either
    assert summary["winner"] == "builtin"


def test_budget_stops_starting_runs_and_still_decides(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0, 25.0, 12.0, 29.0, 18.0], sleep=0.6, tune_budget_s=2)
    s = load_settings(str(env["config"]))
    t0 = time.monotonic()
    summary = tune.Tuner(s, log=lambda _: None).run()
    took = time.monotonic() - t0
    calls = _calls(env)
    # a run (>= 0.6 s) starts only while more than the longest run so far (and 1 s) is left:
    # the first at 2 s left, a second at <= 1.4 s, a third only if both were very short
    assert 1 <= len(calls) <= 3, calls
    assert summary["budget_exhausted"] and summary["phase"] == "done"
    assert summary["elapsed_s"] <= 2 + _progress(env)["longest_run_s"]
    assert took < 10
    assert sum(r["status"] == "not run" for r in summary["candidates"]) >= 4


def _tune_cmd(env: dict) -> list[str]:
    return [sys.executable, "-m", "rocky_selftest", "--config", str(env["config"]), "tune"]


def test_sigkill_mid_tune_resumes_without_rerunning_done_candidates(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0, 25.0, 12.0, 29.0, 18.0], sleep=0.6)
    proc = subprocess.Popen(
        _tune_cmd(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        prog = env["results"] / tune_files.PROGRESS_NAME
        if prog.exists() and sum(bool(r["tps"]) for r in _progress(env)["results"].values()) >= 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its llama-bench, mid-run
    proc.wait()
    done_before = [n for n, r in _progress(env)["results"].items() if r["tps"]]
    assert len(done_before) >= 2 and _progress(env)["phase"] == "sweep"
    # nothing half-written: no temp files, no choice yet
    leftovers = [p.name for p in env["results"].iterdir() if p.name.startswith(".")]
    assert leftovers == [] or all(".tune-progress.json." in n for n in leftovers)
    assert not (env["results"] / tune_files.ENV_NAME).exists()
    before = len(_calls(env))

    again = subprocess.run(_tune_cmd(env), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    calls = _calls(env)[before:]
    by_name = {c.name: c.spec for c in env["cands"]}
    for name in done_before:  # sweep runs are not repeated; only top-3 repeats add runs
        assert calls.count(by_name[name]) <= 2
    final = _progress(env)
    assert final["phase"] == "done"
    assert all(r["tps"] for r in final["results"].values())
    assert final["elapsed_s"] > sum(0.6 for _ in done_before)  # the time before the kill counts


def test_a_candidate_interrupted_twice_is_given_up(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0])
    s = load_settings(str(env["config"]))
    t = tune.Tuner(s, log=lambda _: None)
    t.result(env["cands"][1].name)["in_flight"] = tune.MAX_IN_FLIGHT  # two resets in its run
    t.save()
    summary = tune.Tuner(s, log=lambda _: None).run()
    row = next(r for r in summary["candidates"] if r["name"] == env["cands"][1].name)
    assert row["status"] == "failed" and "interrupted 2 times" in row["reason"]
    assert env["cands"][1].spec not in _calls(env)


def test_choice_file_is_atomic_strict_and_readable(tmp_path):
    rd = str(tmp_path)
    spec = project.candidates()[3].spec
    path = tune_files.write_choice(rd, spec, "tuned\nrm -rf /")
    text = Path(path).read_text()
    assert text.splitlines() == ["# tuned?rm -rf /", f"{ENV_VAR}={spec}"]
    assert tune_files.read_choice(rd, project.builtin_tiles()) == spec
    assert os.listdir(rd) == [tune_files.ENV_NAME]
    with pytest.raises(ValueError):
        tune_files.write_choice(rd, spec + "\nLD_PRELOAD=/tmp/x.so", "")
    Path(path).write_text(f"{ENV_VAR}={spec}\nLD_PRELOAD=/tmp/x.so\n")
    with pytest.raises(tune_files.TuneFileError, match="expected one"):
        tune_files.read_choice(rd)


def test_verify_removes_a_choice_ggml_now_rejects(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0])
    spec = env["cands"][1].spec
    tune_files.write_choice(str(env["results"]), spec, "tuned earlier")
    env["plan"][spec]["reject"] = "int: shared memory 40960 B <= 32768 B"
    env["plan_file"].write_text(json.dumps(env["plan"]))
    done = subprocess.run(_tune_cmd(env) + ["--verify"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout
    assert "rejected by ggml-vulkan: int: shared memory" in done.stdout
    assert not (env["results"] / tune_files.ENV_NAME).exists()


def test_verify_removes_a_damaged_choice_file(tmp_path):
    env = _setup(tmp_path, [20.0])
    (env["results"] / tune_files.ENV_NAME).write_text(f"{ENV_VAR}=int=1,2\n")
    done = subprocess.run(_tune_cmd(env) + ["--verify"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "removed, the built-in tiles are used" in done.stdout
    assert not (env["results"] / tune_files.ENV_NAME).exists()
    assert _calls(env) == []  # a broken file is not even run


def test_first_boot_tunes_only_when_configured_and_after_a_pass(tmp_path):
    env = _setup(tmp_path, [20.0], tune_at_first_boot=False)
    off = subprocess.run(_tune_cmd(env) + ["--first-boot"], capture_output=True, text=True)
    assert off.returncode == 0 and "tune_at_first_boot is off" in off.stdout
    cfg = json.loads(env["config"].read_text()) | {"tune_at_first_boot": True}
    env["config"].write_text(json.dumps(cfg))
    no_pass = subprocess.run(_tune_cmd(env) + ["--first-boot"], capture_output=True, text=True)
    assert no_pass.returncode == 0 and "verdict is none, not PASS" in no_pass.stdout
    assert _calls(env) == []


def test_tune_section_lands_in_result_json(tmp_path):
    from rocky_selftest.outcome import base_doc
    from rocky_selftest.results import read_result, write_result

    env = _setup(tmp_path, [20.0, 31.0, 25.0], n=3)
    passed = {"name": "sweep", "status": "PASS", "evidence": "a run"}  # no PASS without one
    write_result(
        str(env["results"]), base_doc("PASS", "2026-12-03T00:00:00Z") | {"checks": [passed]}
    )
    done = subprocess.run(_tune_cmd(env), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = read_result(str(env["results"]))
    assert doc["verdict"] == "PASS"
    rows = doc["tune"]["candidates"]
    assert [r["median_tps"] for r in rows] == [20.0, 31.0, 25.0]
    assert doc["tune"]["budget_s"] == 1200


@pytest.mark.parametrize(
    ("key", "value"),
    [("tune_at_first_boot", "yes"), ("tune_budget_s", -1), ("tune_budget_s", True)],
)
def test_hostile_tune_settings_are_refused(tmp_path, key, value):
    from rocky_selftest.settings import SettingsError

    path = write_config(tmp_path / "c.json", model_path="/m", **{key: value})
    with pytest.raises(SettingsError, match=key):
        load_settings(str(path))


def test_damaged_progress_is_a_fresh_start_not_a_crash(tmp_path):
    env = _setup(tmp_path, [20.0, 31.0], n=2)
    s = load_settings(str(env["config"]))
    tune.Tuner(s, log=lambda _: None).run()
    prog = _progress(env)
    prog["results"][env["cands"][0].name]["tps"] = ["fast"]
    (env["results"] / tune_files.PROGRESS_NAME).write_text(json.dumps(prog))
    summary = tune.Tuner(s, log=lambda _: None).run()  # starts over: both run again
    assert summary["phase"] == "done"
    assert _calls(env).count(env["cands"][0].spec) == 2 * 3  # twice a sweep run + 2 repeats
