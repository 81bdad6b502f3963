"""`rocky-selftest cts`'s QPA log parser, on logs written in deqp's format (qpTestLog.c and
qpXmlWriter.c: `#beginTestCaseResult`, the XML document, `#endTestCaseResult` or
`#terminateTestCaseResult`) and on hostile ones: truncated, huge, control characters, forged
markers in log text, unknown status codes, results that contradict themselves."""

from __future__ import annotations

import time

import pytest
from rocky_selftest import cts

from tests.helpers.fake_deqp import SESSION, qpa_case

A, B, C = "dEQP-VK.compute.basic.a", "dEQP-VK.compute.basic.b", "dEQP-VK.api.x.c"


def parse(text: str | bytes) -> cts.QpaLog:
    return cts.parse_qpa(text.encode() if isinstance(text, str) else text)


def test_a_real_format_log_gives_each_case_its_status():
    log = parse(
        SESSION
        + qpa_case(A, "Pass")
        + qpa_case(B, "Fail", text="Result mismatch at 3")
        + qpa_case(C, "NotSupported")
        + qpa_case("dEQP-VK.api.x.d", "QualityWarning")
        + "\n#endSession\n"
    )
    assert log.results == [
        (A, "Pass"),
        (B, "Fail"),
        (C, "NotSupported"),
        ("dEQP-VK.api.x.d", "QualityWarning"),
    ]
    assert log.in_flight is None and not log.problems


def test_crlf_and_a_self_closing_result_element_are_read():
    text = (SESSION + qpa_case(A, "Pass")).replace("\n", "\r\n")
    text = text.replace('<Result StatusCode="Pass">Pass</Result>', '<Result StatusCode="Pass" />')
    assert parse(text).results == [(A, "Pass")]


def test_a_log_cut_inside_a_case_names_that_case_in_flight():
    log = parse(SESSION + qpa_case(A, "Pass") + qpa_case(B, None, end="none"))
    assert log.results == [(A, "Pass")]
    assert log.in_flight == B


def test_terminate_records_crash_and_timeout_and_nothing_else():
    log = parse(
        qpa_case(A, None, end="Crash")
        + qpa_case(B, None, end="Timeout")
        + qpa_case(C, None, end="Pass")
    )
    assert log.results == [(A, "Crash"), (B, "Timeout"), (C, cts.BAD_LOG)]


def test_an_unknown_status_code_is_counted_as_unknown_with_its_code():
    log = parse(qpa_case(A, "Splendid") + qpa_case(B, "Splendid") + qpa_case(C, "Pass"))
    assert log.results == [(A, cts.UNKNOWN), (B, cts.UNKNOWN), (C, "Pass")]
    assert log.unknown_codes == {"Splendid": 2}


def test_a_case_without_a_result_element_has_no_result():
    assert parse(qpa_case(A, None)).results == [(A, cts.NO_RESULT)]


def test_markers_forged_in_log_text_do_not_end_or_begin_cases():
    # '#' and line breaks are not escaped by the writer, '<' is: a test's message can hold
    # marker lines but never a <Result> or </TestCaseResult> element.
    forged = (
        "bad value\n#endTestCaseResult\n#beginTestCaseResult dEQP-VK.forged.pass\n"
        "&lt;Result StatusCode=&quot;Pass&quot;&gt;"
    )
    log = parse(qpa_case(A, "Fail", text=forged) + qpa_case(B, "Pass"))
    assert log.results == [(A, "Fail"), (B, "Pass")]


def test_a_second_result_or_another_case_path_makes_the_case_bad():
    two = qpa_case(A, "Fail").replace(
        " <Result", ' <Result StatusCode="Pass">Pass</Result>\n <Result', 1
    )
    other = qpa_case(B, "Pass").replace(f'CasePath="{B}"', f'CasePath="{C}"')
    log = parse(two + other)
    assert log.results == [(A, cts.BAD_LOG), (B, cts.BAD_LOG)]
    assert len(log.problems) == 2


def test_ends_without_begins_and_bad_names_are_noted_not_counted():
    text = (
        "#endTestCaseResult\n#terminateTestCaseResult Crash\n"
        + qpa_case("dEQP-VK.evil;rm -rf", "Pass")
        + qpa_case("dEQP-VK.a\x1b[31m", "Pass")
        + qpa_case(A, "Pass")
    )
    log = parse(text)
    assert log.results == [(A, "Pass")]
    assert log.problems


def test_control_characters_nul_and_invalid_utf8_do_not_break_the_parse():
    junk = b"\x00\xff\xfe\x1b[2J\x07\r\x85" * 1000
    data = (
        junk
        + b"\n"
        + (SESSION + qpa_case(A, "Pass")).encode()
        + junk
        + qpa_case(B, "Fail").encode()
    )
    log = parse(data)
    assert log.results == [(A, "Pass"), (B, "Fail")]


def test_a_huge_single_line_is_parsed_quickly():
    data = (qpa_case(A, "Pass") + "x" * (20 << 20) + "\n" + qpa_case(B, "Pass")).encode()
    t0 = time.monotonic()
    log = parse(data)
    assert log.results == [(A, "Pass"), (B, "Pass")]
    assert time.monotonic() - t0 < 10


def test_a_log_over_the_limit_is_read_up_to_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cts, "MAX_LOG_BYTES", 4096)
    path = tmp_path / "big.qpa"
    path.write_text(
        SESSION + qpa_case(A, "Pass") + "".join(qpa_case(B, "Pass") for _ in range(100))
    )
    log = cts.read_qpa(str(path))
    assert log.truncated and log.results[0] == (A, "Pass")
    assert any("larger than" in p for p in log.problems)


def test_an_absent_log_has_no_results(tmp_path):
    log = cts.read_qpa(str(tmp_path / "none.qpa"))
    assert log.results == [] and log.in_flight is None


@pytest.mark.parametrize("n", [1, 60])
def test_problem_notes_are_bounded(n):
    log = parse("#endTestCaseResult\n" * n)
    assert 1 <= len(log.problems) <= 50
