"""The result document: strict JSON, written atomically, summarised on the console and in the motd.

A verdict is one of PASS, FAIL (a check failed), ERROR (the self-test could not do its job: a
broken disk, a kill, a bug) or IN-PROGRESS (the marker a run writes over the old result before it
starts, so an old PASS can never outlive a run that did not finish).
"""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

from . import RESULT_SCHEMA, RESULT_SCHEMA_VERSION
from .checks import STATUSES, verdict_of
from .files import UnreadableFile, os_error_text, read_json, read_text

RESULT_NAME = "result.json"
MOTD_BEGIN = "# --- rocky-selftest ---"
MOTD_END = "# --- end rocky-selftest ---"
PASS, FAIL, ERROR, IN_PROGRESS = "PASS", "FAIL", "ERROR", "IN-PROGRESS"
FINAL_VERDICTS = (PASS, FAIL, ERROR)
# Far above what a run writes (tool output is capped in runner.py); a bigger file is not ours.
RESULT_MAX_BYTES = 16 << 20
MOTD_MAX_BYTES = 1 << 20


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, rename, fsync the directory: a kill at
    any moment leaves the old file or the new one, complete. On error the temp file is removed."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_stale_temps(path: str) -> None:
    """Temp files a kill left behind next to `path` (never the file itself)."""
    folder, name = os.path.split(os.path.abspath(path))
    for tmp in glob.glob(os.path.join(glob.escape(folder), "." + glob.escape(name) + ".*")):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def non_finite_paths(value: Any, where: str = "") -> list[str]:
    """Where NaN or +-Infinity hide in a document (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [where or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_paths(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite_paths(v, f"{where}[{i}]")]
    return []


def _finite_only(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_only(v) for v in value]
    return value


def encode(doc: dict[str, Any]) -> bytes:
    """Strict JSON. A non-finite number that got this far is a bug: it becomes null and the
    verdict ERROR, naming where it was, rather than a bare NaN no JSON reader accepts."""
    bad = non_finite_paths(doc)
    if bad:
        doc = _finite_only(doc)
        doc["verdict"] = ERROR
        doc.setdefault("errors", []).append(f"non-finite number(s) at {', '.join(bad)}")
    return (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def result_path(results_dir: str) -> str:
    return os.path.join(results_dir, RESULT_NAME)


def write_result(results_dir: str, doc: dict[str, Any]) -> str:
    path = result_path(results_dir)
    write_atomic(path, encode(doc))
    return path


def add_section(
    results_dir: str, key: str, section: dict[str, Any], log: Callable[[str], None], where: str
) -> bool | None:
    """Put an on-demand mode's section (tune, driver, cts) into result.json, atomically, leaving
    the run's verdict and checks as they are. True when added; None when there is no result yet
    (`where` says where the section is instead); False when result.json is unusable or cannot be
    written. Each but True logs why."""
    who = f"rocky-selftest {key}"
    try:
        doc = read_result(results_dir)
    except ValueError as err:
        log(f"{who}: result.json not updated: {err}")
        return False
    if doc is None:
        log(f"{who}: no result.json yet (run `rocky-selftest run` first); {where}")
        return None
    doc[key] = section
    try:
        write_result(results_dir, doc)
    except OSError as err:
        log(f"{who}: cannot update result.json: {os_error_text(err)}")
        return False
    return True


def discard_result(results_dir: str) -> str | None:
    """Remove result.json (a stale verdict must not survive); None when done, else why not."""
    try:
        os.unlink(result_path(results_dir))
    except FileNotFoundError:
        return None
    except OSError as err:
        return os_error_text(err)
    return None


def read_result(results_dir: str) -> dict[str, Any] | None:
    """The last result, None when there is none; ValueError naming the problem otherwise. Read
    as the root step reads it: a regular file (no symlink followed), bounded, strict JSON, the
    fields the summary shows in their types, and no PASS its checks do not show."""
    path = result_path(results_dir)
    try:
        doc = read_json(path, RESULT_MAX_BYTES, follow_links=False)
    except FileNotFoundError:
        return None
    except UnreadableFile as err:
        hint = "; run as root (sudo)" if err.errno in (errno.EACCES, errno.EPERM) else ""
        raise ValueError(f"{err}{hint}") from None
    problem = doc_problem(doc, (*FINAL_VERDICTS, IN_PROGRESS))
    if problem:
        raise ValueError(f"{path}: {problem}")
    return doc


def doc_problem(doc: Any, verdicts: tuple[str, ...]) -> str | None:
    """Why `doc` is not a result document this tool could have written, or None: the schema,
    a known verdict, checks and errors in the types the summary reads, and PASS only when the
    checks show it (a passing check, none failed or broken)."""
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        return f"not a {RESULT_SCHEMA} document"
    version = doc.get("schema_version")
    if type(version) is not int or version != RESULT_SCHEMA_VERSION:
        return f"not a {RESULT_SCHEMA} v{RESULT_SCHEMA_VERSION} document"
    verdict = doc.get("verdict")
    if verdict not in verdicts:
        return f"verdict {str(verdict)[:40]!r} is not one this tool writes"
    checks, errors = doc.get("checks", []), doc.get("errors", [])
    if not isinstance(checks, list) or not isinstance(errors, list):
        return "checks and errors must be lists"
    if not all(isinstance(e, str) for e in errors):
        return "errors must be text"
    for check in checks:
        names = ("name", "status", "evidence")
        if not isinstance(check, dict) or not all(isinstance(check.get(n), str) for n in names):
            return "every check needs a name, a status and evidence (text)"
        if check["status"] not in STATUSES:
            return f"check status {check['status'][:40]!r} is not one this tool writes"
    shown = verdict_of(c["status"] for c in checks)
    if verdict == PASS and shown != PASS:
        return f"says PASS but its checks say {shown}: not a verdict this tool writes"
    return None


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The short verdict for console, motd and journal; copes with partial (ERROR) documents."""
    verdict = doc.get("verdict", ERROR)
    when = doc.get("finished_at") or doc.get("started_at") or "?"
    duration = doc.get("duration_s")
    took = f", {duration:.0f} s" if isinstance(duration, (int, float)) else ""
    lines = [f"rocky-selftest {verdict} ({when}{took})"]
    if verdict == IN_PROGRESS:
        lines.append(f"  running since {doc.get('started_at', '?')}, step {doc.get('step', '?')}")
    for error in doc.get("errors", []):
        lines.append(f"  ERROR {error}")
    for check in doc.get("checks", []):
        lines.append(f"  {check['status']:4} {check['name']}: {check['evidence']}")
    if doc.get("result_saved") is False:
        lines.append("  result NOT saved (see ERROR above); nothing on disk is from this run")
    else:
        lines.append(f"  full result: {doc.get('result_path', RESULT_NAME)}")
    return lines


def update_motd(path: str, lines: list[str]) -> None:
    """Replace our block in the motd (or append it), leaving the rest of the file alone."""
    try:
        old = read_text(path, MOTD_MAX_BYTES)  # UnreadableFile: a FIFO, a device, not text
    except FileNotFoundError:
        old = ""
    kept, skipping = [], False
    for line in old.splitlines():
        if line == MOTD_BEGIN:
            skipping = True
        elif line == MOTD_END:
            skipping = False
        elif not skipping:
            kept.append(line)
    block = [MOTD_BEGIN, *lines, MOTD_END]
    text = "\n".join(kept + block) + "\n"
    write_atomic(path, text.encode("utf-8"))
