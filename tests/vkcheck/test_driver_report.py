"""The `driver` section in the host report (`rocky-vulkan report`): real sections made by
rocky_selftest.driver from rocky-vkcheck's real output, shown as text; a section from a board is
hostile input like the rest of result.json (escape bytes cleaned, a wrong field named, a PASS
without its evidence not shown as a PASS), and it leaves the run's verdict alone."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rocky_selftest import driver
from rocky_selftest.runner import RunResult
from rocky_vulkan.host.driver_report import driver_rows, print_driver
from rocky_vulkan.host.result_doc import check_result

from tests.helpers.project import FIXTURES
from tests.helpers.selftest import OLD_PASS


def _section(name: str, code: int) -> dict[str, Any]:
    text = (FIXTURES / "vkcheck" / name).read_text()
    res = RunResult(["rocky-vkcheck"], code, False, 2.5, text, "")
    return driver.section_from_run(res, "/usr/bin/rocky-vkcheck", 300, "2026-12-04T20:00:00Z")


def _checked(section: Any) -> tuple[dict[str, Any], list[str]]:
    doc = {**copy.deepcopy(OLD_PASS), "driver": section}
    return check_result(doc, Path("result.json"))


def _shown(section: dict[str, Any]) -> str:
    out = io.StringIO()
    print_driver(Console(file=out, width=200, color_system=None), section)
    return out.getvalue()


def test_a_real_pass_is_shown_and_the_run_s_verdict_is_untouched():
    clean, problems = _checked(_section("lavapipe-warp16-pass.json", 0))
    assert problems == [] and clean["verdict"] == "PASS"
    text = _shown(clean["driver"])
    assert "llvmpipe (LLVM 15.0.6, 512 bits) (Mesa 25.0.7" in text
    for name in driver.CHECK_NAMES:
        assert name in text
    assert "48/48 cases" in text and "PASS" in text


def test_a_real_mismatch_is_shown_with_its_first_word():
    clean, problems = _checked(_section("inject-secondaries.json", 1))
    assert problems == []
    rows = driver_rows(clean["driver"])
    assert rows[0][2] == "FAIL"
    row = next(r for r in rows if r[0] == "secondaries")
    assert row[2] == "fail" and "14/15 cases; first mismatch: " in row[1]
    assert "expected 0x" in row[1] and "got 0x" in row[1]


def test_no_device_is_an_error_row():
    clean, problems = _checked(_section("no-driver.json", 2))
    assert problems == []
    rows = driver_rows(clean["driver"])
    assert rows[0][2] == "ERROR" and "VK_ERROR_INCOMPATIBLE_DRIVER" in rows[0][1]
    assert {r[2] for r in rows[1:]} == {"not-run"}


def test_escape_bytes_from_the_board_are_cleaned():
    section = _section("lavapipe-warp16-pass.json", 0)
    section["device"]["name"] = "\x1b[2J\x1b]0;pwned\x07evil\u202egpu"
    section["reason"] = "line1\nline2\x1b[31m"
    clean, _ = _checked(section)
    text = _shown(clean["driver"])
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "evilgpu" in text.replace("]0;pwned", "")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.update(status="P\u200bASS"), "driver.status"),
        (lambda s: s.update(checks="all"), "driver.checks"),
        (lambda s: s["checks"][0].update(cases=-1), "driver.checks[0].cases"),
        (lambda s: s["checks"][0].update(passed=True), "driver.checks[0].passed"),
        (lambda s: s["checks"][1].update(name="everything"), "driver.checks[1].name"),
        (lambda s: s["checks"][1].update(status="PASS"), "driver.checks[1].status"),
        (lambda s: s["checks"][2].update(failed=3), "driver.checks[2]: passed"),
        (lambda s: s["checks"][2].update(first_mismatch=[1]), "driver.checks[2].first_mismatch"),
        (lambda s: s.update(elapsed_s=float("nan")), "driver.elapsed_s"),
        (lambda s: s.update(device=["gpu"]), "driver.device"),
        (lambda s: s["checks"].append(dict(s["checks"][0])), "a second 'tls_growth'"),
    ],
)
def test_a_wrong_field_is_named_and_never_shown_as_pass(change, field: str):
    section = _section("lavapipe-warp16-pass.json", 0)
    change(section)
    clean, problems = _checked(section)
    assert any(p.startswith(field) or field in p for p in problems), problems
    assert clean["driver"]["status"] != "PASS" or clean["driver"]["state"] != "ok"
    assert "BAD" in _shown(clean["driver"])


def test_a_pass_without_every_check_passing_is_not_a_pass():
    section = _section("lavapipe-warp16-pass.json", 0)
    section["checks"] = section["checks"][:2]
    clean, problems = _checked(section)
    assert "driver: PASS without every check passing" in problems
    assert clean["driver"]["status"] == "BAD"


@pytest.mark.parametrize("raw", ["PASS", 5, [], True])
def test_a_section_that_is_not_an_object_is_malformed(raw: Any):
    clean, problems = _checked(raw)
    assert problems and clean["driver"]["state"] == "malformed"
    assert "malformed" in _shown(clean["driver"])


@pytest.mark.parametrize(("name", "code"), [("lavapipe-warp16-pass.json", 0),
                                            ("inject-secondaries.json", 1)])  # fmt: skip
def test_the_report_cli_shows_the_section_and_keeps_the_run_s_verdict(tmp_path, capsys, name,
                                                                       code):  # fmt: skip
    from rocky_vulkan.cli import main

    from tests.helpers.project import ROOT
    from tests.host.test_report import _doc, _write

    path = _write(tmp_path, {**_doc(None), "driver": _section(name, code)})
    assert main(["--config", str(ROOT / "rocky-vulkan.yaml"), "report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "panvk conformance (rocky-selftest driver)" in out
    assert "VERDICT: PASS" in out  # the run's verdict: the driver section does not change it
    assert ("FAIL" in out) == (code == 1)
