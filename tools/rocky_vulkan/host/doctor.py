"""`rocky-vulkan doctor`: check the build host before an hours-long build, and say how to fix it.

Facts about the host are gathered once (`gather_facts`, which runs the real tools) and judged by
pure functions (`judge`), so tests can inject a host that lacks a tool or runs as root.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
GIB = 1024**3

DISK_WARN_BYTES = 100 * GIB  # a full image build with rm_work needs ~100 GB
DISK_FAIL_BYTES = 30 * GIB  # below this the first big unpack (LLVM for libclc) fails
MEM_WARN_BYTES = 8 * GIB  # Yocto's documented minimum; 32 GB recommended
MEM_PER_JOB_BYTES = 2 * GIB  # LLVM/clang links use ~2 GB per parallel job
CPUS_WARN = 4

KAS_VERSION = "5.5"
# kas-container's engines, and how long `ENGINE info` may take to answer.
CONTAINER_ENGINES = ("docker", "podman")
ENGINE_TIMEOUT_S = 30

# Executable -> Debian/Ubuntu package, from the Yocto system requirements (wrynose) and
# oe-core's HOSTTOOLS/SANITY_REQUIRED_UTILITIES.
HOST_TOOLS: dict[str, str] = {
    "gawk": "gawk",
    "wget": "wget",
    "git": "git",
    "diffstat": "diffstat",
    "unzip": "unzip",
    "makeinfo": "texinfo",
    "gcc": "build-essential",
    "g++": "build-essential",
    "make": "build-essential",
    "patch": "patch",
    "perl": "perl",
    "chrpath": "chrpath",
    "socat": "socat",
    "cpio": "cpio",
    "python3": "python3",
    "xz": "xz-utils",
    "bzip2": "bzip2",
    "tar": "tar",
    "lz4c": "lz4",
    "zstd": "zstd",
    "pzstd": "zstd",
    "rpcgen": "rpcsvc-proto",
    "file": "file",
    "which": "debianutils",
    "hostname": "hostname",
}
DEBIAN_PACKAGES = (
    "build-essential chrpath cpio debianutils diffstat file gawk gcc git iputils-ping libacl1 "
    "lz4 locales python3 python3-git python3-jinja2 python3-pexpect python3-pip python3-subunit "
    "rpcsvc-proto socat texinfo unzip wget xz-utils zstd"
)

# Minimum versions oe-core's sanity.bbclass and bitbake enforce.
MIN_VERSIONS: dict[str, tuple[int, ...]] = {
    "python3": (3, 9),
    "git": (1, 8, 3, 1),
    "gcc": (10, 1),
    "tar": (1, 28),
    "make": (4, 0),
    "patch": (2, 7),
}
VERSION_ARGS: dict[str, list[str]] = {
    "python3": ["--version"],  # "Python 3.11.2"
    "git": ["--version"],  # "git version 2.39.5"
    "gcc": ["-dumpfullversion"],  # "12.2.0"
    "tar": ["--version"],  # "tar (GNU tar) 1.34"
    "make": ["--version"],  # "GNU Make 4.3"
    "patch": ["--version"],  # "GNU patch 2.7.6"
}


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class HostFacts:
    """What the checks look at; every field can be injected by a test."""

    uid: int
    disk_path: str
    free_disk_bytes: int
    mem_total_bytes: int
    cpus: int
    tools: Mapping[str, str | None]  # executable -> absolute path, None when missing
    versions: Mapping[str, str | None] = field(default_factory=dict)  # tool -> "1.2.3"
    locale_ok: bool = True
    userns_ok: bool | None = True  # None: could not test (no `unshare`)
    kas: str | None = None
    kas_version: str | None = None
    kas_container: str | None = None
    container_engine: str | None = None  # the engine kas-container would pick: its path
    container_engine_name: str | None = None  # docker, podman (or KAS_CONTAINER_ENGINE's value)
    engine_error: str | None = None  # `ENGINE info` failed: its telling line; None: it answered
    kas_allow_root: bool = False  # KAS_ALLOW_ROOT=yes: kas-container then runs as root


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first dotted number in a tool's --version output: 'GNU Make 4.3' -> (4, 3)."""
    match = re.search(r"(\d+(?:\.\d+)+)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def _version_of(exe: str, args: list[str]) -> str | None:
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (proc.stdout or proc.stderr).strip().splitlines()
    version = parse_version(first[0]) if first else None
    return ".".join(map(str, version)) if version else None


def locale_available(locale_a_output: str, wanted: str = "en_US.UTF-8") -> bool:
    """`locale -a` spells UTF-8 as 'utf8'; compare normalised names."""

    def norm(name: str) -> str:
        return name.strip().lower().replace("-", "")

    return norm(wanted) in {norm(line) for line in locale_a_output.splitlines()}


def _meminfo_total(path: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def pick_engine(path_env: str, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(name, path) of the engine kas-container 5.5 would use: KAS_CONTAINER_ENGINE (or the older
    KAS_DOCKER_ENGINE), else docker when `docker -v` says Docker (podman's docker shim does not),
    else podman."""
    name = environ.get("KAS_CONTAINER_ENGINE") or environ.get("KAS_DOCKER_ENGINE")
    if name:
        return name, shutil.which(name, path=path_env)
    docker = shutil.which("docker", path=path_env)
    if docker:
        try:
            said = subprocess.run([docker, "-v"], capture_output=True, text=True, timeout=30)
            if said.stdout.startswith("Docker"):
                return "docker", docker
        except (OSError, subprocess.TimeoutExpired):
            pass
    podman = shutil.which("podman", path=path_env)
    return ("podman", podman) if podman else (None, None)


def engine_problem(engine: str, path_env: str) -> str | None:
    """None when `ENGINE info` answers (the engine runs and this user may use it), else the line
    of its output that says why."""
    try:
        proc = subprocess.run(
            [engine, "info"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=ENGINE_TIMEOUT_S,
            env={**os.environ, "PATH": path_env},
        )
    except subprocess.TimeoutExpired:
        return f"`{Path(engine).name} info` did not answer within {ENGINE_TIMEOUT_S} s"
    except OSError as err:
        return f"`{Path(engine).name} info` could not run: {err.strerror}"
    if proc.returncode == 0:
        return None
    lines = [x.strip() for x in (proc.stderr + "\n" + proc.stdout).splitlines() if x.strip()]
    telling = [x for x in lines if re.search(r"(?i)cannot connect|permission denied|error", x)]
    line = (telling or lines or [f"exit {proc.returncode}, no output"])[0]
    return line if len(line) <= 300 else line[:297] + "..."


def gather_facts(
    build_dir: Path,
    path_env: str | None = None,
    container: bool = False,
    environ: Mapping[str, str] | None = None,
) -> HostFacts:
    """Look at the real host: tools on `path_env` (default $PATH), disk under `build_dir`; for a
    container build also whether the container engine answers."""
    environ = os.environ if environ is None else environ
    path_env = environ.get("PATH", "") if path_env is None else path_env
    # The CLI's own venv (where `pip install -e .[dev]` put kas) counts, activated or not.
    venv_bin = str(Path(sys.executable).parent)
    tools = {name: shutil.which(name, path=path_env) for name in HOST_TOOLS}
    versions = {
        name: _version_of(tools[name], args) if tools.get(name) else None
        for name, args in VERSION_ARGS.items()
    }
    locale_exe = shutil.which("locale", path=path_env)
    locale_ok = False
    if locale_exe:
        proc = subprocess.run([locale_exe, "-a"], capture_output=True, text=True)
        locale_ok = locale_available(proc.stdout)
    unshare = shutil.which("unshare", path=path_env)
    userns_ok = None
    if unshare:
        # bitbake isolates tasks from the network in a user namespace; AppArmor can forbid it.
        userns_ok = subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0
    kas = shutil.which("kas", path=path_env) or shutil.which("kas", path=venv_bin)
    kas_version = None
    if kas:
        kas_version = _version_of(kas, ["--version"])
    disk = _existing_parent(build_dir)
    engine_name, engine = pick_engine(path_env, environ)
    engine_error = engine_problem(engine, path_env) if container and engine else None
    return HostFacts(
        uid=os.getuid(),
        disk_path=str(disk),
        free_disk_bytes=shutil.disk_usage(disk).free,
        mem_total_bytes=_meminfo_total(),
        cpus=os.cpu_count() or 1,
        tools=tools,
        versions=versions,
        locale_ok=locale_ok,
        userns_ok=userns_ok,
        kas=kas,
        kas_version=kas_version,
        kas_container=shutil.which("kas-container", path=path_env)
        or shutil.which("kas-container", path=venv_bin),
        container_engine=engine,
        container_engine_name=engine_name,
        engine_error=engine_error,
        kas_allow_root=environ.get("KAS_ALLOW_ROOT") == "yes",
    )


def _gb(n: int) -> str:
    return f"{n / GIB:.0f} GiB"


def check_user(f: HostFacts, container: bool) -> Finding:
    if f.uid != 0:
        return Finding("user", PASS, f"running as uid {f.uid}")
    if container and f.kas_allow_root:
        return Finding(
            "user",
            WARN,
            "running as root with KAS_ALLOW_ROOT=yes; kas-container warns this may break some "
            "recipes",
            "build as a normal user who may use the container engine",
        )
    if container:
        return Finding(
            "user",
            FAIL,
            "running as root: kas-container refuses ('Running as root - may break certain "
            "recipes') unless KAS_ALLOW_ROOT=yes",
            "build as a normal user who may use docker (`sudo usermod -aG docker USER`, then log "
            "in again) or podman; or `export KAS_ALLOW_ROOT=yes` to override",
        )
    return Finding(
        "user",
        FAIL,
        "running as root: bitbake refuses ('Do not use Bitbake as root.')",
        "build as a normal user (e.g. `adduser builder; su - builder`), or use --container",
    )


def check_disk(f: HostFacts) -> Finding:
    where = f"{_gb(f.free_disk_bytes)} free under {f.disk_path}"
    fix = "free space or point KAS_BUILD_DIR, DL_DIR and SSTATE_DIR at a bigger disk"
    if f.free_disk_bytes < DISK_FAIL_BYTES:
        return Finding("disk", FAIL, f"{where}; a build needs ~100 GB", fix)
    if f.free_disk_bytes < DISK_WARN_BYTES:
        return Finding("disk", WARN, f"{where}; a first build needs ~100 GB", fix)
    return Finding("disk", PASS, where)


def check_memory(f: HostFacts) -> Finding:
    mem = f"{_gb(f.mem_total_bytes)} RAM, {f.cpus} cores"
    if f.mem_total_bytes < MEM_WARN_BYTES:
        return Finding(
            "memory",
            WARN,
            f"{mem}: under 8 GiB, LLVM (for Mesa's libclc) may be killed for memory",
            'add swap, or set BB_NUMBER_THREADS = "2" and PARALLEL_MAKE = "-j 2"',
        )
    if f.mem_total_bytes < f.cpus * MEM_PER_JOB_BYTES:
        jobs = max(1, f.mem_total_bytes // MEM_PER_JOB_BYTES)
        return Finding(
            "memory",
            WARN,
            f"{mem}: under 2 GiB per core, parallel C++ links can run out of memory",
            f'limit jobs: PARALLEL_MAKE = "-j {jobs}" in a kas local_conf_header',
        )
    if f.cpus < CPUS_WARN:
        return Finding(
            "memory",
            WARN,
            f"{mem}: a first build takes a day or more on under {CPUS_WARN} cores",
            "use a bigger host, or share sstate (kas/sstate-mirror.yml)",
        )
    return Finding("memory", PASS, mem)


def check_host_tools(f: HostFacts) -> Finding:
    missing = sorted(name for name in HOST_TOOLS if not f.tools.get(name))
    if not missing:
        return Finding("host tools", PASS, f"all {len(HOST_TOOLS)} oe-core host tools found")
    packages = " ".join(sorted({HOST_TOOLS[name] for name in missing}))
    return Finding(
        "host tools",
        FAIL,
        "missing: " + ", ".join(missing),
        f"sudo apt-get install {packages}   (full list: sudo apt-get install {DEBIAN_PACKAGES})",
    )


def check_versions(f: HostFacts) -> list[Finding]:
    out = []
    for tool, minimum in MIN_VERSIONS.items():
        if not f.tools.get(tool):
            continue  # reported by check_host_tools
        found = f.versions.get(tool)
        want = ".".join(map(str, minimum))
        parsed = parse_version(found) if found else None
        if parsed is None:
            out.append(Finding(f"{tool} version", WARN, f"could not read {tool}'s version"))
        elif parsed < minimum:
            out.append(
                Finding(
                    f"{tool} version",
                    FAIL,
                    f"{tool} {found} is older than {want}, which oe-core requires",
                    "upgrade the host (a supported distro), or use --container",
                )
            )
        else:
            out.append(Finding(f"{tool} version", PASS, f"{tool} {found} (>= {want})"))
    return out


def check_locale(f: HostFacts) -> Finding:
    if f.locale_ok:
        return Finding("locale", PASS, "en_US.UTF-8 is available")
    return Finding(
        "locale",
        FAIL,
        "en_US.UTF-8 is not available (bitbake switches to it)",
        "sudo apt-get install locales && sudo sed -i 's/^# *en_US.UTF-8/en_US.UTF-8/' "
        "/etc/locale.gen && sudo locale-gen",
    )


def check_userns(f: HostFacts) -> Finding:
    if f.userns_ok:
        return Finding("user namespaces", PASS, "unprivileged user namespaces work")
    if f.userns_ok is None:
        return Finding("user namespaces", WARN, "could not test (no `unshare`)")
    return Finding(
        "user namespaces",
        FAIL,
        "unprivileged user namespaces are blocked (bitbake: 'possibly due to AppArmor')",
        "Ubuntu 24.04+: sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0 "
        "(or an AppArmor profile for bitbake), or use --container",
    )


def check_kas(f: HostFacts, container: bool) -> Finding:
    if container:
        if not f.kas_container:
            return Finding(
                "kas-container",
                FAIL,
                "kas-container not found",
                "pip install kas==5.5 (it ships kas-container), or download it from the kas "
                "release, and put it on PATH",
            )
        return Finding("kas-container", PASS, f.kas_container)
    if not f.kas:
        alt = " (kas-container is installed: add --container)" if f.kas_container else ""
        return Finding(
            "kas",
            FAIL,
            "kas not found" + alt,
            "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' (pins kas==5.5)",
        )
    version = f.kas_version or "unknown"
    if parse_version(version) != parse_version(KAS_VERSION):
        return Finding(
            "kas",
            WARN,
            f"kas {version} at {f.kas}; the kas files are written and tested for {KAS_VERSION}",
            f"pip install kas=={KAS_VERSION}",
        )
    return Finding("kas", PASS, f"kas {version} at {f.kas}")


def check_engine(f: HostFacts) -> Finding:
    """The container engine kas-container will use: present, known, and answering."""
    name = f.container_engine_name
    if name and name not in CONTAINER_ENGINES:
        return Finding(
            "container engine",
            FAIL,
            f"KAS_CONTAINER_ENGINE={name}: kas-container knows only docker and podman",
            "unset KAS_CONTAINER_ENGINE, or set it to docker or podman",
        )
    if not f.container_engine:
        what = f"{name} (KAS_CONTAINER_ENGINE) is not on PATH" if name else None
        return Finding(
            "container engine",
            FAIL,
            what or "neither docker nor podman is on PATH",
            "sudo apt-get install podman (or docker.io)",
        )
    if f.engine_error is None:
        return Finding("container engine", PASS, f"{f.container_engine} answers `{name} info`")
    said = f"{f.container_engine} does not work: {f.engine_error}"
    if "permission denied" in f.engine_error.lower():
        fix = (
            f"let this user use {name}: `sudo usermod -aG docker $USER`, then log out and in; "
            "or use rootless podman (export KAS_CONTAINER_ENGINE=podman)"
            if name == "docker"
            else f"make `{name} info` work for this user (rootless podman: `podman system migrate`)"
        )
    elif name == "docker":
        fix = (
            "start the docker daemon: `sudo systemctl enable --now docker` (or, without "
            "systemd, `sudo service docker start`); `docker info` must then answer"
        )
    else:
        fix = (
            f"fix what `{name} info` says until it answers (podman on a VM: `podman machine start`)"
        )
    return Finding("container engine", FAIL, said, fix)


def judge(f: HostFacts, container: bool = False) -> list[Finding]:
    """Every check's finding; inside kas-container only the outer host's checks apply."""
    findings = [check_user(f, container), check_disk(f), check_memory(f)]
    if not container:
        findings.append(check_host_tools(f))
        findings.extend(check_versions(f))
        findings.append(check_locale(f))
        findings.append(check_userns(f))
    findings.append(check_kas(f, container))
    if container:
        findings.append(check_engine(f))
    return findings


def has_blocker(findings: list[Finding]) -> bool:
    return any(x.status == FAIL for x in findings)


def print_findings(findings: list[Finding]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rocky-vulkan doctor")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail / fix")
    colours = {PASS: "green", WARN: "yellow", FAIL: "red"}
    for x in findings:
        detail = x.detail + (f"\nfix: {x.fix}" if x.fix and x.status != PASS else "")
        table.add_row(x.check, f"[{colours[x.status]}]{x.status}[/]", detail)
    Console(highlight=False, soft_wrap=False).print(table)


def run_doctor(root: Path, container: bool = False, quiet_pass: bool = False) -> bool:
    """Check this host for a build under `root`; print the table; True when nothing blocks."""
    build_dir = Path(os.environ.get("KAS_BUILD_DIR") or root / "build")
    findings = judge(gather_facts(build_dir, container=container), container=container)
    if not (quiet_pass and not [x for x in findings if x.status != PASS]):
        print_findings(findings)
    return not has_blocker(findings)


def _run(args: argparse.Namespace) -> int:
    ok = run_doctor(Path(args.config).resolve().parent, container=args.container)
    if not ok:
        print("doctor: fix the FAIL lines above before building", file=sys.stderr)
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="check the build host (exit 1 on a blocker)")
    parser.add_argument(
        "--container",
        action="store_true",
        help="check for a kas-container build (docker/podman) instead of a native one",
    )
    parser.set_defaults(func=_run)
