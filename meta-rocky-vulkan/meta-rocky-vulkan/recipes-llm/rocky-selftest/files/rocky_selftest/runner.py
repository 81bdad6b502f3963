"""Run one tool in its own process group with a timeout, and name how it failed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

OOM_MARKER = "ErrorOutOfDeviceMemory"
TAIL_LINES = 25
TAIL_CHARS = 3000
# The signals the self-test turns into an ERROR verdict (cli._stop_signals_raise).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}


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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    except OSError as err:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return RunResult(cmd, None, False, 0.0, "", "", error=f"cannot start {cmd[0]}: {err}")
    timed_out = False
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a pending stop raises here, inside
        out, err = proc.communicate(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    except BaseException:
        # Stopped ourselves (SIGTERM, Ctrl-C): the tool must not outlive the self-test.
        _kill_group(proc)
        proc.wait()
        raise
    return RunResult(
        cmd=cmd,
        returncode=proc.returncode,
        timed_out=timed_out,
        elapsed_s=round(time.monotonic() - start, 3),
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
    )
