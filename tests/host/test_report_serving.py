"""`rocky-vulkan report` with the server's sections: placement (GPU / CPU / hybrid for a typical
request) and serving (the GPU server against the CPU server), good and hostile."""

from __future__ import annotations

import copy
import json

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.host.report import placement_rows, plot_serving, serving_rows
from rocky_vulkan.host.result_doc import checked, clean_text, load_result

from tests.helpers.project import ROOT
from tests.host.test_report import _doc, _set, _write

pytestmark = pytest.mark.timeout(120)


def good_placement() -> dict:
    """The agreed shape; the numbers are test inputs, not results."""

    def mode(pp, tg):
        return {"status": "PASS", "pp_tps": pp, "tg_tps": tg, "request_s": 2048 / pp + 256 / tg,
                "reason": ""}  # fmt: skip

    return {
        "request": {"prompt_tokens": 2048, "generated_tokens": 256},
        "modes": {
            "gpu": mode(28.1, 4.2),
            "cpu": mode(22.0, 6.8),
            "hybrid": mode(26.0, 6.7),
        },  # fmt: skip
        "chosen": "hybrid",
        "reason": "hybrid takes 117.0 s for a 2048+256-token request",
    }


def good_serving() -> dict:
    runs = []
    for n, gpu_ttft, cpu_ttft in ((128, 0.9, 1.2), (512, 2.0, 3.5), (2048, 8.0, 14.0)):
        for server, ttft, dec in (("gpu", gpu_ttft, 6.9), ("cpu", cpu_ttft, 6.8)):
            runs.append({"server": server, "prompt_tokens": n, "ttft_s": ttft,
                         "decode_tps": dec, "status": "PASS", "reason": ""})  # fmt: skip
    return {
        "runs": runs,
        "ttft_ratio": 8.0 / 14.0,
        "decode_ratio": 6.9 / 6.8,
        "goal": {"ttft_ratio_max": 0.8, "decode_ratio_min": 1.0},
    }


def _full() -> dict:
    doc = _doc(crash_at=None)
    doc["placement"] = good_placement()
    doc["serving"] = good_serving()
    return doc


def _report(tmp_path, capsys, monkeypatch, doc) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", "250")
    rc = main(["--config", str(ROOT / "rocky-vulkan.yaml"), "report", str(_write(tmp_path, doc))])
    return rc, capsys.readouterr().out


def test_good_sections_in_the_table(tmp_path, capsys, monkeypatch):
    rc, out = _report(tmp_path, capsys, monkeypatch, _full())
    assert rc == 0 and "VERDICT: PASS" in out
    rows = {r[0]: r for r in placement_rows(_full()) + serving_rows(_full())}
    assert rows["placement gpu"][1] == "pp 28.10 t/s, tg 4.20 t/s, request 133.83 s"
    assert rows["placement hybrid"][3] == "PASS"
    assert rows["placement chosen"][1].startswith("hybrid: hybrid takes")
    assert rows["serving p2048 TTFT"][1] == "GPU 8.00 s / CPU 14.00 s = 0.57x"
    assert rows["serving p512 decode"][1] == "GPU 6.90 t/s / CPU 6.80 t/s = 1.01x"
    assert rows["serving goal"][3] == "met"
    assert (tmp_path / "result-serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_absent_sections_are_shown_absent_and_do_not_fail(tmp_path, capsys, monkeypatch):
    rc, out = _report(tmp_path, capsys, monkeypatch, _doc(crash_at=None))
    assert rc == 0
    assert "placement (where the server runs)" in out and "not in this result" in out
    assert "serving (GPU vs CPU server)" in out
    assert not (tmp_path / "result-serving.png").exists()


def test_goal_missed(tmp_path):
    doc = _full()
    for run in doc["serving"]["runs"]:
        if run["server"] == "gpu":
            run["ttft_s"] *= 1.5
    doc["serving"]["ttft_ratio"] = 12.0 / 14.0
    rows = {r[0]: r for r in serving_rows(doc)}
    assert rows["serving goal"][3] == "NOT met" and "not met: TTFT" in rows["serving goal"][1]


def test_a_failed_run_never_meets_the_goal():
    doc = _full()
    doc["serving"]["runs"][0].update(status="FAIL", reason="server did not start")
    del doc["serving"]["runs"][0]["ttft_s"]
    rows = {r[0]: r for r in serving_rows(doc)}
    assert rows["serving goal"][3] == "NOT met"
    assert rows["serving p128 TTFT"][3] == "FAIL"
    assert "GPU FAIL (server did not start)" in rows["serving p128 TTFT"][1]


def test_a_ratio_the_runs_do_not_show_is_not_met():
    doc = _full()
    doc["serving"]["ttft_ratio"] = 0.1  # the runs show 0.57 .. 0.75
    c = checked(doc)
    assert any("serving.ttft_ratio: 0.1 is not what the runs show" in p for p in c["problems"])
    assert {r[0]: r for r in serving_rows(c)}["serving goal"][3] == "not judged"


def test_ratios_without_runs_are_not_judged():
    doc = _full()
    doc["serving"]["runs"] = []
    rows = {r[0]: r for r in serving_rows(doc)}
    assert rows["serving goal"][3] == "not judged"


def test_a_moe_model_s_experts_cpu_row_and_a_dense_model_without_it():
    doc = _full()
    assert [r[0] for r in placement_rows(doc)][:3] == [
        "placement gpu", "placement cpu", "placement hybrid"]  # fmt: skip
    assert not any("experts-cpu" in r[0] for r in placement_rows(doc))
    doc["placement"]["experts_per_layer"] = 128
    rows = {r[0]: r for r in placement_rows(doc)}
    assert rows["placement experts-cpu"][1] == "not measured"  # a MoE model should have it
    doc["placement"]["modes"]["experts-cpu"] = copy.deepcopy(doc["placement"]["modes"]["cpu"])
    rows = {r[0]: r for r in placement_rows(doc)}
    assert rows["placement experts-cpu"][3] == "PASS" and checked(doc)["problems"] == []
    doc["placement"]["experts_per_layer"] = 0  # measured on a model without experts
    assert any("without experts" in p for p in checked(doc)["problems"])
    for bad in (-1, True, 1 << 20, "128"):
        doc["placement"]["experts_per_layer"] = bad
        assert any("experts_per_layer" in p for p in checked(doc)["problems"]), bad


def test_chosen_slower_mode_is_a_problem():
    doc = _full()
    doc["placement"]["chosen"] = "gpu"  # slower than hybrid and the CPU
    assert any("placement.chosen: gpu" in p for p in checked(doc)["problems"])
    doc["placement"]["chosen"] = "cpu"  # the board's fallback when the GPU checks fail: allowed
    assert checked(doc)["problems"] == []


_DELETE = object()
HOSTILE = [
    # (path, value, the field named in a BAD row)
    ("placement", "gpu", "placement: "),
    ("placement", [], "placement: "),
    ("placement.request", None, "placement.request"),
    ("placement.request.prompt_tokens", 10**400, "placement.request.prompt_tokens"),
    ("placement.request.prompt_tokens", -5, "placement.request.prompt_tokens"),
    ("placement.modes", ["gpu"], "placement.modes"),
    ("placement.modes.gpu", "fast", "placement.modes.gpu"),
    ("placement.modes.gpu.pp_tps", float("nan"), "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", float("inf"), "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", 10**400, "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", 10**30, "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", -1.0, "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", True, "placement.modes.gpu.pp_tps"),
    ("placement.modes.gpu.pp_tps", "28.1", "placement.modes.gpu.pp_tps"),
    ("placement.modes.cpu.tg_tps", _DELETE, "placement.modes.cpu: status PASS without tg_tps"),
    ("placement.modes.cpu.request_s", 0, "placement.modes.cpu.request_s"),
    ("placement.modes.hybrid.status", "OK", "placement.modes.hybrid.status"),
    ("placement.modes.hybrid.status", "\x1b[32mPASS", "placement.modes.hybrid.status"),
    ("placement.modes.hybrid.reason", {"a": 1}, "placement.modes.hybrid.reason"),
    ("placement.modes.npu", {"status": "PASS"}, "placement.modes.npu"),
    ("placement.chosen", "npu", "placement.chosen"),
    ("placement.chosen", 3, "placement.chosen"),
    ("serving", "met", "serving: "),
    ("serving.runs", {"gpu": 1}, "serving.runs"),
    ("serving.runs.0", 5, "serving.runs[0]"),
    ("serving.runs.0.server", "npu", "serving.runs[0].server"),
    ("serving.runs.0.prompt_tokens", 1.5, "serving.runs[0].prompt_tokens"),
    ("serving.runs.0.prompt_tokens", 10**400, "serving.runs[0].prompt_tokens"),
    ("serving.runs.0.ttft_s", float("nan"), "serving.runs[0].ttft_s"),
    ("serving.runs.0.ttft_s", -0.5, "serving.runs[0].ttft_s"),
    ("serving.runs.1.decode_tps", _DELETE, "serving.runs[1]: status PASS without decode_tps"),
    ("serving.runs.1.status", None, "serving.runs[1].status"),
    ("serving.ttft_ratio", float("nan"), "serving.ttft_ratio"),
    ("serving.ttft_ratio", "0.5", "serving.ttft_ratio"),
    ("serving.decode_ratio", 10**400, "serving.decode_ratio"),
    ("serving.goal", 0.8, "serving.goal"),
    ("serving.goal.ttft_ratio_max", float("-inf"), "serving.goal.ttft_ratio_max"),
    ("serving.goal.decode_ratio_min", [1], "serving.goal.decode_ratio_min"),
]


def _apply(doc: dict, path: str, value) -> dict:
    if value is _DELETE:
        *keys, last = path.split(".")
        obj = doc
        for key in keys:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        del obj[last]
        return doc
    return _set(path, value)(doc)


@pytest.mark.parametrize(("path", "value", "field"), HOSTILE, ids=lambda v: repr(v)[:30])
def test_hostile_section_is_a_bad_row_never_a_pass(tmp_path, capsys, monkeypatch, path, value,
                                                   field):  # fmt: skip
    doc = _apply(_full(), path, value)
    text = json.dumps(doc)  # NaN and Infinity as Python's json writes them; huge ints exact
    rc, out = _report(tmp_path, capsys, monkeypatch, text)
    assert rc == 1 and "VERDICT: FAIL" in out and "BAD" in out, out
    assert field in out
    assert "Traceback" not in out and "\x1b" not in out
    section = path.split(".")[0]
    rows = placement_rows(load_result(tmp_path / "result.json"))
    rows += serving_rows(load_result(tmp_path / "result.json"))
    if section == "serving":
        goal = [r for r in rows if r[0] == "serving goal"]
        assert not goal or goal[0][3] != "met"
    if path.startswith("placement.modes.gpu"):
        gpu = [r for r in rows if r[0] == "placement gpu"]
        assert not gpu or gpu[0][3] != "PASS"


def test_escape_sequences_and_markup_are_text(tmp_path, capsys, monkeypatch):
    doc = _full()
    evil = "\x1b]8;;file:///etc/shadow\x07link\x1b]8;;\x07 [bold]b[/bold] $x^2$ \u202eevil\r\nnext"
    doc["placement"]["reason"] = evil
    doc["placement"]["modes"]["hybrid"].update(status="FAIL", reason=evil)
    doc["placement"]["chosen"] = "cpu"  # the fastest that passed
    doc["serving"]["runs"][0].update(status="FAIL", reason=evil)
    del doc["serving"]["runs"][0]["ttft_s"]
    rc, out = _report(tmp_path, capsys, monkeypatch, doc)
    assert rc == 0  # the sections' own failures are shown, the image's checks passed
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\r" not in out
    assert "[bold]b[/bold] $x^2$" in out and "link" in out
    assert "GPU FAIL (" in out


def test_clean_text():
    assert clean_text("a\x1b[31mb\tc\nd\u200be\u202ef") == "a[31mb c de" + "f"
    assert clean_text("x" * 5000).endswith("...") and len(clean_text("x" * 5000)) == 1000


def test_huge_integer_in_json_is_a_clear_error(tmp_path):
    from rocky_vulkan.errors import UserError

    text = json.dumps(_full()).replace('"ttft_ratio": ', '"ttft_ratio": ' + "9" * 5000 + ', "x": ')
    with pytest.raises(UserError, match="not a self-test result"):
        load_result(_write(tmp_path, text))


def test_oversized_file_is_refused(tmp_path):
    from rocky_vulkan.errors import UserError

    path = tmp_path / "result.json"
    path.write_bytes(b" " * (9 << 20))
    with pytest.raises(UserError, match="more than 8388608; a self-test result file is at most"):
        load_result(path)


def test_serving_plot_survives_partial_sections(tmp_path):
    doc = _full()
    doc["serving"]["runs"] = [r for r in doc["serving"]["runs"] if r["server"] == "gpu"]
    doc["serving"]["runs"][1].update(status="FAIL")
    del doc["placement"]
    assert plot_serving(copy.deepcopy(doc), tmp_path / "s.png").is_file()
    assert plot_serving(_doc(crash_at=None), tmp_path / "none.png") is None


def test_thousands_of_broken_fields_make_a_short_table(tmp_path, capsys, monkeypatch):
    doc = _full()
    doc["placement"]["modes"].update({f"mode{i}\x1b[2J": {} for i in range(900)})
    rc, out = _report(tmp_path, capsys, monkeypatch, doc)
    assert rc == 1 and "... and 850 more malformed fields" in out and "\x1b" not in out
    assert out.count("placement.modes.mode") == 50
