"""`rocky-selftest driver`: the panvk patches' own conformance check, on demand.

It runs the installed `rocky-vkcheck` (tools/rocky_vkcheck: shared TLS growing on every queue,
WLS reuse without barriers, secondaries, resets, simultaneous use, each result compared with a
CPU reference) within a time budget, reads its JSON as hostile input (exact keys, types, ranges
and patterns, and the counts consistent with each other and with the exit status), and records
a `driver` section: in result.json when there is one (atomically, under the run lock; the run's
own verdict and checks are left as they are), and always in driver.json beside it.

Verdict of the section: PASS (exit 0, every check passed), FAIL (exit 1: a result differs from
the CPU reference), ERROR (no device, a Vulkan error, a timeout, a crash, output that is not a
rocky-vkcheck document).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

from .files import os_error_text
from .results import add_section, write_atomic
from .runner import RunResult, clip, run_tool

TOOL = "rocky-vkcheck"
DOC_SCHEMA = "rocky-vkcheck"
DOC_SCHEMA_VERSION = 1
# The program's checks, in its order (tools/rocky_vkcheck/rocky-vkcheck.c `checks[]`).
CHECK_NAMES = ("tls_growth", "wls_no_barrier", "secondaries", "reset_rerecord", "simultaneous_use")
CHECK_STATUSES = ("pass", "fail", "error", "not-run")
PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"
SECTION_NAME = "driver.json"
DEFAULT_BUDGET_S = 300
# The program's exit statuses (rocky-vkcheck --help) and what they mean here.
EXIT_MEANING = {
    0: "every check passed",
    1: "a result differs from the CPU reference",
    2: "no usable Vulkan device (or a usage error)",
    3: "a Vulkan call failed or a fence wait timed out",
}
MAX_STDOUT = 64 << 10  # a document is about 2 kB; far more is not one
MAX_TEXT = 400  # characters of any string in the document
MAX_COUNT = 1_000_000
MAX_SECONDS = 86400.0
MAX_U32 = (1 << 32) - 1
VK_RESULT = re.compile(r"VK_[A-Z0-9_]{1,60}|VkResult\(-?\d{1,10}\)")
VK_CALL = re.compile(r"vk[A-Z][A-Za-z0-9]{1,60}")
VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,5}")
STDERR_KEEP = 2000

Log = Callable[[str], None]


class BadDocument(ValueError):
    """The output is not a document rocky-vkcheck writes; the message names the field."""


# ---- reading the program's JSON -----------------------------------------------------------


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(items)
    if len(obj) != len(items):
        raise BadDocument("a key is given twice in one object")
    return obj


def _no_constant(name: str) -> Any:
    raise BadDocument(f"{name} is not a JSON number")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _obj(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadDocument(f"{where}: {_show(value)} is not an object")
    if set(value) != set(keys):
        missing = sorted(set(keys) - set(value))
        extra = sorted(set(value) - set(keys))
        what = []
        if missing:
            what.append(f"missing {', '.join(missing)}")
        if extra:
            what.append(f"unknown {', '.join(_show(k) for k in extra[:3])}")
        raise BadDocument(f"{where}: {'; '.join(what)}")
    return value


def _int(obj: dict, key: str, where: str, low: int = 0, high: int = MAX_U32) -> int:
    value = obj[key]
    if type(value) is not int or not low <= value <= high:
        raise BadDocument(f"{where}.{key}: {_show(value)} is not a whole number {low}..{high}")
    return value


def _text(obj: dict, key: str, where: str, pattern: re.Pattern[str] | None = None) -> str:
    value = obj[key]
    ok = isinstance(value, str) and 0 < len(value) <= MAX_TEXT and value.isprintable()
    ok = ok and value.isascii() and (pattern is None or pattern.fullmatch(value) is not None)
    if not ok:
        want = f"text matching {pattern.pattern}" if pattern else "printable ASCII text"
        raise BadDocument(f"{where}.{key}: {_show(value)} is not {want}")
    return value


def _opt(obj: dict, key: str, where: str, read: Callable[..., Any], *args: Any) -> Any:
    return None if obj[key] is None else read(obj, key, where, *args)


DEVICE_KEYS = ("index", "name", "type", "vendor_id", "device_id", "api_version",
               "driver_version", "driver_id", "driver_name", "driver_info", "subgroup_size",
               "max_shared_memory_bytes")  # fmt: skip
DEVICE_TYPES = ("integrated-gpu", "discrete-gpu", "virtual-gpu", "cpu", "other")
CHECK_KEYS = ("name", "status", "cases", "passed", "failed", "seconds", "first_mismatch")
MISMATCH_KEYS = ("case", "word", "expected", "got")
ERROR_KEYS = ("check", "call", "result", "message")
DOC_KEYS = ("schema", "schema_version", "program_version", "device", "queues", "timeout_s",
            "inject_mismatch", "checks", "error", "passed", "exit_code")  # fmt: skip


def _device(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    d = _obj(raw, "device", DEVICE_KEYS)
    w = "device"
    if d["type"] not in DEVICE_TYPES:
        raise BadDocument(f"device.type: {_show(d['type'])} is not one of {DEVICE_TYPES}")
    return {
        "index": _int(d, "index", w, 0, 15),
        "name": _text(d, "name", w),
        "type": d["type"],
        "vendor_id": _int(d, "vendor_id", w),
        "device_id": _int(d, "device_id", w),
        "api_version": _text(d, "api_version", w, VERSION),
        "driver_version": _int(d, "driver_version", w),
        "driver_id": _opt(d, "driver_id", w, _int, 0, 1000),
        "driver_name": _opt(d, "driver_name", w, _text),
        "driver_info": _opt(d, "driver_info", w, _text),
        "subgroup_size": _int(d, "subgroup_size", w, 0, 1024),
        "max_shared_memory_bytes": _int(d, "max_shared_memory_bytes", w),
    }


def _check(raw: Any, i: int) -> dict[str, Any]:
    w = f"checks[{i}]"
    c = _obj(raw, w, CHECK_KEYS)
    if c["name"] != CHECK_NAMES[i]:
        raise BadDocument(f"{w}.name: {_show(c['name'])} is not {CHECK_NAMES[i]!r}")
    if c["status"] not in CHECK_STATUSES:
        raise BadDocument(f"{w}.status: {_show(c['status'])} is not one of {CHECK_STATUSES}")
    cases = _int(c, "cases", w, 0, MAX_COUNT)
    passed = _int(c, "passed", w, 0, MAX_COUNT)
    failed = _int(c, "failed", w, 0, MAX_COUNT)
    seconds = c["seconds"]
    if type(seconds) not in (int, float) or not (
        math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS
    ):
        raise BadDocument(f"{w}.seconds: {_show(seconds)} is not a number 0..{MAX_SECONDS:g}")
    if passed + failed != cases:
        raise BadDocument(f"{w}: passed {passed} + failed {failed} is not cases {cases}")
    mm = c["first_mismatch"]
    if (mm is None) != (failed == 0):
        raise BadDocument(f"{w}: first_mismatch must be given exactly when a case failed")
    mismatch = None
    if mm is not None:
        m = _obj(mm, f"{w}.first_mismatch", MISMATCH_KEYS)
        mw = f"{w}.first_mismatch"
        mismatch = {
            "case": _text(m, "case", mw),
            "word": _int(m, "word", mw, 0, 1 << 24),
            "expected": _int(m, "expected", mw),
            "got": _int(m, "got", mw),
        }
        if mismatch["expected"] == mismatch["got"]:
            raise BadDocument(f"{mw}: expected and got are the same value")
    status = c["status"]
    if status == "pass" and (failed or not cases):
        raise BadDocument(f"{w}: status pass with {failed} failed of {cases} cases")
    if status == "fail" and not failed and cases:
        raise BadDocument(f"{w}: status fail without a failed case")
    if status == "not-run" and (cases or seconds):
        raise BadDocument(f"{w}: status not-run with cases or time")
    return {"name": c["name"], "status": status, "cases": cases, "passed": passed,
            "failed": failed, "seconds": round(float(seconds), 3),
            "first_mismatch": mismatch}  # fmt: skip


def _error(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    e = _obj(raw, "error", ERROR_KEYS)
    if e["check"] is not None and e["check"] not in CHECK_NAMES:
        raise BadDocument(f"error.check: {_show(e['check'])} is not a check name or null")
    return {
        "check": e["check"],
        "call": _text(e, "call", "error", VK_CALL),
        "result": _text(e, "result", "error", VK_RESULT),
        "message": _text(e, "message", "error"),
    }


def parse_document(text: str, exit_code: int | None) -> dict[str, Any]:
    """The program's stdout as a checked document; BadDocument naming what is wrong. The
    document must be consistent in itself and with the exit status the process had."""
    if len(text) > MAX_STDOUT:
        raise BadDocument(f"{len(text)} characters of output, more than a document ({MAX_STDOUT})")
    try:
        raw = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except RecursionError:
        raise BadDocument("nested too deeply") from None
    except BadDocument:
        raise
    except ValueError as err:
        raise BadDocument(f"not JSON ({str(err)[:120]})") from None
    doc = _obj(raw, "document", DOC_KEYS)
    if doc["schema"] != DOC_SCHEMA or doc["schema_version"] != DOC_SCHEMA_VERSION:
        raise BadDocument(f"not a {DOC_SCHEMA} v{DOC_SCHEMA_VERSION} document")
    if type(doc["schema_version"]) is not int:
        raise BadDocument("schema_version is not a whole number")
    checks_raw = doc["checks"]
    if not isinstance(checks_raw, list) or len(checks_raw) != len(CHECK_NAMES):
        raise BadDocument(f"checks: not a list of the {len(CHECK_NAMES)} checks")
    checks = [_check(c, i) for i, c in enumerate(checks_raw)]
    queues = doc["queues"]
    if not isinstance(queues, list) or len(queues) > 2:
        raise BadDocument(f"queues: {_show(queues)} is not a list of at most 2 queues")
    for i, q in enumerate(queues):
        qo = _obj(q, f"queues[{i}]", ("family", "index"))
        _int(qo, "family", f"queues[{i}]", 0, 64)
        _int(qo, "index", f"queues[{i}]", 0, 64)
    inject = doc["inject_mismatch"]
    if inject is not None and inject not in CHECK_NAMES:
        raise BadDocument(f"inject_mismatch: {_show(inject)} is not a check name or null")
    code = _int(doc, "exit_code", "document", 0, 3)
    if type(doc["passed"]) is not bool or doc["passed"] != (code == 0):
        raise BadDocument(f"passed: {_show(doc['passed'])} does not agree with exit_code {code}")
    if exit_code is not None and code != exit_code:
        raise BadDocument(f"exit_code {code} in the document, but the process exited {exit_code}")
    error = _error(doc["error"])
    if (error is None) != (code in (0, 1)):
        raise BadDocument(f"error must be given exactly when exit_code is 2 or 3 (it is {code})")
    statuses = [c["status"] for c in checks]
    if code == 0 and statuses != ["pass"] * len(checks):
        raise BadDocument("exit_code 0 but not every check passed")
    if code == 1 and ("fail" not in statuses or "error" in statuses or "not-run" in statuses):
        raise BadDocument("exit_code 1 needs a failed check, every check run and no error")
    named = error["check"] if error else None
    if "error" in statuses and (
        named is None or checks[CHECK_NAMES.index(named)]["status"] != "error"
    ):
        raise BadDocument("a check has status error but the error does not name it")
    return {
        "program_version": _text(doc, "program_version", "document", VERSION),
        "device": _device(doc["device"]),
        "queues": len(queues),
        "timeout_s": _int(doc, "timeout_s", "document", 1, 3600),
        "inject_mismatch": inject,
        "checks": checks,
        "error": error,
        "exit_code": code,
    }


# ---- the run --------------------------------------------------------------------------------


def _reason(doc: dict[str, Any]) -> str | None:
    """Why the document is not a PASS, in one line, or None."""
    if doc["error"] is not None:
        e = doc["error"]
        said = f"{e['call']} returned {e['result']}"
        where = f" (during {e['check']})" if e["check"] else ""
        if e["message"].startswith(said):
            return f"{e['message']}{where}"
        return f"{said}{where}: {e['message']}"
    failed = [c for c in doc["checks"] if c["status"] != "pass"]
    if not failed:
        return None
    parts = []
    for c in failed:
        mm = c["first_mismatch"]
        first = ""
        if mm:
            first = (
                f" (first: {mm['case']}, word {mm['word']}: expected {mm['expected']:#010x}, "
                f"got {mm['got']:#010x})"
            )
        parts.append(f"{c['name']} {c['failed']} of {c['cases']} cases differ{first}")
    return "results differ from the CPU reference: " + "; ".join(parts)


def section_from_run(res: RunResult, binary: str, budget_s: float, when: str) -> dict[str, Any]:
    """The `driver` section for one finished (or failed) run of the program."""
    section: dict[str, Any] = {
        "status": ERROR,
        "checked_at": when,
        "binary": binary,
        "budget_s": budget_s,
        "elapsed_s": res.elapsed_s,
        "exit_code": res.returncode,
        "reason": None,
        "program_version": None,
        "device": None,
        "queues": None,
        "checks": [],
        "error": None,
        "stderr_tail": clip(res.stderr_tail(), STDERR_KEEP),
    }
    if res.error:
        section["reason"] = f"{res.error}; install {TOOL} (the image ships it) or pass --binary"
        return section
    if res.timed_out:
        section["reason"] = (
            f"{TOOL} did not finish within the budget of {budget_s:g} s (killed): a GPU hang? "
            "Rerun with a larger --budget to tell a slow device from a hang"
        )
        return section
    if res.returncode is None or res.returncode < 0 or res.returncode not in EXIT_MEANING:
        section["reason"] = f"{TOOL} crashed: {res.failure()}"
        return section
    if res.returncode == 2 and not res.stdout.strip():
        section["reason"] = f"{TOOL} refused its arguments (exit 2): {res.stderr_tail()[-300:]}"
        return section
    try:
        doc = parse_document(res.stdout, res.returncode)
    except BadDocument as err:
        section["reason"] = (
            f"{TOOL} exited {res.returncode} ({EXIT_MEANING[res.returncode]}) but its output is "
            f"not a {DOC_SCHEMA} document: {err}"
        )
        return section
    section.update(
        program_version=doc["program_version"],
        device=doc["device"],
        queues=doc["queues"],
        checks=doc["checks"],
        error=doc["error"],
        reason=_reason(doc),
    )
    section["status"] = {0: PASS, 1: FAIL}.get(doc["exit_code"], ERROR)
    inject = doc["inject_mismatch"]
    if inject is not None:  # a test-only run (a wrapper's): never a PASS
        if section["status"] == PASS:
            section["status"] = FAIL
        section["reason"] = f"test-only --inject-mismatch {inject}: {section['reason']}"
    return section


def run_driver_check(
    binary: str, env: dict[str, str | None], budget_s: float, when: str
) -> dict[str, Any]:
    """Run the program with every fence wait bounded inside the budget; its section."""
    fence_s = max(1, min(60, int(budget_s // 4)))
    res = run_tool([binary, "--timeout-s", str(fence_s)], env, budget_s)
    return section_from_run(res, binary, budget_s, when)


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The section for the terminal: the verdict, the device, one line per check."""
    dev = section.get("device") or {}
    name = dev.get("name") or "no device"
    driver = dev.get("driver_info") or dev.get("driver_name") or "?"
    lines = [f"rocky-selftest driver {section['status']} ({section['checked_at']}, "
             f"{section['elapsed_s']:.1f} s): {name}, {driver}"]  # fmt: skip
    for c in section["checks"]:
        lines.append(f"  {c['status']:7} {c['name']}: {c['passed']}/{c['cases']} cases")
    if section["reason"]:
        lines.append(f"  {section['reason']}")
    return lines


def record(results_dir: str, section: dict[str, Any], log: Log) -> bool:
    """driver.json (always) and result.json's `driver` section (when a result exists): both
    atomically; the rest of result.json, the run's own verdict, is left as it is. False when
    either could not be written."""
    ok = True
    data = (json.dumps(section, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    path = os.path.join(results_dir, SECTION_NAME)
    try:
        write_atomic(path, data)
        log(f"rocky-selftest driver: wrote {path}")
    except OSError as err:
        log(f"rocky-selftest driver: cannot write {path}: {os_error_text(err)}")
        ok = False
    added = add_section(results_dir, "driver", section, log, f"the section is in {path} only")
    return ok and added is not False
