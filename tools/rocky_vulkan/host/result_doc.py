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
from rocky_selftest.checks import ERROR, FAIL, PASS, SKIP
from rocky_selftest.placement import EXPERTS_CPU
from rocky_selftest.placement import MODES as MODES_OF_PLACEMENT
from rocky_selftest.results import FINAL_VERDICTS, IN_PROGRESS
from rocky_selftest.sequence import CHECK_ORDER

from rocky_vulkan.errors import UserError
from rocky_vulkan.host.cluster_doc import cluster_section
from rocky_vulkan.host.cts_doc import cts_section
from rocky_vulkan.host.spec_doc import spec_section
from rocky_vulkan.regularfile import NotReadable, read_regular, shown

MODES = ("tuned", "stock", "cpu")
RATIO_NUMBERS = ("tuned_tps", "stock_tps", "cpu_tps", "ratio", "required_ratio")
# A self-test result is a few hundred kB at most; anything far larger is not one.
MAX_RESULT_BYTES = 8 << 20
MAX_TEXT = 1000  # characters of one string shown
# Entries of one list (sweep runs, checks, candidates, ...): a self-test writes a few dozen.
MAX_ITEMS = 1000
VERDICTS = (*FINAL_VERDICTS, IN_PROGRESS)
CHECK_STATUSES = (PASS, FAIL, SKIP, ERROR)
MAX_WHOLE = 1 << 30  # counts (tokens, ub): larger is not a value a board measured
PLACEMENT_MODES = MODES_OF_PLACEMENT  # gpu, cpu, hybrid; experts-cpu for MoE models
MAX_EXPERTS = 1 << 16  # experts per layer (Qwen3-30B-A3B has 128)
SERVERS = ("gpu", "cpu")
RUN_STATUSES = ("PASS", "FAIL")
MAX_RATE = 1e6  # tokens/s
MAX_SECONDS = 1e7
MAX_RATIO = 1e6
# A ratio the board reports may be any aggregate of its runs' ratios (one size, a mean, a median):
# it must lie within their range, give or take rounding.
RATIO_SLACK = 0.02


def clean_text(value: str, limit: int = MAX_TEXT) -> str:
    """`value` as plain text: tabs and line breaks become spaces, other control and format
    characters (escape sequences, bidi overrides, zero-width) are removed; cut to `limit`."""
    cut = len(value) > 4 * limit  # a megabyte string is not cleaned to show its first kB
    out = []
    for ch in value[: 4 * limit] if cut else value:
        if ch.isprintable():
            out.append(ch)
        elif ch in "\t\n\r\v\f\u2028\u2029\x85":
            out.append(" ")
    text = "".join(out)
    return text if len(text) <= limit and not cut else text[: limit - 3] + "..."


class ResultError(UserError):
    """The result file is unreadable, truncated or not a self-test result."""


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"an integer of {len(str(abs(value)))} digits"
    try:
        text = json.dumps(value, allow_nan=True)
    except (ValueError, TypeError, RecursionError):
        text = "?"
    text = clean_text(text, 200)
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
            return clean_text(value)
        self.bad(field, value, "a string")
        return default

    def number(
        self,
        obj: dict,
        key: str,
        field: str,
        low: float | None = None,
        high: float | None = None,
        zero_ok: bool = False,
    ) -> float | None:
        """A finite number (low < value <= high when given; 0 too when zero_ok), or None (absent,
        null or malformed)."""
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)  # OverflowError for an integer past float's range
            except OverflowError:
                number = math.inf
            if math.isfinite(number):
                above = low is None or number > low or (zero_ok and number == 0)
                if above and (high is None or number <= high):
                    return number + 0.0  # -0.0 as 0.0
                sign = ">=" if zero_ok else ">"
                want = " and ".join(
                    w
                    for w in (
                        low is not None and f"{sign} {low:g}",
                        high is not None and f"<= {high:g}",
                    )
                    if w
                )
                self.bad(field, value, f"a number {want}")
                return None
        self.bad(field, value, "a finite number")
        return None

    def whole(
        self, obj: dict, key: str, field: str, default: int | None, high: int = MAX_WHOLE
    ) -> int | None:
        value = obj.get(key, default)
        if value is None or (
            isinstance(value, int) and not isinstance(value, bool) and 0 < value <= high
        ):
            return value
        self.bad(field, value, f"a whole number > 0 and <= {high}")
        return default

    def count(self, obj: dict, key: str, field: str, high: int) -> int | None:
        """A whole number 0..high (zero included), or None and a problem (absent too)."""
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high:
            return value
        self.bad(field, value, f"a whole number 0..{high}")
        return None

    def word(self, obj: dict, key: str, field: str, allowed: tuple[str, ...]) -> str | None:
        """One of `allowed`, exactly as written (no cleaning: "P\u200bASS" is not PASS), or None
        and a problem (absent, null or anything else)."""
        value = obj.get(key)
        if isinstance(value, str) and value in allowed:
            return value
        self.bad(field, value, "one of " + ", ".join(allowed))
        return None

    def items(self, raw: list, field: str) -> list:
        """The first MAX_ITEMS entries of a list; more is a problem (no self-test writes it)."""
        if len(raw) > MAX_ITEMS:
            self.problems.append(
                f"{field}: {len(raw)} entries; a self-test writes far fewer: only the first "
                f"{MAX_ITEMS} read"
            )
        return raw[:MAX_ITEMS]

    def mapping(self, doc: dict, key: str) -> dict:
        value = doc.get(key)
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        self.bad(key, value, "an object")
        return {}


def _checks(raw: list, c: _Checker) -> list[dict[str, Any]]:
    """Each check's name (one the self-test has), status and evidence text; a check named twice
    is a problem (which of the two would the report believe?)."""
    checks = []
    seen: set[str] = set()
    for i, item in enumerate(c.items(raw, "checks")):
        field = f"checks[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        before = len(c.problems)
        if item.get("name") is None or item.get("status") is None:
            c.problems.append(f"{field}: no name or no status")
            continue
        name = c.word(item, "name", f"{field}.name", CHECK_ORDER)
        status = c.word(item, "status", f"{field}.status", CHECK_STATUSES)
        evidence = c.text(item, "evidence", f"{field}.evidence")
        if name in seen:
            c.problems.append(f"{field}: a second {name!r} check")
        if len(c.problems) == before and name and status:
            seen.add(name)
            checks.append({"name": name, "status": status, "evidence": evidence})
    return checks


def _sweep(raw: Any, c: _Checker) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        c.bad("sweep", raw, "a list")
        return []
    runs = []
    for i, item in enumerate(c.items(raw, "sweep")):
        field = f"sweep[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        before = len(c.problems)
        mode = item.get("mode")
        if mode is not None and not (isinstance(mode, str) and mode in MODES):
            c.bad(f"{field}.mode", mode, "one of " + ", ".join(MODES))
        ubatch = c.whole(item, "ubatch", f"{field}.ubatch", None)
        status = _status(c, item, f"{field}.status")
        reason = c.text(item, "reason", f"{field}.reason")
        avg_ts = c.number(item, "avg_ts", f"{field}.avg_ts", 0, MAX_RATE)
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
    for i, item in enumerate(c.items(cands, "tune.candidates")):
        field = f"tune.candidates[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        tps = item.get("tps")
        if not isinstance(tps, list):
            c.bad(f"{field}.tps", tps, "a list")
            tps = []
        runs = [
            c.number({"t": t}, "t", f"{field}.tps[{j}]", 0, MAX_RATE)
            for j, t in enumerate(c.items(tps, f"{field}.tps"))
        ]
        rows.append(
            {
                "name": c.text(item, "name", f"{field}.name", "?"),
                "spec": c.text(item, "spec", f"{field}.spec"),
                "builtin": item.get("builtin") is True,
                "runs": len([t for t in runs if t is not None]),
                "median_tps": c.number(item, "median_tps", f"{field}.median_tps", 0, MAX_RATE),
                "status": c.text(item, "status", f"{field}.status", "?"),
                "reason": c.text(item, "reason", f"{field}.reason"),
            }
        )
    return {
        "winner": c.text(raw, "winner", "tune.winner") or None,
        "elapsed_s": c.number(raw, "elapsed_s", "tune.elapsed_s", 0, MAX_SECONDS, zero_ok=True),
        "budget_s": c.number(raw, "budget_s", "tune.budget_s", 0, MAX_SECONDS, zero_ok=True),
        "budget_exhausted": raw.get("budget_exhausted") is True,
        "phase": c.text(raw, "phase", "tune.phase", "?"),
        "candidates": rows,
    }


def _status(c: _Checker, item: dict, field: str) -> str:
    """PASS or FAIL as the board wrote it (not cleaned first: "P\u200bASS" is not PASS);
    anything else is a problem and shows as BAD."""
    status = item.get("status")
    if isinstance(status, str) and status in RUN_STATUSES:
        return status
    c.bad(field, item.get("status"), "PASS or FAIL")
    return "BAD"


def _placement(raw: Any, c: _Checker) -> dict[str, Any] | None:
    """The self-test's placement runs: per mode pp/tg rates and a typical request's time, the
    mode chosen. None when absent; `state` is "malformed" when anything in it was."""
    if raw is None:
        return None
    before = len(c.problems)
    if not isinstance(raw, dict):
        c.bad("placement", raw, "an object")
        return {"state": "malformed", "request": {}, "modes": {}, "experts_per_layer": 0,
                "chosen": None, "reason": ""}  # fmt: skip
    req = raw.get("request")
    if not isinstance(req, dict):
        c.bad("placement.request", req, "an object")
        req = {}
    request = {
        key: c.whole(req, key, f"placement.request.{key}", None, high=10_000_000)
        for key in ("prompt_tokens", "generated_tokens")
    }
    modes_raw = raw.get("modes")
    if not isinstance(modes_raw, dict):
        c.bad("placement.modes", modes_raw, "an object")
        modes_raw = {}
    modes: dict[str, dict[str, Any]] = {}
    names = c.items(list(modes_raw), "placement.modes")
    for name, item in ((n, modes_raw[n]) for n in names):
        field = f"placement.modes.{clean_text(str(name), 40)}"
        if name not in PLACEMENT_MODES:
            c.bad(field, name, "a mode (" + ", ".join(PLACEMENT_MODES) + ")")
            continue
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        got = len(c.problems)
        entry = {
            "status": _status(c, item, f"{field}.status"),
            "pp_tps": c.number(item, "pp_tps", f"{field}.pp_tps", 0, MAX_RATE),
            "tg_tps": c.number(item, "tg_tps", f"{field}.tg_tps", 0, MAX_RATE),
            "request_s": c.number(item, "request_s", f"{field}.request_s", 0, MAX_SECONDS),
            "reason": c.text(item, "reason", f"{field}.reason"),
        }
        missing = [k for k in ("pp_tps", "tg_tps", "request_s") if entry[k] is None]
        if entry["status"] == "PASS" and missing and len(c.problems) == got:
            c.problems.append(f"{field}: status PASS without {', '.join(missing)}")
        if len(c.problems) != got and entry["status"] == "PASS":
            entry["status"] = "BAD"  # a PASS with a broken number is not shown as a PASS
        modes[name] = entry
    # Absent in results from before MoE models were placed: a dense model.
    experts = 0
    if "experts_per_layer" in raw:
        field = "placement.experts_per_layer"
        experts = c.count(raw, "experts_per_layer", field, MAX_EXPERTS)
    if EXPERTS_CPU in modes and not experts:
        c.problems.append(f"placement.modes.{EXPERTS_CPU}: measured on a model without experts")
    chosen = raw.get("chosen")
    if chosen == "":
        chosen = None
    if chosen is not None and not (isinstance(chosen, str) and chosen in PLACEMENT_MODES):
        c.bad("placement.chosen", chosen, "a mode (" + ", ".join(PLACEMENT_MODES) + ")")
        chosen = None
    elif chosen is not None and chosen != "cpu":
        # The CPU is the board's fallback (GPU checks failed, nothing measured); any other
        # choice must be a passing mode with the least request time.
        timed = {m: e["request_s"] for m, e in modes.items() if e["status"] == "PASS"}
        if chosen not in timed:
            c.problems.append(f"placement.chosen: {chosen} has no passing measurement")
        elif timed[chosen] > min(timed.values()) * (1 + RATIO_SLACK):
            best = min(timed, key=lambda m: timed[m])
            c.problems.append(
                f"placement.chosen: {chosen} ({timed[chosen]:.1f} s) although {best} takes "
                f"{timed[best]:.1f} s"
            )
    return {
        "state": "malformed" if len(c.problems) != before else "ok",
        "request": request,
        "modes": modes,
        "experts_per_layer": experts or 0,
        "chosen": chosen,
        "reason": c.text(raw, "reason", "placement.reason"),
    }


def serving_pairs(runs: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """{prompt_tokens: {server: run}} of the serving runs (the last run of a pair wins)."""
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        pairs.setdefault(run["prompt_tokens"], {})[run["server"]] = run
    return dict(sorted(pairs.items()))


def _measured_ratios(runs: list[dict[str, Any]], key: str) -> list[float]:
    """GPU / CPU of `key` at each prompt size where both servers passed."""
    out = []
    for pair in serving_pairs(runs).values():
        gpu, cpu = pair.get("gpu"), pair.get("cpu")
        if gpu and cpu and gpu["status"] == cpu["status"] == "PASS":
            out.append(gpu[key] / cpu[key])
    return out


def _serving(raw: Any, c: _Checker) -> dict[str, Any] | None:
    """The GPU server against the CPU server: TTFT and decode per prompt size, the ratios and the
    goal. `goal_met` is True only when the ratios meet the goal and the runs bear them out."""
    if raw is None:
        return None
    before = len(c.problems)
    empty = {"state": "malformed", "runs": [], "ttft_ratio": None, "decode_ratio": None,
             "goal": {"ttft_ratio_max": None, "decode_ratio_min": None}, "goal_met": None,
             "goal_why": "the serving section is malformed"}  # fmt: skip
    if not isinstance(raw, dict):
        c.bad("serving", raw, "an object")
        return empty
    runs_raw = raw.get("runs")
    if not isinstance(runs_raw, list):
        c.bad("serving.runs", runs_raw, "a list")
        runs_raw = []
    runs = []
    for i, item in enumerate(c.items(runs_raw, "serving.runs")):
        field = f"serving.runs[{i}]"
        if not isinstance(item, dict):
            c.bad(field, item, "an object")
            continue
        got = len(c.problems)
        server = item.get("server")
        if not (isinstance(server, str) and server in SERVERS):
            c.bad(f"{field}.server", item.get("server"), "gpu or cpu")
        run = {
            "server": server,
            "prompt_tokens": c.whole(
                item, "prompt_tokens", f"{field}.prompt_tokens", None, high=10_000_000
            ),  # fmt: skip
            "ttft_s": c.number(item, "ttft_s", f"{field}.ttft_s", 0, MAX_SECONDS),
            "decode_tps": c.number(item, "decode_tps", f"{field}.decode_tps", 0, MAX_RATE),
            "status": _status(c, item, f"{field}.status"),
            "reason": c.text(item, "reason", f"{field}.reason"),
        }
        if run["prompt_tokens"] is None and len(c.problems) == got:
            c.problems.append(f"{field}: no prompt_tokens")
        missing = [k for k in ("ttft_s", "decode_tps") if run[k] is None]
        if run["status"] == "PASS" and missing and len(c.problems) == got:
            c.problems.append(f"{field}: status PASS without {', '.join(missing)}")
        if len(c.problems) == got:
            runs.append(run)
    ttft = c.number(raw, "ttft_ratio", "serving.ttft_ratio", 0, MAX_RATIO)
    decode = c.number(raw, "decode_ratio", "serving.decode_ratio", 0, MAX_RATIO)
    goal_raw = raw.get("goal")
    if not isinstance(goal_raw, dict):
        c.bad("serving.goal", goal_raw, "an object")
        goal_raw = {}
    goal = {
        "ttft_ratio_max": c.number(
            goal_raw, "ttft_ratio_max", "serving.goal.ttft_ratio_max", 0, MAX_RATIO
        ),  # fmt: skip
        "decode_ratio_min": c.number(
            goal_raw, "decode_ratio_min", "serving.goal.decode_ratio_min", 0, MAX_RATIO
        ),  # fmt: skip
    }
    # The board's ratios must be what its runs show (some aggregate of the per-size ratios).
    for name, value, key in (("ttft_ratio", ttft, "ttft_s"), ("decode_ratio", decode,
                                                                "decode_tps")):  # fmt: skip
        measured = _measured_ratios(runs, key)
        if value is not None and measured:
            low, high = min(measured), max(measured)
            if not low * (1 - RATIO_SLACK) <= value <= high * (1 + RATIO_SLACK):
                c.problems.append(
                    f"serving.{name}: {value:.3g} is not what the runs show "
                    f"(GPU/CPU {low:.3g} to {high:.3g})"
                )
    state = "malformed" if len(c.problems) != before else "ok"
    met, why = _goal(state, runs, ttft, decode, goal)
    return {"state": state, "runs": runs, "ttft_ratio": ttft, "decode_ratio": decode,
            "goal": goal, "goal_met": met, "goal_why": why}  # fmt: skip


def _goal(state, runs, ttft, decode, goal) -> tuple[bool | None, str]:
    """(True / False / None for "cannot tell", why)."""
    if state != "ok":
        return None, "not judged: the serving section is malformed"
    if not _measured_ratios(runs, "ttft_s"):
        return None, "not judged: no prompt size where both servers passed"
    if any(r["status"] != "PASS" for r in runs):
        return False, "not met: a serving run failed"
    if None in (ttft, decode, goal["ttft_ratio_max"], goal["decode_ratio_min"]):
        return None, "not judged: a ratio or the goal is missing"
    ok_ttft = ttft <= goal["ttft_ratio_max"]
    ok_decode = decode >= goal["decode_ratio_min"]
    if ok_ttft and ok_decode:
        return True, "met"
    missed = [w for w, ok in (("TTFT", ok_ttft), ("decode", ok_decode)) if not ok]
    return False, "not met: " + " and ".join(missed)


def check_result(doc: dict[str, Any], path: Path) -> tuple[dict[str, Any], list[str]]:
    """The document with every field the report reads in its type, and the problems found."""
    where = shown(path)
    for key in ("verdict", "checks"):
        if key not in doc:
            raise ResultError(f"{where}: result has no {key!r}: the run did not finish writing it")
    c = _Checker()
    verdict = doc["verdict"]
    if not isinstance(verdict, str):
        raise ResultError(f'{where}: verdict is {_show(verdict)}, not a string like "PASS"')
    if not isinstance(doc["checks"], list):
        raise ResultError(f"{where}: checks is {_show(doc['checks'])}, not a list of checks")
    if c.word(doc, "verdict", "verdict", VERDICTS) is None:
        verdict = clean_text(verdict, 40)  # shown, never taken for one of VERDICTS
    ratio_raw = c.mapping(doc, "ratio")
    ratio: dict[str, Any] = {
        k: c.number(ratio_raw, k, f"ratio.{k}", 0, MAX_RATE if k.endswith("_tps") else MAX_RATIO)
        for k in RATIO_NUMBERS
    }
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
        "placement": _placement(doc.get("placement"), c),
        "serving": _serving(doc.get("serving"), c),
        "speculative": spec_section(doc.get("speculative"), c),
        "cluster": cluster_section(doc.get("cluster"), c),
        "cts": cts_section(doc.get("cts"), c),
        "driver": _driver(doc.get("driver"), c),
    }
    return clean, c.problems


def _driver(raw: Any, c: _Checker) -> dict[str, Any] | None:
    """`rocky-selftest driver`'s section (host/driver_report.py)."""
    from rocky_vulkan.host.driver_report import check_driver

    return check_driver(raw, c)


WANTED = "self-test result"  # read_regular: "pass the path of the self-test result file"


def _parse(text: str, where: str, duplicates: list[str]) -> Any:
    """JSON, every key given twice in one object noted in `duplicates`."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    duplicates.append(f"the key {_show(key)} is given twice in one object")
                seen.add(key)
        return obj

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise ResultError(f"{where}: nested too deeply to be a self-test result") from None
    except json.JSONDecodeError as err:
        cut = not text.rstrip().endswith("}")
        hint = " (the file does not end with '}': truncated? copy it again)" if cut else ""
        raise ResultError(
            f"{where}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}{hint}"
        ) from None
    except ValueError as err:  # e.g. an integer of 5000 digits
        raise ResultError(f"{where}: not a self-test result: {clean_text(str(err), 200)}") from None


def load_result(path: Path) -> dict[str, Any]:
    """The parsed, type-checked result; `problems` lists what was malformed (maybe nothing)."""
    where = shown(path)
    try:
        text = read_regular(path, MAX_RESULT_BYTES, WANTED).decode("utf-8")
    except NotReadable as err:
        if err.why == "missing":
            raise ResultError(
                f"{where}: no such file; copy /var/lib/rocky-selftest/result.json from the board "
                "(`rocky-vulkan board HOST` fetches it)"
            ) from None
        raise ResultError(str(err)) from None
    except UnicodeDecodeError as err:
        raise ResultError(
            f"{where}: not UTF-8 text (byte {err.start}): not a self-test result"
        ) from None
    duplicates: list[str] = []
    doc = _parse(text, where, duplicates)
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise ResultError(f'{where}: not a rocky-selftest result (no "schema": "{RESULT_SCHEMA}")')
    version = doc.get("schema_version")
    if type(version) is not int or version != RESULT_SCHEMA_VERSION:
        raise ResultError(
            f"{where}: result schema_version {_show(version)}; this tool reads "
            f"{RESULT_SCHEMA_VERSION}: use the rocky-vulkan version that matches the image"
        )
    return checked(doc, path, duplicates)


def checked(
    doc: dict[str, Any], path: Path = Path("result.json"), duplicates: list[str] | None = None
) -> dict[str, Any]:
    """`doc` type-checked, with `problems` listing what was malformed (first any `duplicates`,
    keys the file gives twice); a checked doc as it is."""
    if "problems" in doc:
        return doc
    clean, problems = check_result(doc, path)
    clean["problems"] = (duplicates or []) + problems
    return clean
