"""The boot rehearsal's test plumbing: a VM disk built with a key made here, booted, and
reached over SSH as the image's login user (tests/vm/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.project import ROOT

# What every VM test module needs (its pytestmark).
MARKS = [
    pytest.mark.slow,
    pytest.mark.needs_vm_boot,
    pytest.mark.needs_root,
    pytest.mark.needs_tool("qemu-system-x86_64", "Debian: qemu-system-x86"),
    pytest.mark.needs_tool("debootstrap", "Debian: debootstrap"),
    pytest.mark.needs_tool("mkfs.ext4", "Debian: e2fsprogs"),
]

BOOT_TIMEOUT_S = 600
# The self-test runs llama.cpp on the CPU under TCG when it has it: minutes.
SELFTEST_TIMEOUT_S = 1500
LLAMA = os.environ.get("ROCKY_LLAMA_INSTALL_DIR")
needs_llama = pytest.mark.skipif(
    not LLAMA, reason="set ROCKY_LLAMA_INSTALL_DIR: llama.cpp's install tree (.ci/llama.sh)"
)


class Guest:
    def __init__(self, vm, key: Path) -> None:
        self.vm = vm
        self.key = key

    def ssh_argv(self, *extra: str) -> list[str]:
        return [
            "ssh", "-i", str(self.key), "-p", str(self.vm.ports["ssh"]),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20",
            *extra,
        ]  # fmt: skip

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.ssh_argv(), "rocky@127.0.0.1", command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def out(self, command: str, timeout: float = 120) -> str:
        proc = self.run(command, timeout)
        assert proc.returncode == 0, f"{command}: {proc.returncode} {proc.stderr}"
        return proc.stdout

    def wait(self, command: str, timeout: float, what: str) -> str:
        """Until `command` succeeds in the guest; its output."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.run(command)
            if proc.returncode == 0:
                return proc.stdout
            time.sleep(5)
        raise AssertionError(f"{what} not within {timeout} s\n{self.vm.tail()}")


def build_disk(work: Path) -> tuple[Path, Path]:
    """A disk of the rendered layer (with llama.cpp when LLAMA), and the key that logs in."""
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    build = [
        sys.executable, "-m", "rocky_vulkan.cli", "-c", str(ROOT / "rocky-vulkan.yaml"),
        "vm", "build",
        "--out", str(work / "disk"), "--ssh-key", f"{key}.pub",
    ]  # fmt: skip
    if LLAMA:
        build += ["--llama-tree", str(Path(LLAMA) / "root")]
    subprocess.run(build, check=True, timeout=1800)
    return work / "disk", key


def boot(disk: Path, key: Path) -> Guest:
    """The guest of `disk` booted (not a snapshot: what it writes stays, as on a board), SSH up."""
    from rocky_vulkan.vm import qemu

    guest = Guest(qemu.boot(disk, snapshot=False), key)
    try:
        guest.vm.wait_port("ssh", BOOT_TIMEOUT_S)
    except BaseException:
        guest.vm.stop()
        raise
    return guest
