"""Issue 22, area "report": hostile result documents and paths through `rocky-vulkan report`.

Every case writes a real result.json (a valid one from the report tests, one field made hostile)
and runs the real code: `rocky-vulkan report` (cli.main, in this process, stdout and stderr
captured) where the plots matter, else `load_result` and `show` without plots, the functions the
CLI and `rocky-vulkan board` call (ten times faster: the plots are most of a report's time).

A case HELD when nothing escaped, the output holds no control character but the newline (the
console is not a terminal, so rich adds none of its own), there is exactly one line starting
"VERDICT", it says PASS exactly when the exit code is 0, a result that is not
a PASS is not shown as one, text that is shown is shown literally, and a written plot is a PNG
whose text was not read as mathtext. It was REFUSED when the exit code is 2 with one
"rocky-vulkan: error:" line and nothing else half-done (no plot, no verdict)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rocky_vulkan.host.report import EVIDENCE_CHECKS

from tests.helpers.adversary import Case, Outcome
from tests.helpers.project import ROOT

AREA = "report"
CONFIG = ROOT / "rocky-vulkan.yaml"
FAKE = "VERDICT: PASS — every check passed on the board"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VERDICT_LINE = re.compile(r"^\s*VERDICT\b")
OWN_MATH = re.compile(r"\$\\mathdefault\{[-0-9.^{}\\times ]*\}\$")  # log-axis tick labels

# ---------------------------------------------------------------------------------------------
# The valid documents every case starts from.

CHECK_AT = {name: i for i, name in enumerate(EVIDENCE_CHECKS)}  # what a PASS needs
CRASHED_RUN = 4 * 3 + 1  # the FAIL document's stock run at ub 1024 (ub-major, tuned/stock/cpu)


def _tune() -> dict[str, Any]:
    """A tune section shaped like rocky_selftest.tune's summary; the t/s are test inputs."""
    cands = []
    for i, (name, tps) in enumerate((("builtin", 27.0), ("c1", 31.5), ("c2", None))):
        cands.append(
            {"name": name, "spec": f"spec-{i}", "builtin": i == 0,
             "tps": [tps] * 3 if tps else [], "median_tps": tps,
             "status": "ok" if tps else "failed", "reason": None if tps else "out of memory"}
        )  # fmt: skip
    return {"phase": "done", "winner": "c1", "budget_s": 3600, "elapsed_s": 1200.0,
            "budget_exhausted": False, "candidates": cands}  # fmt: skip


def base(passing: bool) -> dict[str, Any]:
    """A full result (checks, sweep, ratio, placement, serving, tune): PASS, or FAIL with the
    stock run at ub 1024 crashed."""
    from tests.host.test_report import _doc
    from tests.host.test_report_serving import good_placement, good_serving

    doc = _doc(crash_at=None if passing else 1024)
    doc.update(placement=good_placement(), serving=good_serving(), tune=_tune())
    doc["model"] = {"path": "/usr/share/rocky-llm/models/model.gguf"}
    doc["thresholds"] = {"prompt_tokens": 512}
    return doc


def _set(doc: dict, path: str, value: Any) -> dict:
    """`doc` with the field at the dotted `path` (list items by index) set to `value`."""
    *keys, last = path.split(".")
    obj: Any = doc
    for key in keys:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value
    return doc


RAW = "@@RAW@@"  # a string value replaced by raw JSON text (numbers json.dumps cannot write)


def dump(doc: dict, raw: str | None = None) -> bytes:
    text = json.dumps(doc)
    if raw is not None:
        text = text.replace(json.dumps(RAW), raw)
    return text.encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------------
# Running the real code.


@dataclass
class Run:
    rc: int
    out: str
    err: str
    pngs: dict[str, bytes]  # plot files written (name -> bytes)
    math: list[str]  # plot texts that matplotlib would parse as mathtext


@cache
def _config():
    from rocky_vulkan.config import load_config

    return load_config(CONFIG)


@contextlib.contextmanager
def _captured(columns: int = 80):
    """stdout/stderr into buffers, a console width that does not depend on who runs this."""
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


@contextlib.contextmanager
def _watch_math(found: list[str]):
    """Record every text of a saved figure that matplotlib rendered as mathtext, but its own
    log-axis tick labels (an observer around Figure.savefig; the figure is saved as it is)."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    real = Figure.savefig

    def savefig(fig, *args, **kwargs):
        done = real(fig, *args, **kwargs)  # drawn: every tick label exists now
        for t in fig.findobj(Text):
            text = t.get_text()
            if "$" in text and t._preprocess_math(text)[1] and not OWN_MATH.fullmatch(text):
                found.append(text)
        return done

    Figure.savefig = savefig
    try:
        yield
    finally:
        Figure.savefig = real


def run_cli(args: list[str], folder: Path) -> Run:
    """`rocky-vulkan --config CONFIG report ARGS` in this process."""
    from rocky_vulkan.cli import main

    before = {p.name for p in folder.iterdir()}
    math: list[str] = []
    with _captured() as (out, err), _watch_math(math):
        try:
            rc = main(["--config", str(CONFIG), "report", *args])
        except SystemExit as stop:  # argparse's own refusals
            rc = stop.code if isinstance(stop.code, int) else 2
    pngs = {}
    for p in folder.iterdir():
        if p.name not in before and p.is_file() and not p.is_symlink():
            pngs[p.name] = p.read_bytes()[:8]
    return Run(rc, out.getvalue(), err.getvalue(), pngs, math)


def run_text(path: Path, console=None) -> Run:
    """load_result + show without plots: what `report` and `board` print."""
    from rocky_vulkan.errors import UserError
    from rocky_vulkan.host.report import show
    from rocky_vulkan.host.result_doc import load_result

    with _captured() as (out, err):
        try:
            rc = show(load_result(path), _config(), None, console)
        except UserError as e:  # what cli._dispatch does with it
            print(f"rocky-vulkan: error: {e}", file=err)
            rc = e.exit_code
    return Run(rc, out.getvalue(), err.getvalue(), {}, [])


# ---------------------------------------------------------------------------------------------
# Judging what it printed.


def _controls(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c != "\n" and not c.isprintable()})


def judge(run: Run, expect: str = "any", shown: tuple[str, ...] = ()) -> tuple[Outcome, str]:
    """expect: "pass" (a good result must stay PASS), "fail" (must not be PASS) or "any"."""
    text = run.out + run.err
    if "Traceback (most recent call last)" in text:
        return Outcome.TRACEBACK, text[-300:]
    bad = _controls(text)
    if bad:
        return Outcome.WRONG, f"control characters reached the output: {', '.join(bad[:8])}"
    if run.math:
        return Outcome.WRONG, f"plot text read as mathtext: {run.math[0][:80]!r}"
    lines = run.out.splitlines()
    verdicts = [ln for ln in lines if VERDICT_LINE.match(ln)]
    if run.rc == 2:
        errs = run.err.strip().splitlines()
        if not errs or not errs[0].startswith("rocky-vulkan: error: ") or verdicts or run.pngs:
            return Outcome.WRONG, f"exit 2 without one clear error: {text[-300:]!r}"
        if expect == "pass":
            return Outcome.WRONG, f"a good result refused: {errs[0][:200]}"
        return Outcome.REFUSED, errs[0][:200]
    if run.rc not in (0, 1):
        return Outcome.WRONG, f"exit code {run.rc}"
    if len(verdicts) != 1:
        shown_v = [v.strip()[:60] for v in verdicts]
        return Outcome.WRONG, f"{len(verdicts)} VERDICT lines: {shown_v}"
    says_pass = verdicts[0].startswith("VERDICT: PASS")
    if says_pass != (run.rc == 0):
        return Outcome.WRONG, f"exit {run.rc} with {verdicts[0][:60]!r}"
    if expect == "fail" and run.rc == 0:
        return Outcome.WRONG, "PASS not earned: " + verdicts[0][:80]
    if expect == "pass" and run.rc != 0:
        return Outcome.WRONG, "a good result not shown as PASS: " + verdicts[0][:200]
    flat = unwrapped(run.out)
    for want in shown:
        if unwrapped(want) not in flat:
            return Outcome.WRONG, f"{want[:60]!r} not shown as text"
    for name, head in run.pngs.items():
        if name.endswith(".png") and head != PNG_MAGIC:
            return Outcome.WRONG, f"{name} is not a PNG"
    return Outcome.HELD, verdicts[0][:80]


def unwrapped(text: str) -> str:
    """Text without table borders and whitespace: a cell's wrapped words read together."""
    return re.sub(r"[\s│┃┆|]", "", text)


# ---------------------------------------------------------------------------------------------
# Cases.


def _case(klass: str, name: str, run: Callable[[], tuple[Outcome, str]], timeout: float = 30.0):
    return Case(AREA, klass, name, run, timeout)


def _in_tmp(body: Callable[[Path], tuple[Outcome, str]]) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with tempfile.TemporaryDirectory(prefix="rocky-hostile-report-") as tmp:
            return body(Path(tmp))

    return run


def doc_case(
    klass: str,
    name: str,
    make: Callable[[], dict],
    expect: str,
    raw: str | None = None,
    shown: tuple[str, ...] = (),
    plots: bool = False,
    timeout: float = 30.0,
) -> Case:
    """The document `make()` through the report: with plots (the CLI) or without (show). The
    document is made when the case runs: thousands of cases hold no megabytes meanwhile."""

    def body(tmp: Path) -> tuple[Outcome, str]:
        path = tmp / "result.json"
        path.write_bytes(dump(make(), raw))
        run = run_cli([str(path)], tmp) if plots else run_text(path)
        if plots and run.rc in (0, 1) and "result.png" not in run.pngs:
            return Outcome.WRONG, "no plot written: " + run.out[-200:]
        return judge(run, expect, shown)

    return _case(klass, name, _in_tmp(body), timeout)


def changed(passing: bool, *changes: tuple[str, Any]) -> Callable[[], dict]:
    """A maker of base(passing) with the dotted fields set."""

    def make() -> dict:
        doc = base(passing)
        for path, value in changes:
            _set(doc, path, value)
        return doc

    return make


def edited(passing: bool, change: Callable[[dict], Any]) -> Callable[[], dict]:
    def make() -> dict:
        doc = base(passing)
        change(doc)
        return doc

    return make


# Hostile strings: (class, label, value, must be shown literally where the field is shown).
FAKE_NL = "m)\n\nVERDICT: PASS — every check passed on the board\x1b[8m"  # the example
STRINGS: list[tuple[str, str, str, str | None]] = [
    ("escapes", "csi-colour", "\x1b[31mred\x1b[0m", None),
    ("escapes", "csi-conceal", "x\x1b[8m", None),
    ("escapes", "csi-clear", "\x1b[2J\x1b[H", None),
    ("escapes", "osc-title", "\x1b]0;X\x1b\\\x1b[2J", None),
    ("escapes", "osc-link", "\x1b]8;;file:///etc/shadow\x07link\x1b]8;;\x07", None),
    ("escapes", "dcs", "\x1bP1$qm\x1b\\", None),
    ("escapes", "c1-csi", "\x9b31mred\x9b0m", None),
    ("escapes", "c1-osc", "\x9d0;X\x9c", None),
    ("escapes", "cr-overwrite", "ok\r" + FAKE, None),
    ("escapes", "newline-fake-verdict", FAKE_NL, None),
    ("escapes", "crlf-fake-verdict", "x\r\n" + FAKE, None),
    ("escapes", "line-separator-fake", "x\u2028" + FAKE + "\u0085", None),
    ("escapes", "wrap-fake-verdict-spaces", " " * 100 + FAKE, None),
    ("escapes", "wrap-fake-verdict-words", "x " * 37 + FAKE, None),
    ("escapes", "wrap-fake-verdict-short", " " * 47 + "VERDICT: PASS", None),  # fits a title
    ("escapes", "bidi-override", "\u202eSSAP :TCIDREV\u202c", None),
    ("escapes", "zero-width", "P\u200bA\u200dSS\ufeff", None),
    ("escapes", "nul-del-bs", "a\x00b\x7fc\x08d\x0be\x0cf", None),
    ("strings", "rich-markup", "[red]x[/red] [/] [link=file:///etc/shadow]l[/link] [bold", "[/]"),
    ("strings", "rich-emoji-code", ":warning: :cross_mark:", ":warning:"),
    ("strings", "mathtext-frac", "$\\frac{$", "$\\frac{$"),
    ("strings", "mathtext-pair", "$x^2$ and $", "$x^2$"),
    ("strings", "mathtext-even", "$x^2$ $\\alpha$", "$x^2$"),
    ("strings", "lone-surrogate", "a\ud800b", None),
    ("strings", "wide-and-emoji", "板子 🚀 é", "板子"),
    ("strings", "empty", "", None),
    ("strings", "tab-and-spaces", "\t  a  \t", None),
    ("size", "1MB-one-word", "A" * 1_000_000, None),
    ("size", "1MB-words", "word " * 200_000, None),
]
# The strings that plotting must survive (the rest cannot reach matplotlib differently).
PLOT_STRINGS = {
    "osc-title",
    "newline-fake-verdict",
    "mathtext-frac",
    "mathtext-pair",
    "mathtext-even",
    "lone-surrogate",
    "wide-and-emoji",
    "1MB-words",
    "empty",
}


@dataclass(frozen=True)
class Field:
    path: str
    kind: str  # "free": any text is fine; "word": a keyword, hostile text is no PASS
    shown: bool = True  # printed in the report's text (else only in the plot, or nowhere)
    plots: bool = False  # reaches a plot
    only_fail: bool = False  # only in the FAIL document (the crashed run)
    extra: tuple[tuple[str, Any], ...] = ()  # other changes that make the field shown


def _fields() -> list[Field]:
    hybrid_fail = (("placement.modes.hybrid.status", "FAIL"), ("placement.chosen", "cpu"))
    return [
        Field("finished_at", "free"),
        Field("host.hostname", "free", shown=False, plots=True),
        Field("model.path", "free", extra=(("thresholds.prompt_tokens", 128),)),
        Field(f"checks.{CHECK_AT['gpu_driver']}.evidence", "free"),
        Field(f"checks.{CHECK_AT['output_match']}.evidence", "free"),
        Field(f"sweep.{CRASHED_RUN}.reason", "free", shown=False, plots=True, only_fail=True),
        Field("placement.reason", "free"),
        Field("placement.modes.hybrid.reason", "free", extra=hybrid_fail),
        Field("serving.runs.0.reason", "free", extra=(("serving.runs.0.status", "FAIL"),)),
        Field("tune.phase", "free"),
        Field("tune.candidates.2.reason", "free"),
        Field("tune.candidates.2.status", "free"),
        Field("tune.candidates.1.name", "free", plots=True, extra=(("tune.winner", None),)),
        Field("tune.winner", "free", shown=False, plots=True),
        Field("tune.candidates.0.spec", "free", shown=False),
        Field("verdict", "word", shown=False, plots=True),
        Field(f"checks.{CHECK_AT['gpu_driver']}.name", "word", shown=False),
        Field(f"checks.{CHECK_AT['gpu_driver']}.status", "word", shown=False),
        Field(f"checks.{CHECK_AT['sweep']}.status", "word", shown=False),
        Field("sweep.0.mode", "word", shown=False, plots=True),
        Field("sweep.0.status", "word", shown=False, plots=True),
        Field("placement.chosen", "word", shown=False),
        Field("placement.modes.gpu.status", "word", shown=False),
        Field("serving.runs.0.server", "word", shown=False),
        Field("serving.runs.0.status", "word", shown=False),
    ]


def string_cases() -> Iterator[Case]:
    for f in _fields():
        for klass, label, value, literal in STRINGS:
            for passing in (True, False):
                if f.only_fail and passing:
                    continue
                make = changed(passing, *f.extra, (f.path, value))
                if not passing:
                    expect = "fail"
                elif f.kind == "word" and f.path.startswith(("verdict", "checks")):
                    expect = "fail" if value != "PASS" else "pass"
                elif f.kind == "word":
                    expect = "any"
                elif f.path.endswith(".evidence") and not value.strip():
                    expect = "fail"  # a PASS without its evidence text
                else:
                    expect = "pass"
                shown = (literal,) if literal and f.shown else ()
                plots = f.plots and label in PLOT_STRINGS and not passing
                where = "plot" if plots else "text"
                name = f"{f.path}={label}:{'pass' if passing else 'fail'}-doc:{where}"
                yield doc_case(klass, name, make, expect, shown=shown, plots=plots)


# Hostile numbers as raw JSON text.
NUMBERS = {
    "400-digits": "9" * 400,
    "minus-400-digits": "-" + "9" * 400,
    "2**70": str(2**70),
    "2**63": str(2**63),
    "2**31": str(2**31),
    "4000-digits": "9" * 4000,
    "5000-digits": "9" * 5000,
    "1e400": "1e400",
    "1e308": "1e308",
    "minus-1e308": "-1e308",
    "5e-324": "5e-324",
    "minus-1": "-1",
    "zero": "0",
    "minus-zero": "-0",
    "minus-zero-float": "-0.0",
    "half": "0.5",
    "float-64": "64.0",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "minus-Infinity": "-Infinity",
    "true": "true",
    "false": "false",
    "null": "null",
    "string-12": '"12"',
    "list": "[]",
    "list-of-1": "[1]",
    "object": "{}",
}
# Values that pass a range check somewhere: the plots must draw them.
PLOT_NUMBERS = ("5e-324", "1e308", "2**31", "2**70", "400-digits", "half", "minus-zero-float")

# (low, high, whole, zero too): the values the self-test can write.
RATE, SECS, RATIO = (0, 1e6, False, False), (0, 1e7, False, False), (0, 1e6, False, False)
SECS0 = (0, 1e7, False, True)  # the tuner's elapsed time and budget may be 0
WHOLE, WHOLE7 = (1, 2**30, True, False), (1, 10_000_000, True, False)
NUMBER_FIELDS: dict[str, tuple[tuple, bool]] = {  # (range, plots)
    "sweep.0.avg_ts": (RATE, True),
    "sweep.0.ubatch": (WHOLE, True),
    "ratio.tuned_tps": (RATE, False),
    "ratio.stock_tps": (RATE, False),
    "ratio.cpu_tps": (RATE, False),
    "ratio.ratio": (RATIO, False),
    "ratio.required_ratio": (RATIO, False),
    "ratio.prompt_tokens": (WHOLE, False),
    "thresholds.prompt_tokens": (WHOLE, True),
    "placement.request.prompt_tokens": (WHOLE7, True),
    "placement.modes.gpu.pp_tps": (RATE, False),
    "placement.modes.gpu.request_s": (SECS, True),
    "serving.runs.0.ttft_s": (SECS, True),
    "serving.runs.0.decode_tps": (RATE, True),
    "serving.runs.0.prompt_tokens": (WHOLE7, True),
    "serving.ttft_ratio": (RATIO, False),
    "serving.goal.decode_ratio_min": (RATIO, False),
    "tune.candidates.1.median_tps": (RATE, True),
    "tune.candidates.1.tps.0": (RATE, False),
    "tune.elapsed_s": (SECS0, False),
    "tune.budget_s": (SECS0, False),
}


def _valid(raw: str, rng: tuple) -> bool:
    """Whether the self-test could have written `raw` here (null: the field left out)."""
    low, high, whole, zero_ok = rng
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if whole:
        return isinstance(value, int) and low <= value <= high
    return (low < value or (zero_ok and value == 0)) and value <= high


def number_cases() -> Iterator[Case]:
    for path, (rng, plots) in NUMBER_FIELDS.items():
        for label, raw in NUMBERS.items():
            valid = _valid(raw, rng)
            # a malformed number is no PASS; one in range keeps the PASS if the data bear it
            expect = "any" if valid else "fail"
            name = f"{path}={label}:pass-doc:text"
            yield doc_case("numbers", name, changed(True, (path, RAW)), expect, raw=raw)
            if plots and label in PLOT_NUMBERS:
                name = f"{path}={label}:fail-doc:plot"
                make = changed(False, (path, RAW))
                yield doc_case("numbers", name, make, "fail", raw=raw, plots=True)
    # the schema version must be exactly 1
    for label, raw in NUMBERS.items():
        make = changed(True, ("schema_version", RAW))
        yield doc_case("numbers", f"schema_version={label}", make, "fail", raw=raw)


def evidence_cases() -> Iterator[Case]:
    bare = {"schema": "rocky-selftest-result", "schema_version": 1, "verdict": "PASS", "checks": []}
    yield doc_case("evidence", "bare-pass-no-checks", lambda: bare, "fail")
    yield doc_case("evidence", "bare-pass-checks-null", lambda: dict(bare, checks=None), "fail")
    all_names = list(CHECK_AT)
    variants: list[tuple[str, Callable[[dict], None]]] = [
        ("every-check-skip", lambda d: [c.update(status="SKIP") for c in d["checks"]]),
        ("no-checks", lambda d: d.update(checks=[])),
        ("no-sweep-runs", lambda d: d.update(sweep=[])),
        ("sweep-null", lambda d: d.update(sweep=None)),
        ("sweep-run-failed", lambda d: d["sweep"][3].update(status="FAIL", reason="crash")),
        ("ratio-numbers-missing", lambda d: d.update(ratio={"prompt_tokens": 512})),
        ("ratio-null", lambda d: d.update(ratio=None)),
        ("ratio-below-required", lambda d: d["ratio"].update(tuned_tps=6.0, ratio=6.0 / 5.8)),
        ("ratio-not-tuned-over-stock", lambda d: d["ratio"].update(ratio=9.0)),
        ("ratio-tuned-below-cpu", lambda d: d["ratio"].update(cpu_tps=40.0)),
        ("evidence-text-empty", lambda d: d["checks"][0].update(evidence="")),
        ("evidence-text-missing", lambda d: d["checks"][7].pop("evidence")),
        ("check-twice-pass-and-fail", lambda d: d["checks"].append(
            {"name": "gpu_driver", "status": "FAIL", "evidence": "no panthor"})),
        ("check-twice-pass-and-skip", lambda d: d["checks"].append(
            {"name": "gpu_driver", "status": "SKIP", "evidence": "skipped"})),
        ("unknown-status", lambda d: d["checks"][0].update(status="OK")),
        ("lowercase-pass", lambda d: d["checks"][0].update(status="pass")),
        ("verdict-lowercase", lambda d: d.update(verdict="pass")),
        ("verdict-in-progress", lambda d: d.update(verdict="IN-PROGRESS")),
        ("verdict-error-checks-pass", lambda d: d.update(verdict="ERROR")),
        ("verdict-padded", lambda d: d.update(verdict=" PASS ")),
        ("serving-check-failed", lambda d: d["checks"].append(
            {"name": "serving", "status": "FAIL", "evidence": "TTFT not met"})),
    ]  # fmt: skip
    for name in all_names:
        variants.append((f"{name}-missing", lambda d, n=name: d.update(
            checks=[c for c in d["checks"] if c["name"] != n])))  # fmt: skip
        for status in ("SKIP", "ERROR", "FAIL", None):
            variants.append((f"{name}-{status}", lambda d, n=name, s=status: [
                c.update(status=s) for c in d["checks"] if c["name"] == n]))  # fmt: skip
    for label, change in variants:
        yield doc_case("evidence", label, edited(True, change), "fail")
    # sweep_modes is the board's setting: a sweep of one mode is still a sweep
    one_mode = edited(True, lambda d: d.update(sweep=[r for r in d["sweep"] if r["mode"] == "cpu"]))
    yield doc_case("evidence", "sweep-one-mode-only", one_mode, "pass")
    yield doc_case("evidence", "control-the-good-pass", changed(True), "pass")
    yield doc_case("evidence", "control-the-good-pass-plots", changed(True), "pass", plots=True)
    # duplicate keys: the file says two things; the report must not pick the PASS
    text = json.dumps(base(False))
    dup = text[:-1] + ', "verdict": "PASS"}'
    yield _text_case("evidence", "duplicate-verdict-key", dup, "fail")
    checks = json.dumps(base(False)["checks"][: CHECK_AT["sweep"]] + [
        {"name": "sweep", "status": "PASS", "evidence": "x"}])  # fmt: skip
    dup_checks = text[:-1] + f', "checks": {checks}' + "}"
    yield _text_case("evidence", "duplicate-checks-key", dup_checks, "fail")
    inner = text.replace('"status": "FAIL"', '"status": "FAIL", "status": "PASS"')
    yield _text_case("evidence", "duplicate-status-key", inner, "fail")


def _text_case(klass: str, name: str, text: str | bytes | Callable[[], str], expect: str,
               plots: bool = False, timeout: float = 30.0) -> Case:  # fmt: skip
    """Raw file content (or a maker of it) through the report."""

    def body(tmp: Path) -> tuple[Outcome, str]:
        data = text() if callable(text) else text
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        path = tmp / "result.json"
        path.write_bytes(data)
        run = run_cli([str(path)], tmp) if plots else run_text(path)
        return judge(run, expect)

    return _case(klass, name, _in_tmp(body), timeout)


def size_cases() -> Iterator[Case]:
    doc = json.dumps(base(True))
    yield _text_case("size", "9MiB-of-spaces", lambda: doc + " " * (9 << 20), "fail")
    yield _text_case("size", "invalid-utf8", doc.replace("rock-5-itx", "\xff") .encode(
        "latin-1", "replace"), "fail")  # fmt: skip
    yield _text_case("size", "utf8-bom", "\ufeff" + doc, "any")
    yield _text_case("size", "empty-file", "", "fail")
    for depth in (500, 5000, 100_000):
        nested = "[" * depth + "]" * depth
        yield _text_case("size", f"nested-{depth}-deep-hostname",
                         doc.replace('"rock-5-itx"', nested), "fail")  # fmt: skip
        yield _text_case("size", f"nested-{depth}-deep-document", nested, "fail")

    def times(path: str, n: int) -> Callable[[dict], None]:
        def change(d: dict) -> None:
            *keys, last = path.split(".")
            obj = d
            for k in keys:
                obj = obj[k]
            obj[last] = obj[last] * n

        return change

    yield doc_case(
        "size",
        "300k-sweep-runs",
        edited(True, times("sweep", 20_000)),
        "any",
        plots=True,
        timeout=20,
    )  # about 7 MB
    yield doc_case(
        "size",
        "3M-malformed-sweep-runs",
        edited(True, lambda d: d.update(sweep=[1] * 3_000_000)),
        "fail",
        timeout=20,
    )  # 6 MB
    yield doc_case("size", "320k-checks", edited(True, times("checks", 40_000)), "any", timeout=20)
    yield doc_case(
        "size",
        "90k-tune-candidates",
        edited(True, times("tune.candidates", 30_000)),
        "any",
        plots=True,
        timeout=20,
    )
    yield doc_case(
        "size",
        "60k-serving-runs",
        edited(True, times("serving.runs", 10_000)),
        "any",
        plots=True,
        timeout=20,
    )
    yield doc_case(
        "size",
        "45k-distinct-ubatch",
        edited(
            True,
            lambda d: d.update(
                sweep=[dict(r, ubatch=i + 1) for i, r in enumerate(d["sweep"] * 3000)]
            ),
        ),
        "any",
        plots=True,
        timeout=20,
    )
    yield _text_case(
        "size",
        "500k-keys",
        lambda: "{" + ", ".join(f'"k{i}": 0' for i in range(500_000)) + ", " + doc[1:],
        "any",
        timeout=20,
    )
    yield doc_case(
        "size",
        "1MB-hostname-plot",
        changed(False, ("host.hostname", "h" * (1 << 20))),
        "fail",
        plots=True,
        timeout=20,
    )


def _special(kind: str, tmp: Path) -> Path:
    """A non-regular result path made for real: FIFO, device link, loop, directory, socket."""
    path = tmp / "result.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        return Path("/dev/zero")
    elif kind == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "dev-urandom":
        return Path("/dev/urandom")
    elif kind == "symlink-loop":
        path.symlink_to(tmp / "loop.json")
        (tmp / "loop.json").symlink_to(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling-symlink":
        path.symlink_to(tmp / "gone.json")
    elif kind == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "proc-file":
        return Path("/proc/self/status")
    elif kind == "missing":
        pass
    elif kind == "name-with-escapes":
        path = tmp / "r\x1b[2J\x1b]0;X\x07.json"
        path.write_bytes(dump(base(True)))
    elif kind == "bad-json-name-with-escapes":
        path = tmp / "r\x1b[2J\x1b]0;X\x07.json"
        path.write_bytes(b"{not json")
    return path


def _input_case(kind: str) -> Case:
    def body(tmp: Path) -> tuple[Outcome, str]:
        path = _special(kind, tmp)
        run = run_cli([str(path), "--plot", str(tmp / "out.png")], tmp)
        return judge(run, "pass" if kind == "name-with-escapes" else "fail")

    return _case("size" if "dev" in kind or kind == "fifo" else "paths", f"input-{kind}",
                 _in_tmp(body), 10)  # fmt: skip


def _plot_case(name: str, setup: Callable[[Path, Path], list[str]], expect: str = "any",
               keep: Callable[[Path, Path], bool] | None = None) -> Case:  # fmt: skip
    """`report RESULT ARGS` with ARGS from setup(tmp, result); `keep` says the input survived."""

    def body(tmp: Path) -> tuple[Outcome, str]:
        result = tmp / "result.json"
        data = dump(base(True))
        result.write_bytes(data)
        args = setup(tmp, result)
        run = run_cli(args, tmp)
        for p in [result, *tmp.glob("*.png")]:
            if p.exists() and not p.is_symlink() and p.is_file() and p.read_bytes() == data:
                break
        else:
            return Outcome.WRONG, "the input was overwritten or removed: " + run.err[-200:]
        if keep is not None and not keep(tmp, result):
            return Outcome.WRONG, "something outside the plot's name was changed"
        return judge(run, expect)

    return _case("paths", name, _in_tmp(body), 15)


def path_cases() -> Iterator[Case]:
    for kind in ("fifo", "dev-zero", "symlink-dev-zero", "dev-urandom", "symlink-loop",
                 "directory", "dangling-symlink", "socket", "proc-file", "missing",
                 "name-with-escapes", "bad-json-name-with-escapes"):  # fmt: skip
        yield _input_case(kind)

    def as_png(tmp: Path, result: Path) -> list[str]:
        png = tmp / "board.png"
        result.rename(png)
        return [str(png)]

    yield _plot_case("input-named-png-default-plot", as_png)

    def plot_is_input(tmp: Path, result: Path) -> list[str]:
        return [str(result), "--plot", str(result)]

    yield _plot_case("plot-equals-input", plot_is_input)

    def plot_dotdot_input(tmp: Path, result: Path) -> list[str]:
        (tmp / "sub").mkdir()
        return [str(result), "--plot", str(tmp / "sub" / ".." / result.name)]

    yield _plot_case("plot-equals-input-via-dotdot", plot_dotdot_input)

    def plot_link_to_input(tmp: Path, result: Path) -> list[str]:
        (tmp / "link.png").symlink_to(result)
        return [str(result), "--plot", str(tmp / "link.png")]

    yield _plot_case("plot-symlink-to-input", plot_link_to_input)

    def hardlink(tmp: Path, result: Path) -> list[str]:
        os.link(result, tmp / "hard.png")
        return [str(result), "--plot", str(tmp / "hard.png")]

    yield _plot_case("plot-hardlink-of-input", hardlink)

    for suffix in ("serving", "tune"):

        def sibling(tmp: Path, result: Path, s=suffix) -> list[str]:
            target = tmp / f"r-{s}.png"
            result.rename(target)
            return [str(target), "--plot", str(tmp / "r.png")]

        yield _plot_case(f"input-is-the-{suffix}-plot", sibling)

    def under_file(tmp: Path, result: Path) -> list[str]:
        (tmp / "afile").write_text("x")
        return [str(result), "--plot", str(tmp / "afile" / "x.png")]

    yield _plot_case("plot-under-a-regular-file", under_file)
    yield _plot_case("plot-in-proc", lambda t, r: [str(r), "--plot", "/proc/rocky-x.png"])
    yield _plot_case("plot-in-sys", lambda t, r: [str(r), "--plot", "/sys/rocky-x.png"])

    def existing_dir(tmp: Path, result: Path) -> list[str]:
        (tmp / "d.png").mkdir()
        return [str(result), "--plot", str(tmp / "d.png")]

    yield _plot_case("plot-is-a-directory", existing_dir)
    yield _plot_case("plot-is-dot", lambda t, r: [str(r), "--plot", str(t) + "/."])
    yield _plot_case("plot-txt-name", lambda t, r: [str(r), "--plot", str(t / "p.txt")])
    yield _plot_case("plot-no-suffix", lambda t, r: [str(r), "--plot", str(t / "plot")])
    yield _plot_case("plot-pdf-name", lambda t, r: [str(r), "--plot", str(t / "p.pdf")])
    long = "x" * 300 + ".png"
    yield _plot_case("plot-name-too-long", lambda t, r: [str(r), "--plot", str(t / long)])

    def fifo_plot(tmp: Path, result: Path) -> list[str]:
        os.mkfifo(tmp / "f.png")
        return [str(result), "--plot", str(tmp / "f.png")]

    yield _plot_case("plot-is-a-fifo", fifo_plot,
                     keep=lambda t, r: stat.S_ISFIFO(os.lstat(t / "f.png").st_mode))  # fmt: skip

    def dev_null(tmp: Path, result: Path) -> list[str]:
        (tmp / "null.png").symlink_to("/dev/null")
        return [str(result), "--plot", str(tmp / "null.png")]

    yield _plot_case("plot-symlink-to-dev-null", dev_null,
                     keep=lambda t, r: stat.S_ISCHR(os.stat("/dev/null").st_mode))  # fmt: skip

    def serving_is_dir(tmp: Path, result: Path) -> list[str]:
        (tmp / "p-serving.png").mkdir()
        return [str(result), "--plot", str(tmp / "p.png")]

    yield _plot_case("serving-plot-name-is-a-directory", serving_is_dir)

    def dangling(tmp: Path, result: Path) -> list[str]:
        (tmp / "dl.png").symlink_to(tmp / "nowhere" / "x.png")
        return [str(result), "--plot", str(tmp / "dl.png")]

    yield _plot_case("plot-dangling-symlink", dangling)

    def escape_name(tmp: Path, result: Path) -> list[str]:
        return [str(result), "--plot", str(tmp / "p\x1b]0;X\x07\x1b[2J.png")]

    yield _plot_case("plot-name-with-escapes", escape_name)

    def existing_png(tmp: Path, result: Path) -> list[str]:
        (tmp / "old.png").write_bytes(b"old")
        return [str(result), "--plot", str(tmp / "old.png")]

    yield _plot_case("plot-replaces-an-old-png", existing_png, expect="pass")


def tty_cases() -> Iterator[Case]:
    """On a terminal rich adds its own colours: only those may be there, nothing from the data."""
    for klass, label, value, _ in STRINGS:
        if klass != "escapes":
            continue

        def body(tmp: Path, value=value) -> tuple[Outcome, str]:
            from rich.console import Console

            doc = base(False)
            for path in ("finished_at", "model.path", "checks.0.evidence", "placement.reason"):
                _set(doc, path, value)
            doc["thresholds"]["prompt_tokens"] = 128
            path = tmp / "result.json"
            path.write_bytes(dump(doc))
            buf = io.StringIO()
            console = Console(file=buf, force_terminal=True, color_system="standard", width=80,
                              highlight=False)  # fmt: skip
            run = run_text(path, console)
            text = buf.getvalue()
            # rich's own styles here are SGR sequences of bold/italic/colours/reset only
            plain = re.sub(r"\x1b\[(?:[0-9]{1,2}(?:;[0-9]{1,2})*)?m", "", text)
            own = set(re.findall(r"\x1b\[([0-9;]*)m", text))
            odd = [s for s in own if not set(s.split(";")) <= {"", "0", "1", "3", "31", "32",
                                                                   "33", "37", "1;31"}]  # fmt: skip
            if odd:
                return Outcome.WRONG, f"SGR {odd} that rich does not use for the report"
            return judge(Run(run.rc, plain, run.err, {}, []), "fail")

        yield _case("escapes", f"tty-console={label}", _in_tmp(body))


def cases() -> Iterator[Case]:
    yield from string_cases()
    yield from number_cases()
    yield from evidence_cases()
    yield from size_cases()
    yield from path_cases()
    yield from tty_cases()
