"""Read a file the user named, safely: a regular file only (never a FIFO that blocks, a device
that never ends or a directory), at most `limit` bytes, every failure a clear ReadError."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rocky_vulkan.errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class ReadError(UserError):
    """The file cannot be read as a `what`; the message starts with the path."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno  # the OSError's, e.g. ENOENT, when the OS refused


MAX_SHOWN = 300


def shown(path: Path | str) -> str:
    """The path for a message: control characters as escapes, so a name cannot drive the
    terminal, and at most MAX_SHOWN characters of it."""
    text = str(path)
    text = text if text.isprintable() else ascii(text)[1:-1]
    return text if len(text) <= MAX_SHOWN else f"{text[: MAX_SHOWN - 20]}...{text[-17:]}"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `limit` of them.
    Checked with stat before opening (opening a device can have effects), then opened
    non-blocking and checked again with fstat, so a FIFO swapped in cannot block the read."""
    where = shown(path)

    def fail(reason: str, code: int | None = None) -> ReadError:
        return ReadError(f"{where}: {reason}", code)

    try:
        kind = os.stat(path).st_mode
        if not stat.S_ISREG(kind):
            raise fail(f"is {_kind(kind)}, not a regular file; pass the {what} file itself")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except ValueError:  # os.stat/os.open refuse a NUL in the path
        raise fail(f"the path holds a NUL byte; pass the path of the {what} file") from None
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise fail(f"no such file; pass the path of the {what} file", err.errno) from None
        if err.errno in (errno.EACCES, errno.EPERM):
            reason = f"permission denied; make the {what} file readable by you (ls -l it)"
            raise fail(reason, err.errno) from None
        if err.errno == errno.ELOOP:
            raise fail("a loop of symbolic links; point it at a real file", err.errno) from None
        raise fail(f"cannot open it ({err.strerror or err})", err.errno) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise fail(f"is {_kind(info.st_mode)}, not a regular file; pass the {what} file itself")
        if info.st_size > limit:
            raise fail(
                f"{info.st_size} bytes; a {what} file is at most {limit}: is it the right file?"
            )
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise fail(f"cannot read it ({err.strerror or err})", err.errno) from None
    if len(data) > limit:  # it grew while we read, or stat did not say (/proc)
        raise fail(f"over {limit} bytes; a {what} file is at most {limit}: is it the right file?")
    return data
