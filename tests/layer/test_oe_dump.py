"""tools/scripts/oe_dump.py: what the cross rehearsals (tools/scripts/cross-llama.sh,
cross-mesa.sh) read from the recipe and from `bitbake -e` dumps. The recipe's EXTRA_OECMAKE and
do_configure:prepend are expanded, never half-expanded; the committed extract of bitbake -e
llama-cpp (.ci/llama-cpp-bitbake-e.txt, CI's input) holds everything cross-llama.sh reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.project import ROOT

SCRIPT = ROOT / "tools/scripts/oe_dump.py"
RECIPE_DIR = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp"
RECIPE = RECIPE_DIR / "llama-cpp_git.bb"
EXTRACT = ROOT / ".ci/llama-cpp-bitbake-e.txt"
CROSS = ROOT / "tools/scripts/cross-llama.sh"


def oe(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=check
    )


def test_extra_oecmake_is_the_recipes_fully_expanded():
    words = oe("recipe-var", str(RECIPE), "EXTRA_OECMAKE", "--set", "WORKDIR=/W").stdout.split("\n")
    words = [w for w in words if w]
    assert "-DGGML_VULKAN_SHADERS_GEN_TOOLCHAIN=/W/host-toolchain.cmake" in words
    assert "-DLLAMA_BUILD_COMMIT=389ff61" in words  # ${@d.getVar('SRCREV')[:7]}
    assert "-DLLAMA_BUILD_NUMBER=9101" in words
    assert all(w.startswith("-D") and "${" not in w for w in words)


def test_an_unset_variable_is_an_error_not_passed_on():
    res = oe("recipe-var", str(RECIPE), "EXTRA_OECMAKE", check=False)
    assert res.returncode == 2
    assert "${WORKDIR} has no value" in res.stderr
    assert res.stdout == ""


def test_do_configure_prepend_renders_a_complete_host_toolchain(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/host-toolchain.cmake.in").write_bytes(
        (RECIPE_DIR / "files/host-toolchain.cmake.in").read_bytes()
    )
    sets = {
        "UNPACKDIR": str(tmp_path / "src"),
        "WORKDIR": str(tmp_path),
        "BUILD_CC": "gcc ",
        "BUILD_CXX": "g++ ",
        "BUILD_CFLAGS": "-O2 -pipe",
        "BUILD_CXXFLAGS": "-O2 -pipe",
        "BUILD_LDFLAGS": "-Wl,-O1",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    body = oe("recipe-func", str(RECIPE), "do_configure:prepend", *args).stdout
    subprocess.run(["sh", "-e", "-c", body], check=True)
    out = (tmp_path / "host-toolchain.cmake").read_text()
    assert "set(CMAKE_C_COMPILER gcc)" in out
    assert "set(CMAKE_CXX_COMPILER g++)" in out
    assert "@" not in re.sub(r"^#.*$", "", out, flags=re.M)


def test_the_committed_extract_holds_what_cross_llama_reads():
    text = CROSS.read_text()
    names = re.search(r"ENV_VARS=\((.*?)\)", text, re.S).group(1).split()
    names += ["WORKDIR", "HOSTTOOLS", "HOSTTOOLS_NONFATAL", "HOSTTOOLS_DIR", "OECMAKE_ARGS"]
    for name in names:
        assert oe("dump-var", str(EXTRACT), name).stdout.strip() or name == "CPPFLAGS", name
    func = oe("dump-func", str(EXTRACT), "cmake_do_generate_toolchain_file").stdout
    assert "set( CMAKE_SYSROOT" in func and "toolchain.cmake" in func


def test_dump_meson_splits_the_setup_line(tmp_path: Path):
    dump = tmp_path / "x.env"
    dump.write_text(
        "meson_do_configure() {\n"
        '    if ! meson setup  --buildtype plain --native-file /w/meson.native "/w/src" '
        "\"/w/build\" --cross-file /w/meson.cross  -Dplatforms='wayland' -Dtools='' "
        "-Dvulkan-drivers=panfrost; then\n        bbfatal_log meson setup failed\n    fi\n}\n"
    )
    words = oe("dump-meson", str(dump), "--map", "/w=/x").stdout.splitlines()
    assert words == [
        "--buildtype",
        "plain",
        "--native-file",
        "/x/meson.native",
        "/x/src",
        "/x/build",
        "--cross-file",
        "/x/meson.cross",
        "-Dplatforms=wayland",
        "-Dtools=",
        "-Dvulkan-drivers=panfrost",
    ]


@pytest.mark.slow
@pytest.mark.needs_bitbake_dumps
def test_the_committed_extract_matches_a_fresh_one(tmp_path: Path):
    dump = Path(os.environ["ROCKY_BITBAKE_ENV_DIR"]) / "rock-5-itx/llama-cpp.env"
    out = tmp_path / "extract.txt"
    subprocess.run(["bash", str(CROSS), "--extract", str(dump), str(out)], check=True)

    def body(p: Path) -> list[str]:
        # Paths under the dump's own OUT folder (WORKDIR is OUT/work/build/tmp/work/...) differ
        # between machines; the rest must not.
        text = p.read_text()
        workdir = re.search(r'^WORKDIR="(.*)"$', text, re.M).group(1)
        text = text.replace(workdir.split("/work/build/tmp/")[0], "OUT")
        return [line for line in text.splitlines() if not line.startswith("# ")]

    assert body(out) == body(EXTRACT), "rerun tools/scripts/cross-llama.sh --extract"
