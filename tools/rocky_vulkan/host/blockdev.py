"""Block devices as `lsblk --json` reports them, and why one must not be flashed."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from rocky_vulkan.errors import UserError

LSBLK_COLUMNS = "NAME,PATH,SIZE,TYPE,RM,HOTPLUG,RO,MOUNTPOINTS,MODEL,TRAN"
# Mount points whose disk is the running system: never a flash target, not even with --force.
SYSTEM_MOUNTS = ("/", "/boot", "/boot/efi", "/boot/firmware", "/usr", "/var", "/home", "[SWAP]")
WHOLE_DISK_TYPES = ("disk", "loop")


@dataclass(frozen=True)
class Disk:
    name: str
    path: str
    size: int
    type: str
    removable: bool
    read_only: bool
    model: str
    tran: str
    mountpoints: tuple[str, ...]  # of this node only
    children: tuple[Disk, ...]

    def all_mountpoints(self) -> list[str]:
        """Mount points of this node and everything below it (partitions, LVM, crypt)."""
        found = list(self.mountpoints)
        for child in self.children:
            found += child.all_mountpoints()
        return found

    def walk(self) -> list[Disk]:
        out = [self]
        for child in self.children:
            out += child.walk()
        return out


@dataclass(frozen=True)
class Refusal:
    reason: str
    fix: str
    overridable: bool  # True: --force lifts it


def _bool(value: object) -> bool:
    # lsblk >= 2.33 gives JSON booleans; older ones "0"/"1" strings.
    return value in (True, 1, "1", "true")


def _disk(node: dict) -> Disk:
    mounts = node.get("mountpoints")
    if mounts is None:  # lsblk < 2.37: one MOUNTPOINT column
        mounts = [node.get("mountpoint")]
    return Disk(
        name=node["name"],
        path=node.get("path") or f"/dev/{node['name']}",
        size=int(node.get("size") or 0),
        type=node.get("type") or "",
        removable=_bool(node.get("rm")) or _bool(node.get("hotplug")) or node.get("tran") == "usb",
        read_only=_bool(node.get("ro")),
        model=(node.get("model") or "").strip(),
        tran=node.get("tran") or "",
        mountpoints=tuple(m for m in mounts if m),
        children=tuple(_disk(c) for c in node.get("children") or ()),
    )


def parse_lsblk(text: str) -> list[Disk]:
    """Top-level devices from `lsblk --json -b -o LSBLK_COLUMNS` output."""
    return [_disk(node) for node in json.loads(text)["blockdevices"]]


def run_lsblk() -> str:
    try:
        proc = subprocess.run(
            ["lsblk", "--json", "--bytes", "-o", LSBLK_COLUMNS],
            capture_output=True,
            text=True,
            check=True,
        )
    except FileNotFoundError:
        raise UserError("lsblk not found: sudo apt-get install util-linux") from None
    except subprocess.CalledProcessError as err:
        raise UserError(f"lsblk failed: {err.stderr.strip()}") from None
    return proc.stdout


def human_size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def describe(disk: Disk) -> str:
    bits = [human_size(disk.size), disk.type]
    if disk.model:
        bits.append(disk.model)
    if disk.tran:
        bits.append(disk.tran)
    bits.append("removable" if disk.removable else "fixed")
    return f"{disk.path} ({', '.join(bits)})"


def find_target(disks: list[Disk], device: str) -> Disk:
    """The whole disk named by `device` (symlinks such as /dev/disk/by-id/* resolved)."""
    real = os.path.realpath(device)
    for top in disks:
        for node in top.walk():
            if real in (node.path, f"/dev/{node.name}"):
                if node.type not in WHOLE_DISK_TYPES:
                    raise UserError(
                        f"{device} is a {node.type}, not a whole disk: flash the disk "
                        f"{top.path} it belongs to"
                    )
                return node
    raise UserError(
        f"{device} is not a block device lsblk knows; `rocky-vulkan flash --list` shows candidates"
    )


def refusals(disk: Disk, image_size: int, force: bool = False) -> list[Refusal]:
    """Every reason not to write an image of `image_size` bytes to `disk`; --force lifts only
    the non-removable one."""
    out = []
    mounts = disk.all_mountpoints()
    system = [m for m in mounts if m in SYSTEM_MOUNTS]
    if system:
        out.append(
            Refusal(
                f"{disk.path} holds the running system ({', '.join(system)})",
                "pick another disk; this one is never flashed",
                overridable=False,
            )
        )
    elif mounts:
        out.append(
            Refusal(
                f"{disk.path} is mounted at {', '.join(mounts)}",
                "unmount it first: " + "; ".join(f"sudo umount {m}" for m in mounts),
                overridable=False,
            )
        )
    if disk.read_only:
        out.append(
            Refusal(
                f"{disk.path} is read-only", "check the SD card's lock switch", overridable=False
            )
        )
    if disk.size < image_size:
        out.append(
            Refusal(
                f"the image ({human_size(image_size)}) does not fit on {disk.path} "
                f"({human_size(disk.size)})",
                "use a bigger card",
                overridable=False,
            )
        )
    if not disk.removable and not force:
        out.append(
            Refusal(
                f"{disk.path} is not a removable disk ({disk.type}, {disk.tran or 'no transport'})",
                "check it is the card you mean, then add --force",
                overridable=True,
            )
        )
    return out


def candidates(disks: list[Disk], image_size: int = 0) -> list[tuple[Disk, list[Refusal]]]:
    """Whole disks with what (if anything) stands against flashing each one."""
    return [
        (d, refusals(d, image_size)) for d in disks if d.type in WHOLE_DISK_TYPES and d.size > 0
    ]
