"""Read a bmaptool block map and verify a written device against its checksums."""

from __future__ import annotations

import hashlib
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from xml.parsers import expat

from rocky_vulkan.errors import UserError
from rocky_vulkan.host.result_doc import clean_text
from rocky_vulkan.regularfile import NotReadable, read_bounded

# A bmap lists a line per mapped extent: tens of MB for a badly fragmented disk image at most.
MAX_BMAP_BYTES = 32 << 20
MAX_IMAGE_BYTES = 1 << 48  # 256 TiB: past any card
MAX_BLOCK_SIZE = 1 << 20
NUMBER = re.compile(r"[0-9]{1,20}")  # ASCII digits only: int() would take '1_000' and '١٢'
RANGE = re.compile(r"([0-9]{1,20})(?:\s*-\s*([0-9]{1,20}))?")
SHA256 = re.compile(r"[0-9a-f]{64}")
VERSION = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})")
REGENERATE = (
    "copy the .wic.bmap again from the build's deploy folder, or make one from the uncompressed "
    "image with `bmaptool create -o IMAGE.wic.bmap IMAGE.wic`"
)


@dataclass(frozen=True)
class BlockRange:
    first: int
    last: int
    checksum: str


@dataclass(frozen=True)
class Bmap:
    image_size: int
    block_size: int
    checksum_type: str
    ranges: tuple[BlockRange, ...]

    @property
    def mapped_bytes(self) -> int:
        return sum((r.last - r.first + 1) * self.block_size for r in self.ranges)


def bmap_for(image: Path) -> Path:
    """`x.wic.gz` -> `x.wic.bmap` (as Yocto names it), else `x.wic.gz.bmap`."""
    stem = image.name
    if not stem or stem in (".", ".."):
        raise UserError(f"{clean_text(str(image), 200)} is not an image file name")
    for ext in (".gz", ".xz", ".zst", ".bz2", ".lz4"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    for candidate in (image.with_name(stem + ".bmap"), image.with_name(image.name + ".bmap")):
        if os.path.lexists(candidate):  # a broken link is found, and parse_bmap says why
            return candidate
    raise UserError(
        f"no block map next to {clean_text(str(image), 200)} (looked for "
        f"{clean_text(stem, 100)}.bmap): build with IMAGE_FSTYPES "
        "including wic.bmap, or create one with `bmaptool create -o IMAGE.bmap IMAGE`"
    )


class BmapError(UserError):
    """A .bmap that is not exactly what `bmaptool create` writes (format 2.0, sha256)."""


class _Declared(Exception):
    """A DOCTYPE or entity declaration: a bmap has none, and entities are how XML blows up."""


def _xml(data: bytes) -> ET.Element:
    """The element tree of `data`, refusing any DOCTYPE or entity declaration before it is
    expanded (expat directly: ElementTree gives no hook for them)."""
    parser = expat.ParserCreate()
    builder = ET.TreeBuilder()

    def declared(*_args: object) -> None:
        raise _Declared

    parser.StartDoctypeDeclHandler = declared
    parser.EntityDeclHandler = declared
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.Parse(data, True)
    return builder.close()


def _checksum_matches(data: bytes, checksum: str) -> bool:
    """bmaptool's rule: the sha256 of the file with its BmapFileChecksum's digits all '0'."""
    pos = data.find(checksum.encode())
    if pos < 0:
        return False
    zeroed = data[:pos] + b"0" * len(checksum) + data[pos + len(checksum) :]
    return hashlib.sha256(zeroed).hexdigest() == checksum


def _shown(text: str | None) -> str:
    return repr(clean_text(text or "", 40))


def parse_bmap(path: Path) -> Bmap:
    """The block map at `path`, every field checked against the format bmaptool 3 writes: exact
    decimal numbers in range, BlocksCount and MappedBlocksCount consistent with the ranges, ranges
    ascending, disjoint and inside the image, each with its sha256, and the file's own checksum."""
    where = clean_text(str(path), 200)

    def bad(problem: str) -> BmapError:
        return BmapError(f"{where}: {problem}; {REGENERATE}")

    try:
        data = read_bounded(path, MAX_BMAP_BYTES)
    except NotReadable as err:
        raise bad(f"cannot read the bmap: {err.problem}") from None
    try:
        root = _xml(data)
    except _Declared:
        raise bad("the bmap declares a DOCTYPE or entities; bmaptool writes neither") from None
    except expat.ExpatError as err:
        raise bad(f"not a bmap (not well-formed XML: {clean_text(str(err), 80)})") from None
    if root.tag != "bmap":
        raise bad(f"not a bmap (its root element is <{clean_text(root.tag, 40)}>)")
    version = VERSION.fullmatch(root.get("version") or "")
    if not version or not (version[1] == "2" or version[0] == "1.4"):
        raise bad(f"bmap format version {_shown(root.get('version'))}; this tool reads 2.x")

    def element(tag: str) -> ET.Element:
        found = root.findall(tag)
        if len(found) != 1:
            raise bad(f"the bmap has {len(found)} <{tag}> elements, not one")
        return found[0]

    def number(tag: str, low: int, high: int) -> int:
        text = (element(tag).text or "").strip()
        if not NUMBER.fullmatch(text) or not low <= int(text) <= high:
            raise bad(f"<{tag}> {_shown(text)} is not a whole number from {low} to {high}")
        return int(text)

    image_size = number("ImageSize", 1, MAX_IMAGE_BYTES)
    block_size = number("BlockSize", 512, MAX_BLOCK_SIZE)
    if block_size & (block_size - 1):
        raise bad(f"<BlockSize> {block_size} is not a power of two")
    blocks = number("BlocksCount", 1, MAX_IMAGE_BYTES)
    if blocks != -(-image_size // block_size):
        raise bad(
            f"<BlocksCount> {blocks} does not cover <ImageSize> {image_size} in blocks of "
            f"{block_size} bytes"
        )
    mapped = number("MappedBlocksCount", 1, blocks)
    ctype = (element("ChecksumType").text or "").strip()
    if ctype != "sha256":
        raise bad(f"<ChecksumType> {_shown(ctype)}; this tool checks sha256")
    checksum = (element("BmapFileChecksum").text or "").strip()
    if not SHA256.fullmatch(checksum):
        raise bad(f"<BmapFileChecksum> {_shown(checksum)} is not 64 hex digits")
    if not _checksum_matches(data, checksum):
        raise bad("the bmap's own checksum does not match: it was changed after bmaptool wrote it")
    ranges = _ranges(element("BlockMap"), blocks, bad)
    if sum(r.last - r.first + 1 for r in ranges) != mapped:
        raise bad(f"<MappedBlocksCount> {mapped} is not the number of blocks in its ranges")
    return Bmap(image_size, block_size, ctype, tuple(ranges))


def _ranges(block_map: ET.Element, blocks: int, bad: Callable[[str], BmapError]) -> list:
    ranges: list[BlockRange] = []
    for node in block_map:
        if node.tag != "Range":
            raise bad(f"<BlockMap> holds a <{clean_text(node.tag, 40)}>; only <Range>s belong")
        text = (node.text or "").strip()
        match = RANGE.fullmatch(text)
        first = int(match[1]) if match else -1
        last = int(match[2] or match[1]) if match else -1
        low = ranges[-1].last + 1 if ranges else 0
        if not match or not low <= first <= last < blocks:
            raise bad(
                f"<Range> {_shown(text)} is not FIRST-LAST with {low} <= FIRST <= LAST < {blocks} "
                "(ranges ascending, apart, inside the image)"
            )
        chksum = node.get("chksum") or ""
        if not SHA256.fullmatch(chksum):
            raise bad(f"<Range> {text} has chksum {_shown(chksum)}, not 64 hex digits")
        ranges.append(BlockRange(first, last, chksum))
    if not ranges:
        raise bad("the bmap's <BlockMap> has no <Range>: it maps no blocks")
    return ranges


def verify_device(
    device: Path, bmap: Bmap, on_bytes: Callable[[int], None] = lambda n: None
) -> list[str]:
    """Read every mapped range back from `device` and compare it with the bmap's checksum.
    Returns the ranges that differ ('' list when all match). The page cache is dropped first so
    the data comes from the medium, not from what was just written."""
    bad = []
    fd = os.open(device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for r in bmap.ranges:
            digest = hashlib.sha256()
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
