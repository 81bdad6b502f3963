"""The packaging rehearsal (issue 21): OE's packaging QA on the real install trees of our recipes.

llama-cpp: the tree .ci/llama.sh built with the recipe's own cmake options (read from the rendered
recipe), `cmake --install`ed into a DESTDIR, with the recipe's do_install:append run there
(ROCKY_LLAMA_INSTALL_DIR: install/ is cmake's output, root/ after the append, PACKAGING.json the
build's paths and options). rocky-selftest, rocky-llm: their do_install run from their files/.
rocky-vkcheck: the tree .ci/llama.sh made with the recipe's own do_compile and do_install on a
copy of its files/ (ROCKY_VKCHECK_INSTALL_DIR: root/ and PACKAGING.json).
Every recipe of rocky_vulkan.packaging.trees.RECIPES is covered: a new one is a row there. Each
failure line names the OE QA test it stands for.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from rocky_vulkan.packaging import oerules, qa, trees

from tests.helpers.project import FIXTURES, ROOT

RULES = oerules.load()
OLD_RECIPE = FIXTURES / "packaging" / "llama-cpp_git.bb.94fcf5d"  # main before issue 21
CI_BUILT = {"llama-cpp", "rocky-vkcheck"}  # the "cmake" and "make" recipes .ci/llama.sh builds


def _install_dir() -> Path:
    return Path(os.environ["ROCKY_LLAMA_INSTALL_DIR"])


def _meta() -> dict:
    return json.loads((_install_dir() / "PACKAGING.json").read_text())


def _build_paths() -> list[str]:
    """OE's TMPDIR holds S, B, WORKDIR, the sysroots and D: here the build's temp dir, the
    Vulkan sysroot (PACKAGING.json) and where the tree itself is staged."""
    return [*_meta()["build_paths"], str(_install_dir())]


def _report(p: qa.Packaged, findings: list[qa.Finding]) -> str:
    lines = [f"{RULES.severity(f.check).upper()}: {f}" for f in findings]
    return trees.manifest(p) + "\n" + "\n".join(lines)


def _errors(findings: list[qa.Finding]) -> list[qa.Finding]:
    """What would stop bitbake: findings of tests in ERROR_QA at the pin."""
    return [f for f in findings if RULES.severity(f.check) == "error"]


def test_every_recipe_has_a_tree() -> None:
    """A recipe added to the table must say how CI gets its tree."""
    for name, entry in trees.RECIPES.items():
        assert entry.tree == "do_install" or name in CI_BUILT, (
            f"{name}: a cmake or make recipe .ci/llama.sh does not build"
        )
        trees.recipe_file(name, ROOT)


@pytest.mark.parametrize(
    "name", sorted(n for n, e in trees.RECIPES.items() if e.tree == "do_install")
)
def test_do_install_recipe_passes_oe_qa(tmp_path: Path, name: str) -> None:
    path = trees.recipe_file(name, ROOT)
    trees.install_from_files(path, RULES, tmp_path / "image", tmp_path / "work")
    p = trees.packaged(name, ROOT, tmp_path / "image", [str(tmp_path)], RULES)
    findings = qa.run_all(p)
    print(_report(p, findings))
    assert p.files(), f"{name}: do_install installed nothing"
    assert not _errors(findings), _report(p, findings)


@pytest.mark.needs_llama_install
def test_llama_cpp_was_built_with_the_recipe_s_options() -> None:
    """One source of truth: the cached build's cmake options are the rendered recipe's now."""
    meta = _meta()
    want = trees.cmake_args(trees.recipe_file("llama-cpp", ROOT), RULES, Path(meta["workdir"]))
    assert meta["cmake_args"] == want, (
        "the recipe changed since the cached build: rerun .ci/llama.sh"
    )


@pytest.mark.needs_llama_install
def test_llama_cpp_tree_passes_oe_qa() -> None:
    root = _install_dir() / "root"
    p = trees.packaged("llama-cpp", ROOT, root, _build_paths(), RULES)
    findings = qa.run_all(p)
    print(_report(p, findings))
    for tool in ("llama-server", "llama-cli", "llama-bench", "test-backend-ops", "rpc-server"):
        assert (root / "usr/bin" / tool).is_file(), f"{tool} not installed"
    assert p.split.owner["/usr/bin/llama-server"] == "llama-cpp-server"
    assert p.split.owner["/usr/bin/rpc-server"] == "llama-cpp-rpc"
    assert any(pkg == "llama-cpp-dev" for _, pkg in p.files()), (
        "no -dev files: not the full install"
    )
    assert not _errors(findings), _report(p, findings)


@pytest.mark.needs_llama_install
def test_old_recipe_fails_on_the_same_build() -> None:
    """The recipe of main before issue 21 on the same `cmake --install` output: OE would stop."""
    install = _install_dir() / "install"
    # Hard links (same file system as the cache): the append's sed/rm replace or unlink entries.
    scratch = Path(tempfile.mkdtemp(dir=_install_dir(), prefix=".old-recipe-"))
    try:
        image = scratch / "image"
        shutil.copytree(install, image, symlinks=True, copy_function=os.link)
        script = trees.task_script(OLD_RECIPE, RULES, "do_install", {"D": str(image)},
                                   parts=("append",))  # fmt: skip
        trees.run_script(script, cwd=scratch)
        p = trees.packaged_recipe(OLD_RECIPE, image, _build_paths(), RULES)
        found = [str(f) for f in _errors(qa.run_all(p))]
    finally:
        shutil.rmtree(scratch)
    print("\n".join(found))
    assert any(
        f.startswith(
            "[buildpaths] File /usr/lib/cmake/ggml/ggml-config.cmake in package llama-cpp-dev"
        )  # fmt: skip
        for f in found
    ), found


@pytest.mark.needs_vkcheck_install
def test_rocky_vkcheck_tree_passes_oe_qa() -> None:
    where = Path(os.environ["ROCKY_VKCHECK_INSTALL_DIR"])
    meta = json.loads((where / "PACKAGING.json").read_text())
    root = where / "root"
    p = trees.packaged("rocky-vkcheck", ROOT, root, [*meta["build_paths"], str(where)], RULES)
    findings = qa.run_all(p)
    print(_report(p, findings))
    assert p.split.owner["/usr/bin/rocky-vkcheck"] == "rocky-vkcheck"
    assert not _errors(findings), _report(p, findings)
