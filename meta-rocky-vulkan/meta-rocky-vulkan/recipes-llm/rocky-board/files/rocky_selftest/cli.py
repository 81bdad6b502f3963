"""`rocky-selftest run|publish|status`: the first-boot self-test, its root-only publishing step
and a look at its last result (and `tune`, `driver`: on demand).

On the board the unit runs `run` as the unprivileged system user rocky-selftest (User=, GPU
groups only) and then, as its ExecStopPost=+, `publish` as root: motd and console need root,
nothing else does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from dataclasses import replace
from typing import Any

from . import outcome
from .lock import EXIT_BUSY, Busy, RunLock
from .outcome import (
    Progress,
    clear_note,
    error_doc,
    interrupted_doc,
    now,
    peek_result,
    read_note,
    save_verdict,
    write_note,
)
from .publish import busy_run_step, printable, settle
from .results import (
    ERROR,
    IN_PROGRESS,
    PASS,
    os_error_text,
    read_result,
    remove_stale_temps,
    result_path,
    summary_lines,
    update_motd,
    write_atomic,
)
from .runner import STOP_SIGNALS
from .sequence import CHECK_ORDER, run_selftest
from .settings import DEFAULT_CONFIG, Settings, SettingsError, fallback_paths, load_settings
from .terminal import say

__all__ = ["CHECK_ORDER", "main"]

EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_CODES = {PASS: 0, "FAIL": EXIT_FAIL, ERROR: EXIT_ERROR}
CONFIG_FIX = "fix the config (rendered from rocky-vulkan.yaml), then run `rocky-selftest run`"


class Stopped(BaseException):
    """A stop signal arrived (systemd's stop or timeout, Ctrl-C, a closed terminal, ...): end
    with an ERROR verdict naming it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


class StopSignals:
    """`with StopSignals() as stop:` every stop signal raises Stopped, once: a second one (Ctrl-C
    pressed again) must not cut short the verdict the first one started; neither may one that
    arrives after `stop.ending()`, while the finished run's verdict is written."""

    def __init__(self) -> None:
        self.done = False  # from here on a stop signal is ignored
        self.fired = False
        self.old: dict[int, Any] = {}

    def _handler(self, signum: int, _frame: object) -> None:
        if not self.done:
            self.done = self.fired = True
            raise Stopped(signum)

    def ending(self) -> None:
        self.done = True

    def __enter__(self) -> StopSignals:
        self.old = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self.old.items():
            # After a stop the process ends with the verdict that signal started: a late one
            # is ignored (SIG_IGN: Python resets its own handlers to the default at exit).
            signal.signal(sig, signal.SIG_IGN if self.fired else previous)


def _settings(args: argparse.Namespace) -> Settings:
    s = load_settings(args.config)
    overrides = {
        key: getattr(args, key)
        for key in ("sysroot", "results_dir", "motd_path")
        if getattr(args, key, None) is not None
    }
    return replace(s, **overrides)


def _paths(args: argparse.Namespace) -> tuple[Settings | None, str, str | None, str | None]:
    """(settings, results_dir, motd_path, why the config cannot be used). With a broken config
    the verdict still goes where it is looked for: the command line's paths, else the config's
    own where sound, else the board's."""
    try:
        s = _settings(args)
        return s, s.results_dir, s.motd_path, None
    except SettingsError as err:
        results, motd = fallback_paths(args.config)
        if args.results_dir is not None:
            results = args.results_dir
        if args.motd_path is not None:
            motd = args.motd_path
        return None, results, motd, f"config: {err}; {CONFIG_FIX}"


def _note_dir(args: argparse.Namespace) -> str:
    """The runtime dir (tmpfs) for the run's final words: given, or the unit's own."""
    return args.note_dir if args.note_dir is not None else outcome.DEFAULT_NOTE_DIR


def show(lines: list[str], motd_path: str | None, console: str | None) -> None:
    """The short verdict on stdout (the journal), in the motd and on the console."""
    lines = printable(lines)
    say("\n".join(lines))
    if motd_path:
        try:
            update_motd(motd_path, lines)
        except OSError as err:
            say(f"rocky-selftest: cannot update {motd_path}: {os_error_text(err)}")
        except ValueError as err:  # files.UnreadableFile: a FIFO, a device, not text
            say(f"rocky-selftest: cannot update the motd: {err}")
    if console:
        try:
            with open(console, "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
        except OSError as err:
            say(f"rocky-selftest: cannot write to {console}: {os_error_text(err)}")


def _stamp(path: str | None, doc: dict[str, Any]) -> None:
    """The first-boot stamp, only once a verdict is on disk: a run that could not save one is
    tried again at the next boot."""
    if not path or not doc.get("result_saved"):
        return
    try:
        write_atomic(path, f"{doc['verdict']} {doc.get('finished_at', now())}\n".encode())
    except OSError as err:
        say(f"rocky-selftest: cannot write the stamp {path}: {os_error_text(err)}")


class _Run:
    """One `rocky-selftest run`: the paths it writes, its lock and its progress marker."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = now()
        self.s, self.results_dir, self.motd, self.config_problem = _paths(args)
        self.note_dir = _note_dir(args)
        self.lock = RunLock(self.results_dir)
        self.progress = Progress(self.results_dir, self.started, log=say)

    def checks(self) -> dict[str, Any]:
        """The run's document: the checks' verdict, or an ERROR naming why none was possible."""
        if self.config_problem:
            return error_doc(self.config_problem, self.started)
        s, args = self.s, self.args
        remove_stale_temps(result_path(s.results_dir))
        if args.stamp:
            previous = peek_result(s.results_dir)
            if previous and previous["verdict"] == IN_PROGRESS:
                # The last first-boot run never ended (reset, hang, kill: it holds no lock any
                # more): report it, don't loop.
                return interrupted_doc(previous)
        try:
            self.progress.start()  # replaces the old result: no stale verdict can outlive this
        except OSError as err:
            return error_doc(
                f"cannot write {result_path(s.results_dir)}: {os_error_text(err)}; nothing was "
                "run. Free space or make the directory writable, then run `rocky-selftest run`",
                self.started,
            )
        try:
            return run_selftest(s, progress=self.progress.step, started=self.started)
        except Exception as err:  # a bug: still a verdict, and the traceback in the journal
            say(traceback.format_exc(), sys.stderr)
            return error_doc(
                f"internal error in step {self.progress.current!r}: {err!r}", self.started
            )

    def stopped(self, stop: Stopped) -> dict[str, Any]:
        return error_doc(f"stopped by {stop} during step {self.progress.current!r}", self.started)

    def finish(self, doc: dict[str, Any]) -> int:
        doc = save_verdict(self.results_dir, doc)
        if self.args.note_dir is not None or not doc.get("result_saved"):
            # The unit's root step reads every note; by hand, `status` needs one only when the
            # disk did not take the verdict (the older result.json there must not stand).
            write_note(self.note_dir, doc, log=say)
        show(summary_lines(doc), self.motd, self.args.console)
        if doc.get("result_saved"):
            say(f"rocky-selftest: wrote {doc['result_path']}")
        _stamp(self.args.stamp, doc)
        if self.config_problem:
            return EXIT_USAGE
        return EXIT_CODES.get(doc["verdict"], EXIT_ERROR)


def cmd_run(args: argparse.Namespace) -> int:
    """Every check, under the lock; every way it ends (a verdict, a broken config, a stop
    signal, a bug) is a verdict saved and shown, and another run in progress is left alone."""
    with StopSignals() as stop:
        run = None
        try:
            run = _Run(args)
            run.lock.acquire()
            clear_note(run.note_dir)
            doc = run.checks()
            stop.ending()
            return run.finish(doc)
        except Busy as busy:
            say(f"rocky-selftest: {busy}")
            return EXIT_BUSY
        except Stopped as sig:
            if run is None or not run.lock.taken:  # nothing of this run is on disk to replace
                say(f"rocky-selftest: stopped by {sig} before the run started; nothing changed")
                return EXIT_ERROR
            return run.finish(run.stopped(sig))
        finally:
            if run is not None:
                run.lock.release()


def cmd_publish(args: argparse.Namespace) -> int:
    _, results_dir, motd, problem = _paths(args)
    if problem:
        say(f"rocky-selftest: {problem}")
    if busy_run_step(os.environ):
        say(
            "rocky-selftest: the run step found another run in progress and changed nothing; "
            "the first-boot self-test runs again at the next boot"
        )
        return 0
    try:
        with RunLock(results_dir):
            doc = settle(results_dir, args.note_dir)
            show(summary_lines(doc), motd, args.console)
            _stamp(args.stamp, doc)
    except Busy as busy:
        say(f"rocky-selftest publish: {busy}; its verdict is shown when it ends")
        return EXIT_BUSY
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    s, results_dir, _, problem = _paths(args)
    if problem:
        # Any run now would end here: no older verdict stands for the board as it is.
        say("\n".join(printable([f"rocky-selftest ERROR ({now()})", f"  ERROR {problem}"])))
        return EXIT_USAGE
    note_dir = _note_dir(args)
    note = read_note(note_dir)
    unsaved = note is not None and note.get("result_saved") is False
    if unsaved and note.get("result_path") == result_path(results_dir):
        # The last run's verdict never reached the disk: what is there is older than it.
        say("\n".join(printable(summary_lines(note))))
        say(f"  (from {note_dir}; result.json on disk is older than this run)")
        return EXIT_CODES.get(note["verdict"], EXIT_ERROR)
    try:
        doc = read_result(results_dir)
    except ValueError as err:
        say(f"rocky-selftest: {err}; run `rocky-selftest run` for a new result")
        return EXIT_FAIL
    if doc is None:
        say(f"rocky-selftest: no result yet in {results_dir}; run `rocky-selftest run`")
        return EXIT_USAGE
    say("\n".join(printable(summary_lines(doc))))
    return 0 if doc["verdict"] == PASS else EXIT_FAIL


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune (or re-check) the matmul tiles; the choice goes to tuned-tiles.env. Under the run
    lock: a tune and a self-test run never share the GPU or write result.json together."""
    from . import tune

    s = _settings(args)
    if args.budget is not None:
        s = replace(s, tune_budget_s=args.budget)
    try:
        with StopSignals(), RunLock(s.results_dir):
            why_not = _first_boot_gate(s) if args.first_boot else None
            if why_not:
                say(f"rocky-selftest tune: {why_not}")
                return 0
            if args.verify:
                section = {"verify": tune.verify_choice(s, log=say), "checked_at": now()}
                tune.record_in_result(s.results_dir, {**(_old_tune(s) or {}), **section}, say)
                return 0 if section["verify"]["ok"] else EXIT_FAIL
            if args.restart:
                tune.restart(s)
            summary = tune.Tuner(s, log=say).run()
            tune.record_in_result(s.results_dir, summary, say)
    except Busy as busy:  # the first-boot tune has no stamp then: it runs at the next boot
        say(f"rocky-selftest tune: {busy}")
        return EXIT_BUSY
    except Stopped as stop:
        say(f"rocky-selftest tune: stopped by {stop}; `rocky-selftest tune` resumes it")
        return EXIT_ERROR
    except (tune.TuneFileError, OSError) as err:
        say(f"rocky-selftest tune: {err}")
        return EXIT_ERROR
    if args.stamp and summary["phase"] == "done":
        try:
            write_atomic(args.stamp, f"{summary['winner'] or 'builtin'} {now()}\n".encode())
        except OSError as err:  # the next boot then looks again; the choice itself is saved
            say(f"rocky-selftest tune: cannot write the stamp {args.stamp}: {os_error_text(err)}")
    return 0


def cmd_cts(args: argparse.Namespace) -> int:
    """A subset of dEQP-VK within a budget (cts.py); under the run lock like tune."""
    from . import cts

    s = _settings(args)
    patterns = tuple(args.case) if args.case else s.cts_cases
    budget = args.budget if args.budget is not None else s.cts_budget_s
    chunk = args.chunk if args.chunk is not None else s.cts_chunk_cases
    if budget < 1 or chunk < 1:
        say("rocky-selftest cts: --budget and --chunk must be at least 1")
        return EXIT_USAGE
    try:
        with StopSignals(), RunLock(s.results_dir):
            section = cts.run_cts(s, patterns, budget, chunk, log=say)
            cts.record(s.results_dir, section, say)
    except Busy as busy:
        say(f"rocky-selftest cts: {busy}")
        return EXIT_BUSY
    except Stopped as stop:
        say(f"rocky-selftest cts: stopped by {stop}; nothing recorded")
        return EXIT_ERROR
    except (cts.CtsError, OSError) as err:
        say(f"rocky-selftest cts: {err}")
        return EXIT_ERROR
    say("\n".join(printable(cts.summary_lines(section))))
    return {"PASS": 0, "FAIL": EXIT_FAIL}.get(section["verdict"], EXIT_ERROR)


def cmd_driver(args: argparse.Namespace) -> int:
    """rocky-vkcheck (the panvk patches' conformance check) within a budget; its section goes
    to driver.json and into result.json, whose verdict it leaves alone (driver.py)."""
    from . import driver

    s = _settings(args)
    binary = args.binary or s.tool(driver.TOOL)
    try:
        with StopSignals(), RunLock(s.results_dir):
            section = driver.run_driver_check(binary, s.env, args.budget, now())
            say("\n".join(printable(driver.summary_lines(section))))
            saved = driver.record(s.results_dir, section, say)
    except Busy as busy:
        say(f"rocky-selftest driver: {busy}")
        return EXIT_BUSY
    except Stopped as stop:
        say(f"rocky-selftest driver: stopped by {stop}; nothing recorded")
        return EXIT_ERROR
    code = EXIT_CODES.get(section["status"], EXIT_ERROR)
    return code if saved or code else EXIT_ERROR


def _first_boot_gate(s: Settings) -> str | None:
    """Why the first-boot tune does nothing, or None when it tunes."""
    if not s.tune_at_first_boot:
        return "tune_at_first_boot is off in the config; nothing to do"
    doc = peek_result(s.results_dir)
    verdict = doc.get("verdict") if doc else "none"
    if verdict != PASS:
        return f"the self-test verdict is {verdict}, not PASS: not tuning"
    return None


def _old_tune(s: Settings) -> dict[str, Any] | None:
    doc = peek_result(s.results_dir)
    return doc.get("tune") if doc else None


def _budget(text: str) -> int:
    if not text.isdigit() or not 10 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds 10..3600")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocky-selftest", description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="default: %(default)s")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run every check and write the result (exit 0 PASS, 1 FAIL, 2 config unusable, "
        f"3 ERROR, {EXIT_BUSY} another run in progress)",
    )
    publish = sub.add_parser(
        "publish", help="root step: show the last run's verdict on console, motd and journal"
    )
    status = sub.add_parser("status", help="print the last result's verdict")
    tune = sub.add_parser(
        "tune",
        help="measure the shipped tile candidates, keep the fastest that passes the KLD check",
    )
    tune.add_argument("--first-boot", action="store_true", help="only if the config says so")
    tune.add_argument("--stamp", help="written once the tune is done")
    tune.add_argument("--budget", type=int, help="seconds of runs in all (default: the config)")
    tune.add_argument("--restart", action="store_true", help="forget earlier progress")
    tune.add_argument(
        "--verify",
        action="store_true",
        help="re-check the tuned spec (accepted, KLD); on failure fall back to the built-in tiles",
    )
    cts = sub.add_parser(
        "cts",
        help="run a subset of dEQP-VK (Vulkan's conformance tests, kas/vulkan-cts.yml) within "
        "a time budget (exit 0 PASS, 1 FAIL, 3 ERROR)",
    )
    cts.add_argument(
        "--case",
        action="append",
        metavar="PATTERN",
        help="a dEQP-VK case pattern, e.g. 'dEQP-VK.compute.*' (repeatable; default: the config)",
    )
    cts.add_argument("--budget", type=int, help="seconds of runs in all (default: the config)")
    cts.add_argument("--chunk", type=int, help="cases per deqp-vk process (default: the config)")
    driver = sub.add_parser(
        "driver",
        help="run rocky-vkcheck, the panvk patches' conformance check; its result goes to "
        f"driver.json and result.json (exit 0 PASS, 1 FAIL, 3 ERROR, {EXIT_BUSY} busy)",
    )
    driver.add_argument(
        "--budget",
        type=_budget,
        default=300,
        help="seconds it may take in all, 10..3600 (default %(default)s)",
    )
    driver.add_argument("--binary", help="the rocky-vkcheck to run (default: in bin_dir)")
    for p in (run, publish):
        p.add_argument("--stamp", help="first-boot stamp, written once a verdict is saved")
        p.add_argument("--console", help="also write the short verdict here, e.g. /dev/console")
    default = f"(default for run and status: {outcome.DEFAULT_NOTE_DIR})"
    for p in (run, publish, status):
        p.add_argument(
            "--note-dir",
            dest="note_dir",
            help="runtime dir (tmpfs) where `run` leaves its verdict for `publish` and `status`, "
            f"also when the results disk refuses it {default}",
        )
    for p in (run, publish, status, tune, cts, driver):
        p.add_argument("--sysroot", help="root for sysfs/dev/firmware checks (tests)")
        p.add_argument("--results-dir", dest="results_dir", help="where result.json goes")
        p.add_argument("--motd", dest="motd_path", help="motd file to update ('' = none)")
    run.set_defaults(func=cmd_run)
    publish.set_defaults(func=cmd_publish)
    status.set_defaults(func=cmd_status)
    tune.set_defaults(func=cmd_tune)
    cts.set_defaults(func=cmd_cts)
    driver.set_defaults(func=cmd_driver)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as err:  # tune; run, publish and status show it as their verdict
        say(f"rocky-selftest: {err}", sys.stderr)
        return EXIT_USAGE
