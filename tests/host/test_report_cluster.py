"""`rocky-vulkan report` with a cluster head's `cluster` section (this board alone and spread
over its workers by whole layers and by tensor parallelism), good and hostile. The numbers are
test inputs, not results."""

from __future__ import annotations

import copy

import pytest
from rocky_vulkan.host.cluster_doc import cluster_rows
from rocky_vulkan.host.result_doc import checked

from tests.host.test_report import _doc
from tests.host.test_report_serving import _report

pytestmark = pytest.mark.timeout(120)


def good_section() -> dict:
    runs = [{"mode": "alone", "status": "PASS", "pp_tps": 20.0, "tg_tps": 5.0, "repeat": 0}]
    return {
        "workers": ["10.77.0.2:50052", "10.77.0.3:50052"],
        "left_out": [],
        "prompt_tokens": 512,
        "decode_tokens": 128,
        "ubatch": 512,
        "modes": {
            "alone": {"status": "PASS", "pp_tps": 20.0, "tg_tps": 5.0, "runs": runs},
            "cluster": {"status": "PASS", "pp_tps": 30.0, "tg_tps": 4.0, "runs": []},
            "tensor": {"status": "PASS", "pp_tps": 25.0, "tg_tps": 7.5, "runs": []},
            "speed": {"status": "PASS", "pp_tps": 32.0, "tg_tps": 4.5, "runs": []},
        },
        "tensor_split": "0.600/0.400",
    }


LAYERS, TENSOR = "cluster: layers, 2 worker(s)", "cluster: tensor parallel, 2 worker(s)"
SPEED = "cluster: layers by speed, 2 worker(s)"


def _rows(section) -> tuple[dict, list[str]]:
    doc = checked({**_doc(crash_at=None), "cluster": section})
    return {r[0]: r for r in cluster_rows(doc["cluster"])}, doc["problems"]


def test_both_rates_and_their_ratios_are_in_the_report(tmp_path, capsys, monkeypatch):
    doc = {**_doc(crash_at=None), "cluster": good_section()}
    rc, out = _report(tmp_path, capsys, monkeypatch, doc)
    assert rc == 0 and "cluster: alone" in out and LAYERS in out and TENSOR in out
    rows, problems = _rows(good_section())
    assert problems == []
    assert rows["cluster: alone"][1] == "pp 20.00 t/s, tg 5.00 t/s"
    assert rows[LAYERS][1] == (
        "pp 30.00 t/s, tg 4.00 t/s = 1.50x / 0.80x this board alone "
        "(over 10.77.0.2:50052, 10.77.0.3:50052)"
    )
    assert rows[TENSOR][1] == (
        "pp 25.00 t/s, tg 7.50 t/s = 1.25x / 1.50x this board alone "
        "(over 10.77.0.2:50052, 10.77.0.3:50052)"
    )
    assert rows[SPEED][1] == (
        "pp 32.00 t/s, tg 4.50 t/s = 1.60x / 0.90x this board alone "
        "(over 10.77.0.2:50052, 10.77.0.3:50052) (-ts 0.600/0.400)"
    )
    assert rows["cluster: alone"][2] == rows[TENSOR][2] == "pp512 / tg128"


def test_a_failed_tensor_run_is_shown_and_an_older_result_without_one_is_no_problem():
    sec = good_section()
    sec["modes"]["tensor"] = {"status": "FAIL", "reason": "not implemented for deepseek2"}
    rows, problems = _rows(sec)
    assert problems == [] and rows[TENSOR][3] == "FAIL" and rows[LAYERS][3] == "PASS"
    assert "FAIL: not implemented for deepseek2" in rows[TENSOR][1]
    del sec["modes"]["tensor"], sec["modes"]["speed"], sec["tensor_split"]  # an older self-test
    rows, problems = _rows(sec)
    assert problems == [] and rows[TENSOR][1:] == ("not measured (a self-test before it)", "", "-")
    assert rows[SPEED][1:] == ("not measured (a self-test before it)", "", "-")


def test_a_failed_cluster_run_shows_its_reason():
    sec = good_section()
    sec["modes"]["cluster"] = {"status": "FAIL", "reason": "llama-bench exited 1", "runs": []}
    rows, problems = _rows(sec)
    assert problems == []
    assert rows[LAYERS][3] == "FAIL"
    assert "FAIL: llama-bench exited 1" in rows[LAYERS][1]


def test_no_section_is_said_and_is_no_problem(tmp_path, capsys, monkeypatch):
    rows, problems = _rows(None)
    assert problems == [] and "not a cluster head" in rows["cluster"][1]
    rc, out = _report(tmp_path, capsys, monkeypatch, _doc(crash_at=None))
    assert rc == 0 and "not a cluster head" in out


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s.update(workers=[]), "cluster.workers"),
        (lambda s: s.update(workers=["10.77.0.2:50052\x1b[2J"]), "cluster.workers[0]"),
        (lambda s: s.update(workers="10.77.0.2:50052"), "cluster.workers"),
        (
            lambda s: s["modes"]["cluster"].update(pp_tps=float("inf")),
            "cluster.modes.cluster.pp_tps",
        ),
        (lambda s: s["modes"]["alone"].update(tg_tps=-1), "cluster.modes.alone.tg_tps"),
        (lambda s: s["modes"]["alone"].pop("pp_tps"), "cluster.modes.alone: status PASS without"),
        (lambda s: s["modes"]["alone"].update(status="P\u200bASS"), "cluster.modes.alone.status"),
        (lambda s: s["modes"].pop("cluster"), "cluster.modes.cluster"),
        (lambda s: s.update(modes=[1]), "cluster.modes"),
        (lambda s: s["modes"]["tensor"].update(tg_tps="fast"), "cluster.modes.tensor.tg_tps"),
        (lambda s: s["modes"].update(tensor=[]), "cluster.modes.tensor"),
        (lambda s: s["modes"]["speed"].update(status="PASS\n"), "cluster.modes.speed.status"),
        (lambda s: s.update(tensor_split="0.6/0.4\x1b[2J"), "cluster.tensor_split"),
        (lambda s: s.update(tensor_split=[0.6, 0.4]), "cluster.tensor_split"),
        (lambda s: s.update(prompt_tokens=True), "cluster.prompt_tokens"),
    ],
)
def test_hostile_fields_are_named_and_never_trusted(edit, problem):
    sec = copy.deepcopy(good_section())
    edit(sec)
    rows, problems = _rows(sec)
    assert any(p.startswith(problem) for p in problems), problems
    assert list(rows) == ["cluster"] and rows["cluster"][3] == "BAD"


def test_a_section_that_is_not_an_object_is_malformed():
    rows, problems = _rows(["alone"])
    assert problems and rows["cluster"][3] == "BAD"
