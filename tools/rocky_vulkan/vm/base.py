"""The VM's Debian base: debootstrap of what oe-core gives the image, cached until its list changes.

Layout under `${ROCKY_CACHE:-/var/cache/rocky-vulkan}/vm/`:
  base/              the Debian root (made in base.tmp/, renamed when complete)
  base/.rocky-vm-base.json   suite and packages it was made with
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rocky_vulkan.errors import UserError

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
STAMP = ".rocky-vm-base.json"
# What the image's packages need at run time, as Debian names them: init and the kernel,
# sshd, networkd + resolved, python3 for the board's tools, openssl-bin for the keys,
# vulkan-tools for the self-test's device check, llama.cpp's shared libraries (libvulkan1,
# libgomp1, libssl3t64), sudo for the image's sudo rule. oe-core's systemd (259) builds
# nss-myhostname and nss-resolve by default and adds them to nsswitch.conf: Debian's
# libnss-myhostname and libnss-resolve do the same.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "systemd-resolved",
    "libnss-myhostname",
    "libnss-resolve",
    "udev",
    "kmod",
    "dbus",
    "iproute2",
    "linux-image-amd64",
    "openssh-server",
    "python3",
    "openssl",
    "sudo",
    "vulkan-tools",
    "libvulkan1",
    "libgomp1",
    "libssl3t64",
    "ca-certificates",
)


def cache_dir() -> Path:
    return Path(os.environ.get("ROCKY_CACHE", "/var/cache/rocky-vulkan")) / "vm"


def say(msg: str) -> None:
    print(f"[vm] {msg}", file=sys.stderr, flush=True)


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(f"{what} needs root (debootstrap, chroot, file ownership): run it as root")


def _wanted() -> dict:
    return {"suite": SUITE, "packages": sorted(PACKAGES)}


def ensure_base(mirror: str = MIRROR) -> Path:
    """The cached base root, made when missing or made from another package list."""
    require_root("vm build")
    base = cache_dir() / "base"
    stamp = base / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == _wanted():
        say(f"reusing the Debian base at {base}")
        return base
    if shutil.which("debootstrap") is None:
        raise UserError("debootstrap not found: apt-get install debootstrap")
    tmp = base.with_name("base.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {SUITE} (minbase + {len(PACKAGES)} packages) into {tmp}")
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp),
         mirror],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise UserError(f"debootstrap {SUITE} failed (exit {proc.returncode}):\n{tail}")
    kernels = sorted((tmp / "boot").glob("vmlinuz-*"))
    if not kernels or not sorted((tmp / "boot").glob("initrd.img-*")):
        raise UserError(f"{tmp}/boot has no kernel and initrd: linux-image-amd64 did not install")
    (tmp / STAMP).write_text(json.dumps(_wanted()))
    shutil.rmtree(base, ignore_errors=True)
    tmp.rename(base)
    return base
