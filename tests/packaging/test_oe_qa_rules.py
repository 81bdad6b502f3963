"""Each OE packaging check fails on a small synthetic install tree that breaks its rule, and passes
on the same tree without the fault (rocky_vulkan.packaging.qa; the rules from oe-rules.json)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.packaging import oerules, qa, trees

RULES = oerules.load()
RECIPE = """\
SUMMARY = "synthetic"
LICENSE = "MIT"
inherit cmake
PACKAGES =+ "${PN}-plugins"
FILES:${PN}-plugins += "${libdir}/plugins"
RDEPENDS:${PN} = "vulkan-loader"
"""


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "demo_1.0.bb"
    path.write_text(RECIPE + extra)
    return path


# Any real ELF file does for the checks that need one (no compiler needed): the system's `true`.
ELF = Path(shutil.which("true") or "/bin/true").resolve().read_bytes()


def _file(root: Path, rel: str, data: bytes | str = b"x", mode: int = 0o644) -> Path:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def _findings(tmp_path: Path, root: Path, extra: str = "", build: str = "") -> list[str]:
    p = trees.packaged_recipe(_recipe(tmp_path, extra), root, [build or "/nonexistent"], RULES)
    return [str(f) for f in qa.run_all(p)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A clean tree: a binary, a versioned library with its -dev link, a header."""
    d = tmp_path / "image"
    _file(d, "/usr/bin/demo", ELF, 0o755)
    _file(d, "/usr/lib/libdemo.so.1.0", ELF, 0o755)
    os.symlink("libdemo.so.1.0", d / "usr/lib/libdemo.so")
    _file(d, "/usr/include/demo.h", "int demo(void);\n")
    return d


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc) for a real ELF file")
    return cc


def _compile(tmp_path: Path, out: Path, source: str, *flags: str) -> Path:
    src = tmp_path / "t.c"
    src.write_text(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([_cc(), "-o", str(out), str(src), *flags], check=True)
    return out


def test_clean_tree_passes_and_splits_like_oe(tmp_path: Path, root: Path) -> None:
    p = trees.packaged_recipe(_recipe(tmp_path), root, ["/nonexistent"], RULES)
    assert qa.run_all(p) == []
    owner = p.split.owner
    assert owner["/usr/bin/demo"] == "demo"
    assert owner["/usr/lib/libdemo.so.1.0"] == "demo"
    assert owner["/usr/lib/libdemo.so"] == "demo-dev"  # FILES_SOLIBSDEV: -dev precedes ${PN}
    assert owner["/usr/include/demo.h"] == "demo-dev"
    assert p.split.order[0] == "demo-src" and p.split.order[1] == "demo-dbg"


def test_buildpaths_in_a_text_file(tmp_path: Path, root: Path) -> None:
    build = str(tmp_path / "work")
    _file(root, "/usr/lib/cmake/demo/demo-config.cmake", f'set(X "{build}/tc.cmake")\n')
    found = _findings(tmp_path, root, build=build)
    assert found and all(f.startswith("[buildpaths] ") for f in found), found
    assert "demo-config.cmake in package demo-dev" in found[0]


def test_buildpaths_in_a_real_binary(tmp_path: Path, root: Path) -> None:
    build = str(tmp_path / "work")
    code = f'#include <stdio.h>\nint main(void) {{ puts("{build}/src/x.c"); return 0; }}\n'
    _compile(tmp_path, root / "usr/bin/demo", code)
    found = _findings(tmp_path, root, build=build)
    assert found == [
        f"[buildpaths] File /usr/bin/demo in package demo contains reference to {build} "
        "(a build, source or temp path: OE's TMPDIR)"
    ]


def test_installed_vs_shipped(tmp_path: Path, root: Path) -> None:
    _file(root, "/opt/demo/data.bin")
    found = _findings(tmp_path, root)
    assert "[installed-vs-shipped] /opt/demo/data.bin was installed but not shipped in any " \
        "package" in found  # fmt: skip
    assert "[installed-vs-shipped] /opt was installed but not shipped in any package" in found


def test_unversioned_so_link_outside_dev(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/lib/plugins/libp.so.1", ELF)
    os.symlink("libp.so.1", root / "usr/lib/plugins/libp.so")
    found = _findings(tmp_path, root)
    assert found == [
        "[dev-so] non -dev/-dbg/nativesdk- package demo-plugins contains symlink .so "
        "'/usr/lib/plugins/libp.so'"
    ]


def test_real_library_as_unversioned_so_in_dev(tmp_path: Path, root: Path) -> None:
    _compile(tmp_path, root / "usr/lib/libraw.so", "int f(void) { return 1; }\n", "-shared",
             "-fPIC")  # fmt: skip
    assert _findings(tmp_path, root) == [
        "[dev-elf] -dev package demo-dev contains non-symlink .so '/usr/lib/libraw.so'"
    ]


def test_static_library_outside_staticdev(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/lib/plugins/libs.a", b"!<arch>\n")
    found = _findings(tmp_path, root)
    assert found == [
        "[staticdev] non -staticdev package contains static .a library: demo-plugins path "
        "'/usr/lib/plugins/libs.a'"
    ]


def test_library_in_wrong_libdir(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/lib64/libw.so.1", ELF)
    found = _findings(tmp_path, root, 'FILES:${PN} += "/usr/lib64"\n')
    assert found == ["[libdir] demo: found library in wrong location: /usr/lib64/libw.so.1"]


def test_script_interpreter_not_in_rdepends(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/bin/tool.py", "#!/usr/bin/python3\nprint(1)\n", 0o755)
    found = _findings(tmp_path, root)
    assert found == [
        "[file-rdeps] /usr/bin/tool.py contained in package demo requires /usr/bin/python3, but "
        "no providers found in RDEPENDS:demo?"
    ]
    fixed = 'RDEPENDS:${PN} += "python3-core"\n'  # python3-manifest.json: core has python3
    assert _findings(tmp_path, root, fixed) == []


def test_env_interpreter_beyond_oe(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/bin/tool", "#!/usr/bin/env python3\n", 0o755)
    found = _findings(tmp_path, root)
    assert len(found) == 1 and found[0].startswith("[file-rdeps (env)] /usr/bin/tool"), found
    assert _findings(tmp_path, root, 'RDEPENDS:${PN} += "python3-core"\n') == []
    # OE's own ignore list: a /bin/sh script, or a script that is not executable, needs nothing.
    _file(root, "/usr/bin/tool", "#!/bin/sh\n", 0o755)
    _file(root, "/usr/share/demo/x.py", "#!/usr/bin/python3\n", 0o644)
    assert _findings(tmp_path, root) == []


def test_runpath_into_the_build_tree(tmp_path: Path, root: Path) -> None:
    build = str(tmp_path / "work/build")
    _compile(tmp_path, root / "usr/bin/demo", "int main(void) { return 0; }\n",
             f"-Wl,-rpath,{build}/lib", "-Wl,--enable-new-dtags")  # fmt: skip
    found = _findings(tmp_path, root, build=str(tmp_path / "elsewhere"))
    assert found == []  # a RUNPATH, but not into what was named as the build tree
    p = trees.packaged_recipe(_recipe(tmp_path), root, [build], RULES)
    assert [str(f) for f in qa.check_rpaths(p)] == [
        f"[rpaths] demo: /usr/bin/demo contains bad RUNPATH {build}/lib"
    ]


def test_useless_rpath(tmp_path: Path, root: Path) -> None:
    _compile(tmp_path, root / "usr/bin/demo", "int main(void) { return 0; }\n",
             "-Wl,-rpath,/usr/lib")  # fmt: skip
    assert len(found := _findings(tmp_path, root)) == 1 and found[0].startswith(
        "[useless-rpaths] demo: /usr/bin/demo contains probably-redundant"
    ), found


def test_dev_deps(tmp_path: Path, root: Path) -> None:
    found = _findings(tmp_path, root, 'RDEPENDS:${PN} += "openssl-dev"\n')
    assert found == ["[dev-deps] demo rdepends on openssl-dev"]


def test_systemd_units_go_to_their_package(tmp_path: Path, root: Path) -> None:
    _file(root, "/usr/lib/systemd/system/demo.service", "[Service]\n")
    extra = 'inherit systemd\nSYSTEMD_SERVICE:${PN} = "demo.service"\n'
    assert _findings(tmp_path, root, extra) == []
    # Without the class's rule the unit is in no package's FILES.
    found = _findings(tmp_path, root)
    assert "[installed-vs-shipped] /usr/lib/systemd/system/demo.service was installed but not " \
        "shipped in any package" in found  # fmt: skip


def test_unversioned_so_link_in_the_main_package(tmp_path: Path, root: Path) -> None:
    """${libdir}/${BPN}/* is in FILES:${PN}: a plugin's .so link there lands in the main package."""
    _file(root, "/usr/lib/demo/libplug.so.1", ELF)
    os.symlink("libplug.so.1", root / "usr/lib/demo/libplug.so")
    assert _findings(tmp_path, root) == [
        "[dev-so] non -dev/-dbg/nativesdk- package demo contains symlink .so "
        "'/usr/lib/demo/libplug.so'"
    ]
