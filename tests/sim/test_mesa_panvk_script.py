"""Argument handling of tools/rocky_vulkan/sim/mesa-panvk-build.sh (no root, no build: these fail
early).

The build and simulation paths themselves need a Debian root and a Mesa tree; they are recorded in
docs/verification/mesa-patch.md.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.project import ROOT

SCRIPT = ROOT / "tools/rocky_vulkan/sim/mesa-panvk-build.sh"


def _run(tmp_path: Path, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MESA_ROOT": str(tmp_path / "no-root")}
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=30
    )


def test_usage_without_command(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 2
    for command in (
        "root",
        "build --tag",
        "run --driver",
        "sweep --driver",
        "exec --",
        "llama --src",
    ):
        assert command in out.stderr


def test_build_without_root_names_the_fix(tmp_path: Path) -> None:
    out = _run(tmp_path, "build", "--tag", "x", "--src", str(tmp_path))
    assert out.returncode == 1
    assert "no build root" in out.stderr and "root' first" in out.stderr


def test_run_without_driver_bundle_is_reported(tmp_path: Path) -> None:
    (tmp_path / "no-root").mkdir()
    out = _run(tmp_path, "run", "--driver", "nope", "--", "true")
    assert out.returncode == 1
    assert "no driver bundle nope" in out.stderr


# Bad arguments, refused before anything is looked up: (arguments, what stderr says).
REFUSED = {
    "build_needs_a_tag": (("build", "--src", "{tmp}"), "--tag NAME is required"),
    "sweep_missing_model_is_reported": (
        ("sweep", "--driver", "stock", "--model", "/work/model/none.gguf"),
        "/work/model/none.gguf not found inside the root",
    ),
    "exec_needs_a_command": (("exec", "--"), "exec: -- COMMAND"),
    "llama_needs_src_and_name": (
        ("llama", "--src", "/work/x"),
        "llama: --src DIR (inside the root) --name NAME",
    ),
    "llama_refuses_a_hostile_name": (
        ("llama", "--src", "/work/x", "--name", "../../etc"),
        "may hold only",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_arguments_are_refused(tmp_path: Path, case: str) -> None:
    args, says = REFUSED[case]
    out = _run(tmp_path, *(a.format(tmp=tmp_path) for a in args))
    assert out.returncode == 1
    assert says in out.stderr


def test_llama_in_an_old_root_without_cmake_names_the_fix(tmp_path: Path) -> None:
    # A root made before cmake/glslc/spirv-headers joined the package list.
    (tmp_path / "no-root/usr/bin").mkdir(parents=True)
    out = _run(tmp_path, "llama", "--src", "/work/x", "--name", "b9101")
    assert out.returncode == 1
    assert "has no cmake/glslc" in out.stderr and "root' again" in out.stderr


def test_root_installs_what_the_llama_build_needs() -> None:
    # The package list is data in the script; the llama.cpp Vulkan build needs these three.
    text = SCRIPT.read_text()
    pkgs = [w.strip('"') for w in text[text.index("BUILD_PKGS=") : text.index("SIM_PKGS=")].split()]
    for name in ("cmake", "glslc", "spirv-headers"):
        assert name in pkgs


TUNE = ROOT / "tools/scripts/sim-tune.sh"


def _tune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(tmp_path, *args, script=TUNE)


def test_sim_tune_usage_without_an_output_folder(tmp_path: Path) -> None:
    out = _tune(tmp_path)
    assert out.returncode == 2 and "sim-tune.sh OUT" in out.stderr


def test_sim_tune_refuses_a_budget_that_is_not_seconds(tmp_path: Path) -> None:
    out = _tune(tmp_path, str(tmp_path / "out"), "--budget", "1; rm -rf /")
    assert out.returncode == 2 and "--budget takes seconds" in out.stderr


def test_sim_tune_without_a_prove_root_says_to_run_sim_prove(tmp_path: Path) -> None:
    out = _tune(tmp_path, str(tmp_path / "out"))
    assert out.returncode == 1
    assert "no-root/work/llama-src-b9101" in out.stderr and "sim prove" in out.stderr
    assert not (tmp_path / "out").exists()
