"""`rocky-llm place NAME`: the placement step's measurements (placement_bench) for one model of
the store, kept beside the store and used for that model's server settings.

The self-test measures the image's served model only. A pulled model (a mixture of experts
above all: experts-cpu may win where the dense model's best mode would not) is otherwise served
in the mode measured for another model. The file names the model's size and sha256: a model
pulled again under the same name with other bytes is not served by an old measurement.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any

from .bench import Deadline
from .files import UnreadableFile, read_json
from .model_store import Model, check_name
from .placement_bench import placement
from .results import write_atomic
from .settings import Settings

SCHEMA = "rocky-llm-placement"
MAX_BYTES = 1 << 20
DIR_NAME = "placement"


class PlacementFileError(Exception):
    """A model's placement file cannot be used; the message says why."""


def placement_dir(s: Settings) -> str:
    """Beside the store (never inside it: the store lists its own folder)."""
    return os.path.join(os.path.dirname(os.path.normpath(s.models_dir)), DIR_NAME)


def _path(s: Settings, name: str) -> str:
    return os.path.join(placement_dir(s), check_name(name) + ".json")


def measure(s: Settings, model: Model, doc: dict[str, Any] | None, log) -> tuple[Any, dict]:
    """The placement step on `model` (its Check and section). `doc`: the self-test's result,
    for its GPU checks and the sweep's best micro-batch."""
    one = replace(s, serve_model_path=model.path, serve_model_name=model.name)
    return placement(one, Deadline(s.deadline_s), doc or {}, log=log)


def save(s: Settings, model: Model, section: dict[str, Any]) -> str:
    path = _path(s, model.name)
    os.makedirs(placement_dir(s), mode=0o755, exist_ok=True)
    doc = {"schema": SCHEMA, "model": model.name, "size": model.size, "sha256": model.sha256,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "placement": section}  # fmt: skip
    write_atomic(path, (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode())
    return path


def load(s: Settings, model: Model) -> tuple[dict[str, Any] | None, str]:
    """The model's own placement section and where it came from, or None and why not (no
    file is not an error; a file that does not fit the model is said). The section itself is
    read as hostile by placement.choose."""
    path = _path(s, model.name)
    try:
        doc = read_json(path, MAX_BYTES, follow_links=False)
    except FileNotFoundError:
        return None, f"not measured for {model.name}: `sudo rocky-llm place {model.name}`"
    except (OSError, UnreadableFile, ValueError) as err:
        return None, f"{path} ignored ({err}); `sudo rocky-llm place {model.name}` again"
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None, f"{path} ignored: not a {SCHEMA} file"
    if (
        doc.get("model") != model.name
        or doc.get("size") != model.size
        or (doc.get("sha256") != model.sha256)
    ):
        return None, f"{path} ignored: measured on other bytes; `sudo rocky-llm place {model.name}`"
    section = doc.get("placement")
    if not isinstance(section, dict):
        return None, f"{path} ignored: no placement section"
    when = doc.get("measured_at")
    when = when if isinstance(when, str) and len(when) == 20 and when.isprintable() else "?"
    return section, f"measured for {model.name} by `rocky-llm place` ({when})"


def remove(s: Settings, name: str) -> None:
    """A removed model's measurements go with it."""
    try:
        os.unlink(_path(s, name))
    except FileNotFoundError:
        pass
