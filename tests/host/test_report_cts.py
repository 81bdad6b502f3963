"""`rocky-vulkan report` with the board's `cts` section (`rocky-selftest cts`, a dEQP-VK subset):
counts and failed case names as text; a section that lies about its own counts, or carries
names that are no dEQP-VK case, is malformed and never shown as it claims."""

from __future__ import annotations

import copy

import pytest
from rocky_selftest import cts
from rocky_selftest.settings import Settings
from rocky_vulkan.host.cts_doc import cts_rows
from rocky_vulkan.host.result_doc import checked

from tests.helpers.fake_deqp import cases, env_of, install, status_file
from tests.host.test_report import _doc
from tests.host.test_report_serving import _report

pytestmark = pytest.mark.timeout(120)
CASES = cases("compute.basic", 6)


@pytest.fixture(scope="module")
def section(tmp_path_factory) -> dict:
    """A section as the board writes it: the real `rocky-selftest cts` code, run against the
    deqp-vk stand-in (tests/helpers/fake_deqp.py: VK-GL-CTS cannot be built in CI's time)."""
    tmp = tmp_path_factory.mktemp("cts")
    cts_dir = install(tmp, {"compute": CASES})
    statuses = status_file(tmp, {CASES[1]: "Fail", CASES[2]: "NotSupported"})
    s = Settings(model_path="/m", model_sha256=None, ubatch_sizes=(64,),
                 results_dir=str(tmp / "results"), cts_dir=str(cts_dir),
                 env=env_of(status=statuses, crash=CASES[4]))  # fmt: skip
    return cts.run_cts(s, ("dEQP-VK.compute.*",), 120, 3, log=lambda _: None)


def with_cts(section: dict) -> dict:
    doc = _doc(crash_at=None)
    doc["cts"] = copy.deepcopy(section)
    return doc


def test_counts_and_failed_cases_are_shown(tmp_path, capsys, monkeypatch, section):
    rc, out = _report(tmp_path, capsys, monkeypatch, with_cts(section))
    assert rc == 0  # the subset is information; the verdict is the self-test's
    assert "dEQP-VK subset: FAIL" in out
    rows = dict(cts_rows(checked(with_cts(section))["cts"]))
    assert rows["pass"] == "3" and rows["fail"] == "2" and rows["not supported"] == "1"
    assert rows["other"] == "0"
    assert rows["Fail"] == CASES[1] and rows["Crash"] == CASES[4]
    assert CASES[1] in out and CASES[4] in out


def test_no_section_no_table(tmp_path, capsys, monkeypatch):
    rc, out = _report(tmp_path, capsys, monkeypatch, _doc(crash_at=None))
    assert rc == 0 and "dEQP-VK" not in out


def _set(section: dict, path: str, value) -> dict:
    bad = copy.deepcopy(section)
    *keys, last = path.split(".")
    target = bad
    for key in keys:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return bad


@pytest.mark.parametrize(
    "path, value",
    [
        ("summary", {"pass": 6, "fail": 0, "not_supported": 0, "other": 0}),  # lies
        ("counts.Pass", 300),  # more than ran
        ("counts.Pass", -1),
        ("counts.Splendid", 1),
        ("ran", 60),
        ("verdict", "PASS"),  # with failing cases
        ("failed_total", 0),
        ("failed.0.case", "dEQP-VK.x\x1b[2J\u202e"),
        ("failed.0.status", "Pass"),
        ("patterns", ["rm -rf /"]),
        ("budget_s", float("nan")),
    ],
)
def test_a_lying_or_hostile_section_is_malformed(tmp_path, capsys, monkeypatch, section, path,
                                                 value):  # fmt: skip
    rc, out = _report(tmp_path, capsys, monkeypatch, with_cts(_set(section, path, value)))
    assert rc == 1 and "malformed field" in out
    assert "\x1b" not in out and "\u202e" not in out


def test_the_fixture_is_what_the_stand_in_was_told(section):
    assert section["counts"] == {"Pass": 3, "Fail": 1, "NotSupported": 1, "Crash": 1}
