"""The `cts` section of a board's result.json (`rocky-selftest cts`: a dEQP-VK subset), read as
hostile input like the rest of the file, and its rows in the report.

Nothing the board summarised is taken on trust: pass/fail/not-supported/other are counted again
from the per-status counts, a summary or a `ran` that disagrees with them is a problem, and a
case name is shown only when it is a dEQP-VK case name (letters, digits, '_', '-', dots)."""

from __future__ import annotations

from typing import Any

from rocky_selftest.cts import CASE, FAILING, STATUSES, SUMMARY_GROUPS, pattern_problem

VERDICTS = ("PASS", "FAIL", "ERROR")
MAX_COUNT = 10_000_000  # cases: far more than dEQP-VK has
MAX_SECONDS = 1e7
MAX_FAILED_SHOWN = 30


def summarise(counts: dict[str, int]) -> dict[str, int]:
    """pass / fail / not_supported / other from the per-status counts (cts.SUMMARY_GROUPS)."""
    summary = {k: sum(counts.get(s, 0) for s in group) for k, group in SUMMARY_GROUPS.items()}
    summary["other"] = sum(counts.values()) - sum(summary.values())
    return summary


def cts_section(raw: Any, c: Any) -> dict[str, Any] | None:
    """The checked section (None when the board has none); `state` is "malformed" when any
    field was, and `c` (result_doc's checker) holds the problems."""
    if raw is None:
        return None
    before = len(c.problems)
    if not isinstance(raw, dict):
        c.bad("cts", raw, "an object")
        return {"state": "malformed", "verdict": None, "counts": {}, "summary": summarise({}),
                "failed": [], "failed_total": 0, "not_run": None, "selected": None,
                "budget_s": None, "duration_s": None, "budget_exhausted": False,
                "patterns": []}  # fmt: skip
    verdict = c.word(raw, "verdict", "cts.verdict", VERDICTS)
    counts_raw = raw.get("counts")
    if not isinstance(counts_raw, dict):
        c.bad("cts.counts", counts_raw, "an object")
        counts_raw = {}
    counts: dict[str, int] = {}
    for key in c.items(list(counts_raw), "cts.counts"):
        if key not in STATUSES:
            c.bad("cts.counts", key, "a status (" + ", ".join(STATUSES) + ")")
            continue
        value = c.count(counts_raw, key, f"cts.counts.{key}", MAX_COUNT)
        if value is not None:
            counts[key] = value
    summary = summarise(counts)
    told = raw.get("summary")
    if isinstance(told, dict) and {k: told.get(k) for k in summary} != summary:
        c.problems.append(f"cts.summary: not what its counts show ({summary})")
    elif not isinstance(told, dict):
        c.bad("cts.summary", told, "an object")
    ran = c.count(raw, "ran", "cts.ran", MAX_COUNT)
    if ran is not None and ran != sum(counts.values()):
        c.problems.append(f"cts.ran: {ran} is not the {sum(counts.values())} cases counted")
    failed_raw = raw.get("failed")
    if not isinstance(failed_raw, list):
        c.bad("cts.failed", failed_raw, "a list")
        failed_raw = []
    failed = []
    for i, item in enumerate(c.items(failed_raw, "cts.failed")):
        field = f"cts.failed[{i}]"
        case = item.get("case") if isinstance(item, dict) else None
        status = item.get("status") if isinstance(item, dict) else None
        if not (isinstance(case, str) and CASE.fullmatch(case)):
            c.bad(f"{field}.case", case, "a dEQP-VK case name")
        elif status not in FAILING:
            c.bad(f"{field}.status", status, "a failing status (" + ", ".join(FAILING) + ")")
        else:
            failed.append({"case": case, "status": status})
    failing = sum(counts.get(s, 0) for s in FAILING)
    failed_total = c.count(raw, "failed_total", "cts.failed_total", MAX_COUNT)
    if failed_total is not None and (failed_total != failing or len(failed) > failed_total):
        c.problems.append(f"cts.failed_total: {failed_total} is not the {failing} failing counted")
    if verdict == "PASS" and failing:
        c.problems.append(f"cts.verdict: PASS with {failing} failing cases")
    patterns = raw.get("patterns")
    if not (isinstance(patterns, list) and all(pattern_problem(p) is None for p in patterns)):
        c.bad("cts.patterns", patterns, "a list of dEQP-VK case patterns")
        patterns = []
    return {
        "state": "malformed" if len(c.problems) != before else "ok",
        "verdict": verdict,
        "counts": counts,
        "summary": summary,
        "failed": failed,
        "failed_total": failing,
        "not_run": c.count(raw, "not_run", "cts.not_run", MAX_COUNT),
        "selected": c.count(raw, "selected", "cts.selected", MAX_COUNT),
        "budget_s": c.number(raw, "budget_s", "cts.budget_s", 0, MAX_SECONDS),
        "duration_s": c.number(raw, "duration_s", "cts.duration_s", 0, MAX_SECONDS, zero_ok=True),
        "budget_exhausted": raw.get("budget_exhausted") is True,
        "patterns": list(patterns[:20]),
        "started_at": c.text(raw, "started_at", "cts.started_at"),
    }


def cts_rows(cts: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows: the counts, what was not run, and each failed case by name."""
    sm = cts["summary"]
    rows = [
        ("patterns", ", ".join(cts["patterns"]) or "—"),
        ("pass", str(sm["pass"])),
        ("fail", str(sm["fail"])),
        ("not supported", str(sm["not_supported"])),
        ("other", str(sm["other"])),
    ]
    others = {k: v for k, v in cts["counts"].items() if k not in ("Pass", "NotSupported")}
    if others:
        rows.append(("by status", ", ".join(f"{k} {v}" for k, v in sorted(others.items()))))
    if cts["not_run"]:
        why = " (budget spent)" if cts["budget_exhausted"] else ""
        rows.append(("not run", f"{cts['not_run']} of {cts['selected'] or '?'} selected{why}"))
    for item in cts["failed"][:MAX_FAILED_SHOWN]:
        rows.append((item["status"], item["case"]))
    more = cts["failed_total"] - min(len(cts["failed"]), MAX_FAILED_SHOWN)
    if more > 0:
        rows.append(("…", f"{more} more failing cases (cts.json on the board)"))
    return rows
