"""The recipe reader and OE's rules: bitbake's operators, the committed oe-rules.json against a
fresh extraction from a real `bitbake -e` dump, and the llama-cpp recipe's install step on a small
tree shaped like llama.cpp's `cmake --install` (the old recipe fails buildpaths, ours passes)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from rocky_vulkan.errors import UserError
from rocky_vulkan.packaging import bbfile, oerules, qa, trees

from tests.helpers.project import FIXTURES, ROOT

RULES = oerules.load()
OLD_RECIPE = FIXTURES / "packaging" / "llama-cpp_git.bb.94fcf5d"  # main before issue 21


def test_bitbake_operators_merge_over_oe_defaults(tmp_path: Path) -> None:
    path = tmp_path / "demo_1.0.bb"
    path.write_text(
        'PACKAGES =+ "${PN}-extra"\n'
        'FILES:${PN}-dev += "${datadir}/demo-dev"\n'
        'A = "1"\nA:append = " late"\nA += "2"\nA =+ "0"\nB ?= "b"\nB ?= "c"\nC ??= "weak"\n'
        "OPTS = \"\\\n    -DX=${A} \\\n    -DY=${@d.getVar('B')[:1]} \\\n\"\n"
        "do_install:append() {\n    echo ${D}${bindir} $shellvar ${unknown}\n}\n"
    )
    recipe, store = trees.load_store(path, RULES, {"D": "/d"})
    assert store.words("PACKAGES")[:2] == ["demo-extra", "demo-src"]
    assert store.words("PACKAGES")[-1] == "demo"
    dev = store.words("FILES:demo-dev")
    assert dev[0] == "/usr/include" and dev[-1] == "/usr/share/demo-dev"
    assert store.get("A") == "0 1 2 late"
    assert (store.get("B"), store.get("C")) == ("b", "weak")
    assert store.words("OPTS") == ["-DX=0", "1", "2", "late", "-DY=b"]
    body = bbfile.task_body(recipe, "do_install", store)
    assert body.strip() == "echo /d/usr/bin $shellvar ${unknown}"


def test_python_functions_and_tasks_are_read_not_run(tmp_path: Path) -> None:
    path = tmp_path / "demo_1.0.bb"
    path.write_text(
        'A = "1"\npython do_check() {\n    bb.fatal("no")\n}\naddtask check after do_install\n'
        "python () {\n    d.setVar('A', '2')\n}\n"
    )
    recipe, store = trees.load_store(path, RULES)
    assert set(recipe.python_functions) == {"do_check", "__anonymous"}
    assert not recipe.functions and store.get("A") == "1"
    path.write_text("require demo.inc\n")
    with pytest.raises(UserError, match="require is not followed"):
        trees.load_store(path, RULES)


MINI_DUMP = """\
#
# $PACKAGES [2 operations]
#   set /x/openembedded-core/meta/conf/bitbake.conf:334
#     "${PN}-dev ${PN}"
#   prepend /x/meta-rocky-vulkan/recipes-llm/demo/demo_1.0.bb:3
#     "${PN}-tests"
# pre-expansion value:
#   "${PN}-tests ${PN}-dev ${PN}"
PACKAGES="demo-tests demo-dev demo"
#
# $FILES:demo-dev [2 operations]
#   set /x/openembedded-core/meta/conf/bitbake.conf:360
#     "${includedir}"
#   rename from FILES:${PN}-dev data.py:97 [expandKeys]
#     "${includedir}"
FILES:demo-dev="/usr/include"
#
# $FILES:demo-tests [2 operations]
#   append /x/meta-rocky-vulkan/recipes-llm/demo/demo_1.0.bb:4
#     "${bindir}/test-*"
#   rename from FILES:${PN}-tests data.py:97 [expandKeys]
#     " ${bindir}/test-*"
FILES:demo-tests=" /usr/bin/test-*"
PN="demo"
export bindir="/usr/bin"
ERROR_QA="buildpaths dev-so  buildpaths"
"""


def test_extract_takes_oe_defaults_not_the_recipe_s_additions() -> None:
    data = oerules.extract(MINI_DUMP)
    assert data["packages"] == {"value": "${PN}-dev ${PN}", "from": "meta/conf/bitbake.conf:334"}
    assert data["files"] == {
        "${PN}-dev": {"value": "${includedir}", "from": "meta/conf/bitbake.conf:360"}
    }
    assert data["vars"]["bindir"] == "/usr/bin"
    assert data["error_qa"] == ["buildpaths", "dev-so"]


@pytest.mark.needs_bitbake_dumps
@pytest.mark.needs_oecore
def test_committed_rules_are_a_fresh_extraction() -> None:
    """oe-rules.json is what tools/scripts/oe-rules-from-dump.py makes of a real dump."""
    dumps = sorted(Path(os.environ["ROCKY_BITBAKE_ENV_DIR"]).glob("*/llama-cpp.env"))
    assert dumps, "no */llama-cpp.env under ROCKY_BITBAKE_ENV_DIR"
    fresh = oerules.extract(dumps[0].read_text(), Path(os.environ["ROCKY_OECORE_DIR"]))
    assert fresh == json.loads(json.dumps(RULES.data)), "rerun tools/scripts/oe-rules-from-dump.py"


def test_the_rules_are_oe_s() -> None:
    """The committed rules hold what the checks rely on, and say where they came from."""
    assert RULES.data["oe_core_revision"].startswith("ef022bf")
    checks = {"buildpaths", "installed-vs-shipped", "dev-so", "dev-elf", "staticdev", "libdir",
              "rpaths", "useless-rpaths", "dev-deps", "debug-deps", "file-rdeps"}  # fmt: skip
    assert checks <= set(RULES.error_qa), "each check here must be an error at the pin"
    assert RULES.data["files"]["${PN}"]["from"].startswith("meta/conf/bitbake.conf:")
    assert RULES.file_providers["/usr/bin/python3"] == ["python3-core"]
    assert "/usr/bin/env" in RULES.ignored_file_rdeps
    assert RULES.severity("buildpaths") == "error"
    assert RULES.severity("file-rdeps (env)") == "error"
    assert RULES.severity("pep517-backend") == "warning"
    assert RULES.severity("no-such-test") == "off"


def test_cmake_args_are_the_recipe_s(tmp_path: Path) -> None:
    args = trees.cmake_args(trees.recipe_file("llama-cpp", ROOT), RULES, tmp_path)
    assert "-DCMAKE_INSTALL_LIBDIR:PATH=lib" in args
    assert f"-DGGML_VULKAN_SHADERS_GEN_TOOLCHAIN={tmp_path}/host-toolchain.cmake" in args
    assert "-DLLAMA_BUILD_COMMIT=389ff61" in args and "-DLLAMA_BUILD_SERVER=ON" in args
    assert "-DGGML_RPC=ON" in args  # rpc-server, a cluster worker
    assert not [a for a in args if "${" in a]


def _cmake_like_tree(d: Path, workdir: Path) -> Path:
    """What llama.cpp's install rules put in ${D}, in miniature."""
    elf = Path(shutil.which("true") or "/bin/true").resolve().read_bytes()
    for rel, data, mode in [
        *[
            (f"usr/bin/{t}", elf, 0o755)
            for t in (
                "llama-bench",
                "llama-perplexity",
                "llama-simple",
                "llama-server",
                "llama-cli",
                "test-backend-ops",
                "rpc-server",
            )
        ],  # fmt: skip
        ("usr/bin/convert_hf_to_gguf.py", b"#!/usr/bin/env python3\n", 0o755),
        # SNAPSHOT_DIR="${S}/tests/snapshots" is compiled into this one test
        (
            "usr/bin/test-quant-type-selection",
            elf + f"{workdir}/src/tests/snapshots".encode(),
            0o755,
        ),  # fmt: skip
        ("usr/lib/libggml.so.0.11.1", elf, 0o755),
        ("usr/include/ggml.h", b"", 0o644),
        ("usr/lib/pkgconfig/llama.pc", b"prefix=/usr\n", 0o644),
        (
            "usr/lib/cmake/ggml/ggml-config.cmake",
            f'set(GGML_VULKAN_SHADERS_GEN_TOOLCHAIN "{workdir}/host-toolchain.cmake")\n'
            'set(GGML_VULKAN "ON")\n'.encode(),
            0o644,
        ),  # fmt: skip
    ]:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
        (d / rel).chmod(mode)
    os.symlink("libggml.so.0.11.1", d / "usr/lib/libggml.so.0")
    os.symlink("libggml.so.0", d / "usr/lib/libggml.so")
    return d


@pytest.mark.parametrize("recipe", ["old", "ours"])
def test_llama_cpp_install_append_on_a_cmake_like_tree(tmp_path: Path, recipe: str) -> None:
    workdir = tmp_path / "work"
    image = _cmake_like_tree(tmp_path / "image", workdir)
    path = OLD_RECIPE if recipe == "old" else trees.recipe_file("llama-cpp", ROOT)
    script = trees.task_script(path, RULES, "do_install", {"D": str(image)}, parts=("append",))
    trees.run_script(script, cwd=tmp_path)
    p = trees.packaged_recipe(path, image, [str(tmp_path)], RULES)
    found = [str(f) for f in qa.run_all(p)]
    if recipe == "old":
        assert found == [
            "[buildpaths] File /usr/bin/test-quant-type-selection in package llama-cpp-tests "
            f"contains reference to {tmp_path} (a build, source or temp path: OE's TMPDIR)",
            "[buildpaths] File /usr/lib/cmake/ggml/ggml-config.cmake in package llama-cpp-dev "
            f"contains reference to {tmp_path} (a build, source or temp path: OE's TMPDIR)",
            "[file-rdeps (env)] /usr/bin/convert_hf_to_gguf.py in package llama-cpp runs `env "
            "python3`: nothing in RDEPENDS:llama-cpp provides /usr/bin/python3 (OE itself checks "
            "only /usr/bin/env, which it ignores)",
        ]
    else:
        assert found == []
        assert p.split.owner["/usr/bin/llama-server"] == "llama-cpp-server"
        assert p.split.owner["/usr/bin/test-backend-ops"] == "llama-cpp-tests"
        assert p.split.owner["/usr/bin/rpc-server"] == "llama-cpp-rpc"
        assert p.split.owner["/usr/lib/cmake/ggml/ggml-config.cmake"] == "llama-cpp-dev"


@pytest.mark.needs_bitbake_dumps
def test_merge_matches_bitbake_s_own_values() -> None:
    """Our reader's PACKAGES, FILES and RDEPENDS for llama-cpp equal bitbake's expanded values in
    the dump, for every package both have (the dump may predate a package the recipe added)."""
    dumps = sorted(Path(os.environ["ROCKY_BITBAKE_ENV_DIR"]).glob("*/llama-cpp.env"))
    assert dumps, "no */llama-cpp.env under ROCKY_BITBAKE_ENV_DIR"
    final, _ = oerules.parse_dump(dumps[0].read_text())
    _, store = trees.load_store(trees.recipe_file("llama-cpp", ROOT), RULES)
    ours, theirs = store.words("PACKAGES"), final["PACKAGES"].split()
    assert [p for p in ours if p in theirs] == theirs
    for pkg in theirs:
        assert store.words(f"FILES:{pkg}") == final.get(f"FILES:{pkg}", "").split(), pkg
        deps = final.get(f"RDEPENDS:{pkg}", "")
        assert qa.explode_deps(store.get(f"RDEPENDS:{pkg}")) == qa.explode_deps(deps), pkg
