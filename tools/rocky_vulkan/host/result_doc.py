"""Read a self-test result.json and type-check every field the report uses.

The file comes from a board (copied by hand, maybe truncated, edited or from another version), so
nothing in it is trusted: a wrong type or a missing key becomes a problem that names the field
(`sweep[3].ubatch: 'abc' is not a whole number`), and the value is replaced by a safe one. The
report then shows those rows as malformed instead of crashing. Only a document without the two
things every report needs (`verdict`, `checks`) is refused outright.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rocky_selftest import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

from rocky_vulkan.errors import UserError

MODES = ("tuned", "stock", "cpu")
RATIO_NUMBERS = ("tuned_tps", "stock_tps", "cpu_tps", "ratio", "required_ratio")


class ResultError(UserError):
    """The result file is unreadable, truncated or not a self-test result."""


def _show(value: Any) -> str:
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."


class _Checker:
    """Collects problems; each getter returns a value of the wanted type or the fallback."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, field: str, value: Any, want: str) -> None:
        self.problems.append(f"{field}: {_show(value)} is not {want}")

    def text(self, obj: dict, key: str, field: str, default: str = "") -> str:
        value = obj.get(key)
        if value is None:  # absent or null: optional text
            return default
        if isinstance(value, str):
            return value
        self.bad(field, value, "a string")
        return default

    def number(self, obj: dict, key: str, field: str) -> float | None:
        """A finite number, or None (absent, null or malformed)."""
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
        self.bad(field, value, "a finite number")
        return None

    def whole(self, obj: dict, key: str, field: str, default: int | None) -> int | None:
        value = obj.get(key, default)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value
        self.bad(field, value, "a whole number > 0")
        return default

    def mapping(self, doc: dict, key: str) -> dict:
        value = doc.get(key)
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        self.bad(key, value, "an object")
        return {}


def _checks(raw: list, c: _Checker) -> list[dict[str, Any]]:
    checks = []
    for i, item in enumerate(raw):
        field = f"checks[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        before = len(c.problems)
        name = c.text(item, "name", f"{field}.name")
        status = c.text(item, "status", f"{field}.status")
        evidence = c.text(item, "evidence", f"{field}.evidence")
        if len(c.problems) == before and name and status:
            checks.append({"name": name, "status": status, "evidence": evidence})
        elif len(c.problems) == before:
            c.problems.append(f"{field}: no name or no status")
    return checks


def _sweep(raw: Any, c: _Checker) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        c.bad("sweep", raw, "a list")
        return []
    runs = []
    for i, item in enumerate(raw):
        field = f"sweep[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        before = len(c.problems)
        mode = c.text(item, "mode", f"{field}.mode")
        if mode and mode not in MODES:
            c.bad(f"{field}.mode", mode, "one of " + ", ".join(MODES))
        ubatch = c.whole(item, "ubatch", f"{field}.ubatch", None)
        status = c.text(item, "status", f"{field}.status")
        reason = c.text(item, "reason", f"{field}.reason")
        avg_ts = c.number(item, "avg_ts", f"{field}.avg_ts")
        if status == "PASS" and avg_ts is None and len(c.problems) == before:
            c.problems.append(f"{field}: status PASS without a finite avg_ts")
        if len(c.problems) == before and mode and ubatch:
            runs.append(
                {"mode": mode, "ubatch": ubatch, "status": status, "avg_ts": avg_ts,
                 "reason": reason}
            )  # fmt: skip
        elif len(c.problems) == before:
            c.problems.append(f"{field}: no mode or no ubatch")
    return runs


def _tune(raw: Any, c: _Checker) -> dict[str, Any] | None:
    """`rocky-selftest tune`'s section: each candidate's name, spec, t/s and status."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        c.bad("tune", raw, "an object")
        return None
    rows = []
    cands = raw.get("candidates")
    if not isinstance(cands, list):
        c.bad("tune.candidates", cands, "a list")
        cands = []
    for i, item in enumerate(cands):
        field = f"tune.candidates[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        tps = item.get("tps")
        if not isinstance(tps, list):
            c.bad(f"{field}.tps", tps, "a list")
            tps = []
        runs = [c.number({"t": t}, "t", f"{field}.tps[{j}]") for j, t in enumerate(tps)]
        rows.append(
            {
                "name": c.text(item, "name", f"{field}.name", "?"),
                "spec": c.text(item, "spec", f"{field}.spec"),
                "builtin": item.get("builtin") is True,
                "runs": len([t for t in runs if t is not None]),
                "median_tps": c.number(item, "median_tps", f"{field}.median_tps"),
                "status": c.text(item, "status", f"{field}.status", "?"),
                "reason": c.text(item, "reason", f"{field}.reason"),
            }
        )
    return {
        "winner": c.text(raw, "winner", "tune.winner") or None,
        "elapsed_s": c.number(raw, "elapsed_s", "tune.elapsed_s"),
        "budget_s": c.number(raw, "budget_s", "tune.budget_s"),
        "budget_exhausted": raw.get("budget_exhausted") is True,
        "phase": c.text(raw, "phase", "tune.phase", "?"),
        "candidates": rows,
    }


def check_result(doc: dict[str, Any], path: Path) -> tuple[dict[str, Any], list[str]]:
    """The document with every field the report reads in its type, and the problems found."""
    for key in ("verdict", "checks"):
        if key not in doc:
            raise ResultError(f"{path}: result has no {key!r}: the run did not finish writing it")
    c = _Checker()
    verdict = doc["verdict"]
    if not isinstance(verdict, str):
        raise ResultError(f'{path}: verdict is {_show(verdict)}, not a string like "PASS"')
    if not isinstance(doc["checks"], list):
        raise ResultError(f"{path}: checks is {_show(doc['checks'])}, not a list of checks")
    ratio_raw = c.mapping(doc, "ratio")
    ratio: dict[str, Any] = {k: c.number(ratio_raw, k, f"ratio.{k}") for k in RATIO_NUMBERS}
    ratio["prompt_tokens"] = c.whole(ratio_raw, "prompt_tokens", "ratio.prompt_tokens", 512)
    thresholds = c.mapping(doc, "thresholds")
    clean = {
        "verdict": verdict,
        "finished_at": c.text(doc, "finished_at", "finished_at"),
        "checks": _checks(doc["checks"], c),
        "sweep": _sweep(doc.get("sweep"), c),
        "ratio": ratio,
        "thresholds": {
            "prompt_tokens": c.whole(thresholds, "prompt_tokens", "thresholds.prompt_tokens", 512)
        },
        "host": {"hostname": c.text(c.mapping(doc, "host"), "hostname", "host.hostname", "board")},
        "model": {"path": c.text(c.mapping(doc, "model"), "path", "model.path")},
        "tune": _tune(doc.get("tune"), c),
    }
    return clean, c.problems


def load_result(path: Path) -> dict[str, Any]:
    """The parsed, type-checked result; `problems` lists what was malformed (maybe nothing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(
            f"{path}: no such file; copy /var/lib/rocky-selftest/result.json from the board first"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultError(f"{path}: cannot read: {err}") from None
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        if isinstance(err, RecursionError):
            raise ResultError(f"{path}: nested too deeply to be a self-test result") from None
        cut = not text.rstrip().endswith("}")
        hint = " (the file does not end with '}': truncated? copy it again)" if cut else ""
        raise ResultError(
            f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}{hint}"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise ResultError(f'{path}: not a rocky-selftest result (no "schema": "{RESULT_SCHEMA}")')
    version = doc.get("schema_version")
    if type(version) is not int or version != RESULT_SCHEMA_VERSION:
        raise ResultError(
            f"{path}: result schema_version {_show(version)}; this tool reads "
            f"{RESULT_SCHEMA_VERSION}: use the rocky-vulkan version that matches the image"
        )
    return checked(doc, path)


def checked(doc: dict[str, Any], path: Path = Path("result.json")) -> dict[str, Any]:
    """`doc` type-checked, with `problems` listing what was malformed; a checked doc as it is."""
    if "problems" in doc:
        return doc
    clean, problems = check_result(doc, path)
    clean["problems"] = problems
    return clean
