"""Read a bmaptool block map and verify a written device against its checksums."""

from __future__ import annotations

import hashlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocky_vulkan.errors import UserError


@dataclass(frozen=True)
class BlockRange:
    first: int
    last: int
    checksum: str | None


@dataclass(frozen=True)
class Bmap:
    image_size: int
    block_size: int
    checksum_type: str | None
    ranges: tuple[BlockRange, ...]

    @property
    def mapped_bytes(self) -> int:
        return sum((r.last - r.first + 1) * self.block_size for r in self.ranges)


def bmap_for(image: Path) -> Path:
    """`x.wic.gz` -> `x.wic.bmap` (as Yocto names it), else `x.wic.gz.bmap`."""
    stem = image.name
    for ext in (".gz", ".xz", ".zst", ".bz2", ".lz4"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    for candidate in (image.with_name(stem + ".bmap"), image.with_name(image.name + ".bmap")):
        if candidate.exists():
            return candidate
    raise UserError(
        f"no block map next to {image} (looked for {stem}.bmap): build with IMAGE_FSTYPES "
        "including wic.bmap, or create one with `bmaptool create -o IMAGE.bmap IMAGE`"
    )


def parse_bmap(path: Path) -> Bmap:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise UserError(f"{path}: not a readable bmap file: {err}") from None

    def number(tag: str) -> int:
        node = root.find(tag)
        if node is None or not (node.text or "").strip():
            raise UserError(f"{path}: bmap has no <{tag}>")
        return int(node.text.strip())

    ctype = root.find("ChecksumType")
    ranges = []
    for node in root.iterfind("BlockMap/Range"):
        text = (node.text or "").strip()
        first, _, last = text.partition("-")
        ranges.append(BlockRange(int(first), int(last or first), node.get("chksum")))
    return Bmap(
        image_size=number("ImageSize"),
        block_size=number("BlockSize"),
        checksum_type=(ctype.text or "").strip() if ctype is not None else None,
        ranges=tuple(ranges),
    )


def verify_device(
    device: Path, bmap: Bmap, on_bytes: Callable[[int], None] = lambda n: None
) -> list[str]:
    """Read every mapped range back from `device` and compare it with the bmap's checksum.
    Returns the ranges that differ ('' list when all match). The page cache is dropped first so
    the data comes from the medium, not from what was just written."""
    algo = bmap.checksum_type or "sha256"
    bad = []
    fd = os.open(device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for r in bmap.ranges:
            if not r.checksum:
                continue
            digest = hashlib.new(algo)
            offset = r.first * bmap.block_size
            remaining = (r.last - r.first + 1) * bmap.block_size
            remaining = min(remaining, bmap.image_size - offset)  # last block may be partial
            while remaining > 0:
                chunk = os.pread(fd, min(remaining, 4 << 20), offset)
                if not chunk:
                    break
                digest.update(chunk)
                offset += len(chunk)
                remaining -= len(chunk)
                on_bytes(len(chunk))
            if digest.hexdigest() != r.checksum:
                bad.append(f"blocks {r.first}-{r.last}")
    finally:
        os.close(fd)
    return bad
