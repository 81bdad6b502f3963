"""The board's model store: GGUF models pulled at run time, beside the image's own.

Layout (under paths.LLM_MODELS_DIR, owned by the server's user):
  NAME.gguf        a model, complete and checked (size, sha256, GGUF header)
  NAME.json        what it is: sha256, size, source, the licence the user stated, when
  default          the name `rocky-llm use` chose (absent: the image's served model)
  .pull/NAME.*     a pull in progress: the .part, its resume state, its lock

A model is offered only when both of its files are there and agree; a pull writes the record,
then renames the checked .part into place, so a kill at any moment leaves no half-written model
(a record without its .gguf is left out and cleaned up by the next pull of that name).
The image's models (the reference model the self-test keeps, and `models:` of the config that
the image installs) are listed too, read-only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .files import UnreadableFile, os_error_text, read_json, read_text
from .gguf import GgufError, layout, model_shape
from .model_fetch import Fetched, FetchError, copy_local, discard, fetch_url
from .results import write_atomic

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SHA256 = re.compile(r"[0-9a-f]{64}")
RECORD_SCHEMA = "rocky-llm-model"
MAX_RECORD_BYTES = 16384
MAX_LICENSE = 200
PULL_DIR = ".pull"
DEFAULT_FILE = "default"


class StoreError(Exception):
    """A store operation was refused; the message names the cause and the fix."""


@dataclass(frozen=True)
class Model:
    name: str
    path: str
    size: int
    sha256: str | None
    source: str  # "image" or where it was pulled from
    license: str
    pulled_at: str | None = None

    @property
    def pulled(self) -> bool:
        return self.source != "image"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise StoreError(
            f"model name {_show(name)} is not usable: 1 to 63 characters of a-z, 0-9, '.', '_', "
            "'-', starting with a letter or digit (e.g. qwen2.5-1.5b)"
        )
    return name


def check_sha256(value: str) -> str:
    if not isinstance(value, str) or not SHA256.fullmatch(value.lower()):
        raise StoreError(
            f"--sha256 {_show(value)} is not 64 hex digits; give the file's sha256 as its "
            "publisher lists it (Hugging Face: the file's page), or `sha256sum FILE`"
        )
    return value.lower()


def check_license(text: str) -> str:
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_LICENSE:
        raise StoreError(
            "--license is required: the model's licence as you accept it (an SPDX id such as "
            f"Apache-2.0, or its name), at most {MAX_LICENSE} characters"
        )
    if not text.isprintable():
        raise StoreError("--license has control characters; give the licence's name as text")
    return text.strip()


def name_from_source(source: str) -> str:
    """A store name from a URL's or a path's file name: qwen2.5-1.5b-instruct-q4_k_m.gguf ->
    qwen2.5-1.5b-instruct-q4_k_m."""
    base = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE).lower()
    base = re.sub(r"[^a-z0-9._-]+", "-", base).strip("-._")[:63]
    return check_name(base)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Store:
    """The store at `root` and the image's models (name -> path)."""

    def __init__(self, root: str, image_models: dict[str, str] | None = None) -> None:
        self.root = root
        self.image_models = dict(image_models or {})

    def _path(self, name: str, ext: str) -> str:
        return os.path.join(self.root, check_name(name) + ext)

    def _pull_path(self, name: str, ext: str) -> str:
        return os.path.join(self.root, PULL_DIR, check_name(name) + ext)

    # --- reading --------------------------------------------------------------------------------

    def _record(self, name: str) -> Model | None:
        gguf = self._path(name, ".gguf")
        try:
            doc = read_json(self._path(name, ".json"), MAX_RECORD_BYTES, follow_links=False)
            size = os.lstat(gguf).st_size
        except (OSError, UnreadableFile):
            return None
        if not (
            isinstance(doc, dict)
            and doc.get("schema") == RECORD_SCHEMA
            and doc.get("name") == name
            and isinstance(doc.get("sha256"), str)
            and SHA256.fullmatch(doc["sha256"])
            and doc.get("size") == size
            and isinstance(doc.get("source"), str)
            and isinstance(doc.get("license"), str)
            and os.path.isfile(gguf)
            and not os.path.islink(gguf)
        ):
            return None
        return Model(
            name, gguf, size, doc["sha256"], doc["source"], doc["license"], doc.get("pulled_at")
        )

    def models(self) -> list[Model]:
        """The image's models first, then the pulled ones, by name."""
        out = []
        for name, path in sorted(self.image_models.items()):
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            out.append(Model(name, path, size, None, "image", "see the image's MODEL-LICENSE"))
        try:
            entries = sorted(os.listdir(self.root))
        except OSError:
            entries = []
        for entry in entries:
            stem, ext = os.path.splitext(entry)
            if ext != ".json" or not NAME.fullmatch(stem) or stem in self.image_models:
                continue
            model = self._record(stem)
            if model:
                out.append(model)
        return out

    def get(self, name: str) -> Model:
        for model in self.models():
            if model.name == name:
                return model
        known = ", ".join(m.name for m in self.models()) or "none"
        raise StoreError(f"no model named {_show(name)} (models: {known}); `rocky-llm list`")

    def default(self) -> str | None:
        """The name `rocky-llm use` chose, if it is still a model."""
        try:
            name = read_text(os.path.join(self.root, DEFAULT_FILE), 256, follow_links=False)
        except (OSError, UnreadableFile):
            return None
        name = name.strip()
        names = {m.name for m in self.models()}
        return name if name in names else None

    # --- changing -------------------------------------------------------------------------------

    def _lock(self, name: str) -> int:
        """An exclusive lock on NAME's pull (and rm): a second one at once is refused."""
        os.makedirs(os.path.join(self.root, PULL_DIR), mode=0o755, exist_ok=True)
        path = self._pull_path(name, ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"another pull or rm of {name} is running; wait for it to end (or pick another "
                "name), then try again"
            ) from None
        return fd

    def pull(
        self,
        name: str,
        source: str,
        sha256: str,
        license: str,
        *,
        progress: Callable[[int, int | None], None] = lambda d, t: None,
        fetch_options: dict[str, Any] | None = None,
    ) -> Model:
        """Fetch `source` (an http(s) URL or a local file) as NAME: checked, then offered."""
        check_name(name)
        sha256, license = check_sha256(sha256), check_license(license)
        if name in self.image_models:
            raise StoreError(f"{name} is one of the image's models; pull under another name")
        if not os.path.isdir(self.root):
            raise StoreError(f"the model store {self.root} does not exist; is rocky-llm installed?")
        fd = self._lock(name)
        try:
            existing = self._record(name)
            if existing:
                if existing.sha256 == sha256:
                    return existing
                raise StoreError(
                    f"{name} is already in the store with another sha256; `rocky-llm rm {name}` "
                    "first, or pull under another name"
                )
            discard(self._path(name, ".json"))  # a record whose model never landed
            part = self._pull_path(name, ".part")
            try:
                if re.match(r"(?i)https?://", source):
                    got = fetch_url(source, part, progress=progress, **(fetch_options or {}))
                else:
                    got = copy_local(source, part, progress)
            except FetchError as err:
                raise StoreError(f"pull of {name}: {err}") from None
            self._check(name, got, sha256)
            record = {
                "schema": RECORD_SCHEMA,
                "name": name,
                "sha256": sha256,
                "size": got.size,
                "source": source if "://" in source else "local file " + os.path.basename(source),
                "license": license,
                "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            owner = os.stat(self.root)
            write_atomic(self._path(name, ".json"), (json.dumps(record, indent=1) + "\n").encode())
            _chown_like(self._path(name, ".json"), owner)
            _chown_like(part, owner)
            os.replace(part, self._path(name, ".gguf"))
            _fsync_dir(self.root)
            return self.get(name)
        except OSError as err:
            raise StoreError(f"pull of {name}: {os_error_text(err)}") from None
        finally:
            os.close(fd)

    def _check(self, name: str, got: Fetched, sha256: str) -> None:
        """The .part is the file asked for and a whole GGUF model; else it is removed."""
        why = None
        if got.sha256 != sha256:
            why = (
                f"its sha256 is {got.sha256}, not {sha256}: the file is not the one named (or "
                "changed on the server); check --sha256 and the URL"
            )
        else:
            try:
                lay = layout(got.part)
                if not lay.complete(got.size):
                    why = (
                        f"its GGUF header describes {lay.padded_end} bytes, the file has {got.size}"
                    )
                else:
                    model_shape(got.part)  # the metadata the server's memory plan needs
            except GgufError as err:
                why = f"not a usable GGUF model ({err})"
            except OSError as err:
                why = f"cannot read it back ({os_error_text(err)})"
        if why:
            discard(got.part, got.part + ".json")
            raise StoreError(f"pull of {name} refused: {why}; nothing was added")

    def remove(self, name: str) -> Model:
        model = self.get(name)
        if not model.pulled:
            raise StoreError(f"{name} is one of the image's models and cannot be removed")
        fd = self._lock(name)
        try:
            discard(self._path(name, ".json"), self._path(name, ".gguf"))
            if self.default() is None:
                discard(os.path.join(self.root, DEFAULT_FILE))
            _fsync_dir(self.root)
        finally:
            os.close(fd)
        return model

    def use(self, name: str) -> Model:
        model = self.get(name)
        path = os.path.join(self.root, DEFAULT_FILE)
        write_atomic(path, (name + "\n").encode())
        _chown_like(path, os.stat(self.root))
        return model


def _chown_like(path: str, owner: os.stat_result) -> None:
    """Root's pulls belong to the store's owner (the server's user), as the server's own do."""
    if os.geteuid() == 0:
        os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
