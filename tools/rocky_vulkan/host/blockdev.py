"""Block devices (as host/lsblk.py reads them), and why one must not be flashed.

Strings from lsblk (models, mount points) are data: every message shows them through shown(),
and every command hint quotes them (shellquote)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rocky_vulkan.errors import UserError
from rocky_vulkan.host.result_doc import clean_text
from rocky_vulkan.shellquote import quote

# Mount points whose disk is the running system: never a flash target, not even with --force.
SYSTEM_MOUNTS = ("/", "/boot", "/boot/efi", "/boot/firmware", "/usr", "/var", "/home", "[SWAP]")
WHOLE_DISK_TYPES = ("disk", "loop")
MOUNTS_SHOWN = 5  # a message names this many mount points, then counts the rest


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


def shown(value: str, limit: int = 60) -> str:
    """A string from lsblk or the command line as one line of plain text, cut to `limit`."""
    return clean_text(value, limit)


def human_size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def describe(disk: Disk) -> str:
    bits = [human_size(disk.size), disk.type]
    if disk.model:
        bits.append(shown(disk.model, 40))
    if disk.tran:
        bits.append(disk.tran)
    bits.append("removable" if disk.removable else "fixed")
    return f"{shown(disk.path)} ({', '.join(bits)})"


def find_target(disks: list[Disk], device: str) -> Disk:
    """The whole disk named by `device` (symlinks such as /dev/disk/by-id/* resolved)."""
    if "\x00" in device:
        raise UserError(f"{shown(device)} is not a device path (it holds a NUL)")
    real = os.path.realpath(device)
    for top in disks:
        for node in top.walk():
            if real in (node.path, f"/dev/{node.name}"):
                if node.type not in WHOLE_DISK_TYPES:
                    raise UserError(
                        f"{shown(device)} is a {node.type}, not a whole disk: flash the disk "
                        f"{shown(top.path)} it belongs to"
                    )
                return node
    raise UserError(
        f"{shown(device)} is not a block device lsblk knows; `rocky-vulkan flash --list` shows "
        "candidates"
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
        more = f" and {len(mounts) - MOUNTS_SHOWN} more" if len(mounts) > MOUNTS_SHOWN else ""
        first = mounts[:MOUNTS_SHOWN]
        out.append(
            Refusal(
                f"{disk.path} is mounted at {', '.join(shown(m, 200) for m in first)}{more}",
                "unmount it first: " + "; ".join(umount_hint(m) for m in first) + more,
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


def umount_hint(mount: str) -> str:
    """The command that unmounts `mount`, quoted for the shell (`--`: a path is never an option)."""
    return f"sudo umount {'-- ' if mount.startswith('-') else ''}{quote(mount)}"


def candidates(disks: list[Disk], image_size: int = 0) -> list[tuple[Disk, list[Refusal]]]:
    """Whole disks with what (if anything) stands against flashing each one."""
    return [
        (d, refusals(d, image_size)) for d in disks if d.type in WHOLE_DISK_TYPES and d.size > 0
    ]
