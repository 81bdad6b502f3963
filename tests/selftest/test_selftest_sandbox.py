"""The self-test's sandbox (issue 11, item 3): the checks run as an unprivileged system user with
the GPU's groups, under systemd's hardening; only the publishing step (motd, console) runs as
root. Scored with the real `systemd-analyze security --offline=true` on the rendered unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.project import ROOT
from tests.helpers.selftest import fake_root, write_config
from tests.helpers.systemd import ANALYZE, MAX_EXPOSURE, exposure, needs_analyze, settings

pytestmark = pytest.mark.timeout(180)

LAYER_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-selftest/files"
BOARD_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board/files"
UNIT = LAYER_FILES / "rocky-selftest.service"


def _unit_with_real_script(tmp_path: Path) -> Path:
    """The rendered unit, with the self-test's path pointing at an executable copy of the entry
    script (verify checks that the ExecStart/ExecStopPost programs exist)."""
    script = tmp_path / "rocky-selftest"
    script.write_bytes((LAYER_FILES / "rocky-selftest").read_bytes())
    script.chmod(0o755)
    text = UNIT.read_text()
    assert "/usr/bin/rocky-selftest " in text
    path = tmp_path / "rocky-selftest.service"
    path.write_text(text.replace("/usr/bin/rocky-selftest ", f"{script} "))
    return path


@needs_analyze
def test_unit_exposure_is_at_most_4(tmp_path):
    score, out = exposure(_unit_with_real_script(tmp_path))
    print(f"systemd-analyze security --offline=true: exposure {score}")
    assert score <= MAX_EXPOSURE, out


@needs_analyze
def test_the_score_can_fail(tmp_path):
    # The same unit with its sandbox lines removed scores far above the target: the check
    # above measures the hardening, it is not a constant.
    path = _unit_with_real_script(tmp_path)
    text = path.read_text()
    bare = text.split("# Sandbox:")[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    bare = bare.replace("User=rocky-selftest\n", "").replace("Group=rocky-selftest\n", "")
    path.write_text(bare)
    score, out = exposure(path)
    assert score > MAX_EXPOSURE, out


@needs_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path):
    unit = _unit_with_real_script(tmp_path)
    proc = subprocess.run(
        [ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [
        line for line in (proc.stdout + proc.stderr).splitlines()
        if "rocky-selftest.service" in line
    ]  # fmt: skip
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def test_checks_run_unprivileged_and_only_the_publish_step_is_root():
    s = settings(UNIT.read_text())
    assert s["User"] == ["rocky-selftest"] and s["Group"] == ["rocky-selftest"]
    assert s["SupplementaryGroups"] == ["render video"]
    assert s["CapabilityBoundingSet"] == [""] and s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"]
    assert s["PrivateTmp"] == ["yes"] and s["StateDirectory"] == ["rocky-selftest"]
    (start,) = s["ExecStart"]
    assert start.startswith("/usr/bin/rocky-selftest ") and " run " in start
    assert "--console" not in start and "--motd=" in start.split()  # root's job, not the run's
    (post,) = s["ExecStopPost"]
    assert post.startswith("+/usr/bin/rocky-selftest ") and " publish " in post
    assert "--console /dev/console" in post
    privileged = [v for values in s.values() for v in values if v.startswith(("+", "!"))]
    assert privileged == [post]
    # The stamp: set by whichever step saved the verdict, never before the run.
    assert "--stamp /var/lib/rocky-selftest/first-boot.stamp" in start
    assert "--stamp /var/lib/rocky-selftest/first-boot.stamp" in post
    # Both steps agree on the runtime dir the note travels through.
    assert "--note-dir %t/rocky-selftest" in start and "--note-dir %t/rocky-selftest" in post


def test_recipe_creates_the_system_user_and_leaves_the_state_dir_to_systemd():
    recipe = next(
        (ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-selftest").glob("*.bb")
    ).read_text()
    assert "inherit allarch systemd useradd" in recipe
    param = recipe.split("USERADD_PARAM:${PN} = ")[1].split('"')[1]
    words = param.replace("\\", " ").split()
    assert words[-1] == "rocky-selftest" and "--system" in words
    assert words[words.index("--shell") + 1] == "${base_sbindir}/nologin"
    assert "-G" not in words and "--groups" not in words  # GPU groups only via the unit
    install = re.search(r"^do_install\(\) \{\n(.*?)^\}", recipe, re.M | re.S).group(1)
    assert "install" in install and "localstatedir" not in install  # StateDirectory= makes it


def _run_layer_copy(tmp_path: Path, *args: str, user: int | None = None):
    lib = tmp_path / "share/rocky-selftest"
    (lib / "rocky_selftest").mkdir(parents=True, exist_ok=True)
    for src in (BOARD_FILES / "rocky_selftest").glob("*.py"):
        (lib / "rocky_selftest" / src.name).write_bytes(src.read_bytes())
    script = (LAYER_FILES / "rocky-selftest").read_text()
    entry = tmp_path / "rocky-selftest"
    entry.write_text(script.replace('"/usr/share/rocky-selftest"', repr(str(lib))))
    # The venv's python may live under /root (0700): the unprivileged run uses the system's.
    python = SYSTEM_PYTHON if user is not None else sys.executable
    cmd = [python, "-S", "-I", "-B", str(entry), *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def open_tmp():
    """A scratch dir an unprivileged uid can reach (pytest's tmp_path sits under a 0700 dir)."""
    path = Path(tempfile.mkdtemp(prefix="rocky-sandbox-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.needs_root
@pytest.mark.needs_tool("setpriv", "util-linux")
@pytest.mark.needs_tool(SYSTEM_PYTHON, "Debian: python3")
def test_run_needs_no_root_and_the_root_step_publishes(open_tmp):
    """The privilege split for real: `run` as an unprivileged uid (as the DynamicUser), which
    cannot touch the root-owned motd, then `publish` as root."""
    tmp_path = open_tmp
    nobody = 65534
    root_dir = fake_root(tmp_path, kmsg=["panthor fb000000.gpu: [drm] CSF FW using interface"])
    results, notes = tmp_path / "state", tmp_path / "run"
    for d in (results, notes):
        d.mkdir()
        os.chown(d, nobody, nobody)
    motd = tmp_path / "motd"
    motd.write_text("Welcome\n")
    motd.chmod(0o644)
    board = json.loads((BOARD_FILES / "config.json").read_text())
    board.update(
        model_path=str(tmp_path / "missing.gguf"),
        results_dir=str(results),
        motd_path=str(motd),
        sysroot=str(root_dir),
        bin_dir=str(tmp_path / "nobin"),
        vulkaninfo=str(tmp_path / "nobin/vulkaninfo"),
        gpu_wait_s=0,
    )
    del board["schema_version"]
    cfg = write_config(tmp_path / "config.json", **board)
    cfg.chmod(0o644)
    stamp = results / "first-boot.stamp"
    run = _run_layer_copy(
        tmp_path, "--config", str(cfg), "run", "--stamp", str(stamp),
        "--note-dir", str(notes), "--motd=", user=nobody,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "PASS gpu_driver" in run.stdout and "Traceback" not in run.stderr
    assert os.stat(results / "result.json").st_uid == nobody
    assert motd.read_text() == "Welcome\n"  # the unprivileged step did not (could not) touch it
    denied = _run_layer_copy(
        tmp_path, "--config", str(cfg), "publish", "--note-dir", str(notes), user=nobody
    )
    assert "cannot update" in denied.stdout and motd.read_text() == "Welcome\n"
    console = tmp_path / "console"
    pub = _run_layer_copy(
        tmp_path, "--config", str(cfg), "publish", "--note-dir", str(notes),
        "--stamp", str(stamp), "--console", str(console),
    )  # fmt: skip
    assert pub.returncode == 0, pub.stdout + pub.stderr
    assert "rocky-selftest FAIL" in motd.read_text() and motd.read_text().startswith("Welcome\n")
    assert console.read_text().startswith("rocky-selftest FAIL")
    assert stamp.read_text().startswith("FAIL ")


def test_only_the_selftest_unit_reaches_its_own_loopback_over_ipv4():
    """The serving step talks HTTP to llama-server on 127.0.0.1: the self-test's unit allows IPv4
    on localhost only, in its own network namespace; the tuner's unit keeps AF_UNIX only."""
    s = settings(UNIT.read_text())
    assert s["PrivateNetwork"] == ["yes"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET"]
    assert s["IPAddressAllow"] == ["localhost"] and s["IPAddressDeny"] == ["any"]
    tune = settings((LAYER_FILES / "rocky-selftest-tune.service").read_text())
    assert tune["PrivateNetwork"] == ["yes"] and tune["RestrictAddressFamilies"] == ["AF_UNIX"]
    assert "IPAddressAllow" not in tune and tune["IPAddressDeny"] == ["any"]
