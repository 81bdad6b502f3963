"""Shared fixtures (a scratch copy of the project) and the `needs_*` markers.

A `needs_*` marker says what a test needs from outside the checkout; a test whose need is not met
is skipped with a reason naming what to set or install (`pytest -rs` lists them). The markers are
registered from the same table (`pytest --markers` lists them) and checked here, once, for every
test that carries them: ENV_NEEDS below for those met by environment variables, then
`needs_root` (uid 0) and `needs_tool(name, hint)` (`name` on PATH, or that absolute path).

`slow` is apart: it selects the long tests that CI runs in its own stages (`-m slow` in .ci/run,
.ci/llama.sh and .ci/sim.sh), whatever they need.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

# The helpers' asserts report like the tests' own (they were test-module code before); this must
# come before the first import of a helper.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.project import ROOT  # noqa: E402


@dataclass(frozen=True)
class EnvNeed:
    names: tuple[str, ...]  # environment variables
    what: str  # what they point at, for the skip reason
    any_of: bool = False  # one of the names is enough (else all of them are needed)

    def unmet(self) -> str | None:
        given = [bool(os.environ.get(name)) for name in self.names]
        if (any if self.any_of else all)(given):
            return None
        *first, last = self.names
        names = f"{', '.join(first)} {'or' if self.any_of else 'and'} {last}" if first else last
        return f"set {names}: {self.what}"


ENV_NEEDS = {
    "needs_llama_bin": EnvNeed(("ROCKY_LLAMA_BIN_DIR",), "a llama.cpp bin/ built by .ci/llama.sh"),
    "needs_llama_sdist": EnvNeed(
        ("ROCKY_LLAMA_SDIST_CACHE",), "the PyPI sdists of the pinned llama.cpp (.ci/llama.sh)"
    ),
    "needs_llama_tree": EnvNeed(
        ("ROCKY_LLAMA_SDIST_CACHE", "ROCKY_LLAMA_SRC_DIR"),
        "PyPI sdists of the pinned llama.cpp, or a patched tree",
        any_of=True,
    ),
    "needs_llama_install": EnvNeed(
        ("ROCKY_LLAMA_INSTALL_DIR",),
        "llama.cpp's install tree, built with the recipe's options (.ci/llama.sh)",
    ),
    "needs_llama_quantize": EnvNeed(("ROCKY_LLAMA_QUANTIZE",), "a llama-quantize binary"),
    "needs_debian_root": EnvNeed(
        ("ROCKY_SIM_ROOT",), "the simulator's Debian root (rocky-vulkan sim setup; .ci/sim.sh)"
    ),
    "needs_meta_oe": EnvNeed(
        ("ROCKY_META_OE_GIT",),
        "a git dir of meta-openembedded holding vulkan_cts.repo.commit (a clone or mirror)",
    ),
    "needs_sim_model": EnvNeed(("ROCKY_SIM_MODEL",), "a small GGUF (.ci/sim.sh writes one)"),
    "needs_sim_big_model": EnvNeed(
        ("ROCKY_SIM_BIG_MODEL",), "testmodel's qwen2.5-3b-shape with 36 layers (ROCKY_SIM_FULL=1)"
    ),
    "needs_sim_prove_sources": EnvNeed(
        ("ROCKY_MESA_GIT", "ROCKY_GGML_GIT", "ROCKY_SIM_PROVE_CACHE"),
        "Mesa and ggml git dirs and a cache for sim prove",
    ),
    "needs_vm_boot": EnvNeed(
        ("ROCKY_VM_BOOT",),
        "1, to build and boot the image's userspace in a VM (minutes, root, network; .ci/run)",
    ),
    "needs_vm_powerloss": EnvNeed(
        ("ROCKY_VM_POWERLOSS",),
        "1, to cut the VM's power mid-self-test and mid-pull (about 10 min; a recorded run)",
    ),
    "needs_mesa_src": EnvNeed(("ROCKY_MESA_SRC",), "a Mesa source tree"),
    "needs_vkcheck_bin": EnvNeed(
        ("ROCKY_VKCHECK_BIN",), "rocky-vkcheck built by .ci/llama.sh (tools/rocky_vkcheck)"
    ),
    "needs_vkcheck_install": EnvNeed(
        ("ROCKY_VKCHECK_INSTALL_DIR",), "rocky-vkcheck's install tree, from its recipe's tasks"
    ),
    "needs_lavapipe": EnvNeed(
        ("ROCKY_LAVAPIPE_ICD", "ROCKY_LAVAPIPE_LIB"),
        "bookworm-backports' lavapipe (.ci/llama.sh unpacks it)",
    ),
    "needs_bitbake_dumps": EnvNeed(
        ("ROCKY_BITBAKE_ENV_DIR",), "run tools/scripts/bitbake-env.sh MIRRORS OUT first"
    ),
    "needs_bitbake": EnvNeed(("ROCKY_BITBAKE_DIR",), "a bitbake 2.18 checkout"),
    "needs_oecore": EnvNeed(("ROCKY_OECORE_DIR",), "openembedded-core at the pin"),
    "needs_sshd": EnvNeed(
        ("ROCKY_SSHD",), "a command running sshd (see docs/verification/config-access.md)"
    ),
}


@cache
def _tool_missing(name: str) -> bool:
    if os.path.isabs(name):
        return not os.path.exists(name)
    return shutil.which(name) is None


def _unmet(mark: pytest.Mark) -> str | None:
    """Why the need that `mark` states is not met here, or None (also for other markers)."""
    need = ENV_NEEDS.get(mark.name)
    if need:
        why = need.unmet()
        return why and f"{mark.name}: {why}"
    if mark.name == "needs_root":
        return None if os.geteuid() == 0 else "needs_root: run as root"
    if mark.name == "needs_tool":
        name, *hint = mark.args
        if _tool_missing(name):
            return f"needs_tool: {name} is not installed" + (f" ({hint[0]})" if hint else "")
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Register the needs_* markers (--strict-markers) from the one table of what they need."""
    for name, need in ENV_NEEDS.items():
        config.addinivalue_line("markers", f"{name}: {', '.join(need.names)}, {need.what}")
    config.addinivalue_line("markers", "needs_root: runs as root (uid 0)")
    config.addinivalue_line(
        "markers", "needs_tool(name, hint): the program `name` on PATH (or that absolute path)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        unmet = [why for mark in item.iter_markers() if (why := _unmet(mark))]
        if unmet:
            item.add_marker(pytest.mark.skip(reason="; ".join(reversed(unmet))))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's config, patches and generated tree to break at will."""
    dest = tmp_path / "proj"
    dest.mkdir()
    shutil.copy(ROOT / "rocky-vulkan.yaml", dest)
    for tree in ("patches", "meta-rocky-vulkan", "kas"):
        if (ROOT / tree).exists():
            shutil.copytree(ROOT / tree, dest / tree)
    return dest
