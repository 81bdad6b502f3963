"""The recipes whose install trees CI checks, and how a recipe's values become a checkable tree.

A new recipe is one more row in RECIPES: its .bb under the layer, and how its install tree is
made here:
- "cmake": CI configures the real source with OE's install layout plus the recipe's EXTRA_OECMAKE
  (`cmake_args`), builds, `cmake --install`s into a DESTDIR, then runs the recipe's
  do_install:append there (`task_script(..., "do_install", parts=("append",))`): .ci/llama.sh;
- "do_install": the recipe's own do_install, run from its files/ folder (`install_from_files`);
- "make": CI copies its files/ folder, runs the recipe's do_compile and do_install there (its
  EXTRA_OEMAKE through oe_runmake, the host's compiler and glslc): .ci/llama.sh.

Classes add to FILES at packaging time; those we inherit are modelled in `_class_files`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.packaging import bbfile, oerules, qa, split


@dataclass(frozen=True)
class RecipeEntry:
    path: str  # under the layer
    tree: str  # "cmake", "do_install" or "make"
    layer: str = "meta-rocky-vulkan"  # under meta-rocky-vulkan/


RECIPES = {
    "llama-cpp": RecipeEntry("recipes-llm/llama-cpp/llama-cpp_git.bb", "cmake"),
    "rocky-board": RecipeEntry("recipes-llm/rocky-board/rocky-board_0.1.0.bb", "do_install"),
    "rocky-selftest": RecipeEntry(
        "recipes-llm/rocky-selftest/rocky-selftest_0.1.0.bb", "do_install"
    ),
    "rocky-llm": RecipeEntry("recipes-llm/rocky-llm/rocky-llm_0.1.0.bb", "do_install"),
    "rocky-vkcheck": RecipeEntry(
        "recipes-graphics/rocky-vkcheck/rocky-vkcheck_1.0.0.bb", "make", "meta-rocky-vulkan-distro"
    ),
}
LAYERS = Path("meta-rocky-vulkan")
# What a build host gives the recipe in place of bitbake's BUILD_* (the host compiler for
# vulkan-shaders-gen; OE's BUILD_OPTIMIZATION is "-O2 -pipe").
HOST_BUILD_VARS = {
    "BUILD_CC": "cc",
    "BUILD_CXX": "c++",
    "BUILD_CFLAGS": "-O2 -pipe",
    "BUILD_CXXFLAGS": "-O2 -pipe",
    "BUILD_LDFLAGS": "",
}


def recipe_file(name: str, project: Path) -> Path:
    if name not in RECIPES:
        raise UserError(f"no recipe {name!r} in the packaging table; known: {', '.join(RECIPES)}")
    entry = RECIPES[name]
    path = (Path(project) / LAYERS / entry.layer / entry.path).resolve()
    if not path.is_file():
        raise UserError(f"{path} missing: run `rocky-vulkan render` in {project}")
    return path


def load_store(
    path: Path, rules: oerules.OeRules, overrides: dict[str, str] | None = None
) -> tuple[bbfile.Recipe, bbfile.Store]:
    recipe = bbfile.parse(path)
    base = rules.defaults()
    base.setdefault("UNPACKDIR", str(path.parent / "files"))
    return recipe, bbfile.finalize(recipe, base, overrides or {})


def cmake_args(path: Path, rules: oerules.OeRules, workdir: Path) -> list[str]:
    """OE's install layout (cmake.bbclass's OECMAKE_ARGS) and the recipe's EXTRA_OECMAKE."""
    _, store = load_store(path, rules, {"WORKDIR": str(workdir)})
    args = [*rules.cmake_install_args, *store.words("EXTRA_OECMAKE")]
    left = [a for a in args if "${" in a]
    if left:
        raise UserError(f"{path.name}: EXTRA_OECMAKE has unexpanded values: {left}")
    return args


def task_script(
    path: Path,
    rules: oerules.OeRules,
    task: str,
    overrides: dict[str, str],
    parts: tuple[str, ...] = ("prepend", "", "append"),
) -> str:
    """A bash script running the named parts of the recipe's `task` (bitbake's bbfatal/bbnote
    as shell functions; `set -e` as bitbake runs shell tasks)."""
    recipe, store = load_store(path, rules, overrides)
    names = [f"{task}:{part}" if part else task for part in parts]
    body = "".join(store.expand(recipe.functions.get(name, "")) for name in names)
    if not body.strip():
        raise UserError(f"{path.name} has none of {', '.join(names)}")
    # base.bbclass's oe_runmake: ${MAKE} ${EXTRA_OEMAKE} "$@"; the compiler and its flags come
    # from the environment, as bitbake exports CC, CFLAGS and LDFLAGS.
    make = store.expand(store.get("EXTRA_OEMAKE") or "")
    return (
        "set -e\n"
        'bbfatal() { echo "ERROR: $*" >&2; exit 1; }\n'
        'bbnote() { echo "NOTE: $*"; }\n'
        'bbwarn() { echo "WARNING: $*" >&2; }\n'
        f'oe_runmake() {{ make {make} "$@" || bbfatal "oe_runmake failed"; }}\n' + body
    )


def run_script(script: str, cwd: Path) -> None:
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"task failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")


def install_from_files(path: Path, rules: oerules.OeRules, dest: Path, workdir: Path) -> None:
    """Run the recipe's do_install with S = its files/ (the SRC_URI file:// entries) into dest."""
    files = path.parent / "files"
    overrides = {"S": str(files), "UNPACKDIR": str(files), "D": str(dest), "WORKDIR": str(workdir),
                 "B": str(workdir / "build")}  # fmt: skip
    os.makedirs(dest, exist_ok=True)
    run_script(task_script(path, rules, "do_install", overrides), cwd=files)


def _class_files(recipe: bbfile.Recipe, store: bbfile.Store, root: Path) -> dict[str, list[str]]:
    """FILES that classes add while packaging. systemd.bbclass (systemd_populate_packages): each
    unit of SYSTEMD_SERVICE:<pkg> found in ${sysconfdir}/systemd/system or
    ${systemd_system_unitdir} goes to FILES:<pkg>, for each pkg of SYSTEMD_PACKAGES (?= ${PN})."""
    extra: dict[str, list[str]] = {}
    if "systemd" not in recipe.inherits:
        return extra
    dirs = [f"{store.get('sysconfdir')}/systemd/system", store.get("systemd_system_unitdir")]
    for pkg in (store.get("SYSTEMD_PACKAGES") or recipe.pn).split():
        for service in store.words(f"SYSTEMD_SERVICE:{pkg}"):
            found = [f"{d}/{service}" for d in dirs if (root / d.lstrip("/") / service).exists()]
            if not found:
                raise UserError(f"[systemd] didn't find service unit '{service}', "
                                f"specified in SYSTEMD_SERVICE:{pkg}")  # fmt: skip
            extra.setdefault(pkg, []).append(found[0])
    return extra


def packaged(
    name: str, project: Path, root: Path, build_paths: list[str], rules: oerules.OeRules
) -> qa.Packaged:
    """The install tree at `root` of the table's recipe `name`, split into its packages."""
    return packaged_recipe(recipe_file(name, project), root, build_paths, rules)


def packaged_recipe(
    path: Path, root: Path, build_paths: list[str], rules: oerules.OeRules
) -> qa.Packaged:
    """The install tree at `root` split into the packages of the recipe at `path`."""
    recipe, store = load_store(path, rules)
    if store.get("PACKAGE_DEBUG_SPLIT_STYLE") == "debug-with-srcpkg":
        store.raw[f"FILES:{recipe.pn}-src"] = "/usr/src/debug"
    packages = store.words("PACKAGES")
    files = {pkg: store.words(f"FILES:{pkg}") for pkg in packages}
    for pkg, extra in _class_files(recipe, store, Path(root)).items():
        files.setdefault(pkg, []).extend(extra)
    rdepends = {pkg: qa.explode_deps(store.get(f"RDEPENDS:{pkg}")) for pkg in packages}
    dirs = {
        k: store.get(k) for k in ("libdir", "base_libdir", "libexecdir", "exec_prefix", "bindir")
    }
    return qa.Packaged(
        root=Path(root),
        split=split.split(Path(root), packages, files),
        rdepends=rdepends,
        build_paths=[p for p in build_paths if p],
        dirs=dirs,
        ignored_file_rdeps=rules.ignored_file_rdeps,
        file_providers=rules.file_providers,
    )


def manifest(p: qa.Packaged) -> str:
    """One line per package: how many files it ships, and a few of them."""
    by_pkg: dict[str, list[str]] = {}
    for path, pkg in p.files():
        by_pkg.setdefault(pkg, []).append(path)
    lines = []
    for pkg in p.split.order:
        got = by_pkg.get(pkg, [])
        shown = " ".join(shlex.quote(x) for x in got[:4]) + (" ..." if len(got) > 4 else "")
        lines.append(f"{pkg}: {len(got)} files {shown}".rstrip())
    return "\n".join(lines)
