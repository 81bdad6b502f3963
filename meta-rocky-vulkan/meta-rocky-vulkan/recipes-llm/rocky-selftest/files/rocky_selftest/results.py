"""The result document: written atomically, summarised on the console and in /etc/motd."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from . import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

RESULT_NAME = "result.json"
MOTD_BEGIN = "# --- rocky-selftest ---"
MOTD_END = "# --- end rocky-selftest ---"


def write_atomic(path: str, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, rename, fsync the directory."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_result(results_dir: str, doc: dict[str, Any]) -> str:
    path = os.path.join(results_dir, RESULT_NAME)
    write_atomic(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return path


def read_result(results_dir: str) -> dict[str, Any] | None:
    path = os.path.join(results_dir, RESULT_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return None
    if doc.get("schema") != RESULT_SCHEMA or doc.get("schema_version") != RESULT_SCHEMA_VERSION:
        raise ValueError(f"{path}: not a {RESULT_SCHEMA} v{RESULT_SCHEMA_VERSION} document")
    return doc


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = [f"rocky-selftest {doc['verdict']} ({doc['finished_at']}, {doc['duration_s']:.0f} s)"]
    for check in doc["checks"]:
        lines.append(f"  {check['status']:4} {check['name']}: {check['evidence']}")
    lines.append(f"  full result: {doc.get('result_path', RESULT_NAME)}")
    return lines


def update_motd(path: str, lines: list[str]) -> None:
    """Replace our block in the motd (or append it), leaving the rest of the file alone."""
    try:
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
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
