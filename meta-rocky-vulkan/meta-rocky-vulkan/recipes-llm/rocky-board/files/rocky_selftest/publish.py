"""The root step (`rocky-selftest publish`, the unit's ExecStopPost=+): show the verdict on the
console, in the motd and the journal, whatever became of the unprivileged run.

systemd runs it after the run step in every case: a verdict, an exit with an error, a kill at the
timeout, a failure to start at all. When the run step left no note, the cause comes from systemd's
SERVICE_RESULT / EXIT_CODE / EXIT_STATUS and the IN-PROGRESS marker, and result.json is replaced by
an ERROR document, so an older PASS never stands for this run. What it prints comes from a file an
unprivileged process wrote: control characters are replaced before anything reaches a terminal.
"""

from __future__ import annotations

import os
from typing import Any

from .lock import EXIT_BUSY
from .outcome import error_doc, read_note, save_verdict
from .results import FINAL_VERDICTS, IN_PROGRESS, read_result
from .terminal import printable

__all__ = ["busy_run_step", "printable", "service_outcome", "settle", "verdict_without_note"]

# What systemd's EXIT_STATUS numbers below 255 mean when the run step never got going.
START_FAILURES = {
    "200": "CHDIR",
    "203": "EXEC: the program could not be run",
    "216": "GROUP: a SupplementaryGroups= group is missing on this image",
    "217": "USER: the User= account could not be set up",
    "226": "NAMESPACE: the sandbox could not be set up",
    "238": "STATE_DIRECTORY: /var/lib/rocky-selftest could not be set up",
}


def service_outcome(env: dict[str, str]) -> str:
    """How systemd says the run step ended (set for ExecStopPost= processes)."""
    result = env.get("SERVICE_RESULT")
    if not result:
        return "the run step left no verdict (not started by systemd: no SERVICE_RESULT)"
    code, status = env.get("EXIT_CODE", "?"), env.get("EXIT_STATUS", "?")
    text = f"systemd: service result {result!r}, {code} {status}"
    if result == "timeout":
        text += " (hit TimeoutStartSec and was killed)"
    elif code == "exited" and status in START_FAILURES:
        text += f" ({START_FAILURES[status]})"
    return text


def verdict_without_note(results_dir: str, env: dict[str, str]) -> dict[str, Any]:
    """The run step ended without its final words: say why, from what is left."""
    outcome = service_outcome(env)
    try:
        prev = read_result(results_dir)
        unreadable = None
    except ValueError as err:
        prev, unreadable = None, str(err)
    invocation = env.get("INVOCATION_ID")
    if prev and prev["verdict"] in FINAL_VERDICTS and invocation:
        if prev.get("invocation") == invocation:
            return {**prev, "result_saved": True}  # saved by this run; only the note is lost
    if prev and prev["verdict"] == IN_PROGRESS:
        cause = f"the run stopped in step {prev.get('step', '?')!r} without a verdict: {outcome}"
        return error_doc(cause, started_at=prev.get("started_at"))
    cause = f"the self-test ended before it started a run: {outcome}"
    if prev:
        cause += (
            f"; the older result.json ({prev['verdict']}, started {prev.get('started_at', '?')})"
            " is not from this run and was replaced"
        )
    elif unreadable:
        cause += f"; {unreadable}"
    return error_doc(cause)


def busy_run_step(env: dict[str, str]) -> bool:
    """The run step exited because another run held the lock: it changed nothing, and neither
    may the root step (no stamp: the first-boot run happens at the next boot)."""
    return env.get("EXIT_CODE") == "exited" and env.get("EXIT_STATUS") == str(EXIT_BUSY)


def settle(results_dir: str, note_dir: str | None, env: dict[str, str] | None = None) -> dict:
    """The document to show for the run that just ended, saved where the disk allows.

    Without a note dir (by hand) it is simply the last result."""
    env = dict(os.environ) if env is None else env
    if not note_dir:
        try:
            doc = read_result(results_dir)
        except ValueError as err:
            return error_doc(str(err)) | {"result_saved": None}
        if doc is None:
            return error_doc(f"no result in {results_dir}; run `rocky-selftest run`") | {
                "result_saved": None
            }
        return doc
    note = read_note(note_dir)
    if note is not None:
        if note.get("result_saved") is False:
            # The run step could not save it; the root step may (reserved blocks, permissions).
            return save_verdict(results_dir, note)
        return note
    doc = verdict_without_note(results_dir, env)
    if doc.get("result_saved"):
        return doc
    return save_verdict(results_dir, doc)
