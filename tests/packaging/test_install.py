"""The package works installed normally (not editable): nothing it runs reaches into the checkout
around it, and nothing writes into the installed package."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.project import ROOT


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A regular (non-editable) install of a copy of the source into a plain folder."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "tools", src / "tools", ignore=shutil.ignore_patterns("*.egg-info"))
    target = tmp / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return target


def _run(site: Path, cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Python code with the installed copy first on sys.path and the checkout's tools/ off it."""
    prelude = (
        "import sys\n"
        f"sys.path = [p for p in sys.path if p != {str(ROOT / 'tools')!r}]\n"
        f"sys.path.insert(0, {str(site)!r})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_only_the_two_packages_are_installed(installed: Path):
    tops = sorted(p.name for p in installed.iterdir() if not p.name.endswith(".dist-info"))
    assert [t for t in tops if t != "bin"] == ["rocky_selftest", "rocky_vulkan"]


def test_installed_package_renders_checks_and_lists_tiles_without_the_checkout(
    installed: Path, tmp_path: Path
):
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(ROOT / "rocky-vulkan.yaml", proj)
    for tree in ("patches", "meta-rocky-vulkan", "kas", "tools/rocky_vkcheck"):
        shutil.copytree(ROOT / tree, proj / tree)
    before = _tree_digest(installed)
    out = _run(
        installed,
        proj,
        "import rocky_vulkan, rocky_selftest\n"
        "print(rocky_vulkan.__file__)\nprint(rocky_selftest.__file__)\n"
        "from rocky_vulkan.cli import main\n"
        "assert main(['render', '--check']) == 0\n"
        "assert main(['tiles', 'candidates', '--json']) == 0\n"
        "assert main(['render']) == 0\n",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith(str(installed)) and lines[1].startswith(str(installed))
    assert "match a fresh render" in out.stdout and '"builtin": true' in out.stdout
    assert _tree_digest(installed) == before, "a command wrote into the installed package"
    assert _tree_digest(proj / "meta-rocky-vulkan") == _tree_digest(ROOT / "meta-rocky-vulkan")


def test_installed_selftest_runs_from_its_own_copy(installed: Path, tmp_path: Path):
    out = _run(
        installed,
        tmp_path,
        "import rocky_selftest.cli as c\nprint(c.__file__)\n"
        "sys.argv = ['rocky-selftest', '--help']\nc.main()\n",
    )
    assert out.stdout.startswith(str(installed)), out.stderr[-2000:]
    assert "usage: rocky-selftest" in out.stdout
