"""How the tuner reaches the board: its unit, its data, and how llama.cpp's users pick up the
choice (the wrapper and the login-shell script, both run here with the real sh)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rocky_selftest import paths
from rocky_vulkan.config import load_config

from tests.helpers import project
from tests.helpers.project import ROOT
from tests.helpers.systemd import ANALYZE, MAX_EXPOSURE, exposure, needs_analyze, settings

RECIPE_DIR = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-selftest"
FILES = RECIPE_DIR / "files"
BOARD_CONFIG = (
    ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board/files/config.json"
)
TUNE_UNIT = FILES / "rocky-selftest-tune.service"
SPEC = project.candidates()[4].spec


def test_board_config_and_recipe_carry_the_tuner():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    board = json.loads(BOARD_CONFIG.read_text())
    assert board["tune_budget_s"] == cfg.selftest.tune_budget_s
    assert board["tune_at_first_boot"] is cfg.selftest.tune_at_first_boot
    assert board["tune_candidates"] == paths.TILE_CANDIDATES
    recipe = next(RECIPE_DIR.glob("*.bb")).read_text()
    for name in ("tile_candidates.json", "rocky-selftest-tune.service", "rocky-tiles-env"):
        assert f"file://{name}" in recipe
    assert "rocky-selftest-tune.service" in recipe.split("SYSTEMD_SERVICE:${PN} =")[1]
    assert "${sysconfdir}/profile.d/rocky-tiles.sh" in recipe
    shipped = (FILES / "tile_candidates.json").read_bytes()
    assert shipped == (ROOT / "tools/rocky_vulkan/tiles/tile_candidates.json").read_bytes()


def test_tune_unit_resumes_until_done_and_runs_unprivileged():
    text = TUNE_UNIT.read_text()
    assert f"ConditionPathExists=!{paths.TUNE_STAMP}" in text
    assert "After=rocky-selftest.service" in text
    s = settings(text)
    assert s["User"] == ["rocky-selftest"] and "CapabilityBoundingSet" in s
    assert s["ExecStart"][0].endswith(f"tune --first-boot --stamp {paths.TUNE_STAMP}")
    assert not any(v.startswith("+") for v in s["ExecStart"])


def _with_real_script(tmp_path: Path) -> Path:
    script = tmp_path / "rocky-selftest"
    script.write_bytes((FILES / "rocky-selftest").read_bytes())
    script.chmod(0o755)
    path = tmp_path / "rocky-selftest-tune.service"
    path.write_text(TUNE_UNIT.read_text().replace("/usr/bin/rocky-selftest ", f"{script} "))
    return path


@needs_analyze
def test_tune_unit_exposure_is_at_most_4_and_verifies(tmp_path):
    unit = _with_real_script(tmp_path)
    score, out = exposure(unit)
    assert score <= MAX_EXPOSURE, out
    proc = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True)
    complaints = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "tune.service" in ln]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def _script(tmp_path: Path, name: str) -> Path:
    env_file = tmp_path / "tuned-tiles.env"
    text = (FILES / name).read_text().replace(paths.TILES_ENV, str(env_file))
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _wrapped(tmp_path: Path, content: str | None, preset: str | None = None) -> str:
    if content is not None:
        (tmp_path / "tuned-tiles.env").write_text(content)
    env = {"PATH": "/usr/bin:/bin"} | ({"GGML_VK_MALI_WARPTILE": preset} if preset else {})
    cmd = [
        str(_script(tmp_path, "rocky-tiles-env")),
        "sh",
        "-c",
        "echo ${GGML_VK_MALI_WARPTILE-unset}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_wrapper_exports_the_tuned_spec(tmp_path):
    assert _wrapped(tmp_path, f"# tuned\nGGML_VK_MALI_WARPTILE={SPEC}\n") == SPEC


def test_wrapper_without_a_choice_leaves_the_builtin_tiles(tmp_path):
    assert _wrapped(tmp_path, None) == "unset"


def test_wrapper_keeps_an_explicit_setting(tmp_path):
    assert _wrapped(tmp_path, f"GGML_VK_MALI_WARPTILE={SPEC}\n", preset="0") == "0"


@pytest.mark.parametrize(
    "value",
    ["$(touch PWNED)", "int=1;touch PWNED", "`touch PWNED`", "int=256 x", "int=256|x", ""],
)
def test_wrapper_refuses_what_is_not_a_spec(tmp_path, value):
    assert _wrapped(tmp_path, f"GGML_VK_MALI_WARPTILE={value}\n") == "unset"
    assert not (tmp_path / "PWNED").exists()


def test_profile_script_exports_only_a_spec_and_cleans_up(tmp_path):
    profile = _script(tmp_path, "rocky-tiles.sh")
    (tmp_path / "tuned-tiles.env").write_text(f"GGML_VK_MALI_WARPTILE={SPEC}\n")
    show = f'. {profile}; echo "$GGML_VK_MALI_WARPTILE|${{rocky_tiles_spec-gone}}"'
    done = subprocess.run(["sh", "-c", show], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == f"{SPEC}|gone", done.stderr
    (tmp_path / "tuned-tiles.env").write_text("GGML_VK_MALI_WARPTILE=$(id)\n")
    done = subprocess.run(
        ["sh", "-c", f". {profile}; echo ${{GGML_VK_MALI_WARPTILE-unset}}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.stdout.strip() == "unset"
