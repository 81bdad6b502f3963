"""The image file given to `flash`: a regular file whose contents are the image its bmap
describes, checked before anything is written. bmaptool would find out too, but only after it
has overwritten the card's start.

What is checked cheaply: the compressed formats' magic bytes, an .xz's footer, a raw .wic's size,
and a .gz's trailer (the size of the unpacked data mod 2**32). Only when that trailer disagrees
(a truncated or concatenated gzip) is the whole stream unpacked and counted."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.host.bmap import Bmap
from rocky_vulkan.host.result_doc import clean_text
from rocky_vulkan.regularfile import NotReadable, open_regular

# What bmaptool unpacks, by file name ending, and how each format starts.
MAGIC = {
    ".gz": ("gzip", b"\x1f\x8b\x08"),
    ".xz": ("xz", b"\xfd7zXZ\x00"),
    ".zst": ("zstd", b"\x28\xb5\x2f\xfd"),
    ".bz2": ("bzip2", b"BZh"),
    ".lz4": ("lz4", b"\x04\x22\x4d\x18"),
}
RECOPY = "copy it again from the build's deploy folder, or rebuild with `rocky-vulkan build`"


def open_image(image: Path) -> int:
    """A descriptor of the image, a regular file (a link to one is fine); UserError otherwise."""
    try:
        return open_regular(image)
    except NotReadable as err:
        where = clean_text(str(image), 200)
        problem = "no such image" if err.why == "missing" else err.problem
        raise UserError(
            f"{where}: {problem}; pass the .wic.gz that `rocky-vulkan build` printed"
        ) from None


def check_image(fd: int, image: Path, bmap: Bmap, bmap_path: Path) -> None:
    """UserError unless the file at `fd` holds (in its format) exactly `bmap.image_size` bytes."""
    where = clean_text(str(image), 200)
    size = os.fstat(fd).st_size
    mismatch = (
        f"{where} is not the image its bmap {clean_text(bmap_path.name, 100)} describes "
        f"({bmap.image_size} bytes): use the .wic.gz and .wic.bmap of one build"
    )
    kind = MAGIC.get(image.suffix)
    if kind is None:  # an uncompressed .wic
        if size != bmap.image_size:
            raise UserError(f"{mismatch}; this file has {size} bytes")
        return
    name, magic = kind
    head = os.pread(fd, len(magic), 0)
    if head != magic:
        what = "empty" if not head else f"starts with {head.hex()}"
        raise UserError(
            f"{where}: not {name} data ({what}) although named {image.suffix}; {RECOPY}"
        )
    if name == "xz" and os.pread(fd, 2, max(size - 2, 0)) != b"YZ":
        raise UserError(f"{where}: the xz data is truncated (no end of stream); {RECOPY}")
    if name == "gzip":
        _check_gzip(fd, size, where, bmap.image_size, mismatch)


def _check_gzip(fd: int, size: int, where: str, want: int, mismatch: str) -> None:
    trailer = os.pread(fd, 4, max(size - 4, 0))
    if size >= 18 and int.from_bytes(trailer, "little") == want % 2**32:
        return  # the common case: one gzip member, whole
    got, complete = _gunzip_count(fd, want)
    if not complete:
        raise UserError(f"{where}: the gzip data is truncated or damaged; {RECOPY}")
    if got != want:
        raise UserError(f"{mismatch}; it unpacks to {'more than ' if got > want else ''}{got}")


def _gunzip_count(fd: int, limit: int) -> tuple[int, bool]:
    """(bytes unpacked, whether every gzip member ended properly); stops past `limit`."""
    total, offset, unpack = 0, 0, zlib.decompressobj(wbits=31)
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return total, unpack.eof
        offset += len(chunk)
        while chunk:
            try:
                total += len(unpack.decompress(chunk, 1 << 24))
                while unpack.unconsumed_tail and total <= limit:
                    total += len(unpack.decompress(unpack.unconsumed_tail, 1 << 24))
            except zlib.error:
                return total, False
            if total > limit:
                return total, True
            chunk = unpack.unused_data if unpack.eof else b""
            if chunk:  # a next member (pigz -i, cat a.gz b.gz)
                unpack = zlib.decompressobj(wbits=31)
