"""`rocky-vulkan report` with the self-test's `speculative` section (decode modes against plain
decode, the choice, the goal), good and hostile. The numbers are test inputs, not results."""

from __future__ import annotations

import copy

import pytest
from rocky_vulkan.host.result_doc import checked

from tests.host.test_report import _doc
from tests.host.test_report_serving import _report

pytestmark = pytest.mark.timeout(120)


def good_section(fast_ms: float = 60_000.0) -> dict:
    def entry(ms: float, made: int, took: int) -> dict:
        runs = [{"request": r, "status": "PASS", "predicted_ms": ms / 2, "predicted_n": 256,
                 "decode_tps": 512_000 / ms, "draft_n": made, "draft_n_accepted": took,
                 "same_text": True} for r in ("chat", "repeat")]  # fmt: skip
        return {"status": "PASS", "runs": runs}

    modes = {"off": entry(80_000.0, 0, 0), "ngram-simple": entry(78_000.0, 40, 10),
             "ngram-mod": entry(fast_ms, 300, 200)}  # fmt: skip
    ratio = 80_000.0 / fast_ms
    met = ratio >= 1.3
    return {
        "goal": 1.3,
        "model": "/usr/share/rocky-vulkan/models/reference.gguf",
        "draft_model": None,
        "requests": [{"name": "chat"}, {"name": "repeat"}],
        "modes": modes,
        "speedups": {"ngram-simple": round(80 / 78, 4), "ngram-mod": round(ratio, 4)},
        "chosen": "ngram-mod",
        "reason": f"ngram-mod: {ratio:.2f}x plain decode on the typical requests",
        "goal_met": met,
        "goal_why": "ngram-mod 1.33x >= 1.3x" if met else "below 1.3x; no draft model",
    }


def _rows(section: dict) -> dict:
    from rocky_vulkan.host.spec_doc import spec_rows

    doc = checked({**_doc(crash_at=None), "speculative": section})
    return {r[0]: r for r in spec_rows(doc["speculative"])}, doc["problems"]


def test_good_section_in_the_report(tmp_path, capsys, monkeypatch):
    rc, out = _report(tmp_path, capsys, monkeypatch, {**_doc(crash_at=None),
                                                       "speculative": good_section()})  # fmt: skip
    assert rc == 0 and "decode goal" in out and "1.33x plain decode" in out
    rows, problems = _rows(good_section())
    assert problems == []
    assert rows["decode ngram-mod"][1] == (
        "chat 8.53 t/s (200/300 drafts taken), repeat 8.53 t/s (200/300 drafts taken) = 1.33x plain"
    )
    assert rows["decode goal"][3] == "met" and rows["decode chosen"][1].startswith("ngram-mod:")


def test_goal_not_met_says_why():
    rows, problems = _rows(good_section(fast_ms=70_000.0))
    assert problems == []
    assert rows["decode goal"][3] == "NOT met" and "no draft model" in rows["decode goal"][1]


def test_absent_section_is_shown_absent(tmp_path, capsys, monkeypatch):
    rc, out = _report(tmp_path, capsys, monkeypatch, _doc(crash_at=None))
    assert rc == 0 and "speculative" in out and "not in this result" in out


def _mutated(path: str, value):
    sec = copy.deepcopy(good_section())
    *head, last = path.split(".")
    obj = sec
    for key in head:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    if value is KeyError:
        del obj[last]
    else:
        obj[last] = value
    return sec


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("speedups.ngram-mod", 2.5, "speculative.speedups: not what the runs show"),
        ("chosen", "ngram-simple", "the runs make it ngram-mod"),
        ("chosen", "eagle", "speculative.chosen"),
        ("goal_met", False, "speculative.goal_met"),
        ("goal_met", "yes", "speculative.goal_met"),
        ("modes.ngram-mod.runs.0.predicted_ms", float("nan"), "predicted_ms"),
        ("modes.ngram-mod.runs.0.draft_n_accepted", 301, "accepted of 300 made"),
        ("modes.ngram-mod.runs.0.request", "other", "request"),
        ("modes.ngram-mod.status", "P\u200bASS", "status"),
        ("modes.medusa", {"status": "PASS", "runs": []}, "a mode"),
        ("requests", "chat", "speculative.requests"),
        ("modes", KeyError, "speculative.modes"),
        ("reason", "\x1b[2Jcleared", None),  # shown as text, never as terminal control
    ],
)
def test_hostile_fields_are_named_and_never_trusted(path, value, problem):
    rows, problems = _rows(_mutated(path, value))
    if problem is None:
        assert problems == [] and "\x1b" not in rows["decode chosen"][1]
        return
    assert any(problem in p for p in problems), problems
    assert list(rows) == ["speculative"] and rows["speculative"][3] == "BAD"
