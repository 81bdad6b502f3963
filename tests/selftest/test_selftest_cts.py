"""`rocky-selftest cts`: the case list from the installed mustpass lists, deqp-vk in chunks
within a budget, crashes and hangs survived, results recorded beside the last run's.

deqp-vk here is tests/helpers/fake_deqp.py, a stand-in: VK-GL-CTS cannot be built in CI's time.
It takes only deqp-vk's real option names and writes logs in deqp's own format."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rocky_selftest import cli, cts
from rocky_selftest.settings import Settings, SettingsError, load_settings

from tests.helpers import fake_deqp
from tests.helpers.fake_deqp import calls, cases, env_of, install, status_file
from tests.helpers.selftest import OLD_PASS, write_config

COMPUTE = cases("compute.basic", 7)
API = cases("api.command_buffers", 3)
OTHER = cases("texture.filtering", 4)


@pytest.fixture
def cts_dir(tmp_path):
    return install(tmp_path, {"compute": COMPUTE, "api": API, "texture": OTHER})


def settings(tmp_path, cts_dir, **kw) -> Settings:
    base = Settings(
        model_path="/nonexistent",
        model_sha256=None,
        ubatch_sizes=(64,),
        results_dir=str(tmp_path / "results"),
        cts_dir=str(cts_dir),
        cts_case_timeout_s=30,
    )
    return replace(base, **kw)


def run(s: Settings, patterns=("dEQP-VK.compute.*",), budget=120, chunk=3, **env):
    s = replace(s, env={**env_of(calls=str(s.cts_dir) + "/calls.jsonl"), **env_of(**env)})
    lines: list[str] = []
    return cts.run_cts(s, tuple(patterns), budget, chunk, log=lines.append)


# --- the case list --------------------------------------------------------------------------


def test_patterns_select_from_the_mustpass_lists_in_order(cts_dir):
    sel = cts.select_cases(
        str(cts_dir), ["dEQP-VK.compute.*", "dEQP-VK.api.command_buffers.case_1"]
    )
    assert sel.cases == [*COMPUTE, API[1]]
    assert sel.files == 4  # the index and its three lists


def test_a_star_matches_across_groups_like_deqp(cts_dir):
    sel = cts.select_cases(str(cts_dir), ["dEQP-VK.*_2"])
    assert sel.cases == [COMPUTE[2], API[2], OTHER[2]]


def test_nested_lists_are_followed(tmp_path):
    d = install(tmp_path, {"compute": COMPUTE, "api": API}, nested=True)
    assert cts.select_cases(str(d), ["dEQP-VK.*"]).cases == [*COMPUTE, *API]


def test_missing_cts_names_the_kas_fragment(tmp_path):
    with pytest.raises(cts.CtsError) as err:
        cts.select_cases(str(tmp_path / "nothing"), ["dEQP-VK.compute.*"])
    assert "kas/vulkan-cts.yml" in str(err.value) and "vulkan-cts" in str(err.value)


@pytest.mark.parametrize(
    "pattern",
    ["", "compute.*", "dEQP-GLES2.*", "dEQP-VK.a b", "dEQP-VK.$(reboot)", "dEQP-VK." + "a" * 400],
)
def test_bad_patterns_are_refused(cts_dir, pattern):
    with pytest.raises(cts.CtsError, match="case pattern"):
        cts.select_cases(str(cts_dir), [pattern])


def test_hostile_list_lines_are_skipped_and_counted(cts_dir):
    group = cts_dir / "mustpass/main/vk-default/compute.txt"
    group.write_bytes(
        group.read_bytes()
        + b"dEQP-VK.compute.evil\x1b[2J\n"
        + b"dEQP-VK.compute."
        + b"x" * 5000
        + b"\n"
        + b"\x00\xff\n# a comment\n\n"
        + COMPUTE[0].encode()
        + b"\n"  # a duplicate: listed once
    )
    index = cts_dir / "mustpass/main/vk-default.txt"
    index.write_text(index.read_text() + "../../../../etc/passwd.txt\nvk-default/absent.txt\n")
    sel = cts.select_cases(str(cts_dir), ["dEQP-VK.compute.*"])
    assert sel.cases == COMPUTE
    assert sel.bad_lines == 3
    assert any("absent.txt" in n for n in sel.notes)


def test_the_lists_are_read_bounded(cts_dir, monkeypatch):
    monkeypatch.setattr(cts, "MAX_LIST_BYTES", 200)
    with pytest.raises(cts.CtsError, match="larger than"):
        cts.select_cases(str(cts_dir), ["dEQP-VK.*"])


def test_selected_cases_are_capped_and_the_cap_said(cts_dir):
    sel = cts.select_cases(str(cts_dir), ["dEQP-VK.*"], max_cases=5)
    assert len(sel.cases) == 5 and sel.matched == 14
    assert any("narrow the patterns" in n for n in sel.notes)


# --- running --------------------------------------------------------------------------------


def test_all_pass_in_chunks_with_deqps_real_options(tmp_path, cts_dir):
    section = run(settings(tmp_path, cts_dir))
    assert section["verdict"] == "PASS"
    assert section["counts"] == {"Pass": 7}
    assert section["summary"] == {"pass": 7, "fail": 0, "not_supported": 0, "other": 0}
    assert section["chunks"] == 3 and section["not_run"] == 0
    argv = calls(cts_dir / "calls.jsonl")
    assert len(argv) == 3
    assert "--deqp-log-images=disable" in argv[0] and "--deqp-log-shader-sources=disable" in argv[0]
    assert any(a.startswith("--deqp-caselist-file=") for a in argv[0])
    assert any(a.startswith("--deqp-log-filename=") for a in argv[0])


def test_statuses_are_counted_and_failures_named(tmp_path, cts_dir):
    statuses = {COMPUTE[1]: "Fail", COMPUTE[2]: "NotSupported", COMPUTE[3]: "Bogus",
                COMPUTE[4]: "CompatibilityWarning"}  # fmt: skip
    section = run(settings(tmp_path, cts_dir), status=status_file(tmp_path, statuses))
    assert section["verdict"] == "FAIL"
    assert section["counts"] == {
        "Pass": 3, "Fail": 1, "NotSupported": 1, "CompatibilityWarning": 1, "Unknown": 1
    }  # fmt: skip
    assert section["summary"] == {"pass": 3, "fail": 1, "not_supported": 1, "other": 2}
    assert section["failed"] == [
        {"case": COMPUTE[1], "status": "Fail"},
        {"case": COMPUTE[3], "status": "Unknown"},
    ]
    assert section["unknown_codes"] == {"Bogus": 1}


def test_a_crash_records_the_case_and_the_rest_still_runs(tmp_path, cts_dir):
    section = run(settings(tmp_path, cts_dir), crash=COMPUTE[1])
    assert section["counts"] == {"Pass": 6, "Crash": 1}
    assert section["failed"] == [{"case": COMPUTE[1], "status": "Crash"}]
    assert section["crashes"] == 1 and section["not_run"] == 0
    # chunk 1 crashed at its second case; its third ran again first in the next chunk
    argv = calls(cts_dir / "calls.jsonl")
    second = next(a for a in argv[1] if a.startswith("--deqp-caselist-file="))
    assert open(second.split("=", 1)[1]).read().splitlines()[0] == COMPUTE[2]


def test_a_hang_becomes_a_timeout_and_the_rest_still_runs(tmp_path, cts_dir):
    s = settings(tmp_path, cts_dir, cts_case_timeout_s=1)
    section = run(s, hang=COMPUTE[4])
    assert section["counts"] == {"Pass": 6, "Timeout": 1}
    assert section["stalls"] == 1 and section["not_run"] == 0


def test_the_budget_stops_new_chunks_and_says_how_many_were_not_run(tmp_path, cts_dir):
    section = run(settings(tmp_path, cts_dir), budget=2, chunk=2, sleep="0.4")
    assert section["budget_exhausted"] is True
    assert section["not_run"] > 0
    assert section["ran"] + section["not_run"] == 7
    assert section["duration_s"] < 6
    assert "not run (budget spent)" in "\n".join(cts.summary_lines(section))


def test_a_deqp_that_dies_at_startup_stops_the_run_with_its_reason(tmp_path, cts_dir):
    section = run(settings(tmp_path, cts_dir), startup="1")
    assert section["verdict"] == "ERROR" and section["ran"] == 0 and section["not_run"] == 7
    assert len(calls(cts_dir / "calls.jsonl")) == 1
    assert any("Failed to create a Vulkan instance" in n for n in section["notes"])


def test_cases_the_binary_does_not_have_count_as_no_result(tmp_path, cts_dir):
    section = run(settings(tmp_path, cts_dir), missing=COMPUTE[6])
    assert section["counts"] == {"Pass": 6, "NoResult": 1}
    assert section["verdict"] == "FAIL"


def test_stdouts_totals_are_not_believed(tmp_path, cts_dir):
    # The stand-in prints "Passed: 7/7 (100.0%)" like deqp-vk whatever the log says.
    section = run(settings(tmp_path, cts_dir), status=status_file(tmp_path, {COMPUTE[0]: "Fail"}))
    assert section["summary"]["fail"] == 1


# --- the command ----------------------------------------------------------------------------


def cli_config(tmp_path, cts_dir, **kw):
    return write_config(
        tmp_path / "config.json",
        model_path="/nonexistent",
        results_dir=str(tmp_path / "results"),
        motd_path="",
        cts_dir=str(cts_dir),
        cts_cases=["dEQP-VK.api.*"],
        **kw,
    )


def test_the_command_adds_a_cts_section_and_keeps_the_last_run(tmp_path, cts_dir, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "result.json").write_text(json.dumps(OLD_PASS))
    config = cli_config(tmp_path, cts_dir)
    assert cli.main(["--config", str(config), "cts"]) == 0
    doc = json.loads((results / "result.json").read_text())
    assert doc["verdict"] == "PASS" and doc["checks"] == OLD_PASS["checks"]
    assert doc["cts"]["counts"] == {"Pass": 3}
    assert doc["cts"]["patterns"] == ["dEQP-VK.api.*"]
    assert json.loads((results / "cts.json").read_text())["cts"] == doc["cts"]
    assert "3 pass, 0 fail" in capsys.readouterr().out


def test_without_a_result_yet_only_cts_json_is_written(tmp_path, cts_dir):
    config = cli_config(tmp_path, cts_dir)
    code = cli.main(["--config", str(config), "cts", "--case", "dEQP-VK.compute.*",
                     "--chunk", "100"])  # fmt: skip
    assert code == 0
    results = tmp_path / "results"
    assert not (results / "result.json").exists()
    assert json.loads((results / "cts.json").read_text())["cts"]["ran"] == 7


def test_the_command_without_cts_says_which_fragment_to_build(tmp_path, capsys):
    config = cli_config(tmp_path, tmp_path / "no-cts")
    assert cli.main(["--config", str(config), "cts"]) == cli.EXIT_ERROR
    assert "kas/vulkan-cts.yml" in capsys.readouterr().out


def test_a_failing_case_fails_the_command(tmp_path, cts_dir):
    config = cli_config(
        tmp_path, cts_dir, env=env_of(status=status_file(tmp_path, {API[0]: "Fail"}))
    )
    assert cli.main(["--config", str(config), "cts"]) == cli.EXIT_FAIL


@pytest.mark.parametrize(
    "key, value",
    [
        ("cts_cases", []),
        ("cts_cases", ["dEQP-VK.ok.*", "rm -rf /"]),
        ("cts_cases", "dEQP-VK.compute.*"),
        ("cts_budget_s", 0),
        ("cts_budget_s", 1.5),
        ("cts_chunk_cases", -1),
        ("cts_case_timeout_s", True),
    ],
)
def test_the_config_refuses_bad_cts_values(tmp_path, key, value):
    config = write_config(tmp_path / "c.json", model_path="/m", **{key: value})
    with pytest.raises(SettingsError, match=key):
        load_settings(str(config))


def test_the_defaults_are_the_issues_subset():
    s = load_settings(str(write_config(fake_deqp_tmp_config(), model_path="/m")))
    assert s.cts_cases == cts.DEFAULT_CASES and s.cts_dir == "/usr/lib/vulkan-cts"
    assert "dEQP-VK.synchronization2.op.multi_queue.*" in s.cts_cases


def fake_deqp_tmp_config():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp()) / "config.json"


assert fake_deqp.REAL_OPTIONS  # the stand-in's option list is the one these tests rely on


def test_links_in_the_work_dir_are_removed_not_followed(tmp_path, cts_dir):
    s = settings(tmp_path, cts_dir)
    work = tmp_path / "results" / "cts"
    work.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (work / "chunk-001.txt").symlink_to(victim)
    (work / "chunk-001.qpa").symlink_to(victim)
    (work / "mine.txt").write_text("not ours")
    section = run(s)
    assert section["counts"] == {"Pass": 7}
    assert victim.read_text() == "keep me" and (work / "mine.txt").exists()


def test_a_work_dir_that_is_a_link_is_refused(tmp_path, cts_dir):
    s = settings(tmp_path, cts_dir)
    (tmp_path / "results").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "results" / "cts").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(cts.CtsError, match="not a directory"):
        run(s)
