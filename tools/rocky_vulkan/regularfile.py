"""Open or read a file the user named only if it is a regular file: never block on a FIFO, never
read a device, never read more than a bound. Symlinks are followed (Yocto's deploy folder links
the dated images), but to a regular file only.

NotReadable says what is wrong with the file; read_regular adds the fix for the kind of file the
caller wanted, other callers add their own. Paths in messages go through shown()."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rocky_vulkan.errors import UserError

MAX_SHOWN = 300


def shown(path: Path | str) -> str:
    """A path for a message: control characters as escapes, so a name cannot drive the
    terminal, and at most MAX_SHOWN characters of it."""
    text = str(path)
    text = text if text.isprintable() else ascii(text)[1:-1]
    return text if len(text) <= MAX_SHOWN else f"{text[: MAX_SHOWN - 20]}...{text[-17:]}"


class NotReadable(UserError):
    """`path` cannot be read as a regular file. `why` is one of "missing", "denied", "open" (other
    errors of open, e.g. a symlink loop), "type" (not a regular file), "size" (over the bound),
    "read"; `detail` is the file kind, the size or the system's words."""

    def __init__(self, path: Path, why: str, detail: str, problem: str) -> None:
        super().__init__(f"{shown(path)}: {problem}")
        self.path, self.why, self.detail, self.problem = path, why, detail, problem


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in (
        (stat.S_ISREG, None),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file at `path`; the caller closes it. Checked with
    stat before opening (opening a device can have effects) and with fstat on the opened file, so
    a swap between the two cannot slip a device or a FIFO in."""
    try:
        kind = file_kind(os.stat(path).st_mode)
        if kind:
            raise NotReadable(path, "type", kind, f"is {kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotReadable(path, "missing", "", "no such file") from None
    except PermissionError:
        raise NotReadable(path, "denied", "", "permission denied") from None
    except ValueError:  # os.stat/os.open refuse a NUL in the name
        raise NotReadable(path, "open", "NUL", "the path holds a NUL byte") from None
    except OSError as err:
        words = err.strerror or str(err)
        raise NotReadable(path, "open", words, f"cannot open it ({words})") from None
    kind = file_kind(os.fstat(fd).st_mode)
    if kind:
        os.close(fd)
        raise NotReadable(path, "type", kind, f"is {kind}, not a regular file")
    return fd


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them (NotReadable past it)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > limit:
            raise NotReadable(path, "size", str(size), f"{size} bytes, more than {limit}")
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise NotReadable(
                path, "read", err.strerror or "", f"cannot read it ({err.strerror})"
            ) from None
    if len(data) > limit:  # grew while we looked
        raise NotReadable(path, "size", f"over {limit}", f"over {limit} bytes")
    return data


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """read_bounded, with the fix for a `what` file (e.g. "config") added to NotReadable."""
    try:
        return read_bounded(path, limit)
    except NotReadable as err:
        fix = {
            "missing": f"pass the path of the {what} file",
            "denied": f"make the {what} file readable by you (ls -l it)",
            "open": f"pass the path of a readable {what} file",
            "type": f"pass the {what} file itself",
            "size": f"a {what} file is at most {limit} bytes: is it the right file?",
            "read": f"check the disk that holds the {what} file",
        }[err.why]
        raise NotReadable(err.path, err.why, err.detail, f"{err.problem}; {fix}") from None
