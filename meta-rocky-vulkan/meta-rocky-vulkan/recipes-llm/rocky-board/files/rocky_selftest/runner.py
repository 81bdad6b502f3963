"""Run one tool in its own process group with a timeout, and name how it failed.

The timeout holds whatever the tool does: its pipes are read with select() against the deadline,
never until EOF, so a child the tool left in a session of its own (which the group kill misses)
cannot keep the run waiting. What the tool prints is kept bounded: the first and the last
MAX_CAPTURE / 2 bytes of each stream, with a line saying how much was dropped between them.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

OOM_MARKER = "ErrorOutOfDeviceMemory"
TAIL_LINES = 25
TAIL_CHARS = 3000
MAX_CAPTURE = 1 << 20  # bytes kept of each of stdout and stderr
# After the tool exited or was killed: how long a pipe may stay open (held by a child the tool
# left behind) before the run stops reading it; and how long a killed tool may take to go.
GRACE_S = 1.0
CHUNK = 65536
# The signals the self-test turns into an ERROR verdict (cli.stop_signals_raise): every one whose
# default action ends the process and that a person or systemd sends (not SIGKILL, which
# cannot be caught; not SIGALRM or SIGPIPE, which the self-test itself may cause).
STOP_SIGNALS = {
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
}


@dataclass
class RunResult:
    cmd: list[str]
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stdout: str
    stderr: str
    error: str | None = None  # the tool could not be started at all

    def failure(self) -> str | None:
        """Why the run counts as a crash, or None when it ended cleanly."""
        if self.error:
            return self.error
        reasons = []
        if self.timed_out:
            reasons.append(f"timed out after {self.elapsed_s:.0f} s (killed)")
        elif self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            reasons.append(f"killed by {name}")
        elif self.returncode == 134:
            reasons.append("aborted (exit 134, SIGABRT: uncaught exception)")
        elif self.returncode:
            reasons.append(f"exit status {self.returncode}")
        if OOM_MARKER in self.stderr:
            reasons.append(f"{OOM_MARKER} in stderr")
        return "; ".join(reasons) or None

    def stderr_tail(self) -> str:
        tail = "\n".join(self.stderr.rstrip().splitlines()[-TAIL_LINES:])
        return tail[-TAIL_CHARS:]


def kill_group(proc: subprocess.Popen) -> None:
    if proc.returncode is not None:  # reaped: the group id may belong to someone else now
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Capture:
    """One stream's bytes, bounded: the head, the tail, and how many were dropped between."""

    def __init__(self, limit: int = MAX_CAPTURE) -> None:
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", "replace")
        head, tail = (b.decode("utf-8", "replace") for b in (self.head, self.tail))
        return f"{head}\n[... rocky-selftest dropped {self.dropped} bytes here ...]\n{tail}"


def pump(proc: subprocess.Popen, sel: selectors.BaseSelector, end: float) -> None:
    """Read the pipes until both are closed or `end` (monotonic) passes; once the tool itself
    has exited, at most GRACE_S more (a child it left behind may hold them open for ever)."""
    exited_at = None
    while sel.get_map():
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        limit = end if exited_at is None else min(end, exited_at + GRACE_S)
        if now >= limit:
            return
        for key, _ in sel.select(timeout=min(limit - now, 0.2)):
            chunk = os.read(key.fd, CHUNK)
            if chunk:
                key.data.add(chunk)
            else:
                sel.unregister(key.fileobj)


def reap(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:  # stuck in the kernel after SIGKILL: not waited for
        return None


def merged_env(env_extra: dict[str, str | None]) -> dict[str, str]:
    """This process's environment plus `env_extra`, where None unsets a variable."""
    env = dict(os.environ)
    for key, value in env_extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_tool(cmd: list[str], env_extra: dict[str, str | None], timeout_s: float) -> RunResult:
    """Run `cmd` with the environment plus `env_extra` (None unsets a variable); kill its whole
    process group on timeout."""
    env = merged_env(env_extra)
    start = time.monotonic()
    # A stop signal between fork and the `try` below would raise before we know the child, and
    # leave it running: hold those signals until then (the child unblocks them before exec).
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # own group: a timeout kills helpers it spawned too
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held),
        )
    except (OSError, ValueError) as err:  # ValueError: a NUL in an argument
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return RunResult(cmd, None, False, 0.0, "", "", error=f"cannot start {cmd[0]}: {err}")
    out, err = Capture(), Capture()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    timed_out = False
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a pending stop raises here, inside
        end = start + max(timeout_s, 1)
        pump(proc, sel, end)
        try:
            proc.wait(timeout=max(end - time.monotonic(), 0))  # pipes closed: has it ended?
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
            pump(proc, sel, time.monotonic() + GRACE_S)
        returncode = reap(proc)
    except BaseException:
        # Stopped ourselves (SIGTERM, Ctrl-C): the tool must not outlive the self-test.
        kill_group(proc)
        reap(proc)
        raise
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return RunResult(
        cmd=cmd,
        returncode=returncode,
        timed_out=timed_out,
        elapsed_s=round(time.monotonic() - start, 3),
        stdout=out.text(),
        stderr=err.text(),
    )


def clip(text: str | None, limit: int) -> str | None:
    """At most `limit` characters of a tool's text for result.json, saying when it was cut."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters not kept]"
