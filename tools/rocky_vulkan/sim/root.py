"""The cached Debian sid root: amd64 with arm64 as a second architecture, run through chroot.

Layout under `${ROCKY_CACHE:-/var/cache/rocky-vulkan}/sim/`:
  root/                      the Debian root (made in root.tmp/, renamed when debootstrap is done)
  root/.rocky-sim.json       what `sim setup` installed (pins or floating, versions)
  root/opt/rocky/lib/        librocky_vacount.so (the VA counter, cross-built at setup)
  root/opt/rocky/drivers/    extra and imported panvk builds, one folder each
  root/var/cache/rocky-sim/  Mesa's shader cache, kept between runs (compiles take minutes)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.sim import pins

STAMP = ".rocky-sim.json"
VACOUNT_LIB = "/opt/rocky/lib/librocky_vacount.so"
DRIVERS_DIR = "/opt/rocky/drivers"
SHADER_CACHE = "/var/cache/rocky-sim"

# Runs "$@" chrooted in $R inside a private mount namespace: /proc, /dev and a fresh /tmp exist
# only for this command, so a crash never leaves /dev bound inside the root (dangerous to rm -r).
# Extra binds come as triples HOST TARGET MODE before a literal "--".
_IN_ROOT_SH = r"""
set -e
R=$1; shift
while [ "$1" != "--" ]; do
  mkdir -p "$R$2"
  mount --bind "$1" "$R$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$R$2"; fi
  shift 3
done
shift
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/tmp"
exec chroot "$R" "$@"
"""


def cache_dir() -> Path:
    """The simulator's cache folder (ROCKY_CACHE or /var/cache/rocky-vulkan, then sim/)."""
    return Path(os.environ.get("ROCKY_CACHE", "/var/cache/rocky-vulkan")) / "sim"


@dataclass(frozen=True)
class Bind:
    """A host path made visible at `target` (an absolute path inside the root)."""

    host: Path
    target: str
    read_only: bool = True


def say(msg: str) -> None:
    print(f"[sim] {msg}", file=sys.stderr, flush=True)


class SimRoot:
    """One Debian root on disk and the commands that run inside it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def default(cls) -> SimRoot:
        return cls(cache_dir() / "root")

    def exists(self) -> bool:
        return (self.path / STAMP).is_file()

    def require(self) -> None:
        if not self.exists():
            raise UserError(
                f"no simulator root at {self.path} (missing {STAMP}); "
                "run `rocky-vulkan sim setup` first (or set ROCKY_CACHE to where it lives)"
            )

    def stamp(self) -> dict:
        return json.loads((self.path / STAMP).read_text())

    def host_path(self, inside: str) -> Path:
        """The host path of an absolute path inside the root."""
        return self.path / inside.lstrip("/")

    def command(self, argv: list[str], binds: tuple[Bind, ...] = ()) -> list[str]:
        """The host argv that runs `argv` inside the root."""
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_ROOT_SH, "sh"]
        cmd.append(str(self.path))
        for b in binds:
            cmd += [str(b.host), b.target, "ro" if b.read_only else "rw"]
        return cmd + ["--", *argv]

    def run(
        self,
        argv: list[str],
        binds: tuple[Bind, ...] = (),
        check: bool = True,
        capture: bool = False,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the root; with capture, stdout and stderr come back as text."""
        full_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
        full_env.update(env or {})
        proc = subprocess.run(
            self.command(argv, binds),
            env=full_env,
            text=True,
            capture_output=capture,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            detail = (proc.stderr or "")[-2000:] if capture else ""
            raise UserError(
                f"command in the simulator root failed (exit {proc.returncode}): "
                f"{' '.join(argv)}\n{detail}"
            )
        return proc

    def apt(self, args: list[str], capture: bool = False) -> subprocess.CompletedProcess[str]:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        return self.run(["apt-get", "-q", "-y", *args], env=env, capture=capture, check=False)

    def installed_versions(self, names: list[str]) -> dict[str, str]:
        """`name -> version` for installed packages; missing ones map to ''."""
        out = {}
        for name in names:
            proc = self.run(
                ["dpkg-query", "-W", "-f", "${Version}", name], check=False, capture=True
            )
            out[name] = proc.stdout.strip() if proc.returncode == 0 else ""
        return out


def _debootstrap(root: SimRoot, mirror: str) -> None:
    tmp = root.path.with_name(root.path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {pins.SUITE} (amd64, minbase) into {tmp}")
    subprocess.run(
        [
            "nice",
            "-n",
            "10",
            "debootstrap",
            "--variant=minbase",
            "--arch=amd64",
            pins.SUITE,
            str(tmp),
            mirror,
        ],
        check=True,
    )
    tmp.rename(root.path)


def _configure_apt(root: SimRoot) -> None:
    # sid's Release files can be past Valid-Until on a mirror that lags; the content is signed.
    conf = root.host_path("/etc/apt/apt.conf.d/99rocky-sim")
    conf.write_text('Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n')
    root.run(["dpkg", "--add-architecture", pins.GUEST_ARCH])
    say("apt-get update")
    proc = root.apt(["update"])
    if proc.returncode != 0:
        raise UserError(
            "apt-get update failed in the simulator root: is the Debian mirror reachable?"
        )


_MISSING_VERSION = re.compile(r"Version '([^']+)' for '([^']+)' was not found")


def _install(root: SimRoot, pinned: bool, cross: bool) -> None:
    specs = pins.install_specs(pinned, cross)
    say("apt-get install " + " ".join(specs))
    proc = root.apt(["install", *specs], capture=True)
    sys.stderr.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        missing = _MISSING_VERSION.findall(proc.stderr)
        if missing:
            gone = ", ".join(f"{pkg}={ver}" for ver, pkg in missing)
            raise UserError(
                f"pinned Debian versions are no longer in {pins.SUITE}: {gone}. Run "
                "`rocky-vulkan sim setup --float` to install the current ones, then update "
                "tools/rocky_vulkan/sim/pins.py with the versions it prints"
            )
        raise UserError(f"apt-get install failed in the simulator root:\n{proc.stderr[-2000:]}")


def _build_vacount(root: SimRoot) -> None:
    src = resources.files("rocky_vulkan.sim").joinpath("vacount.c").read_text()
    lib_dir = root.host_path(os.path.dirname(VACOUNT_LIB))
    lib_dir.mkdir(parents=True, exist_ok=True)
    copy = lib_dir / "vacount.c"
    if root.host_path(VACOUNT_LIB).exists() and copy.exists() and copy.read_text() == src:
        return  # built from this source already (and maybe mapped by a running program)
    (lib_dir / "vacount.c.new").write_text(src)
    say("cross-building the private-VA counter " + VACOUNT_LIB)
    root.run(
        ["aarch64-linux-gnu-gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-x", "c",
         "-o", VACOUNT_LIB + ".tmp", f"{os.path.dirname(VACOUNT_LIB)}/vacount.c.new", "-ldl",
         "-lpthread"],
        capture=True,
    )  # fmt: skip
    # The source copy is renamed last: it marks the library as built from it.
    os.replace(root.host_path(VACOUNT_LIB + ".tmp"), root.host_path(VACOUNT_LIB))
    os.replace(lib_dir / "vacount.c.new", copy)


def _extra_suite_opts(tag: str) -> list[str]:
    base = f"/var/lib/rocky-sim/{tag}"
    return [
        "-o",
        f"Dir::Etc::SourceList={base}.list",
        "-o",
        "Dir::Etc::SourceParts=-",
        "-o",
        f"Dir::State::Lists={base}-lists",
    ]


def install_debian_driver(root: SimRoot, name: str, spec: dict) -> str:
    """Unpack another Debian panvk + shim (e.g. 26.1 from trixie-backports) as driver `name`.

    Nothing is installed through dpkg: the packages are unpacked into their own folder (with the
    old runtime libraries they need, found through LD_LIBRARY_PATH), so the stock driver stays
    the one apt knows about. Returns the version label.
    """
    version, suites = spec["version"], spec["suites"]
    dest = f"{DRIVERS_DIR}/{name}"
    label = f"Debian {version} ({suites[-1]})"
    done = root.host_path(dest) / "version"
    if done.exists() and done.read_text().strip() == label:
        say(f"driver {name} ({label}) already unpacked")
        return label
    base = root.host_path(f"/var/lib/rocky-sim/{name}")
    (base.parent / f"{name}-lists" / "partial").mkdir(parents=True, exist_ok=True)
    (base.parent / f"{name}.list").write_text(
        "".join(f"deb {pins.EXTRA_SUITE_MIRROR} {suite} main\n" for suite in suites)
    )
    opts = _extra_suite_opts(name)
    if root.apt([*opts, "update"]).returncode != 0:
        raise UserError(f"apt-get update for {', '.join(suites)} failed in the simulator root")
    shutil.rmtree(root.host_path(dest), ignore_errors=True)
    root.host_path(dest + "/debs").mkdir(parents=True)
    arch = pins.GUEST_ARCH
    debs = [f"mesa-vulkan-drivers:{arch}={version}", f"mesa-drm-shim:{arch}={version}"]
    debs += [f"{lib.split('=')[0]}:{arch}={lib.split('=')[1]}" for lib in spec.get("libs", ())]
    say(f"unpacking {' '.join(debs)} into {dest}")
    proc = root.run(
        ["sh", "-c", f"cd {dest}/debs && apt-get -q {' '.join(opts)} download " + " ".join(debs)],
        capture=True,
        check=False,
    )
    if proc.returncode != 0:
        raise UserError(
            f"could not download {' '.join(debs)} from {', '.join(suites)}:\n"
            f"{proc.stderr[-1500:]}\nupdate EXTRA_DRIVERS in tools/rocky_vulkan/sim/pins.py or "
            "run `sim setup --no-extra-drivers`"
        )
    root.run(["sh", "-c", f"for d in {dest}/debs/*.deb; do dpkg-deb -x $d {dest}/pkg; done"])
    libdir = f"{dest}/pkg/usr/lib/aarch64-linux-gnu"
    write_icd(root, dest, f"{libdir}/libvulkan_panfrost.so")
    (root.host_path(dest) / "shim").write_text(f"{libdir}/libpanfrost_noop_drm_shim.so\n")
    (root.host_path(dest) / "libpath").write_text(libdir + "\n")
    # Written last: its presence means the unpack finished.
    done.write_text(label + "\n")
    return label


def write_icd(root: SimRoot, dest: str, library: str) -> None:
    icd = {"file_format_version": "1.0.1", "ICD": {"library_path": library, "api_version": "1.4.0"}}
    root.host_path(dest + "/icd.json").write_text(json.dumps(icd, indent=2) + "\n")


def setup(
    root: SimRoot,
    pinned: bool = True,
    mirror: str = pins.MIRROR,
    extra_drivers: bool = True,
    cross: bool = False,
) -> dict:
    """Create (or finish) the root; returns the stamp that records what was installed."""
    if not (root.path / "usr/bin/apt-get").exists():
        _debootstrap(root, mirror)
    else:
        say(f"reusing the debootstrap root at {root.path}")
    _configure_apt(root)
    _install(root, pinned, cross)
    _build_vacount(root)
    root.host_path(SHADER_CACHE).mkdir(parents=True, exist_ok=True)
    drivers = {}
    if extra_drivers:
        for name, spec in pins.EXTRA_DRIVERS.items():
            drivers[name] = install_debian_driver(root, name, spec)
    versions = root.installed_versions(pins.query_names())
    stamp = {
        "suite": pins.SUITE,
        "pinned": pinned,
        # Installed now, by this run or an earlier `--cross` one.
        "cross": all(versions[name] for name in pins.CROSS_PACKAGES),
        "versions": versions,
        "extra_drivers": drivers,
    }
    (root.path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp
