"""`rocky-vulkan flash IMAGE DEVICE`: write a .wic.gz to an SD card with `bmaptool copy`, after
refusing anything that could be the wrong disk, and read it back against the bmap."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.host import blockdev
from rocky_vulkan.host.bmap import bmap_for, parse_bmap, verify_device

BMAPTOOL_FIX = "sudo apt-get install bmap-tools (bmaptool is not on PyPI)"


def print_candidates(disks: list[blockdev.Disk], image_size: int = 0) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="disks (lsblk)")
    table.add_column("device")
    table.add_column("flash?")
    table.add_column("why not")
    for disk, why in blockdev.candidates(disks, image_size):
        verdict = "[green]yes[/]" if not why else "[red]no[/]"
        table.add_row(blockdev.describe(disk), verdict, "\n".join(r.reason for r in why))
    Console(highlight=False).print(table)


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
    if not image.is_file():
        raise UserError(f"{image}: no such image; `rocky-vulkan build` prints its path")
    bmap_path = bmap_for(image)
    bmap = parse_bmap(bmap_path)
    disks = blockdev.parse_lsblk(lsblk_json if lsblk_json is not None else blockdev.run_lsblk())
    disk = check_target(disks, device, bmap.image_size, force)
    bmaptool = shutil.which("bmaptool")
    if not bmaptool:
        raise UserError(f"bmaptool not found: {BMAPTOOL_FIX}")
    if not os.access(disk.path, os.W_OK):
        raise UserError(
            f"no write permission on {disk.path}: run `sudo {Path(sys.argv[0]).name} flash ...`"
        )
    if not yes and not confirm(disk, ask):
        raise UserError("not confirmed; nothing was written")
    cmd = bmaptool_command(bmaptool, image, bmap_path, disk.path)
    print("running: " + " ".join(cmd), flush=True)
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
    print(f"verified: {bmap.mapped_bytes} mapped bytes on {disk.path} match {bmap_path.name}")
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
        print_candidates(blockdev.parse_lsblk(blockdev.run_lsblk()), size)
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
