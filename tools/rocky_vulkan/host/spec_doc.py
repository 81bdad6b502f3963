"""The `speculative` section of a board's result.json (the self-test's decode modes), read as
hostile input like the rest of the file, and its rows in the report.

Nothing the board summarised is taken on trust: the speed-ups are computed again from the
runs' decode times (rocky_selftest.speculation, as the board computes them), and a chosen mode
or a goal verdict that the runs do not bear out is a problem."""

from __future__ import annotations

from typing import Any

from rocky_selftest.speculation import GOAL, MODES, WIN_MIN, speedups, winner

MAX_MS = 1e10
MAX_TOKENS = 10_000_000
MAX_RATE = 1e9
SLACK = 1e-3  # the board rounds its speed-ups to 4 digits


def _run(item: Any, field: str, names: list[str], c: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        c.bad(field, item, "an object")
        return None
    got = len(c.problems)
    request = item.get("request")
    if request not in names:
        c.bad(f"{field}.request", request, "one of the section's requests")
    run = {
        "request": request,
        "status": c.word(item, "status", f"{field}.status", ("PASS", "FAIL")),
        "predicted_ms": c.number(item, "predicted_ms", f"{field}.predicted_ms", 0, MAX_MS),
        "decode_tps": c.number(item, "decode_tps", f"{field}.decode_tps", 0, MAX_RATE),
        "same_text": item.get("same_text") if isinstance(item.get("same_text"), bool) else None,
    }
    for key in ("draft_n", "draft_n_accepted"):
        run[key] = None if item.get(key) is None else c.count(item, key, f"{field}.{key}",
                                                               MAX_TOKENS)  # fmt: skip
    made, took = run["draft_n"], run["draft_n_accepted"]
    if made is not None and took is not None and took > made:
        c.problems.append(f"{field}: {took} drafted tokens accepted of {made} made")
    if run["status"] == "PASS" and run["predicted_ms"] is None and len(c.problems) == got:
        c.problems.append(f"{field}: status PASS without predicted_ms")
    return run if len(c.problems) == got else None


def _mode(raw: Any, mode: str, names: list[str], c: Any) -> dict[str, Any]:
    field = f"speculative.modes.{mode}"
    if not isinstance(raw, dict):
        c.bad(field, raw, "an object")
        return {"status": "BAD", "reason": "", "runs": []}
    runs_raw = raw.get("runs")
    if not isinstance(runs_raw, list):
        c.bad(f"{field}.runs", runs_raw, "a list")
        runs_raw = []
    runs = [_run(r, f"{field}.runs[{i}]", names, c) for i, r in enumerate(c.items(runs_raw, field))]
    return {
        "status": c.word(raw, "status", f"{field}.status", ("PASS", "FAIL")) or "BAD",
        "reason": c.text(raw, "reason", f"{field}.reason"),
        "runs": [r for r in runs if r is not None],
    }


def spec_section(raw: Any, c: Any) -> dict[str, Any] | None:
    """The checked section (None when the board has none); `state` is "malformed" when any
    field was, and `c` (result_doc's checker) holds the problems."""
    if raw is None:
        return None
    before = len(c.problems)
    out: dict[str, Any] = {"state": "malformed", "requests": [], "modes": {}, "speedups": {},
                           "chosen": None, "reason": "", "goal_met": None,
                           "goal_why": "the speculative section is malformed"}  # fmt: skip
    if not isinstance(raw, dict):
        c.bad("speculative", raw, "an object")
        return out
    requests = raw.get("requests")
    if not isinstance(requests, list) or not requests:
        c.bad("speculative.requests", requests, "a list of requests")
        requests = []
    names = []
    for i, item in enumerate(c.items(requests, "speculative.requests")):
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and name.isidentifier() and len(name) <= 40:
            names.append(name)
        else:
            c.bad(f"speculative.requests[{i}].name", name, "a short name")
    modes_raw = raw.get("modes")
    if not isinstance(modes_raw, dict):
        c.bad("speculative.modes", modes_raw, "an object")
        modes_raw = {}
    for mode in c.items(list(modes_raw), "speculative.modes"):
        if mode in MODES:
            out["modes"][mode] = _mode(modes_raw[mode], mode, names, c)
        else:
            c.bad("speculative.modes", mode, "a mode (" + ", ".join(MODES) + ")")
    out["requests"] = names
    chosen = c.word(raw, "chosen", "speculative.chosen", MODES)
    out.update(chosen=chosen, reason=c.text(raw, "reason", "speculative.reason"))
    ratios, _ = speedups({"requests": [{"name": n} for n in names], "modes": out["modes"]})
    out["speedups"] = ratios
    told = raw.get("speedups")
    if not isinstance(told, dict) or set(told) != set(ratios) or any(
        not isinstance(told[m], (int, float)) or abs(told[m] - r) > SLACK * max(r, 1)
        for m, r in ratios.items()
    ):  # fmt: skip
        shown = {m: round(r, 4) for m, r in ratios.items()}
        c.problems.append(f"speculative.speedups: not what the runs show ({shown})")
    expected = winner({"modes": out["modes"]}, ratios)
    if chosen is not None and chosen != expected:
        c.problems.append(f"speculative.chosen: {chosen}, but the runs make it {expected}")
    if len(c.problems) != before:
        return out
    ratio = ratios.get(chosen, 1.0)
    told_met = raw.get("goal_met")
    met = ratio >= GOAL
    if told_met is not met:
        c.problems.append(f"speculative.goal_met: {told_met!r}, but the runs give {ratio:.2f}x")
        return out
    why = c.text(raw, "goal_why", "speculative.goal_why")
    out.update(state="ok", goal_met=met, goal_why=why, ratio=ratio)
    return out


def _cells(entry: dict[str, Any]) -> str:
    parts = []
    for run in entry["runs"]:
        text = f"{run['request']} {run['decode_tps']:.2f} t/s" if run["decode_tps"] else ""
        if run["draft_n"]:
            text += f" ({run['draft_n_accepted']}/{run['draft_n']} drafts taken)"
        if run["same_text"] is False:
            text += " (text differs from plain)"
        parts.append(text or f"{run['request']}: no rate")
    return ", ".join(parts) or "no runs"


def spec_rows(section: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Per mode its decode rates and drafts; the choice; the goal (GOAL x plain decode)."""
    if section is None:
        return [("speculative", "not in this result (a self-test without it)", "", "-")]
    if section["state"] != "ok":
        return [("speculative", "malformed: the fields are named in the BAD rows below", "",
                 "BAD")]  # fmt: skip
    rows = []
    for mode, entry in section["modes"].items():
        board = _cells(entry)
        if mode in section["speedups"]:
            board += f" = {section['speedups'][mode]:.2f}x plain"
        if entry["status"] != "PASS" and entry["reason"]:
            board += f" ({entry['reason']})"
        rows.append((f"decode {mode}", board, "", entry["status"]))
    rows.append(("decode chosen", f"{section['chosen']}: {section['reason']}",
                 f"a mode only at >= {WIN_MIN}x", "-"))  # fmt: skip
    board = f"{section['chosen']} {section['ratio']:.2f}x plain decode"
    if not section["goal_met"]:
        board += f" ({section['goal_why']})"
    status = "met" if section["goal_met"] else "NOT met"
    rows.append(("decode goal", board, f">= {GOAL}x plain decode", status))
    return rows
