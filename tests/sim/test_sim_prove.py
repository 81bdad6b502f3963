"""`rocky-vulkan sim prove` (rocky_vulkan.sim.prove): the orchestration around real builds.

Fast tests cover the result parsing, the claim checks, the table and the argument errors. The
whole proof (Debian root, two Mesa builds, a llama.cpp Vulkan build, sweeps: about an hour on two
cores) is the slow test at the end; it runs only with -m slow and these set:
  ROCKY_MESA_GIT   a git dir holding the Mesa tree (e.g. the leegao/mesa-26.2 snapshot)
  ROCKY_GGML_GIT   a ggml-org/ggml git dir holding f76511eb
  ROCKY_SIM_PROVE_CACHE  the cache dir to build in (it may be warm)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.errors import UserError
from rocky_vulkan.sim import prove
from rocky_vulkan.sim.prove import (
    INSTRUMENTATION,
    Claim,
    ProveArgs,
    Runner,
    UbRun,
    check_args,
    check_claims,
    claims_table,
    parse_ub_run,
    read_sweep,
    stages_table,
    ub_table,
)


def _printf(fmt: str, *values: float) -> str:
    """The C format string from the instrumentation patch, filled in like fprintf would."""
    return fmt.replace('%" PRIu64 "', "%d") % values


def _patch_format(prefix: str) -> str:
    """The fprintf format of the instrumentation patch line that starts with `prefix`."""
    text = INSTRUMENTATION.read_text()
    m = re.search(r'fprintf\(stderr, "(' + re.escape(prefix) + r'[^\n]*?)\\n"', text)
    assert m, f"no fprintf of {prefix!r} in {INSTRUMENTATION.name}"
    return m.group(1)


def _stock_stderr(peak: float, refused: list[float]) -> str:
    """stderr of a failing stock run, from the instrumentation's own format strings plus the
    exception text libstdc++ prints for an uncaught vk::OutOfDeviceMemoryError."""
    exhausted = _patch_format("panvk-privva: priv heap exhausted")
    lines = [_printf(_patch_format("panvk-privva: peak"), 2048.0, 100.0, 40)]
    lines += [_printf(exhausted, x) for x in refused]
    lines += [
        "terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'",
        "  what():  vk::CommandBuffer::end: ErrorOutOfDeviceMemory",
        _printf(_patch_format("panvk-privva: peak"), peak, 3000.0, 900),
    ]
    return "\n".join(lines) + "\n"


def _ok(ub: int, peak: float) -> UbRun:
    return UbRun(ub, 0, peak, "", [])


def _oom(ub: int, peak: float) -> UbRun:
    return UbRun(ub, 134, peak, "vk::CommandBuffer::end: ErrorOutOfDeviceMemory", [19.0])


GOOD_STOCK = [_ok(64, 2681.4)] + [_oom(u, 3900.0) for u in (128, 256, 512, 1024)]
GOOD_PATCHED = [_ok(64, 212.0)] + [_ok(u, 704.1) for u in (128, 256, 512, 1024)]
GOOD_SPILLS = ({"stock": 604, "patched": 604}, {"stock": 7, "patched": 7})


def test_parse_ub_run_reads_the_instrumentation_lines():
    run = parse_ub_run(512, 134, _stock_stderr(3935.1, [19.0, 9.5]))
    assert run.peak_mib == 3935.1  # the largest of the peak lines, not the first
    assert run.error == "vk::CommandBuffer::end: ErrorOutOfDeviceMemory"
    assert run.first_exhausted_mib == [19.0, 9.5]


def test_parse_ub_run_without_instrumentation():
    run = parse_ub_run(64, 0, "llama_model_loader: loaded\n")
    assert run.peak_mib is None and run.error == "" and run.first_exhausted_mib == []


def test_read_sweep_marks_missing_ubs(tmp_path: Path):
    (tmp_path / "summary.tsv").write_text(
        "ub\texit\tpeak_priv_va_mib\terror\n64\t0\t212.0\t\n128\t134\t3878.1\twhat(): x\n"
    )
    (tmp_path / "ub64.stderr").write_text(_printf(_patch_format("panvk-privva: peak"), 212, 1, 2))
    (tmp_path / "ub128.stderr").write_text(_stock_stderr(3878.1, [304.0]))
    runs = read_sweep(tmp_path, (64, 128, 256))
    assert [(r.ub, r.exit_code, r.peak_mib) for r in runs] == [
        (64, 0, 212.0),
        (128, 134, 3878.1),
        (256, -1, None),
    ]
    assert runs[1].first_exhausted_mib == [304.0]
    assert runs[2].error == "not run"


def test_claims_pass_on_the_recorded_numbers():
    claims = check_claims(GOOD_STOCK, GOOD_PATCHED, *GOOD_SPILLS)
    assert len(claims) == 6
    assert all(c.ok for c in claims), claims_table(claims)


@pytest.mark.parametrize(
    ("what", "stock", "patched", "spills", "failing"),
    [
        # stock passing at ub 128 is not the reference crash
        (
            "stock passes 128",
            [_ok(64, 2681.4), _ok(128, 3500.0)] + GOOD_STOCK[2:],
            GOOD_PATCHED,
            GOOD_SPILLS,
            {0, 1},
        ),
        # a crash other than ErrorOutOfDeviceMemory is not the claim
        (
            "other error",
            GOOD_STOCK[:4] + [UbRun(1024, 134, 3900.0, "double free detected", [])],
            GOOD_PATCHED,
            GOOD_SPILLS,
            {0},
        ),
        ("stock peak low", [_ok(64, 1.0)] + [_oom(128, 2000.0)], GOOD_PATCHED, GOOD_SPILLS, {1}),
        ("patched fails", GOOD_STOCK, GOOD_PATCHED[:4] + [_oom(1024, 700.0)], GOOD_SPILLS, {2}),
        ("patched peak high", GOOD_STOCK, GOOD_PATCHED + [_ok(2048, 900.0)], GOOD_SPILLS, {3}),
        ("no spills", GOOD_STOCK, GOOD_PATCHED, ({"stock": None}, {"stock": 7}), {4}),
        ("mali spills", GOOD_STOCK, GOOD_PATCHED, ({"stock": 604}, {"stock": 300}), {4}),
    ],
)
def test_claims_fail_where_the_numbers_differ(what, stock, patched, spills, failing):
    claims = check_claims(stock, patched, *spills)
    assert {i for i, c in enumerate(claims) if not c.ok} == failing, what


def test_claims_fail_when_nothing_ran():
    not_run = [UbRun(u, -1, None, "not run", []) for u in prove.UBS]
    claims = check_claims(not_run, not_run, {}, {})
    assert claims and not any(c.ok for c in claims)


def test_tables_show_results_and_refused_allocations():
    text = ub_table(GOOD_STOCK, GOOD_PATCHED)
    assert "| 128 | 134, 3900.0 MiB, heap refused 19.0 MiB | 0, 704.1 MiB |" in text
    claims = [Claim("a", "x", "y", True), Claim("b", "x", "z", False)]
    text = claims_table(claims)
    assert "| a | x | y | PASS |" in text and "| b | x | z | FAIL |" in text


def test_runner_times_stages_and_records_a_failure(tmp_path: Path):
    runner = Runner(tmp_path, log=lambda _msg: None)
    runner.stage("one", lambda: "note")

    def boom() -> None:
        raise UserError("broke")

    with pytest.raises(UserError, match="broke"):
        runner.stage("two", boom)
    saved = json.loads((tmp_path / "stages.json").read_text())
    assert [(s["name"], s["ok"], s["note"]) for s in saved] == [
        ("one", True, "note"),
        ("two", False, "broke"),
    ]
    table = stages_table(runner.stages, 12.0)
    assert "| two |" in table and "FAILED" in table and "| whole command | 12 |" in table


def test_runner_lanes_run_side_by_side_and_raise_failures(tmp_path: Path):
    runner = Runner(tmp_path, log=lambda _msg: None)
    both = threading.Barrier(2, timeout=10)  # only passes if both lanes run at once
    runner.lanes([("a", lambda: str(both.wait()))], [("b", lambda: str(both.wait()))])
    assert sorted(s.name for s in runner.stages) == ["a", "b"]

    def fail() -> None:
        raise UserError("lane b broke")

    with pytest.raises(UserError, match="lane b broke"):
        runner.lanes([("c", lambda: time.sleep(0.1))], [("d", fail)])
    assert {s.name: s.ok for s in runner.stages}["c"] is True


def _git_repo(tmp_path: Path) -> tuple[Path, str]:
    work = tmp_path / "repo"
    work.mkdir()
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    run = lambda *a: subprocess.run(  # noqa: E731
        ["git", *a], cwd=work, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    run("init", "-q")
    (work / "f").write_text("x")
    run("add", "f")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return work / ".git", run("rev-parse", "HEAD")


def _args(tmp_path: Path, **kw) -> ProveArgs:
    base = dict(
        mesa_git=tmp_path / "mesa",
        mesa_commit=prove.DEFAULT_MESA_COMMIT,
        ggml_git=tmp_path / "ggml",
        cache=tmp_path / "cache",
        out=tmp_path / "out",
    )
    return ProveArgs(**{**base, **kw})


@pytest.mark.needs_root  # the input checks come after the root check
def test_check_args_names_each_missing_input(tmp_path: Path):
    with pytest.raises(UserError, match="--mesa-git is missing.*leegao/mesa-26.2"):
        check_args(_args(tmp_path, mesa_git=None))
    with pytest.raises(UserError, match="no such directory.*No Mesa tarball"):
        check_args(_args(tmp_path))
    git, head = _git_repo(tmp_path)
    with pytest.raises(UserError, match=f"has no commit {prove.DEFAULT_MESA_COMMIT}"):
        check_args(_args(tmp_path, mesa_git=git))
    with pytest.raises(UserError, match="is not a git commit id"):
        check_args(_args(tmp_path, mesa_git=git, mesa_commit="HEAD; rm -rf /"))
    with pytest.raises(UserError, match="--ggml-git is missing.*f76511eb"):
        check_args(_args(tmp_path, mesa_git=git, mesa_commit=head, ggml_git=None))
    with pytest.raises(UserError, match="has no commit f76511eb"):
        check_args(_args(tmp_path, mesa_git=git, mesa_commit=head, ggml_git=git))


def test_check_args_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A fake euid: the tests may run as root, and the message for non-root users must still work.
    monkeypatch.setattr(prove.os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root"):
        check_args(_args(tmp_path))


def test_cli_reports_bad_arguments_without_building(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("ROCKY_MESA_GIT", raising=False)
    monkeypatch.setenv("ROCKY_CACHE", str(tmp_path / "cache"))
    assert main(["sim", "prove", "--ubs", "64,x"]) == 2
    assert "--ubs '64,x': want comma-separated integers" in capsys.readouterr().err
    if os.geteuid() == 0:
        assert main(["sim", "prove", "--ggml-git", str(tmp_path)]) == 2
        assert "--mesa-git is missing" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_existing_sim_subcommands_still_registered(capsys):
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    out = capsys.readouterr().out
    for name in ("setup", "versions", "run", "sweep", "stats", "build-llama", "prove"):
        assert name in out


@pytest.mark.slow
@pytest.mark.needs_sim_prove_sources
def test_prove_end_to_end(tmp_path: Path):
    mesa, ggml = os.environ["ROCKY_MESA_GIT"], os.environ["ROCKY_GGML_GIT"]
    cache = os.environ["ROCKY_SIM_PROVE_CACHE"]
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "rocky_vulkan.cli", "sim", "prove", "--mesa-git", mesa,
         "--ggml-git", ggml, "--cache", cache, "--out", str(out)],
        capture_output=True, text=True, timeout=4 * 3600, check=False,
    )  # fmt: skip
    report = json.loads((out / "prove.json").read_text())
    failed = [c for c in report["claims"] if not c["ok"]]
    assert proc.returncode == 0 and not failed, proc.stdout + proc.stderr[-3000:]
