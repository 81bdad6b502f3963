"""A model's own measurements, kept beside the store and used for that model's server settings:
`rocky-llm place NAME` (kind "placement": the placement step's runs, placement_bench) and, on a
cluster's head, `rocky-llm cluster bench` (kind "cluster": alone and with the workers,
cluster_bench) for serve.model.

The self-test measures the image's served model only, at first boot. A pulled model (a mixture
of experts above all: experts-cpu may win where the dense model's best mode would not) is
otherwise served in the mode measured for another model; a cluster's workers are usually paired
after first boot. The file names the model's size and sha256: a model pulled again under the
same name with other bytes is not served by an old measurement.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from typing import Any

from .bench import Deadline
from .cluster import reachable
from .files import UnreadableFile, read_json
from .model_store import Model, check_name
from .placement_bench import placement
from .results import write_atomic
from .settings import Settings

MAX_BYTES = 1 << 20
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# kind: (folder beside the store, file schema, the command that measures it)
KINDS = {
    "placement": ("placement", "rocky-llm-placement", "rocky-llm place {name}"),
    "cluster": ("cluster-bench", "rocky-llm-cluster-bench", "rocky-llm cluster bench"),
}


class PlacementFileError(Exception):
    """A model's placement file cannot be used; the message says why."""


def measured_dir(s: Settings, kind: str = "placement") -> str:
    """Beside the store (never inside it: the store lists its own folder)."""
    return os.path.join(os.path.dirname(os.path.normpath(s.models_dir)), KINDS[kind][0])


def _path(s: Settings, name: str, kind: str) -> str:
    return os.path.join(measured_dir(s, kind), check_name(name) + ".json")


def server_in_the_way(s: Settings, command: str) -> str | None:
    """Why `command` must not measure now: the server answers (it holds memory and the GPU,
    and its requests would share the timings); None when it is stopped."""
    up, _ = reachable([f"127.0.0.1:{s.serve_port}"], timeout_s=1.0)
    if not up:
        return None
    return (
        f"the server answers on port {s.serve_port}: it holds memory and the GPU and would share "
        "the timings; `sudo systemctl stop rocky-llm rocky-llm-ollama`, then "
        f"`sudo {command}`, then `sudo systemctl start rocky-llm rocky-llm-ollama`"
    )


def not_writable(s: Settings, kind: str, command: str) -> str | None:
    """Why `command` could not keep what it measures (asked before minutes of measuring), or
    None: the nearest existing folder of its file must be writable by this user."""
    folder = measured_dir(s, kind)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if os.access(folder, os.W_OK):
        return None
    return f"{folder} is not writable by this user: `sudo {command}`"


def measure(s: Settings, model: Model, doc: dict[str, Any] | None, log) -> tuple[Any, dict]:
    """The placement step on `model` (its Check and section). `doc`: the self-test's result,
    for its GPU checks and the sweep's best micro-batch."""
    one = replace(s, serve_model_path=model.path, serve_model_name=model.name)
    return placement(one, Deadline(s.deadline_s), doc or {}, log=log)


def save(s: Settings, model: Model, section: dict[str, Any], kind: str = "placement") -> str:
    path = _path(s, model.name, kind)
    os.makedirs(measured_dir(s, kind), mode=0o755, exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc = {"schema": KINDS[kind][1], "model": model.name, "size": model.size,
           "sha256": model.sha256, "measured_at": when, kind: section}  # fmt: skip
    write_atomic(path, (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode())
    return path


def load(
    s: Settings, model: Model, kind: str = "placement"
) -> tuple[dict[str, Any] | None, str, str | None]:
    """The model's own section of `kind`, where it came from and when (a UTC timestamp as the
    self-test writes them), or None, why not and None (no file is not an error; a file that
    does not fit the model is said). The section itself is read as hostile by its user
    (placement.choose, serve_settings.cluster_times)."""
    path = _path(s, model.name, kind)
    _, schema, command = KINDS[kind]
    how = f"`sudo {command.format(name=model.name)}`"
    try:
        doc = read_json(path, MAX_BYTES, follow_links=False)
    except FileNotFoundError:
        return None, f"not measured for {model.name}: {how}", None
    except (OSError, UnreadableFile, ValueError) as err:
        return None, f"{path} ignored ({err}); {how} again", None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        return None, f"{path} ignored: not a {schema} file", None
    if (
        doc.get("model") != model.name
        or doc.get("size") != model.size
        or (doc.get("sha256") != model.sha256)
    ):
        return None, f"{path} ignored: measured on other bytes; {how}", None
    section = doc.get(kind)
    if not isinstance(section, dict):
        return None, f"{path} ignored: no {kind} section", None
    when = doc.get("measured_at")
    when = when if isinstance(when, str) and TIMESTAMP.fullmatch(when) else None
    by = command.replace(" {name}", "")
    return section, f"measured for {model.name} by `{by}` ({when or '?'})", when


def remove(s: Settings, name: str) -> None:
    """A removed model's measurements go with it."""
    for kind in KINDS:
        try:
            os.unlink(_path(s, name, kind))
        except FileNotFoundError:
            pass
