"""Issue 22, the self-test's adversarial cases (tests/helpers/hostile_selftest.py): each one is
refused with a clear message or held (the right verdict, shown clean), never a traceback, a hang
or a quiet wrong answer. `python -m tests.helpers.adversary selftest` prints the counts."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import adversary
from tests.helpers import hostile_selftest as hostile
from tests.helpers.selftest import OLD_PASS, read_only

CASES = adversary.area_cases("selftest")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_selftest_input(case):
    adversary.assert_good(case)


# ---- targeted: what the generated cases do not pin down -----------------------------------------


def test_a_flood_keeps_the_head_and_the_tail_and_says_how_much_went(tmp_path):
    # 3 MB of numbered lines from a real process: the first and last lines survive, the middle
    # is one line naming the dropped byte count exactly.
    from rocky_selftest.runner import MAX_CAPTURE, run_tool

    lines = [f"{i:07d}" for i in range(375_000)]  # 8 bytes a line: 3,000,000 bytes
    code = "import sys; sys.stdout.write(''.join(f'{i:07d}\\n' for i in range(375_000)))"
    res = run_tool([sys.executable, "-c", code], {}, 30)
    assert res.failure() is None
    out = res.stdout
    assert out.startswith(lines[0] + "\n") and out.endswith(lines[-1] + "\n")
    dropped = 3_000_000 - MAX_CAPTURE
    assert f"[... rocky-selftest dropped {dropped} bytes here ...]" in out
    assert len(out.encode()) < MAX_CAPTURE + 100


def test_the_run_lock_is_not_inherited_by_what_a_tool_leaves_behind(tmp_path):
    # A tool leaves `setsid sleep` running: the run's lock must go with the run, or every later
    # run would find the board busy until the sleeper ends.
    with hostile.Scene() as sc:
        sc.tool("llama-bench", f"setsid sleep 30 & echo $! >> {sc.pids}\ncat {sc.good}")
        assert sc.by_hand().rc == 0
        again = sc.by_hand()
        assert again.rc == 0, again.text


def test_status_shows_an_unsaved_note_only_for_its_own_results_dir(tmp_path):
    # The note in the runtime dir names the result.json it could not replace: `status` for
    # another results dir (another config) keeps to that dir's own result.
    with hostile.Scene() as sc, read_only(sc.results) as how:
        if not how:
            pytest.skip("cannot make a directory read-only here")
        assert sc.by_hand().rc == 3
        assert "ERROR" in hostile.verdict_line(sc.status().out)
        # `status` runs as any user: the note is as readable as result.json
        assert (sc.notes / "verdict.json").stat().st_mode & 0o777 == 0o644
        other = tmp_path / "other"
        other.mkdir()
        (other / "result.json").write_text(json.dumps(OLD_PASS))
        with hostile._default_note_dir(sc.notes):
            r = hostile.cli_main(["--config", str(sc.cfg), "status", "--results-dir", str(other)])
        assert r.rc == 0 and "PASS" in hostile.verdict_line(r.out)


def test_a_saved_run_clears_the_unsaved_note_of_an_earlier_one():
    with hostile.Scene() as sc:
        with read_only(sc.results) as how:
            if not how:
                pytest.skip("cannot make a directory read-only here")
            assert sc.by_hand().rc == 3
        assert sc.by_hand().rc == 0  # the disk is writable again
        st = sc.status()
        assert st.rc == 0 and "PASS" in hostile.verdict_line(st.out), st.out


def test_the_rendered_board_config_passes_the_strict_loader(tmp_path):
    # Every range here is at least as wide as rocky-vulkan.yaml's schema: what render writes
    # for the board loads.
    from rocky_selftest.settings import load_settings
    from rocky_vulkan.config import load_config
    from rocky_vulkan.layer.board import selftest_board_config

    from tests.helpers.project import ROOT

    cfg = selftest_board_config(load_config(ROOT / "rocky-vulkan.yaml"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    s = load_settings(str(path))
    assert s.ubatch_sizes and s.run_timeout_s >= 10
