"""Read a file the user named, bounded: a regular file only (never blocks on a FIFO or reads a
device), at most `limit` bytes, every failure a UserError naming the path, the cause and the
file wanted. Shared by every host command that reads such a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rocky_vulkan.errors import UserError


class ReadFileError(UserError):
    """A file that is not a readable regular file of bounded size."""


def shown_path(path: Path | str) -> str:
    """`path` for a message: characters a terminal would act on are shown escaped (\\x1b)."""
    text = os.fspath(path)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of `path` (links followed), a regular file of at most `limit` bytes. Opened
    non-blocking and checked with fstat before any read. `what` names the file wanted, e.g.
    "a public key file (~/.ssh/id_ed25519.pub)": the messages say "pass {what}"."""
    p = shown_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ReadFileError(f"{p}: no such file; pass {what}") from None
    except OSError as err:
        try:  # a socket cannot be opened at all: say what it is
            mode = os.stat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        cause = f"is {kind_of(mode)}" if not stat.S_ISREG(mode) else "cannot open it"
        raise ReadFileError(f"{p}: {cause} ({err.strerror}); pass {what}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ReadFileError(f"{p}: is {kind_of(info.st_mode)}, not a regular file; pass {what}")
    if info.st_size > limit:
        raise ReadFileError(
            f"{p}: larger than {_size(limit)} ({info.st_size} bytes): is it the right file? "
            f"pass {what}"
        )
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise ReadFileError(f"{p}: cannot read it ({err.strerror})") from None
    if len(data) > limit:  # it grew while we read, or fstat does not know (/proc)
        raise ReadFileError(f"{p}: larger than {_size(limit)}: is it the right file? pass {what}")
    return data
