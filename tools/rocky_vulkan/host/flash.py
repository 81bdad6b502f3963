"""`rocky-vulkan flash IMAGE DEVICE`: write a .wic.gz to an SD card with `bmaptool copy`, after
refusing anything that could be the wrong disk, and read it back against the bmap."""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rocky_vulkan import shellquote
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import blockdev, lsblk
from rocky_vulkan.host.bmap import bmap_for, parse_bmap, verify_device
from rocky_vulkan.host.wicimage import check_image, open_image

BMAPTOOL_FIX = "sudo apt-get install bmap-tools (bmaptool is not on PyPI)"


def print_candidates(disks: list[blockdev.Disk], image_size: int = 0) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="disks (lsblk)")
    table.add_column("device")
    table.add_column("flash?")
    table.add_column("why not")
    for disk, why in blockdev.candidates(disks, image_size):
        verdict = Text("yes", "green") if not why else Text("no", "red")
        # Text, not markup: a model or mount point from lsblk is shown as the characters it is.
        reasons = Text("\n".join(r.reason for r in why))
        table.add_row(Text(blockdev.describe(disk)), verdict, reasons)
    Console(highlight=False, emoji=False).print(table)


def confirm(disk: blockdev.Disk, ask: Callable[[str], str] = input) -> bool:
    """Typed confirmation: the user types the device's name (e.g. 'sdb')."""
    prompt = (
        f"This ERASES everything on {blockdev.describe(disk)}.\n"
        f"Type the device name '{disk.name}' to continue: "
    )
    try:
        return ask(prompt).strip() == disk.name
    except EOFError:
        return False


def check_target(
    disks: list[blockdev.Disk], device: str, image_size: int, force: bool
) -> blockdev.Disk:
    disk = blockdev.find_target(disks, device)
    refused = blockdev.refusals(disk, image_size, force=force)
    if refused:
        lines = "\n  ".join(f"{r.reason}: {r.fix}" for r in refused)
        raise UserError(f"refusing to flash {disk.path}:\n  {lines}")
    return disk


def require_block_device(disk: blockdev.Disk) -> None:
    """`disk.path` is a block device now: the card may have been pulled since lsblk listed it
    (bmaptool would then write a regular file of the image's size into /dev)."""
    try:
        mode = os.stat(disk.path).st_mode
    except OSError as err:
        mode, why = 0, f"not there ({err.strerror})"
    else:
        why = "not a block device"
    if not stat.S_ISBLK(mode):
        raise UserError(
            f"{disk.path} is {why}, though lsblk listed it: the card was removed or the device "
            "name changed; nothing was written. Insert the card and check `rocky-vulkan flash "
            "--list`"
        )


def bmaptool_command(bmaptool: str, image: Path, bmap: Path, device: str) -> list[str]:
    return [bmaptool, "copy", "--bmap", str(bmap), str(image), device]


def flash(
    image: Path,
    device: str,
    *,
    force: bool = False,
    yes: bool = False,
    ask: Callable[[str], str] = input,
    lsblk_json: str | None = None,
) -> int:
    """Check, confirm, copy and verify; raise UserError on any refusal."""
    fd = open_image(image)
    try:
        bmap_path = bmap_for(image)
        bmap = parse_bmap(bmap_path)
        check_image(fd, image, bmap, bmap_path)
    finally:
        os.close(fd)
    disks = lsblk.read_disks(lsblk_json)
    disk = check_target(disks, device, bmap.image_size, force)
    bmaptool = shutil.which("bmaptool")
    if not bmaptool:
        raise UserError(f"bmaptool not found: {BMAPTOOL_FIX}")
    require_block_device(disk)
    if not os.access(disk.path, os.W_OK):
        again = shellquote.join([Path(sys.argv[0]).name, "flash", image, disk.path])
        raise UserError(f"no write permission on {disk.path}: run `sudo {again}`")
    if not yes and not confirm(disk, ask):
        raise UserError("not confirmed; nothing was written")
    require_block_device(disk)  # again: the card may have been pulled while the prompt waited
    cmd = bmaptool_command(bmaptool, image, bmap_path, disk.path)
    print("running: " + shellquote.join(cmd), flush=True)
    # bmaptool prints its own progress; it opens the device O_EXCL, so a late mount fails safely.
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise UserError(f"bmaptool copy failed with exit {rc}; the card is not usable as is")
    bad = _verify(Path(disk.path), bmap)
    if bad:
        raise UserError(
            f"read-back of {disk.path} differs from the image in {len(bad)} ranges "
            f"({', '.join(bad[:5])}): the card is faulty or was removed; try another card"
        )
    shown = blockdev.shown(bmap_path.name, 200)
    print(f"verified: {bmap.mapped_bytes} mapped bytes on {disk.path} match {shown}")
    print("next: put the card in the ROCK 5 ITX, serial console 1500000 8N1 on the debug UART")
    return 0


def _verify(device: Path, bmap) -> list[str]:
    from rich.progress import DownloadColumn, Progress

    with Progress(*Progress.get_default_columns(), DownloadColumn()) as progress:
        task = progress.add_task("verifying", total=bmap.mapped_bytes)
        return verify_device(device, bmap, lambda n: progress.advance(task, n))


def _run(args: argparse.Namespace) -> int:
    if args.list or not (args.image and args.device):
        if not args.list:
            print("usage: rocky-vulkan flash IMAGE DEVICE  (candidates below)", file=sys.stderr)
        size = parse_bmap(bmap_for(Path(args.image))).image_size if args.image else 0
        print_candidates(lsblk.read_disks(), size)
        return 0 if args.list else 2
    return flash(Path(args.image), args.device, force=args.force, yes=args.yes)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "flash", help="write IMAGE (.wic.gz + .wic.bmap) to an SD card with bmaptool, verified"
    )
    parser.add_argument("image", nargs="?", help="the .wic.gz that `rocky-vulkan build` printed")
    parser.add_argument("device", nargs="?", help="the whole disk, e.g. /dev/sdb or /dev/mmcblk0")
    parser.add_argument("--list", action="store_true", help="list disks and which can be flashed")
    parser.add_argument(
        "--force", action="store_true", help="allow a non-removable disk (never a mounted one)"
    )
    parser.add_argument("--yes", action="store_true", help="skip the typed confirmation")
    parser.set_defaults(func=_run)
