"""Boot the VM disk with qemu-system-x86_64: KVM where it works, else TCG; ports on loopback.

KVM can open here and still fail to run the guest ("KVM internal error ... emulation failure"
under nested virtualisation, FACTS.md): KVM is tried first only where /dev/kvm opens, and a
guest that dies with that error is booted again under TCG.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.vm.base import say

# The guest's ports that the host reaches, each forwarded from a free loopback port.
GUEST_PORTS = {"ssh": 22, "openai": 8443, "ollama": 11434}
KVM_FAILED = "KVM internal error"
MEMORY_MIB = 3072


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def command(out: Path, ports: dict[str, int], accel: str, snapshot: bool) -> list[str]:
    forwards = ",".join(
        f"hostfwd=tcp:127.0.0.1:{ports[name]}-:{guest}" for name, guest in GUEST_PORTS.items()
    )
    cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]
    return [
        "qemu-system-x86_64",
        "-accel", accel if accel == "kvm" else "tcg,thread=multi",
        *cpu,
        "-smp", "2", "-m", str(MEMORY_MIB),
        "-display", "none", "-no-reboot",
        "-serial", f"file:{out / 'console.log'}",
        "-kernel", str(out / "vmlinuz"), "-initrd", str(out / "initrd.img"),
        "-append", "console=ttyS0 root=/dev/vda rw net.ifnames=0 panic=-1",
        "-drive", f"file={out / 'disk.img'},format=raw,if=virtio",
        *(["-snapshot"] if snapshot else []),
        "-netdev", f"user,id=n0,{forwards}", "-device", "virtio-net-pci,netdev=n0",
        # A DRM render node that is not panthor: DevicePolicy=closed + DeviceAllow=char-drm
        # meet a real one, and the self-test must name the missing GPU.
        "-device", "virtio-gpu-pci",
    ]  # fmt: skip


@dataclass
class Vm:
    """One running guest."""

    out: Path
    ports: dict[str, int]
    accel: str
    proc: subprocess.Popen
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.out / "console.log"

    def console(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_port(self, name: str, timeout: float) -> None:
        """Until the guest's service answers through its forward (qemu accepts first, then
        closes at once while nothing listens inside: wait for the SSH banner's first byte)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise UserError(f"the VM stopped (exit {self.proc.returncode}):\n{self.tail()}")
            if self.accel == "kvm" and KVM_FAILED in self.qemu_said():
                raise UserError(f"KVM stopped the guest:\n{self.qemu_said()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.ports[name]), timeout=5) as s:
                    s.settimeout(5)
                    if name != "ssh" or s.recv(1):
                        return
            except OSError:
                pass
            time.sleep(2)
        late = f"the guest's {name} port did not answer in {timeout:.0f} s"
        raise UserError(f"{late}:\n{self.tail()}")

    def qemu_said(self) -> str:
        try:
            return (self.out / "qemu.log").read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.console().splitlines()[-n:])

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# Set once KVM failed to bring a guest up in this process: later boots go straight to TCG.
_kvm_broken: list[str] = []


def boot(out: Path, snapshot: bool = True, ready_timeout: float = 600) -> Vm:
    """Start the guest of out/ (disk.img, vmlinuz, initrd.img) and wait for its SSH; with
    snapshot, nothing it writes reaches disk.img, so every boot is a first boot. KVM is used
    only when it brings the guest up: under nested KVM the guest may stop with "KVM internal
    error" or oops in the kernel ("Oops: int3", seen here); then it is booted again under TCG."""
    for name in ("disk.img", "vmlinuz", "initrd.img"):
        if not (out / name).is_file():
            raise UserError(f"{out / name} missing: run `rocky-vulkan vm build` first")
    # ROCKY_VM_ACCEL=tcg skips the KVM try (it costs a minute where KVM cannot run the guest).
    kvm = kvm_usable() and os.environ.get("ROCKY_VM_ACCEL") != "tcg" and not _kvm_broken
    for accel in ["kvm", "tcg"] if kvm else ["tcg"]:
        vm = _start(out, accel, snapshot)
        if accel == "tcg":
            vm.wait_port("ssh", ready_timeout)
            return vm
        try:
            if _kvm_failed(vm):
                raise UserError("KVM stopped the guest:\n" + vm.qemu_said()[-2000:])
            vm.wait_port("ssh", ready_timeout)
            return vm
        except UserError as err:
            vm.stop(10)
            _kvm_broken.append(str(err)[-2000:])
            say("KVM cannot run this guest here: booting again under TCG")
    raise UserError("qemu-system-x86_64 could not start the guest")


def _start(out: Path, accel: str, snapshot: bool) -> Vm:
    ports = {name: free_port() for name in GUEST_PORTS}
    (out / "console.log").unlink(missing_ok=True)
    with open(out / "qemu.log", "w") as qemu_log:
        proc = subprocess.Popen(
            command(out, ports, accel, snapshot), stdin=subprocess.DEVNULL, stdout=qemu_log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    say(f"booting under {accel}: ports {ports}, console {out / 'console.log'}")
    return Vm(out, ports, accel, proc)


def _kvm_failed(vm: Vm, watch_s: float = 90) -> bool:
    """Whether KVM stopped the guest in its first seconds (qemu then pauses it, or exits): its
    error in qemu.log before the guest's init runs. Such a guest is killed."""
    end = time.monotonic() + watch_s
    while time.monotonic() < end:
        said = vm.qemu_said()
        if KVM_FAILED in said or "failed to set MSR" in said or vm.proc.poll() is not None:
            vm.stop(10)
            return True
        if "Run /init" in vm.console() or "systemd[1]" in vm.console():
            return False
        time.sleep(1)
    return False
