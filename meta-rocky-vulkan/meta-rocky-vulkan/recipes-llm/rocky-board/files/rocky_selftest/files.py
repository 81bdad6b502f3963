"""The one way the self-test reads a file: a regular file only (never blocking on a FIFO, never
reading a device), bounded in size, and strict JSON from it.

The root step reads what an unprivileged process wrote (result.json, the runtime note): those
are opened without following a symlink, so a link cannot make root read elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any


class UnreadableFile(ValueError):
    """The file is not a regular file we may read, is too big, or is not what it should be;
    the message names the file and the problem (`errno` set when the OS refused)."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    for test, words in kinds:
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_bounded(path: str, max_bytes: int, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes`.

    FileNotFoundError when there is nothing there (callers treat that as "none yet"); every other
    problem is UnreadableFile naming the file: another kind of file (opened non-blocking, checked
    with fstat before any read), a symlink where `follow_links` is False, too big, an OS error."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP:
            what = "a symbolic link (not followed here)" if not follow_links else "a symlink loop"
            raise UnreadableFile(f"{path}: is {what}") from None
        raise UnreadableFile(f"cannot read {path}: {os_error_text(err)}", err.errno) from None
    try:
        info = os.fstat(fd)
        kind = _kind(info.st_mode)
        if kind:
            raise UnreadableFile(f"{path}: is {kind}, not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{path}: {info.st_size} bytes, more than the {max_bytes} allowed")
        chunks, size = [], 0
        while size <= max_bytes:  # the size can change under us: the cap holds regardless
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise UnreadableFile(f"cannot read {path}: {os_error_text(err)}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise UnreadableFile(f"{path}: more than the {max_bytes} bytes allowed")
    return b"".join(chunks)


def read_text(path: str, max_bytes: int, follow_links: bool = True) -> str:
    """read_bounded, decoded as UTF-8 (UnreadableFile when it is not)."""
    data = read_bounded(path, max_bytes, follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, allow_nan: bool = False) -> Any:
    """json.loads, with ValueError for everything that goes wrong: NaN/Infinity (unless
    `allow_nan`: a tool's output whose numbers are checked afterwards), nesting too deep for
    the parser, integers too long to convert."""
    try:
        if allow_nan:
            return json.loads(text)
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json(path: str, max_bytes: int, follow_links: bool = True, allow_nan: bool = False) -> Any:
    """Strict JSON from a bounded regular file; UnreadableFile naming the file otherwise.
    `allow_nan`: NaN/Infinity are let through to a reader that checks every number itself and
    names the key that holds one."""
    text = read_text(path, max_bytes, follow_links)
    try:
        return parse_json(text, allow_nan)
    except ValueError as err:
        raise UnreadableFile(f"{path}: not valid JSON ({err})") from None


def os_error_text(err: OSError) -> str:
    """'No space left on device (ENOSPC)': the kernel's words and the name to search for."""
    if err.errno and err.strerror:
        return f"{err.strerror} ({errno.errorcode.get(err.errno, err.errno)})"
    return str(err)
