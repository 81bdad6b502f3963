"""The self-test never loses its verdict (issue 11, item 4).

llama-bench cannot be made to print malformed numbers, and a run cannot be made to die at a chosen
step, on demand: a fake `llama-bench` (a shell script, fault injection only) prints the JSON or
hangs where a test needs it. The disk faults are real where this machine allows: a read-only bind
mount and a tiny tmpfs that is really full (root with mount rights); otherwise a read-only
directory by permissions, and for a full disk a fake write that raises ENOSPC (said in the test).
Processes are really killed (SIGKILL, SIGTERM) in the middle of a run.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rocky_selftest import results as results_mod
from rocky_selftest.bench import parse_bench_json
from rocky_selftest.cli import main
from rocky_selftest.results import write_result

from tests.helpers.project import ROOT
from tests.helpers.selftest import (
    GOOD_ENTRY,
    OLD_PASS,
    SERVER_STEPS,
    STACK,
    bench_config,
    fake_bench,
    old_pass,
    printing,
    read_only,
    strict_json,
)

pytestmark = pytest.mark.timeout(120)


# ---- malformed and non-finite numbers -------------------------------------------------------

MALFORMED = {
    "samples_ts string": ({"samples_ts": ["a"]}, "samples_ts[0]"),
    "n_gpu_layers string": ({"n_gpu_layers": "lots"}, "n_gpu_layers"),
    "avg_ts NaN": ({"avg_ts": float("nan")}, "avg_ts"),
    "avg_ts Infinity": ({"avg_ts": float("inf")}, "avg_ts"),
    "avg_ts string": ({"avg_ts": "12"}, "avg_ts"),
    "avg_ts bool": ({"avg_ts": True}, "avg_ts"),
    "avg_ts zero": ({"avg_ts": 0}, "avg_ts"),
    "avg_ts negative": ({"avg_ts": -3.0}, "avg_ts"),
    "samples_ts NaN": ({"samples_ts": [1.0, float("nan")]}, "samples_ts[1]"),
    "samples_ts not a list": ({"samples_ts": 5}, "samples_ts"),
    "n_ubatch float": ({"n_ubatch": 1.5}, "n_ubatch"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_bench_numbers_are_a_failed_run_with_a_saved_verdict(tmp_path, capsys, case):
    change, key = MALFORMED[case]
    # json.dumps writes NaN/Infinity as llama-bench's JSON would carry them: bare tokens.
    bin_dir = printing(tmp_path, json.dumps([{**GOOD_ENTRY, **change}]))
    cfg = bench_config(tmp_path, bin_dir, tmp_path / "results")
    rc = main(["--config", str(cfg), "run"])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert rc == 1
    doc = strict_json((tmp_path / "results/result.json").read_text())
    assert doc["verdict"] == "FAIL"
    (run,) = doc["sweep"]
    assert run["status"] == "FAIL" and key in run["reason"], run
    assert "avg_ts" not in run  # no number from a malformed entry is kept
    assert "rocky-selftest FAIL" in out.out


def test_a_well_formed_entry_still_passes(tmp_path):
    # The same path with nothing wrong: the checks above fail for the right reason.
    bin_dir = printing(tmp_path, json.dumps([GOOD_ENTRY]))
    cfg = bench_config(tmp_path, bin_dir, tmp_path / "results")
    assert main(["--config", str(cfg), "run"]) == 0
    doc = strict_json((tmp_path / "results/result.json").read_text())
    assert doc["verdict"] == "PASS" and doc["sweep"][0]["avg_ts"] == 123.5


def test_lowercase_nan_from_printf_is_invalid_json_not_a_pass():
    entry, reason = parse_bench_json('[{"avg_ts": nan, "samples_ts": [nan]}]')
    assert entry is None and "invalid JSON" in reason


def test_nan_is_never_written_even_if_one_slips_into_the_document(tmp_path):
    doc = {**OLD_PASS, "ratio": {"ratio": float("nan"), "runs": [{"avg_ts": float("inf")}]}}
    write_result(str(tmp_path), doc)
    saved = strict_json((tmp_path / "result.json").read_text())
    assert saved["verdict"] == "ERROR"
    assert saved["ratio"]["ratio"] is None and saved["ratio"]["runs"][0]["avg_ts"] is None
    assert "ratio.ratio" in saved["errors"][0] and "ratio.runs[0].avg_ts" in saved["errors"][0]


# ---- disk faults -----------------------------------------------------------------------------


def _can_mount() -> bool:
    return (
        os.geteuid() == 0
        and subprocess.run(["which", "mount"], capture_output=True).returncode == 0
    )


@pytest.fixture
def read_only_results(tmp_path):
    """A results dir holding an old PASS, made read-only (tests.helpers.selftest.read_only)."""
    results = tmp_path / "results"
    old_pass(results)
    with read_only(results) as how:
        if not how:
            pytest.skip("cannot make a directory read-only here (no bind mount as root)")
        yield results


def test_read_only_results_dir_gives_a_visible_error_never_the_old_pass(
    tmp_path, capsys, read_only_results
):
    results = read_only_results
    bin_dir = printing(tmp_path, json.dumps([GOOD_ENTRY]))
    cfg = bench_config(tmp_path, bin_dir, results)
    notes, console, stamp = tmp_path / "run", tmp_path / "console", tmp_path / "stamp"
    notes.mkdir()
    rc = main(["--config", str(cfg), "run", "--note-dir", str(notes), "--stamp", str(stamp)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert rc == 3
    assert "rocky-selftest ERROR" in out.out
    assert "cannot write" in out.out and ("Read-only" in out.out or "Permission" in out.out)
    assert "result NOT saved" in out.out
    assert not stamp.exists()  # no verdict on disk: the next boot tries again
    # The root step (as on the board: ExecStopPost=+) shows the run's ERROR, not the old PASS.
    assert main(["--config", str(cfg), "publish", "--note-dir", str(notes),
                 "--console", str(console)]) == 0  # fmt: skip
    shown = console.read_text()
    assert shown.startswith("rocky-selftest ERROR") and "PASS" not in shown.splitlines()[0]
    assert "rocky-selftest ERROR" in (tmp_path / "motd").read_text()
    # `status` prefers the run's note to the older file it could not replace.
    assert main(["--config", str(cfg), "status", "--note-dir", str(notes)]) == 3
    assert "result.json on disk is older" in capsys.readouterr().out


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs: a disk that really fills up. Skips where mounting is not allowed."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(mnt: Path) -> None:
    """Write until the file system says ENOSPC."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_full_disk_before_the_run_error_verdict_and_the_old_pass_is_gone(tmp_path, capsys, tiny_fs):
    results = tiny_fs / "results"
    old_pass(results)
    fill(tiny_fs)
    calls = tmp_path / "calls"
    bin_dir = fake_bench(tmp_path, f"echo run >> {calls}; cat {tmp_path}/none")
    cfg = bench_config(tmp_path, bin_dir, results)
    rc = main(["--config", str(cfg), "run", "--note-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert rc == 3 and "rocky-selftest ERROR" in out.out
    assert not calls.exists()  # nothing run when its result could not be kept
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR"
    assert any("No space left on device" in e for e in doc["errors"]), doc["errors"]
    assert not [p for p in results.iterdir() if p.name.startswith(".")]  # no temp file left


def test_disk_fills_during_the_run_the_verdict_says_error_with_the_checks(
    tmp_path, capsys, tiny_fs
):
    # The fake llama-bench fills the disk, then prints a good entry: the run passes, the save
    # hits a really full disk.
    payload = tmp_path / "bench.json"
    payload.write_text(json.dumps([GOOD_ENTRY]))
    filler = tiny_fs / "filler"
    bin_dir = fake_bench(tmp_path, f"dd if=/dev/zero of={filler} bs=4k 2>/dev/null; cat {payload}")
    results = tiny_fs / "results"
    old_pass(results)
    cfg = bench_config(tmp_path, bin_dir, results)
    rc = main(["--config", str(cfg), "run"])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert rc == 3
    assert "PASS sweep" in out.out  # the checks' own outcome is still shown
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR"
    assert "No space left on device" in doc["errors"][-1]
    assert "the checks' verdict was PASS" in doc["errors"][-1]
    assert [c["status"] for c in doc["checks"] if c["name"] == "sweep"] == ["PASS"]


def test_full_disk_fake_when_nothing_can_be_written_no_stale_pass_remains(
    tmp_path, capsys, monkeypatch
):
    """FAKE: every write raises ENOSPC (what a full disk does to write(2)); unlinking still
    works, as on a real full disk. Runs where the tmpfs test cannot mount."""
    results = tmp_path / "results"
    old_pass(results)

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results_mod, "_write_all", no_space)
    cfg = bench_config(tmp_path, printing(tmp_path, json.dumps([GOOD_ENTRY])), results)
    stamp = tmp_path / "stamp"
    rc = main(["--config", str(cfg), "run", "--stamp", str(stamp)])
    out = capsys.readouterr().out
    assert rc == 3 and "rocky-selftest ERROR" in out and "No space left" in out
    assert not (results / "result.json").exists()  # the old PASS is gone, not left standing
    assert not stamp.exists()
    assert not [p for p in results.iterdir() if p.name.startswith(".")]


# ---- kills in the middle of a run ------------------------------------------------------------


def _start_run(tmp: Path, results: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    started = tmp / "bench-started"
    bin_dir = fake_bench(tmp, f"echo $$ > {started}; exec sleep 60")
    cfg = bench_config(tmp, bin_dir, results, run_timeout_s=120)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocky_selftest", "--config", str(cfg), "run", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists() or not started.read_text().strip():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the fake llama-bench never started"
        time.sleep(0.05)
    return proc, cfg


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_kill_mid_run_leaves_in_progress_not_the_old_pass_and_no_stamp(tmp_path, capsys):
    results = tmp_path / "results"
    old_pass(results)
    stamp = results / "first-boot.stamp"
    notes = tmp_path / "run"
    notes.mkdir()
    proc, cfg = _start_run(tmp_path, results, "--stamp", str(stamp), "--note-dir", str(notes))
    during = strict_json((results / "result.json").read_text())
    assert during["verdict"] == "IN-PROGRESS" and during["step"] == "sweep"
    assert not stamp.exists()  # no verdict yet: the stamp must not be set
    os.killpg(proc.pid, signal.SIGKILL)  # the board resets, or systemd kills the unit
    proc.wait()
    after = strict_json((results / "result.json").read_text())  # complete, not cut off
    assert after["verdict"] == "IN-PROGRESS"
    assert main(["--config", str(cfg), "status", "--note-dir", str(notes)]) == 1
    assert "IN-PROGRESS" in capsys.readouterr().out
    # systemd then runs the root step, telling it how the run ended.
    env = {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL",
           "INVOCATION_ID": "0123"}  # fmt: skip
    console = tmp_path / "console"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        main(["--config", str(cfg), "publish", "--note-dir", str(notes), "--stamp", str(stamp),
              "--console", str(console)])  # fmt: skip
    shown = console.read_text()
    assert shown.startswith("rocky-selftest ERROR")
    assert "stopped in step 'sweep'" in shown and "'signal', killed KILL" in shown
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR" and stamp.read_text().startswith("ERROR ")
    assert "rocky-selftest ERROR" in (tmp_path / "motd").read_text()


def test_after_a_reset_mid_run_the_next_boot_reports_it_instead_of_looping(tmp_path, capsys):
    results = tmp_path / "results"
    stamp = results / "first-boot.stamp"
    proc, cfg = _start_run(tmp_path, results, "--stamp", str(stamp))
    os.killpg(proc.pid, signal.SIGKILL)  # a GPU hang resets the board: no root step ran
    proc.wait()
    (tmp_path / "bench-started").unlink()
    rc = main(["--config", str(cfg), "run", "--stamp", str(stamp)])  # the next boot
    out = capsys.readouterr().out
    assert rc == 3 and "interrupted" in out and "'sweep'" in out
    assert not (tmp_path / "bench-started").exists()  # not run again
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR" and stamp.exists()


def test_sigterm_mid_run_saves_an_error_verdict_and_kills_the_tool(tmp_path):
    results = tmp_path / "results"
    old_pass(results)
    proc, _ = _start_run(tmp_path, results)
    bench_pid = int((tmp_path / "bench-started").read_text())
    proc.send_signal(signal.SIGTERM)  # systemd's stop, or TimeoutStartSec
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, out + err
    assert "Traceback" not in err
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR"
    assert doc["errors"] == ["stopped by SIGTERM during step 'sweep'"]
    assert not _alive(bench_pid)


WRITER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from rocky_selftest.results import write_result
docs = [json.loads(open(p).read()) for p in sys.argv[3:]]
i = 0
while True:
    write_result(sys.argv[1], docs[i % 2])
    i += 1
"""


def test_kill_during_the_write_leaves_the_old_or_the_new_file_complete(tmp_path):
    """Atomic replace (temp file, fsync, rename in the same dir) under SIGKILL at random
    moments: result.json always parses and is one of the two documents."""
    docs = []
    for n in range(2):
        doc = {**OLD_PASS, "verdict": ["PASS", "FAIL"][n], "pad": [str(n) * 100] * 5000}
        path = tmp_path / f"doc{n}.json"
        path.write_text(json.dumps(doc))
        docs.append(doc)
    results = tmp_path / "results"
    write_result(str(results), docs[0])
    for i in range(15):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(results), str(ROOT / "tools"),
             str(tmp_path / "doc0.json"), str(tmp_path / "doc1.json")]
        )  # fmt: skip
        time.sleep(0.05 + (i % 5) * 0.03)
        proc.kill()
        proc.wait()
        assert strict_json((results / "result.json").read_text()) in docs
    results_mod.remove_stale_temps(str(results / "result.json"))
    assert [p.name for p in results.iterdir()] == ["result.json"]


# ---- the run step never started, or broke -----------------------------------------------------


def test_unit_that_failed_to_start_shows_error_not_an_older_pass(tmp_path, monkeypatch):
    results = tmp_path / "results"
    old_pass(results)
    cfg = bench_config(tmp_path, tmp_path / "nobin", results)
    notes = tmp_path / "run"
    notes.mkdir()  # systemd made the runtime dir; the run step never ran (216/GROUP)
    for key, value in {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited",
                       "EXIT_STATUS": "216", "INVOCATION_ID": "abc"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    console = tmp_path / "console"
    main(["--config", str(cfg), "publish", "--note-dir", str(notes), "--console", str(console)])
    shown = console.read_text()
    assert shown.startswith("rocky-selftest ERROR") and "GROUP" in shown
    assert "older result.json (PASS" in shown
    doc = strict_json((results / "result.json").read_text())
    assert doc["verdict"] == "ERROR"


def test_broken_config_still_gives_an_error_verdict_through_the_root_step(tmp_path, capsys):
    results = tmp_path / "results"
    old_pass(results)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    notes = tmp_path / "run"
    notes.mkdir()
    paths = ["--results-dir", str(results), "--motd", str(tmp_path / "motd")]
    assert main(["--config", str(bad), "run", "--note-dir", str(notes), *paths]) == 2
    # The run saves its ERROR itself (a by-hand run has no root step after it).
    assert strict_json((results / "result.json").read_text())["verdict"] == "ERROR"
    console = tmp_path / "console"
    main(["--config", str(bad), "publish", "--note-dir", str(notes), "--console", str(console),
          "--results-dir", str(results), "--motd", str(tmp_path / "motd")])  # fmt: skip
    assert "Traceback" not in capsys.readouterr().err
    assert console.read_text().startswith("rocky-selftest ERROR")
    assert "cannot read JSON config" in console.read_text()
    assert strict_json((results / "result.json").read_text())["verdict"] == "ERROR"


def test_a_check_that_raises_is_an_error_line_and_the_others_still_run(
    tmp_path, capsys, monkeypatch
):
    """FAKE: a bug is injected into one check (it raises); nothing real raises on demand."""
    from rocky_selftest import sequence

    def boom(_s):
        raise OSError(errno.EIO, "Input/output error", "/usr/share/rocky-models/m.gguf")

    monkeypatch.setattr(sequence, "check_model", boom)
    bin_dir = printing(tmp_path, json.dumps([GOOD_ENTRY]))
    cfg = bench_config(tmp_path, bin_dir, tmp_path / "results", skip_checks=[*STACK, "ratio",
                 "output_match", *SERVER_STEPS])  # fmt: skip
    assert main(["--config", str(cfg), "run"]) == 3
    doc = strict_json((tmp_path / "results/result.json").read_text())
    status = {c["name"]: c for c in doc["checks"]}
    assert doc["verdict"] == "ERROR"
    assert status["model_sha256"]["status"] == "ERROR"
    assert "Input/output error" in status["model_sha256"]["evidence"]
    assert status["sweep"]["status"] == "PASS"


def test_root_step_replaces_control_characters_from_the_note(tmp_path):
    notes = tmp_path / "run"
    notes.mkdir()
    evil = "x\x1b]0;owned\x07\r\n"
    doc = {**OLD_PASS, "verdict": "FAIL", "result_saved": True,
           "checks": [{"name": "sweep", "status": "FAIL", "evidence": evil}]}  # fmt: skip
    (notes / "verdict.json").write_text(json.dumps(doc))
    console = tmp_path / "console"
    cfg = bench_config(tmp_path, tmp_path / "nobin", tmp_path / "results")
    main(["--config", str(cfg), "publish", "--note-dir", str(notes), "--console", str(console)])
    text = console.read_text() + (tmp_path / "motd").read_text()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "x?]0;owned???" in text


@pytest.mark.parametrize(
    "note",
    [
        '{"schema": "rocky-selftest-result", "verdict": "PASS", "checks": [1, 2]}',
        '{"schema": "rocky-selftest-result", "verdict": "PASS", "errors": [{"x": 1}]}',
        '{"schema": "rocky-selftest-result", "verdict": "GREAT"}',
        "[1, 2, 3]",
        "not json at all",
    ],
)
def test_root_step_ignores_a_malformed_note_and_reports_an_error(tmp_path, note):
    notes = tmp_path / "run"
    notes.mkdir()
    (notes / "verdict.json").write_text(note)
    console = tmp_path / "console"
    cfg = bench_config(tmp_path, tmp_path / "nobin", tmp_path / "results")
    assert main(["--config", str(cfg), "publish", "--note-dir", str(notes),
                 "--console", str(console)]) == 0  # fmt: skip
    assert console.read_text().startswith("rocky-selftest ERROR")


def test_root_step_does_not_follow_a_symlinked_note(tmp_path):
    # The unprivileged step owns the runtime dir: a link there must not make root read elsewhere.
    notes = tmp_path / "run"
    notes.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({**OLD_PASS, "result_saved": True}))
    (notes / "verdict.json").symlink_to(elsewhere)
    console = tmp_path / "console"
    cfg = bench_config(tmp_path, tmp_path / "nobin", tmp_path / "results")
    main(["--config", str(cfg), "publish", "--note-dir", str(notes), "--console", str(console)])
    assert console.read_text().startswith("rocky-selftest ERROR")


STOPPER = """
import signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from rocky_selftest.runner import run_tool

class Stopped(BaseException):
    pass

def stop(signum, frame):
    raise Stopped()

class DescheduledPopen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        time.sleep(2)  # the parent loses the CPU right after the fork, as on a loaded board

subprocess.Popen = DescheduledPopen
signal.signal(signal.SIGTERM, stop)
try:
    run_tool(["sh", "-c", sys.argv[2]], {}, 60)
except Stopped:
    print("stopped")
"""


def test_a_stop_while_the_tool_is_being_started_still_kills_it(tmp_path):
    # Fault injection (CI hit this race once under load): the tool signals the self-test while
    # the parent is still inside Popen, before run_tool's `try` knows the child.
    pid_file = tmp_path / "pid"
    body = f"echo $$ > {pid_file}; kill -TERM $PPID; exec sleep 60"
    done = subprocess.run(
        [sys.executable, "-c", STOPPER, str(ROOT / "tools"), body],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "stopped", done.stdout + done.stderr
    assert not _alive(int(pid_file.read_text()))
