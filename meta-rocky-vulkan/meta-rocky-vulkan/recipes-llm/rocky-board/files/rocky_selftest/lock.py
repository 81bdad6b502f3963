"""One run at a time: an exclusive flock on the results directory itself.

Two runs at once would overwrite each other's IN-PROGRESS marker, and the first-boot run would
take a live by-hand run's marker for a run a reset interrupted. The lock is on the directory, not
a file in it, so it works on a read-only disk and leaves nothing behind; the kernel drops it when
the holder dies, however it dies. The descriptor is close-on-exec: a tool the run starts (or a
child that tool leaves behind) never holds it.

A run that finds the lock taken changes nothing (no result, no note, no stamp) and exits with
EXIT_BUSY; the first-boot unit then has no stamp, so it runs again at the next boot.
"""

from __future__ import annotations

import fcntl
import os

from .files import read_text

# `rocky-selftest run|publish|tune` exit status when another run holds the lock.
EXIT_BUSY = 4
PROC_LOCKS = "/proc/locks"


class Busy(Exception):
    """Another process holds the lock; the message names it and what to do."""

    def __init__(self, results_dir: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(
            f"another rocky-selftest run ({who}) is in progress on {results_dir}; "
            "wait for it to end (`rocky-selftest status` shows its progress), then try again"
        )
        self.pid = pid


class RunLock:
    """`with RunLock(results_dir):` holds the lock or raises Busy (or `acquire()` and
    `release()`; `taken` says whether this run may go on). Where the directory cannot be
    opened (missing and not creatable) there is nothing to guard: the run's own write of its
    marker then fails and says why."""

    def __init__(self, results_dir: str) -> None:
        self.results_dir = results_dir
        self.fd: int | None = None
        self.taken = False

    def acquire(self) -> None:
        try:
            os.makedirs(self.results_dir, exist_ok=True)
        except OSError:
            pass
        try:
            fd = os.open(self.results_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.taken = True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = holder(fd)
            os.close(fd)
            raise Busy(self.results_dir, pid) from None
        except OSError:  # a file system without flock: no lock, as before there was one
            os.close(fd)
        else:
            self.fd = fd
        self.taken = True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
            self.fd = None
        self.taken = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(fd: int) -> int | None:
    """The pid holding a flock on the file open at `fd`, from /proc/locks, or None."""
    info = os.fstat(fd)
    want = (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)
    try:
        lines = read_text(PROC_LOCKS, 4 << 20).splitlines()
    except (OSError, ValueError):
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 08:02:131 0 EOF"; waiters have "->" after the number
        words = line.split()
        if len(words) < 6 or words[1] != "FLOCK":
            continue
        try:
            major, minor, inode = words[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
            pid = int(words[4])
        except ValueError:
            continue
        if where == want and pid != os.getpid():
            return pid
    return None
