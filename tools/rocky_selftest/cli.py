"""`rocky-selftest run|publish|status`: the first-boot self-test, its root-only publishing step
and a look at its last result.

On the board the unit runs `run` as the unprivileged system user rocky-selftest (User=, GPU
groups only) and then, as its ExecStopPost=+, `publish` as root: motd and console need root,
nothing else does.
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Any

from .outcome import (
    DEFAULT_NOTE_DIR,
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
from .publish import printable, settle
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
from .sequence import CHECK_ORDER, run_selftest
from .settings import DEFAULT_CONFIG, Settings, SettingsError, load_settings

__all__ = ["CHECK_ORDER", "main"]

EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_CODES = {PASS: 0, "FAIL": EXIT_FAIL, ERROR: EXIT_ERROR}


class Stopped(BaseException):
    """SIGTERM (systemd's stop or timeout) or SIGHUP arrived: end with an ERROR verdict."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _stop_signals_raise():
    def handler(signum, _frame):
        raise Stopped(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _settings(args: argparse.Namespace) -> Settings:
    s = load_settings(args.config)
    overrides = {
        key: getattr(args, key)
        for key in ("sysroot", "results_dir", "motd_path")
        if getattr(args, key, None) is not None
    }
    return replace(s, **overrides)


def show(lines: list[str], motd_path: str | None, console: str | None) -> None:
    """The short verdict on stdout (the journal), in the motd and on the console."""
    lines = printable(lines)
    _say("\n".join(lines))
    if motd_path:
        try:
            update_motd(motd_path, lines)
        except OSError as err:
            _say(f"rocky-selftest: cannot update {motd_path}: {os_error_text(err)}")
    if console:
        try:
            with open(console, "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
        except OSError as err:
            _say(f"rocky-selftest: cannot write to {console}: {os_error_text(err)}")


def _stamp(path: str | None, doc: dict[str, Any]) -> None:
    """The first-boot stamp, only once a verdict is on disk: a run that could not save one is
    tried again at the next boot."""
    if not path or not doc.get("result_saved"):
        return
    try:
        write_atomic(path, f"{doc['verdict']} {doc.get('finished_at', now())}\n".encode())
    except OSError as err:
        _say(f"rocky-selftest: cannot write the stamp {path}: {os_error_text(err)}")


def _finish(s: Settings, args: argparse.Namespace, doc: dict[str, Any]) -> int:
    doc = save_verdict(s.results_dir, doc)
    write_note(args.note_dir, doc, log=_say)
    show(summary_lines(doc), s.motd_path, args.console)
    if doc.get("result_saved"):
        _say(f"rocky-selftest: wrote {doc['result_path']}")
    _stamp(args.stamp, doc)
    return EXIT_CODES.get(doc["verdict"], EXIT_ERROR)


def cmd_run(args: argparse.Namespace) -> int:
    clear_note(args.note_dir)
    s = _settings(args)
    started = now()
    remove_stale_temps(result_path(s.results_dir))
    if args.stamp:
        previous = peek_result(s.results_dir)
        if previous and previous["verdict"] == IN_PROGRESS:
            # The last first-boot run never ended (reset, hang, kill): report it, don't loop.
            return _finish(s, args, interrupted_doc(previous))
    progress = Progress(s.results_dir, started, log=_say)
    try:
        progress.start()  # replaces the old result: no stale verdict can outlive this run
    except OSError as err:
        cause = (
            f"cannot write {result_path(s.results_dir)}: {os_error_text(err)}; nothing was run. "
            "Free space or make the directory writable, then run `rocky-selftest run`"
        )
        return _finish(s, args, error_doc(cause, started))
    try:
        with _stop_signals_raise():
            doc = run_selftest(s, progress=progress.step, started=started)
    except Stopped as stop:
        doc = error_doc(f"stopped by {stop} during step {progress.current!r}", started)
    except Exception as err:  # a bug: still a verdict, and the traceback in the journal
        traceback.print_exc()
        doc = error_doc(f"internal error in step {progress.current!r}: {err!r}", started)
    return _finish(s, args, doc)


def _fallback_paths(args: argparse.Namespace) -> tuple[str, str | None]:
    """results_dir and motd_path for `publish` even when the config is broken."""
    try:
        s = _settings(args)
        return s.results_dir, s.motd_path
    except SettingsError as err:
        _say(f"rocky-selftest: {err}; using the default paths")
        defaults = {f.name: f.default for f in fields(Settings)}
        results = args.results_dir if args.results_dir is not None else defaults["results_dir"]
        motd = args.motd_path if args.motd_path is not None else defaults["motd_path"]
        return results, motd


def cmd_publish(args: argparse.Namespace) -> int:
    results_dir, motd = _fallback_paths(args)
    doc = settle(results_dir, args.note_dir)
    show(summary_lines(doc), motd, args.console)
    _stamp(args.stamp, doc)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    s = _settings(args)
    note = read_note(args.note_dir)
    if note is not None and note.get("result_saved") is False:
        # The last run's verdict never reached the disk: what is there is older than it.
        _say("\n".join(printable(summary_lines(note))))
        _say(f"  (from {args.note_dir}; result.json on disk is older than this run)")
        return EXIT_CODES.get(note["verdict"], EXIT_ERROR)
    try:
        doc = read_result(s.results_dir)
    except ValueError as err:
        _say(f"rocky-selftest: {err}")
        return EXIT_FAIL
    if doc is None:
        _say(f"rocky-selftest: no result yet in {s.results_dir}; run `rocky-selftest run`")
        return EXIT_USAGE
    _say("\n".join(printable(summary_lines(doc))))
    return 0 if doc["verdict"] == PASS else EXIT_FAIL


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune (or re-check) the matmul tiles; the choice goes to tuned-tiles.env."""
    from . import tune

    s = _settings(args)
    if args.budget is not None:
        s = replace(s, tune_budget_s=args.budget)
    if args.first_boot:
        if not s.tune_at_first_boot:
            _say("rocky-selftest tune: tune_at_first_boot is off in the config; nothing to do")
            return 0
        doc = peek_result(s.results_dir)
        if not doc or doc.get("verdict") != PASS:
            verdict = doc.get("verdict") if doc else "none"
            _say(f"rocky-selftest tune: the self-test verdict is {verdict}, not PASS: not tuning")
            return 0
    try:
        with _stop_signals_raise():
            if args.verify:
                section = {"verify": tune.verify_choice(s, log=_say), "checked_at": now()}
                tune.record_in_result(s.results_dir, {**(_old_tune(s) or {}), **section}, _say)
                return 0 if section["verify"]["ok"] else EXIT_FAIL
            if args.restart:
                tune.restart(s)
            summary = tune.Tuner(s, log=_say).run()
    except Stopped as stop:
        _say(f"rocky-selftest tune: stopped by {stop}; `rocky-selftest tune` resumes it")
        return EXIT_ERROR
    except (tune.TuneFileError, OSError) as err:
        _say(f"rocky-selftest tune: {err}")
        return EXIT_ERROR
    tune.record_in_result(s.results_dir, summary, _say)
    if args.stamp and summary["phase"] == "done":
        try:
            write_atomic(args.stamp, f"{summary['winner'] or 'builtin'} {now()}\n".encode())
        except OSError as err:  # the next boot then looks again; the choice itself is saved
            _say(f"rocky-selftest tune: cannot write the stamp {args.stamp}: {os_error_text(err)}")
    return 0


def _old_tune(s: Settings) -> dict[str, Any] | None:
    doc = peek_result(s.results_dir)
    return doc.get("tune") if doc else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocky-selftest", description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="default: %(default)s")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run every check and write the result (exit 0 PASS, 1 FAIL, 3 ERROR)"
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
    for p in (run, publish):
        p.add_argument("--stamp", help="first-boot stamp, written once a verdict is saved")
        p.add_argument("--console", help="also write the short verdict here, e.g. /dev/console")
        p.add_argument(
            "--note-dir",
            dest="note_dir",
            help="runtime dir (tmpfs) where `run` leaves its verdict for `publish`",
        )
    status.add_argument(
        "--note-dir", dest="note_dir", default=DEFAULT_NOTE_DIR, help="default: %(default)s"
    )
    for p in (run, publish, status, tune):
        p.add_argument("--sysroot", help="root for sysfs/dev/firmware checks (tests)")
        p.add_argument("--results-dir", dest="results_dir", help="where result.json goes")
        p.add_argument("--motd", dest="motd_path", help="motd file to update ('' = none)")
    run.set_defaults(func=cmd_run)
    publish.set_defaults(func=cmd_publish)
    status.set_defaults(func=cmd_status)
    tune.set_defaults(func=cmd_tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as err:
        print(f"rocky-selftest: {err}", file=sys.stderr)
        if args.command == "run":
            # The root step shows this as the verdict (the results dir is unknown here).
            doc = error_doc(f"config: {err}") | {"result_saved": False}
            write_note(getattr(args, "note_dir", None), doc, log=_say)
        return EXIT_USAGE
