"""`rocky-selftest run|status`: the first-boot self-test and a look at its last result."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from typing import Any

from . import RESULT_SCHEMA, RESULT_SCHEMA_VERSION
from .bench import Deadline, ratio, sweep
from .checks import FAIL, PASS, SKIP, Check, failed
from .match import output_match
from .results import read_result, summary_lines, update_motd, write_atomic, write_result
from .settings import DEFAULT_CONFIG, Settings, SettingsError, load_settings
from .stack import (
    check_firmware,
    check_gpu_driver,
    check_model,
    check_no_vendor_driver,
    check_vulkan_device,
)

CHECK_ORDER = (
    "gpu_driver",
    "csf_firmware",
    "no_vendor_driver",
    "vulkan_device",
    "model_sha256",
    "sweep",
    "ratio",
    "output_match",
)
EXIT_FAIL = 1
EXIT_USAGE = 2


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _say(text: str) -> None:
    print(text, flush=True)


def run_selftest(s: Settings) -> dict[str, Any]:
    """Every check in order; returns the result document (not yet written)."""
    started, t0 = _now(), time.monotonic()
    deadline = Deadline(s.deadline_s)
    skip = set(s.skip_checks)
    checks: list[Check] = []
    doc: dict[str, Any] = {}

    def record(check: Check) -> None:
        checks.append(check)
        _say(f"{check.status:4} {check.name}: {check.evidence}")

    def skipped(name: str) -> bool:
        if name in skip:
            record(Check(name, SKIP, "left out by skip_checks in the config"))
        return name in skip

    if not skipped("gpu_driver"):
        record(check_gpu_driver(s))
    if not skipped("csf_firmware"):
        bound = any(c.name == "gpu_driver" and c.status == PASS for c in checks)
        record(check_firmware(s, driver_bound=bound))
    if not skipped("no_vendor_driver"):
        record(check_no_vendor_driver(s))
    if not skipped("vulkan_device"):
        record(check_vulkan_device(s))
    if not skipped("model_sha256"):
        record(check_model(s))
    model_there = os.path.isfile(s.model_path)
    for name, step in (("sweep", sweep), ("ratio", ratio), ("output_match", output_match)):
        if skipped(name):
            continue
        if not model_there:
            record(failed(name, f"not run: model {s.model_path} is missing"))
            continue
        _say(f"---- {name}")
        check, data = step(s, deadline, log=_say)
        doc[name] = data
        record(check)
    verdict = PASS if checks and all(c.status in (PASS, SKIP) for c in checks) else FAIL
    doc.update(
        schema=RESULT_SCHEMA,
        schema_version=RESULT_SCHEMA_VERSION,
        verdict=verdict,
        started_at=started,
        finished_at=_now(),
        duration_s=round(time.monotonic() - t0, 1),
        host={
            "hostname": platform.node(),
            "kernel": platform.release(),
            "arch": platform.machine(),
        },
        thresholds={
            "tuned_vs_stock_ratio": s.tuned_vs_stock_ratio,
            "ratio_tolerance": s.ratio_tolerance,
            "match_tokens": s.match_tokens,
            "prompt_tokens": s.prompt_tokens,
            "repetitions": s.repetitions,
            "ubatch_sizes": list(s.ubatch_sizes),
        },
        model={"path": s.model_path, "sha256": s.model_sha256},
        checks=[c.to_json() for c in checks],
    )
    return doc


def _settings(args: argparse.Namespace) -> Settings:
    s = load_settings(args.config)
    overrides = {
        key: getattr(args, key)
        for key in ("sysroot", "results_dir", "motd_path")
        if getattr(args, key, None) is not None
    }
    return replace(s, **overrides)


def cmd_run(args: argparse.Namespace) -> int:
    s = _settings(args)
    if args.stamp:
        # Stamp first: if the GPU hangs the board, the next boot must not run this again.
        write_atomic(args.stamp, f"started {_now()}\n".encode())
    doc = run_selftest(s)
    doc["result_path"] = os.path.join(s.results_dir, "result.json")
    path = write_result(s.results_dir, doc)
    lines = summary_lines(doc)
    _say("\n".join(lines))
    if s.motd_path:
        try:
            update_motd(s.motd_path, lines)
        except OSError as err:
            _say(f"rocky-selftest: cannot update {s.motd_path}: {err}")
    if args.console:
        # Only the short verdict goes to the serial console; the details are in the journal.
        try:
            with open(args.console, "w", encoding="utf-8") as console:
                console.write("\n".join(lines) + "\n")
        except OSError as err:
            _say(f"rocky-selftest: cannot write to {args.console}: {err}")
    _say(f"rocky-selftest: wrote {path}")
    return 0 if doc["verdict"] == PASS else EXIT_FAIL


def cmd_status(args: argparse.Namespace) -> int:
    s = _settings(args)
    try:
        doc = read_result(s.results_dir)
    except ValueError as err:
        _say(f"rocky-selftest: {err}")
        return EXIT_FAIL
    if doc is None:
        _say(f"rocky-selftest: no result yet in {s.results_dir}; run `rocky-selftest run`")
        return EXIT_USAGE
    _say("\n".join(summary_lines(doc)))
    return 0 if doc["verdict"] == PASS else EXIT_FAIL


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocky-selftest", description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="default: %(default)s")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every check and write the result (exit 0 = all pass)")
    run.add_argument("--stamp", help="write this stamp file before starting (first-boot unit)")
    run.add_argument("--console", help="also write the short verdict here, e.g. /dev/console")
    status = sub.add_parser("status", help="print the last result's verdict")
    for p in (run, status):
        p.add_argument("--sysroot", help="root for sysfs/dev/firmware checks (tests)")
        p.add_argument("--results-dir", dest="results_dir", help="where result.json goes")
        p.add_argument("--motd", dest="motd_path", help="motd file to update ('' = none)")
    run.set_defaults(func=cmd_run)
    status.set_defaults(func=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as err:
        print(f"rocky-selftest: {err}", file=sys.stderr)
        return EXIT_USAGE
