"""Run a command with its output bounded in size and its run bounded in time: a tool that hangs
or floods (a stuck device under lsblk, a board that talks forever) ends the wait, not the host."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounded:
    rc: int  # the exit status (negative: killed by that signal, as when stopped here)
    out: bytes  # at most `limit` bytes of stdout
    err: bytes  # at most `err_limit` bytes of stderr
    overflow: bool  # stdout passed the limit (the command was stopped)
    timed_out: bool  # still running after `timeout` seconds (the command was stopped)


def run_bounded(cmd: list[str], limit: int, timeout: float, err_limit: int = 64 << 10) -> Bounded:
    """Run `cmd` (stdin /dev/null); keep at most `limit` bytes of stdout (stop it past that) and
    `err_limit` of stderr; stop it after `timeout` seconds. OSError (e.g. FileNotFoundError) if
    it cannot start: the caller says what to install."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = bytearray(), bytearray()
    overflow = timed_out = False
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map() and not overflow:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = key.data
                    room = (limit if buf is out else err_limit) - len(buf)
                    buf += chunk[: max(room, 0)]
                    overflow = overflow or (buf is out and len(chunk) > room)
    finally:
        if proc.poll() is None and (overflow or timed_out):
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
        try:
            rc = proc.wait(timeout=max(deadline - time.monotonic(), 5))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    return Bounded(rc, bytes(out), bytes(err), overflow, timed_out)
