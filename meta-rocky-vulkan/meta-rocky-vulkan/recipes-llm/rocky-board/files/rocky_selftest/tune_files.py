"""The tuner's files: the shipped candidate list (read), its progress (resumable) and the chosen
spec (an environment file that llama.cpp's users on the board read). Every write is atomic."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from .files import UnreadableFile, read_json, read_text
from .paths import TILES_ENV_NAME
from .results import os_error_text, write_atomic
from .tune_spec import ENV_VAR, SpecError, check_spec, parse_spec

PROGRESS_NAME = "tune-progress.json"
ENV_NAME = TILES_ENV_NAME
PROGRESS_SCHEMA = "rocky-tune-progress"
CANDIDATES_SCHEMA = "rocky-tile-candidates"
MAX_BYTES = 1 << 20


class TuneFileError(Exception):
    """A tuner file is unreadable or malformed; the message names the file and the fix."""


def _read_json(path: str) -> Any:
    try:
        return read_json(path, MAX_BYTES)
    except FileNotFoundError as err:
        raise TuneFileError(f"cannot read {path}: {os_error_text(err)}") from None
    except UnreadableFile as err:
        raise TuneFileError(str(err)) from None


def load_candidates(path: str) -> tuple[list[dict[str, Any]], dict[str, tuple[int, ...]], str]:
    """(kept candidates, built-in tiles, pruning status) from tile_candidates.json; every spec
    is checked against the rules again: the file is data, not trusted code."""
    doc = _read_json(path)
    if not isinstance(doc, dict) or doc.get("schema") != CANDIDATES_SCHEMA:
        raise TuneFileError(f"{path}: not a {CANDIDATES_SCHEMA} document; reinstall the image")
    try:
        builtin = {k: tuple(int(x) for x in v) for k, v in doc["builtin"].items()}
        kept = []
        for entry in doc["candidates"]:
            check_spec(entry["spec"], builtin)
            if not isinstance(entry["name"], str) or not entry["name"].isprintable():
                raise TuneFileError(f"{path}: candidate name {entry['name']!r}")
            if entry.get("kept") is True:
                kept.append(entry)
        status = str(doc["pruning"]["status"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TuneFileError(f"{path}: malformed candidate list ({err})") from None
    names = [c["name"] for c in kept]
    if not kept or len(set(names)) != len(names) or not any(c.get("builtin") for c in kept):
        raise TuneFileError(f"{path}: needs distinct candidates, the built-in tiles among them")
    return kept, builtin, status


def candidates_digest(kept: list[dict[str, Any]]) -> str:
    """Names the candidate set: progress made for another list is not resumed."""
    text = "\n".join(f"{c['name']} {c['spec']}" for c in kept)
    return hashlib.sha256(text.encode()).hexdigest()


def progress_path(results_dir: str) -> str:
    return os.path.join(results_dir, PROGRESS_NAME)


def read_progress(results_dir: str, digest: str) -> dict[str, Any] | None:
    """The progress of an earlier tune of the same candidates, or None to start afresh."""
    path = progress_path(results_dir)
    if not os.path.exists(path):
        return None
    try:
        doc = _read_json(path)
    except TuneFileError:
        return None  # unreadable progress is a fresh start, not a stuck tuner
    if not isinstance(doc, dict) or doc.get("schema") != PROGRESS_SCHEMA:
        return None
    if doc.get("candidates_sha256") != digest or not _progress_shape_ok(doc):
        return None
    return doc


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0


def _progress_shape_ok(doc: dict[str, Any]) -> bool:
    """The fields the tuner reads, in their types (an edited or damaged file is a fresh start)."""
    results, validation = doc.get("results"), doc.get("validation")
    if not (isinstance(results, dict) and isinstance(validation, dict)):
        return False
    if not (_number(doc.get("elapsed_s")) and _number(doc.get("longest_run_s"))):
        return False
    for r in results.values():
        if not isinstance(r, dict) or not isinstance(r.get("tps"), list):
            return False
        if not all(_number(t) for t in r["tps"]) or not isinstance(r.get("in_flight"), int):
            return False
    return all(isinstance(v, dict) and isinstance(v.get("ok"), bool) for v in validation.values())


def write_progress(results_dir: str, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(progress_path(results_dir), text.encode("utf-8"))


def env_path(results_dir: str) -> str:
    return os.path.join(results_dir, ENV_NAME)


def write_choice(results_dir: str, spec: str, comment: str) -> str:
    """The chosen spec as `GGML_VK_MALI_WARPTILE=<spec>` (systemd EnvironmentFile= syntax, read
    strictly by the profile script and the wrapper), written atomically: never half a spec."""
    parse_spec(spec)  # refuses anything that is not a spec (no newline, no shell text)
    note = "".join(ch if ch.isprintable() else "?" for ch in comment)
    text = f"# {note}\n{ENV_VAR}={spec}\n"
    path = env_path(results_dir)
    write_atomic(path, text.encode("ascii", "replace"))
    return path


def read_choice(results_dir: str, builtin: dict[str, tuple[int, ...]] | None = None) -> str | None:
    """The spec in the environment file, None when there is none; TuneFileError when it is not
    exactly one valid spec line."""
    path = env_path(results_dir)
    try:
        lines = read_text(path, 4096).splitlines()
    except FileNotFoundError:
        return None
    except UnreadableFile as err:
        raise TuneFileError(str(err)) from None
    values = [ln for ln in lines if ln and not ln.startswith("#")]
    if len(values) != 1 or not values[0].startswith(f"{ENV_VAR}="):
        raise TuneFileError(f"{path}: expected one {ENV_VAR}=SPEC line")
    spec = values[0][len(ENV_VAR) + 1 :]
    try:
        check_spec(spec, builtin) if builtin else parse_spec(spec)
    except SpecError as err:
        raise TuneFileError(f"{path}: {err}") from None
    return spec


def remove_choice(results_dir: str) -> bool:
    """Back to the built-in tiles; True when a file was removed."""
    try:
        os.unlink(env_path(results_dir))
    except FileNotFoundError:
        return False
    return True
