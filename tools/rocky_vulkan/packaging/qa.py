"""OE's packaging QA over a real install tree, one function per insane.bbclass test.

Each finding starts with the name of the OE test it stands for ("[buildpaths] ..."); all of those
used here are in ERROR_QA at the pin (oe-rules.json), so any finding would stop a bitbake build.
Sources, at openembedded-core ef022bf: meta/classes-global/insane.bbclass (package_qa_check_*),
meta/lib/oe/package.py (populate_packages: installed-vs-shipped), rpm's scripts/script.req (the
interpreter a script requires: the first absolute path of an executable's `#!` line, or the
absolute path after `env`).

One check goes beyond OE and says so: for `#!/usr/bin/env NAME`, rpm records only /usr/bin/env,
which OE ignores, so a python script with no python in RDEPENDS passes OE; "file-rdeps (env)"
requires ${bindir}/NAME from the package's RDEPENDS too.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocky_vulkan.packaging import elfinfo
from rocky_vulkan.packaging.split import Split


@dataclass(frozen=True)
class Finding:
    check: str  # the OE QA test's name
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


@dataclass(frozen=True)
class Packaged:
    """A recipe's install tree (its D) split into its packages."""

    root: Path
    split: Split
    rdepends: dict[str, list[str]]  # package -> RDEPENDS:package (names only)
    build_paths: list[str]  # what OE's buildpaths test looks for (TMPDIR: S, B, WORKDIR, D)
    dirs: dict[str, str]  # libdir, base_libdir, libexecdir, exec_prefix, bindir
    ignored_file_rdeps: set[str]
    file_providers: dict[str, list[str]]

    def files(self) -> list[tuple[str, str]]:
        """(path, package) for every shipped file and link (not directories)."""
        return [
            (path, pkg)
            for path, pkg in sorted(self.split.owner.items())
            if (self.root / path.lstrip("/")).is_symlink()
            or not (self.root / path.lstrip("/")).is_dir()
        ]

    def full(self, path: str) -> Path:
        return self.root / path.lstrip("/")


def explode_deps(value: str) -> list[str]:
    """bb.utils.explode_deps: names without their version constraints."""
    return re.sub(r"\([^)]*\)", " ", value).split()


def check_buildpaths(p: Packaged) -> list[Finding]:
    """insane.bbclass package_qa_check_buildpaths: TMPDIR's bytes in a file (links skipped)."""
    needles = [path.encode() for path in p.build_paths]
    out = []
    for path, pkg in p.files():
        full = p.full(path)
        if full.is_symlink() or not stat.S_ISREG(full.lstat().st_mode):
            continue
        data = full.read_bytes()
        for needle, text in zip(needles, p.build_paths, strict=True):
            if needle in data:
                out.append(
                    Finding(
                        "buildpaths",
                        f"File {path} in package {pkg} contains reference to "
                        f"{text} (a build, source or temp path: OE's TMPDIR)",
                    )  # fmt: skip
                )
                break
    return out


def check_installed_vs_shipped(p: Packaged) -> list[Finding]:
    """package.py populate_packages: files installed but in no package's FILES."""
    return [
        Finding("installed-vs-shipped", f"{path} was installed but not shipped in any package")
        for path in p.split.unshipped
    ]


def check_dev_so(p: Packaged) -> list[Finding]:
    """package_qa_check_dev: a .so symlink outside -dev/-dbg/-ptest/nativesdk-."""
    return [
        Finding("dev-so", f"non -dev/-dbg/nativesdk- package {pkg} contains symlink .so '{path}'")
        for path, pkg in p.files()
        if not pkg.endswith(("-dev", "-dbg", "-ptest"))
        and not pkg.startswith("nativesdk-")
        and path.endswith(".so")
        and p.full(path).is_symlink()
    ]


def check_dev_elf(p: Packaged) -> list[Finding]:
    """package_qa_check_dev_elf: a real (non-symlink) ELF .so in a -dev package."""
    return [
        Finding("dev-elf", f"-dev package {pkg} contains non-symlink .so '{path}'")
        for path, pkg in p.files()
        if pkg.endswith("-dev") and path.endswith(".so") and elfinfo.is_elf(p.full(path))
    ]


def check_staticdev(p: Packaged) -> list[Finding]:
    """package_qa_check_staticdev: a .a outside -staticdev/-pic/-ptest."""
    return [
        Finding(
            "staticdev", f"non -staticdev package contains static .a library: {pkg} path '{path}'"
        )  # fmt: skip
        for path, pkg in p.files()
        if not pkg.endswith(("-pic", "-staticdev", "-ptest"))
        and path.endswith(".a")
        and not path.endswith("_nonshared.a")
        and "/usr/lib/debug-static/" not in path
    ]


def check_libdir(p: Packaged) -> list[Finding]:
    """package_qa_check_libdir: an ELF library outside ${libdir}/${base_libdir}/${libexecdir}."""
    base_libdir = p.dirs["base_libdir"] + os.sep
    libdir = p.dirs["libdir"] + os.sep
    libexecdir = p.dirs["libexecdir"] + os.sep
    lib_re = re.compile(r"^/lib.+\.so(\..+)?$")
    exec_prefix = re.escape(p.dirs["exec_prefix"] + os.sep)
    exec_re = re.compile(rf"^{exec_prefix}.*/lib.+\.so(\..+)?$")
    out = []
    for path, pkg in p.files():
        wrong = (lib_re.match(path) and base_libdir not in path) or (
            exec_re.match(path) and libdir not in path and libexecdir not in path
        )
        if wrong and elfinfo.is_elf(p.full(path)):
            out.append(Finding("libdir", f"{pkg}: found library in wrong location: {path}"))
    return out


def check_rpaths(p: Packaged) -> list[Finding]:
    """package_qa_check_rpath (a RPATH/RUNPATH into the build tree) and
    package_qa_check_useless_rpaths (one that names ${libdir} or ${base_libdir})."""
    out = []
    plain = {os.path.normpath(p.dirs["libdir"]), os.path.normpath(p.dirs["base_libdir"])}
    for path, pkg in p.files():
        if not elfinfo.is_elf(p.full(path)):
            continue
        for kind, value in elfinfo.rpaths(p.full(path)):
            if any(bad in value for bad in p.build_paths):
                out.append(Finding("rpaths", f"{pkg}: {path} contains bad {kind} {value}"))
            elif any(os.path.normpath(v) in plain for v in value.split(":") if v):
                out.append(
                    Finding(
                        "useless-rpaths",
                        f"{pkg}: {path} contains probably-redundant {kind} {value}",
                    )  # fmt: skip
                )
    return out


def check_dev_deps(p: Packaged) -> list[Finding]:
    """package_qa_check_rdepends: dev-deps (a non -dev package on a -dev one) and debug-deps."""
    out = []
    for pkg, deps in p.rdepends.items():
        if "-dbg" in pkg:
            continue
        for dep in deps:
            if dep.endswith("-dbg"):
                out.append(Finding("debug-deps", f"{pkg} rdepends on {dep}"))
            if "-dev" not in pkg and "-staticdev" not in pkg and dep.endswith("-dev"):
                out.append(Finding("dev-deps", f"{pkg} rdepends on {dep}"))
    return out


def interpreter(path: Path) -> tuple[str | None, str | None, int]:
    """(what rpm's script.req records, the NAME of `#!.../env NAME`, shebang length) of an
    executable script; (None, None, 0) when it is not one."""
    mode = path.lstat().st_mode
    if not stat.S_ISREG(mode) or not mode & 0o111:
        return None, None, 0
    with path.open("rb") as f:
        first = f.readline(4096)
    if not first.startswith(b"#!"):
        return None, None, 0
    line = first.decode(errors="replace").rstrip("\n")
    words = line[2:].split()
    if not words or not words[0].startswith("/"):
        return None, None, len(line)
    if words[0].endswith("/bin/env") and len(words) > 1:
        if words[1].startswith("/"):
            return words[1], None, len(line)
        return words[0], words[1], len(line)
    return words[0], None, len(line)


def check_file_rdeps(p: Packaged) -> list[Finding]:
    """package_qa_check_rdepends' file-rdeps: each script's interpreter must be provided by the
    package itself or by its RDEPENDS (python3-core provides /usr/bin/python3, ...); plus
    shebang-size (package_qa_check_shebang_size: at most 128 characters)."""
    out = []
    for path, pkg in p.files():
        if "-dbg" in pkg:
            continue
        need, env_name, size = interpreter(p.full(path))
        if size > 129:
            out.append(Finding("shebang-size", f"{pkg}: {path} maximum shebang size exceeded"))
        if need is None:
            continue
        if need not in p.ignored_file_rdeps and not _provided(p, pkg, need):
            out.append(
                Finding(
                    "file-rdeps",
                    f"{path} contained in package {pkg} requires {need}, "
                    f"but no providers found in RDEPENDS:{pkg}?",
                )  # fmt: skip
            )
        if env_name is not None:
            target = f"{p.dirs['bindir']}/{env_name}"
            if not _provided(p, pkg, target):
                out.append(
                    Finding(
                        "file-rdeps (env)",
                        f"{path} in package {pkg} runs `env {env_name}`: "
                        f"nothing in RDEPENDS:{pkg} provides {target} (OE itself checks only "
                        "/usr/bin/env, which it ignores)",
                    )  # fmt: skip
                )
    return out


def _provided(p: Packaged, pkg: str, file: str) -> bool:
    deps = [pkg, *p.rdepends.get(pkg, [])]
    if p.split.owner.get(file) in deps:
        return True
    return bool(set(p.file_providers.get(file, [])) & set(deps)) or file in deps


CHECKS: dict[str, Callable[[Packaged], list[Finding]]] = {
    "buildpaths": check_buildpaths,
    "installed-vs-shipped": check_installed_vs_shipped,
    "dev-so": check_dev_so,
    "dev-elf": check_dev_elf,
    "staticdev": check_staticdev,
    "libdir": check_libdir,
    "rpaths": check_rpaths,
    "dev-deps": check_dev_deps,
    "file-rdeps": check_file_rdeps,
}


def run_all(p: Packaged) -> list[Finding]:
    return [finding for check in CHECKS.values() for finding in check(p)]
