"""The `driver` section of a self-test result (`rocky-selftest driver`: rocky-vkcheck, the panvk
patches' conformance check) in the host report: type-checked like every other field of the file
(a wrong field becomes a problem naming it, shown as BAD), then printed as a table of text.

It is the board's own on-demand check: shown, and a malformed one counts as a malformed field,
but it does not change the run's verdict.
"""

from __future__ import annotations

from typing import Any

from rocky_selftest.driver import CHECK_NAMES, CHECK_STATUSES, ERROR, FAIL, PASS

from rocky_vulkan.host.result_doc import MAX_SECONDS, _Checker, clean_text

STATUSES = (PASS, FAIL, ERROR)
MAX_CASES = 1_000_000
TITLE_TEXT = 60


def _mismatch(c: _Checker, raw: Any, field: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, dict):
        c.bad(field, raw, "an object or null")
        return ""
    case = c.text(raw, "case", f"{field}.case", "?")
    nums = [raw.get(k) for k in ("word", "expected", "got")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 32 for n in nums):
        c.bad(field, raw, "a case, word, expected and got (32-bit whole numbers)")
        return case
    word, expected, got = nums
    return f"{case}, word {word}: expected {expected:#010x}, got {got:#010x}"


def _checks(c: _Checker, raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        c.bad("driver.checks", raw, "a list")
        return []
    rows = []
    seen: set[str] = set()
    for i, item in enumerate(c.items(raw, "driver.checks")):
        field = f"driver.checks[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        before = len(c.problems)
        name = c.word(item, "name", f"{field}.name", CHECK_NAMES)
        status = c.word(item, "status", f"{field}.status", CHECK_STATUSES)
        cases = c.count(item, "cases", f"{field}.cases", MAX_CASES)
        passed = c.count(item, "passed", f"{field}.passed", MAX_CASES)
        failed = c.count(item, "failed", f"{field}.failed", MAX_CASES)
        mismatch = _mismatch(c, item.get("first_mismatch"), f"{field}.first_mismatch")
        if None not in (cases, passed, failed) and passed + failed != cases:
            c.problems.append(f"{field}: passed {passed} + failed {failed} is not cases {cases}")
        if name in seen:
            c.problems.append(f"{field}: a second {name!r} check")
        if name:
            seen.add(name)
        rows.append({"name": name or "?", "status": status if len(c.problems) == before else "BAD",
                     "cases": cases, "passed": passed, "failed": failed,
                     "mismatch": mismatch})  # fmt: skip
    return rows


def check_driver(raw: Any, c: _Checker) -> dict[str, Any] | None:
    """The section with every field the report shows in its type; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        c.bad("driver", raw, "an object")
        return {"state": "malformed", "status": "BAD", "checks": [], "device": "no device",
                "driver": "", "checked_at": "?", "elapsed_s": None, "reason": ""}  # fmt: skip
    before = len(c.problems)
    status = c.word(raw, "status", "driver.status", STATUSES)
    device = raw.get("device")
    if device is not None and not isinstance(device, dict):
        c.bad("driver.device", device, "an object or null")
        device = None
    device = device or {}
    checks = _checks(c, raw.get("checks"))
    names = [row["name"] for row in checks]
    if status == PASS and (
        names != list(CHECK_NAMES) or any(row["status"] != "pass" for row in checks)
    ):
        c.problems.append("driver: PASS without every check passing")
    section = {
        "status": status or "BAD",
        "checked_at": c.text(raw, "checked_at", "driver.checked_at", "?"),
        "elapsed_s": c.number(raw, "elapsed_s", "driver.elapsed_s", 0, MAX_SECONDS, zero_ok=True),
        "reason": c.text(raw, "reason", "driver.reason"),
        "device": c.text(device, "name", "driver.device.name", "no device"),
        "driver": c.text(device, "driver_info", "driver.device.driver_info")
        or c.text(device, "driver_name", "driver.device.driver_name"),
        "checks": checks,
    }
    section["state"] = "malformed" if len(c.problems) != before else "ok"
    if section["state"] != "ok" and section["status"] == PASS:
        section["status"] = "BAD"  # a PASS with a broken field is not shown as a PASS
    return section


def driver_rows(section: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(check, result, status) rows: the verdict first, then one row per check."""
    took = f", {section['elapsed_s']:.1f} s" if section["elapsed_s"] is not None else ""
    head = f"{section['device']}" + (f" ({section['driver']})" if section["driver"] else "")
    head += f", {section['checked_at']}{took}"
    if section["reason"]:
        head += f": {section['reason']}"
    if section["state"] != "ok":
        head = f"malformed: the fields are named in the report's problems; {head}"
    rows = [("rocky-vkcheck", head, section["status"])]
    for row in section["checks"]:
        counts = (
            f"{row['passed']}/{row['cases']} cases"
            if row["passed"] is not None and row["cases"] is not None
            else "counts malformed"
        )
        if row["mismatch"]:
            counts += f"; first mismatch: {row['mismatch']}"
        rows.append((row["name"], counts, row["status"] or "BAD"))
    return rows


def print_driver(console, section: dict[str, Any]) -> None:
    """The section as a table: every cell is Text (no markup), board text cleaned."""
    from rich.table import Table
    from rich.text import Text

    title = "panvk conformance (rocky-selftest driver)"
    table = Table(title=Text(title, no_wrap=True, overflow="ellipsis"))
    for column in ("check", "result", "status"):
        table.add_column(column)
    styles = {PASS: "green", "pass": "green", FAIL: "red", "fail": "red", ERROR: "red",
              "error": "red", "BAD": "red", "not-run": "yellow"}  # fmt: skip
    for check, result, status in driver_rows(section):
        table.add_row(Text(clean_text(check, TITLE_TEXT)), Text(result),
                      Text(status, style=styles.get(status, "white")))  # fmt: skip
    console.print(table)
