"""Every run ends with a verdict someone can see: the IN-PROGRESS marker that replaces the old
result before a run, ERROR documents naming the cause, saving the verdict with fallbacks when the
disk refuses, and the note the run leaves in its runtime dir (tmpfs) for the root step."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

from . import RESULT_SCHEMA, RESULT_SCHEMA_VERSION
from .files import UnreadableFile, read_json, read_text
from .results import (
    ERROR,
    FINAL_VERDICTS,
    IN_PROGRESS,
    discard_result,
    doc_problem,
    os_error_text,
    read_result,
    result_path,
    write_atomic,
    write_result,
)
from .terminal import say

NOTE_NAME = "verdict.json"
# The unit's RuntimeDirectory= (%t/rocky-selftest): tmpfs, kept until reboot.
DEFAULT_NOTE_DIR = "/run/rocky-selftest"
NOTE_MAX_BYTES = 4 << 20
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def boot_id() -> str | None:
    try:
        return read_text(BOOT_ID, 4096).strip() or None
    except (OSError, ValueError):
        return None


def base_doc(verdict: str, started_at: str) -> dict[str, Any]:
    """The fields every result carries, whatever its verdict."""
    return {
        "schema": RESULT_SCHEMA,
        "schema_version": RESULT_SCHEMA_VERSION,
        "verdict": verdict,
        "started_at": started_at,
        "boot_id": boot_id(),
        # systemd sets INVOCATION_ID for every process of one start of the unit: the root step
        # uses it to tell this run's result from an older one.
        "invocation": os.environ.get("INVOCATION_ID"),
        "host": {
            "hostname": platform.node(),
            "kernel": platform.release(),
            "arch": platform.machine(),
        },
        "checks": [],
    }


def error_doc(cause: str, started_at: str | None = None) -> dict[str, Any]:
    doc = base_doc(ERROR, started_at or now())
    doc.update(finished_at=now(), errors=[cause])
    return doc


class Progress:
    """The IN-PROGRESS marker in place of result.json, rewritten (atomically) at each step, so a
    kill, a reset or a hang leaves a document that says where the run stopped, never a stale
    verdict."""

    def __init__(self, results_dir: str, started_at: str, log=say) -> None:
        self.results_dir = results_dir
        self.doc = base_doc(IN_PROGRESS, started_at)
        self.current = "start"
        self.log = log
        self._warned = False

    def start(self) -> None:
        """Write the first marker; OSError when the results dir cannot take it."""
        self.doc["step"] = self.current
        write_result(self.results_dir, self.doc)

    def step(self, name: str) -> None:
        self.current = name
        self.doc["step"] = name
        try:
            write_result(self.results_dir, self.doc)
        except OSError as err:
            if not self._warned:  # the final save reports it; say it once here
                self.log(f"rocky-selftest: cannot update the progress marker: {err}")
                self._warned = True


def interrupted_doc(marker: dict[str, Any]) -> dict[str, Any]:
    """The verdict for a first-boot run that a reset or a kill stopped before it ended."""
    started = marker.get("started_at", "?")
    same_boot = marker.get("boot_id") and marker.get("boot_id") == boot_id()
    when = "earlier in this boot" if same_boot else "in an earlier boot"
    cause = (
        f"interrupted: the run started {started} ({when}) never finished; it was in step "
        f"{marker.get('step', '?')!r} when the board reset or the run was killed. Not run again "
        "automatically (a GPU hang must not loop); run `rocky-selftest run` to try again"
    )
    return error_doc(cause, started_at=str(started))


def _compact(doc: dict[str, Any], cause: str) -> dict[str, Any]:
    """A small ERROR document: the cause and each check's one line, none of the run data."""
    small = {k: doc[k] for k in ("schema", "schema_version", "started_at", "boot_id") if k in doc}
    small.update(
        verdict=ERROR,
        invocation=doc.get("invocation"),
        finished_at=doc.get("finished_at", now()),
        errors=[*doc.get("errors", []), cause],
        checks=[
            {"name": c["name"], "status": c["status"], "evidence": c["evidence"]}
            for c in doc.get("checks", [])
        ],
    )
    return small


def save_verdict(results_dir: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Write `doc` as result.json; when the disk refuses, fall back to a small ERROR document,
    then to removing the old file to make room (and so that no stale verdict survives). Returns
    the document as saved (or as it should be shown), with result_saved telling which."""
    path = result_path(results_dir)
    doc = {**doc, "result_path": path, "result_saved": True}
    try:
        write_result(results_dir, doc)
        return doc
    except OSError as err:
        cause = f"cannot write {path}: {os_error_text(err)}"
    verdict = doc.get("verdict")
    if verdict not in (ERROR, IN_PROGRESS):
        cause += f" (the checks' verdict was {verdict}; the full result is in the journal)"
    small = _compact(doc, cause + "; free space or make the directory writable, then re-run")
    small.update(result_path=path, result_saved=True)
    for attempt in ("compact", "after removing the old file"):
        if attempt != "compact":
            why_not = discard_result(results_dir)
            if why_not:
                small["errors"].append(f"could not remove the old {path} either: {why_not}")
                break
        try:
            write_result(results_dir, small)
            return small
        except OSError:
            continue
    small["result_saved"] = False
    return small


def peek_result(results_dir: str) -> dict[str, Any] | None:
    """The result on disk, or None when there is none or it cannot be read."""
    try:
        return read_result(results_dir)
    except ValueError:
        return None


def write_note(note_dir: str | None, doc: dict[str, Any], log=say) -> None:
    """The run step's final words for the root step, in the unit's runtime dir (tmpfs: works
    when the results disk is full or read-only)."""
    if not note_dir:
        return
    data = json.dumps(doc, sort_keys=True, allow_nan=False).encode("utf-8")
    try:
        # Readable by all, as result.json is: `rocky-selftest status` (any user) shows it when
        # the disk did not take the verdict.
        write_atomic(os.path.join(note_dir, NOTE_NAME), data, mode=0o644)
    except (OSError, ValueError) as err:
        log(f"rocky-selftest: cannot leave the verdict note in {note_dir}: {err}")


def clear_note(note_dir: str | None) -> None:
    if not note_dir:
        return
    try:
        os.unlink(os.path.join(note_dir, NOTE_NAME))
    except OSError:
        pass


def read_note(note_dir: str) -> dict[str, Any] | None:
    """The run step's note, or None. The root step reads what an unprivileged process wrote:
    results.read_result's guards (a regular file, no symlink, bounded, the document's shape)."""
    path = os.path.join(note_dir, NOTE_NAME)
    try:
        doc = read_json(path, NOTE_MAX_BYTES, follow_links=False)
    except (FileNotFoundError, UnreadableFile):
        return None
    if doc_problem(doc, FINAL_VERDICTS):
        return None
    return doc
