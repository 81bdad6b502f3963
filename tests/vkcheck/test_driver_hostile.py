"""`rocky-selftest driver` reads rocky-vkcheck's output as hostile input (issue 24, part 2).

The five documents in tests/fixtures/vkcheck/ are real output of the real program (lavapipe at
warp 16: every check passed; `--inject-mismatch secondaries`; no Vulkan driver; the simulated
Mali-G610, which executes nothing: two queues, every case differs; the same with Debian's panvk
26.1.6, which runs out of private VA at vkEndCommandBuffer in `secondaries`). Every leaf of
them replaced by a value of the wrong type, out of range or not matching its pattern, every key
dropped, an unknown key added, a key given twice, counts that contradict each other or the exit
status, truncated text: each must be refused naming the field, and the section must be an
ERROR, never a PASS. The process-level failures (not found, killed, timed out, an exit status
the program does not have) likewise. Fake programs (shell scripts) stand in only where the real
one cannot be made to misbehave: a hang, 20 MB of output, escape bytes, a document that lies.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rocky_selftest import driver
from rocky_selftest.runner import RunResult

from tests.helpers.project import FIXTURES, ROOT
from tests.helpers.selftest import OLD_PASS, fake_tool, write_config

SAMPLES = {
    "pass": (FIXTURES / "vkcheck" / "lavapipe-warp16-pass.json", 0),
    "inject": (FIXTURES / "vkcheck" / "inject-secondaries.json", 1),
    "nodriver": (FIXTURES / "vkcheck" / "no-driver.json", 2),
    "sim": (FIXTURES / "vkcheck" / "sim-g610-stock-panvk.json", 1),
    "oom": (FIXTURES / "vkcheck" / "sim-g610-panvk-26.1-oom.json", 3),
}


def _text(name: str) -> str:
    return SAMPLES[name][0].read_text()


def _doc(name: str) -> dict[str, Any]:
    return json.loads(_text(name))


def _run(stdout: str, code: int | None, **kw: Any) -> RunResult:
    return RunResult(["rocky-vkcheck"], code, kw.pop("timed_out", False), 1.0, stdout,
                     kw.pop("stderr", ""), **kw)  # fmt: skip


def _section(stdout: str, code: int | None, **kw: Any) -> dict[str, Any]:
    return driver.section_from_run(_run(stdout, code, **kw), "/usr/bin/rocky-vkcheck", 300, "t")


# ---- the real documents --------------------------------------------------------------------


def test_the_real_documents_parse_and_give_their_verdicts():
    ok = _section(_text("pass"), 0)
    assert ok["status"] == "PASS" and ok["reason"] is None, ok
    assert [c["name"] for c in ok["checks"]] == list(driver.CHECK_NAMES)
    assert ok["device"]["driver_name"] == "llvmpipe" and ok["device"]["subgroup_size"] == 16
    bad = _section(_text("inject"), 1)
    assert bad["status"] == "FAIL", bad
    assert "test-only --inject-mismatch secondaries" in bad["reason"]
    assert "secondaries 1 of 15 cases differ (first:" in bad["reason"]
    none = _section(_text("nodriver"), 2)
    assert none["status"] == "ERROR" and none["device"] is None
    assert none["reason"].startswith("vkCreateInstance returned VK_ERROR_INCOMPATIBLE_DRIVER")
    sim = _section(_text("sim"), 1)
    assert sim["status"] == "FAIL" and sim["queues"] == 2, sim
    assert sim["device"]["name"] == "Mali-G610 MC4" and sim["device"]["driver_name"] == "panvk"
    assert "tls_growth 40 of 40 cases differ" in sim["reason"]
    oom = _section(_text("oom"), 3)
    assert oom["status"] == "ERROR" and oom["error"]["check"] == "secondaries", oom
    assert oom["reason"] == (
        "vkEndCommandBuffer returned VK_ERROR_OUT_OF_DEVICE_MEMORY (during secondaries)"
    )


def test_the_program_s_check_names_are_the_parser_s():
    source = (ROOT / "tools/rocky_vkcheck/rocky-vkcheck.c").read_text()
    found = [line.split('"')[1] for line in source.splitlines() if line.strip().startswith(
        '{.name = "')]  # fmt: skip
    assert tuple(found) == driver.CHECK_NAMES


# ---- every leaf, every key -----------------------------------------------------------------

BAD_INTS = ["1", True, 1.5, -1, 1 << 32, [], {}]
BAD_TEXT = [5, True, "", "\x1b[2J", "a\u202eb", "caf\u00e9", "x" * 401, [], {}]
BAD_NULLS = [5, "x", [], True]


def _leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list) and path and path[-1] == "checks":
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [(path, value)]


def _set(doc: Any, path: tuple, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _mutations() -> list[tuple[str, str, str]]:
    """(sample, what, text) for every wrong value of every leaf and every missing or extra key."""
    out = []
    for sample in SAMPLES:
        doc = _doc(sample)
        for path, value in _leaves(doc):
            name = ".".join(map(str, path))
            if type(value) is bool:
                bad = [1, "true", None]
            elif type(value) is int:
                bad = BAD_INTS
            elif type(value) is float:
                bad = ["1", True, -1.0, 1e300, [], None]
            elif isinstance(value, str):
                bad = BAD_TEXT
            elif value is None:
                bad = BAD_NULLS
            else:  # queues: a list
                bad = [5, "x", None, [{"family": 0, "index": 0}] * 3]
            out += [(sample, f"{name}={v!r:.20}", json.dumps(_set(doc, path, v))) for v in bad]
        for path in {p[:-1] for p, _ in _leaves(doc) if p[:-1]} | {()}:
            target = doc
            for key in path:
                target = target[key]
            where = ".".join(map(str, path)) or "document"
            for key in target:
                dropped = copy.deepcopy(doc)
                holder = dropped
                for k in path:
                    holder = holder[k]
                del holder[key]
                out.append((sample, f"{where} without {key}", json.dumps(dropped)))
            extra = _set(doc, (*path, "surprise"), 1)
            out.append((sample, f"{where} with an unknown key", json.dumps(extra)))
    return out


MUTATIONS = _mutations()


MUTATION_IDS = [f"{what}@{sample}" for sample, what, _ in MUTATIONS]


@pytest.mark.parametrize(("sample", "what", "text"), MUTATIONS, ids=MUTATION_IDS)
def test_every_wrong_field_is_refused(sample: str, what: str, text: str):
    code = SAMPLES[sample][1]
    with pytest.raises(driver.BadDocument):
        driver.parse_document(text, code)
    section = _section(text, code)
    assert section["status"] == "ERROR", (what, section)
    assert "not a rocky-vkcheck document" in section["reason"]


def test_the_mutations_cover_every_leaf():
    assert len(MUTATIONS) > 300


def _consistency_cases() -> list[tuple[str, str, Any, int]]:
    ok, inj, nod = _doc("pass"), _doc("inject"), _doc("nodriver")
    c0 = ("checks", 0)
    return [
        ("counts do not add up", _set(ok, (*c0, "failed"), 1), 0),
        ("pass with a failed case", _set(_set(ok, (*c0, "failed"), 1), (*c0, "passed"), 19), 0),
        (
            "a failed case without first_mismatch",
            _set(inj, ("checks", 2, "first_mismatch"), None),
            1,
        ),  # fmt: skip
        (
            "a mismatch where expected == got",
            _set(
                inj,
                ("checks", 2, "first_mismatch", "got"),
                inj["checks"][2]["first_mismatch"]["expected"],
            ),
            1,
        ),  # fmt: skip
        ("the process exited otherwise", ok, 1),
        ("passed false with exit 0", _set(ok, ("passed",), False), 0),
        (
            "exit 1 with every check passing",
            _set(_set(ok, ("exit_code",), 1), ("passed",), False),
            1,
        ),  # fmt: skip
        ("an error with exit 0", _set(ok, ("error",), nod["error"]), 0),
        ("exit 2 without an error", _set(nod, ("error",), None), 2),
        ("checks out of order", _set(ok, ("checks",), ok["checks"][::-1]), 0),
        ("a check missing", _set(ok, ("checks",), ok["checks"][:4]), 0),
        ("a check twice", _set(ok, ("checks",), [*ok["checks"][:4], ok["checks"][3]]), 0),
        ("not-run with cases", _set(nod, ("checks", 0, "cases"), 0) | {}, 2),
        ("a status error no error names", _set(nod, ("checks", 1, "status"), "error"), 2),
        ("another schema", _set(ok, ("schema",), "rocky-selftest-result"), 0),
        ("schema version true", _set(ok, ("schema_version",), True), 0),
        ("schema version 2", _set(ok, ("schema_version",), 2), 0),
        ("inject names no check", _set(inj, ("inject_mismatch",), "all"), 1),
        ("an unknown device type", _set(ok, ("device", "type"), "npu"), 0),
        ("a call that is not a Vulkan call", _set(nod, ("error", "call"), "rm -rf"), 2),
    ][:]


CONSISTENCY = _consistency_cases()


@pytest.mark.parametrize(("what", "doc", "code"), CONSISTENCY, ids=[c[0] for c in CONSISTENCY])
def test_contradictions_are_refused(what: str, doc: Any, code: int):
    if what == "not-run with cases":  # make it contradict: not-run but cases counted
        doc = _set(_set(doc, ("checks", 0, "cases"), 3), ("checks", 0, "passed"), 3)
    with pytest.raises(driver.BadDocument):
        driver.parse_document(json.dumps(doc), code)
    assert _section(json.dumps(doc), code)["status"] == "ERROR"


def _text_cases() -> list[tuple[str, str]]:
    ok = _text("pass")
    return [
        ("empty", ""),
        ("truncated", ok[: len(ok) // 2]),
        ("a list", f"[{ok}]"),
        ("trailing data", ok + "{}"),
        ("a key twice", ok.replace('"passed": true,', '"passed": true, "passed": true,')),
        ("NaN seconds", ok.replace('"seconds": 0.', '"seconds": NaN, "x": 0.', 1)),
        ("deep nesting", "[" * 100000 + "]" * 100000),
        ("100 kB", ok[:-2] + ', "pad": "' + "x" * 100_000 + '"}'),
        ("not UTF-8 text", ok.replace("llvmpipe", "llvm\udcffpipe")),
        ("a huge integer", ok.replace('"vendor_id": 65541', '"vendor_id": ' + "9" * 5000)),
    ]


@pytest.mark.parametrize(("what", "text"), _text_cases(), ids=[c[0] for c in _text_cases()])
def test_broken_text_is_refused(what: str, text: str):
    with pytest.raises(driver.BadDocument):
        driver.parse_document(text, 0)
    assert _section(text, 0)["status"] == "ERROR"


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"error": "cannot start /usr/bin/rocky-vkcheck: No such file"}, "install rocky-vkcheck"),
        ({"timed_out": True}, "did not finish within the budget"),
        ({"code": -9}, "crashed: killed by SIGKILL"),
        ({"code": 134}, "crashed: aborted"),
        ({"code": 7}, "crashed: exit status 7"),
        ({"code": 2, "stdout": "", "stderr": "bad argument '--x'"}, "refused its arguments"),
        ({"code": 0, "stdout": ""}, "not a rocky-vkcheck document"),
    ],
)
def test_process_failures_are_errors(kw: dict, words: str):
    code = kw.pop("code", None)
    stdout = kw.pop("stdout", _text("pass"))
    section = _section(stdout, code, **kw)
    assert section["status"] == "ERROR" and words in section["reason"], section


# ---- through the CLI, with fake programs for what the real one cannot do ----------------------


def _cli(tmp: Path, body: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    bin_dir = fake_tool(tmp, "rocky-vkcheck", body)
    results = tmp / "results"
    config = write_config(tmp / "config.json", model_path=str(tmp / "m.gguf"),
                          bin_dir=str(bin_dir), results_dir=str(results), motd_path="")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    return subprocess.run(
        [sys.executable, "-m", "rocky_selftest", "--config", str(config), "driver", *extra],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


def _old_pass(tmp: Path) -> Path:
    results = tmp / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "result.json").write_text(json.dumps(OLD_PASS))
    return results


def test_a_pass_is_recorded_beside_the_run_s_verdict(tmp_path: Path):
    results = _old_pass(tmp_path)
    sample = SAMPLES["pass"][0]
    out = _cli(tmp_path, f"cat {sample}")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((results / "result.json").read_text())
    assert doc["driver"]["status"] == "PASS"
    assert {k: v for k, v in doc.items() if k != "driver"} == OLD_PASS
    assert json.loads((results / "driver.json").read_text()) == doc["driver"]


def test_a_lying_document_is_an_error_and_the_old_verdict_stays(tmp_path: Path):
    results = _old_pass(tmp_path)
    lie = _doc("inject")
    lie["exit_code"], lie["passed"] = 0, True  # "passed" with a failed check, exit 0
    (tmp_path / "lie.json").write_text(json.dumps(lie))
    out = _cli(tmp_path, f"cat {tmp_path / 'lie.json'}")
    assert out.returncode == 3, out.stdout + out.stderr
    doc = json.loads((results / "result.json").read_text())
    assert doc["verdict"] == "PASS" and doc["checks"] == OLD_PASS["checks"]
    assert doc["driver"]["status"] == "ERROR"
    assert "exit_code 0 but not every check passed" in doc["driver"]["reason"]


def test_a_hang_is_killed_at_the_budget(tmp_path: Path):
    _old_pass(tmp_path)
    t0 = time.monotonic()
    out = _cli(tmp_path, "sleep 1000 & sleep 1000", "--budget", "10")
    took = time.monotonic() - t0
    assert out.returncode == 3 and took < 30, (took, out.stdout)
    assert "did not finish within the budget of 10 s" in out.stdout


def test_floods_and_escape_bytes_stay_out_of_the_terminal_and_the_file(tmp_path: Path):
    results = _old_pass(tmp_path)
    body = (
        "printf '\\033[2J\\033]0;pwned\\007 evil\\n' >&2; "
        "head -c 20000000 /dev/zero | tr '\\0' 'x'; exit 1"
    )
    out = _cli(tmp_path, body)
    assert out.returncode == 3
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    text = (results / "result.json").read_text()
    assert len(text) < 64 << 10, len(text)
    assert json.loads(text)["driver"]["reason"].startswith("rocky-vkcheck exited 1")


def test_no_result_yet_writes_driver_json_only(tmp_path: Path):
    out = _cli(tmp_path, f"cat {SAMPLES['nodriver'][0]}; exit 2")
    assert out.returncode == 3, out.stdout
    results = tmp_path / "results"
    assert not (results / "result.json").exists()
    assert json.loads((results / "driver.json").read_text())["status"] == "ERROR"
    assert "no result.json yet" in out.stdout


def test_a_broken_result_json_is_left_alone(tmp_path: Path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "result.json").write_text('{"schema": "rocky-selftest-result", "verdict": "PA')
    out = _cli(tmp_path, f"cat {SAMPLES['pass'][0]}")
    assert out.returncode == 3, out.stdout
    assert (results / "result.json").read_text().endswith('"PA')
    assert "result.json not updated" in out.stdout


@pytest.mark.parametrize("budget", ["9", "3601", "x", "-5"])
def test_budget_outside_its_range_is_a_usage_error(tmp_path: Path, budget: str):
    out = _cli(tmp_path, "exit 0", "--budget", budget)
    assert out.returncode == 2 and "10..3600" in out.stderr
