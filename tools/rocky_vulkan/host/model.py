"""`rocky-vulkan model fetch [NAME...]`: download the reference model and the models of
models:, resumable and verified by sha256, and pin the checksum into rocky-vulkan.yaml on the
first download when it is still null: only after the file proved to be a whole GGUF model (its
size exactly what its header describes, so neither a login page nor a cut download is pinned),
by changing only the bytes of that `null` (download.py fetches the bytes)."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from rocky_selftest import gguf
from rocky_selftest.results import write_atomic

from rocky_vulkan.config import REFERENCE_MODEL, Config, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.download import (
    DEFAULT_MAX_TIME_S,
    DEFAULT_STALL_S,
    STATE_SUFFIX,
    DownloadError,
    check_url,
    discard,
    download,
    not_regular,
)
from rocky_vulkan.host.result_doc import clean_text

CHUNK = 1 << 20
DEFAULT_DEST = "build/models"
GGUF_MAGIC = b"GGUF"
MIN_MODEL_BYTES = 1 << 20  # no usable LLM is smaller; a login or error page usually is


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_shortfall(path: Path) -> str | None:
    """Why a body that ended where the server closed (no Content-Length) is not the whole GGUF
    file its header describes; None when it is, or when it is no GGUF file (check_gguf says
    so)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not GGUF_MAGIC.startswith(head[: len(GGUF_MAGIC)]):
        return None
    try:
        layout = gguf.layout(str(path))
    except gguf.GgufTruncated:
        return f"the connection closed inside the GGUF header (after {size} bytes)"
    except (gguf.GgufError, OSError):
        return None
    if size < layout.padded_end and not layout.complete(size):
        return f"the connection closed after {size} of the {layout.padded_end} bytes of the file"
    return None


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a whole GGUF model: an HTML login page, an error text, a stub,
    a file cut short or with bytes its header does not describe (the tensor data must end
    exactly where the file does)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(24)
    problem = None
    if head[:4] != GGUF_MAGIC:
        start = head[:16].decode("ascii", "replace")
        looks = (
            " (an HTML page: the URL needs a login or is not a direct link)"
            if (head.lstrip()[:1] == b"<")
            else ""
        )
        problem = f"it does not start with the GGUF magic but with {start!r}{looks}"
    elif len(head) < 24:
        problem = f"its GGUF header is cut short ({size} bytes)"
    else:
        version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version not in gguf.VERSIONS:
            problem = f"GGUF version {version}; llama.cpp here reads versions 2 and 3"
        elif not (0 < n_tensors <= gguf.MAX_TENSORS and 0 < n_kv <= gguf.MAX_KEYS):
            problem = f"its GGUF header claims {n_tensors} tensors and {n_kv} metadata keys"
        elif size < MIN_MODEL_BYTES:
            problem = f"it is only {size} bytes; a model is at least {MIN_MODEL_BYTES} bytes"
        else:
            problem = _layout_problem(path, size)
    if problem:
        raise DownloadError(f"the download is not a GGUF model: {problem}")


def _layout_problem(path: Path, size: int) -> str | None:
    try:
        layout = gguf.layout(str(path))
    except gguf.GgufTruncated:
        return f"it is cut short: the file ({size} bytes) ends inside its GGUF header"
    except gguf.GgufError as err:
        return f"its GGUF header is malformed: {clean_text(str(err), 200)}"
    if layout.complete(size):
        return None
    if size < layout.padded_end:
        return (
            f"it is cut short: its GGUF header describes {layout.padded_end} bytes, the file "
            f"has {size}"
        )
    return (
        f"it has {size - layout.padded_end} bytes more than the {layout.padded_end} its GGUF "
        "header describes: not the file that header belongs to"
    )


@dataclass(frozen=True)
class Wanted:
    """One model to fetch: its serve.model name, where it is in the config, and its pins."""

    name: str
    field: str  # "model" or "models[i]", as messages name it
    url: str
    filename: str
    sha256: str | None


def wanted(cfg: Config, name: str) -> Wanted:
    """The model `name` (`reference` or a models: entry) of the config, or a UserError."""
    if name == REFERENCE_MODEL:
        m = cfg.model
        return Wanted(name, "model", m.url, m.filename, m.sha256)
    for i, m in enumerate(cfg.models):
        if m.name == name:
            return Wanted(name, f"models[{i}]", m.url, m.filename, m.sha256)
    names = ", ".join([REFERENCE_MODEL, *(m.name for m in cfg.models)])
    raise UserError(f"{cfg.path.name}: no model named {name!r}; the models: {names}")


def _sha256_node(root: yaml.Node, field: str, name: str) -> tuple[yaml.Node, yaml.Node] | None:
    """The key and value nodes of `sha256` in the model: section (field 'model') or in the
    models: entry named `name`."""
    if not isinstance(root, yaml.MappingNode):
        return None
    section = next((v for k, v in root.value if k.value == field.split("[")[0]), None)
    entries = [section] if field == "model" else getattr(section, "value", [])
    for entry in entries:
        if not isinstance(entry, yaml.MappingNode):
            continue
        keys = {k.value: (k, v) for k, v in entry.value}
        if field != "model" and getattr(keys.get("name", (None, None))[1], "value", None) != name:
            continue
        return keys.get("sha256")
    return None


NULLS = ("null", "Null", "NULL", "~")


def _pin_site(path: Path, name: str) -> tuple[str, int, int, str]:
    """(text of the config, start and end of the `null` to replace, field): the plain word
    `null` right after `sha256:`, not an alias, anchor or tag that would make the edit land
    elsewhere or change what another key means. A UserError when there is none."""
    field = wanted(load_config(path), name).field
    where = "model:" if field == "model" else f"models: entry {name!r}"
    fix = "write `sha256: null` there (or the file's sha256, by hand), then run it again"
    try:
        text = path.read_bytes().decode("utf-8")
        found = _sha256_node(yaml.compose(text, Loader=yaml.SafeLoader), field, name)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise UserError(f"{path}: cannot read it to pin the checksum ({err})") from None
    key, node = found or (None, None)
    if not (
        isinstance(node, yaml.ScalarNode)
        and node.tag == "tag:yaml.org,2002:null"
        and node.value in NULLS
        and text[node.start_mark.index : node.end_mark.index] == node.value
        and re.fullmatch(r"[ \t]*:[ \t]*", text[key.end_mark.index : node.start_mark.index])
    ):
        raise UserError(f"{path}: no `sha256: null` line under {where}; {fix}")
    return text, node.start_mark.index, node.end_mark.index, field


def pin_sha256(config_path: Path, sha256: str, name: str = REFERENCE_MODEL) -> None:
    """Replace the `null` of the model's sha256 (model:, or the models: entry `name`) with
    `sha256`, touching no other byte of the file (its line endings, encoding, comments stay);
    a symlinked config keeps its link and its target gets the pin."""
    path = Path(config_path).resolve()
    try:
        text, start, end, field = _pin_site(path, name)
    except UserError as err:
        raise UserError(f"{err}; the downloaded file's sha256 is {sha256}") from None
    new = text[:start] + sha256 + text[end:]
    try:
        write_atomic(str(path), new.encode("utf-8"), stat.S_IMODE(path.stat().st_mode))
    except OSError as err:
        raise UserError(
            f"{path}: cannot write the pin ({err.strerror}); the file was not changed; set "
            f"{field}.sha256 to {sha256} by hand"
        ) from None
    if wanted(load_config(path), name).sha256 != sha256:  # the edit must read back
        raise UserError(f"{path}: pinning {field}.sha256 did not read back; check the file")


def _set_aside(part: Path, bad: Path) -> None:
    try:
        os.replace(part, bad)
    except OSError as err:
        raise DownloadError(
            f"cannot move the download to {bad} ({err.strerror}); move that path away, then "
            "run the command again"
        ) from None


def _prepare(dest_dir: Path, dest: Path) -> int:
    """The model folder exists, and every path fetch writes in it is absent or a regular file:
    a directory, FIFO, device or link there is refused, never written through or waited on.
    Returns a descriptor of the folder holding its lock: two fetches into one folder would
    write one .part at once."""
    if os.path.lexists(dest_dir) and not dest_dir.is_dir():
        what = not_regular(dest_dir) if dest_dir.exists() else "a broken link"
        raise UserError(
            f"{dest_dir} is {what or 'a regular file'}, not a folder; pass --dest a folder for "
            "the model (one that does not exist yet is made)"
        )
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"{dest_dir}: cannot use it as the model folder ({err.strerror}); pass --dest a "
            "folder you can write (or where one can be made)"
        ) from None
    fd = os.open(dest_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UserError(
            f"another `rocky-vulkan model fetch` is downloading into {dest_dir}; let it finish "
            "(or stop it), then run this one again"
        ) from None
    for suffix in ("", ".part", STATE_SUFFIX, ".not-gguf", ".sha256-mismatch"):
        path = dest.with_name(dest.name + suffix)
        problem = not_regular(path)
        if problem:
            os.close(fd)
            raise UserError(
                f"{path} is {problem}, not a regular file; `model fetch` writes a regular file "
                "there: move it away (or pass another --dest), then run the command again"
            )
    return fd


def fetch_model(
    config_path: Path, dest_dir: Path, name: str = REFERENCE_MODEL, **kwargs
) -> tuple[Path, str, bool]:
    """Fetch the model `name` (`reference`: the model: section, else an entry of models:) into
    dest_dir; return (path, sha256, pinned_now)."""
    config_path = Path(config_path).resolve()
    model = wanted(load_config(config_path), name)
    check_url(model.url, model.field)
    dest = dest_dir / model.filename
    lock = _prepare(dest_dir, dest)
    try:
        return _fetch(config_path, name, model, dest, **kwargs)
    finally:
        os.close(lock)


def _fetch(
    config_path: Path, name: str, model: Wanted, dest: Path, **kwargs
) -> tuple[Path, str, bool]:
    expected = model.sha256
    if not expected:
        _pin_site(config_path, name)  # a config that cannot take the pin fails before downloading
    again = "`rocky-vulkan model fetch" + ("`" if name == REFERENCE_MODEL else f" {name}`")
    if expected and dest.is_file() and sha256_of(dest) == expected:
        return dest, expected, False
    part = download(model.url, dest, field=model.field, shortfall=gguf_shortfall, **kwargs)
    state = dest.with_name(dest.name + STATE_SUFFIX)
    if not expected:
        # Nothing to compare with: before this checksum becomes the pin, the file must be a
        # whole model. A refused download is moved aside, so it is neither pinned nor resumed.
        try:
            check_gguf(part)
        except DownloadError as err:
            bad = dest.with_name(dest.name + ".not-gguf")
            _set_aside(part, bad)
            discard(state)
            raise DownloadError(
                f"{model.url}: {err}. Nothing was pinned and nothing was written to {dest}; "
                f"the download is in {bad} to look at. Check {model.field}.url in "
                f"{config_path.name} (a direct download link, reachable without a login), then "
                f"run {again} again."
            ) from None
    actual = sha256_of(part)
    if expected and actual != expected:
        bad = dest.with_name(dest.name + ".sha256-mismatch")
        _set_aside(part, bad)
        discard(state)
        kept = f"; {dest} was left as it was" if dest.exists() else ""
        raise UserError(
            f"{model.url}: downloaded file has sha256 {actual}, but {model.field}.sha256 in "
            f"{config_path.name} is {expected}. Nothing was replaced{kept}; the download is in "
            f"{bad}. If upstream replaced the file on purpose, check where the new one comes "
            f"from, then set {model.field}.sha256 to the new value and run `rocky-vulkan "
            f"render`; otherwise delete {bad} and run {again} again."
        )
    _set_aside(part, dest)
    discard(state)
    if not expected:
        pin_sha256(config_path, actual, name)
        return dest, actual, True
    return dest, actual, False


def names_to_fetch(cfg: Config, names: list[str], every: bool) -> list[str]:
    """The models one `model fetch` gets: those named; with --all every model; with neither
    what the image installs (the reference model, the one serve.model names, the draft)."""
    if every:
        return [REFERENCE_MODEL, *(m.name for m in cfg.models)]
    if names:
        for name in names:
            wanted(cfg, name)  # an unknown name fails before anything is downloaded
        return list(dict.fromkeys(names))
    draft = [cfg.serve.draft_model] if cfg.serve.draft_model else []
    return list(dict.fromkeys([REFERENCE_MODEL, cfg.serve.model, *draft]))


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds, >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds, > 0."""
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 seconds would give up at once; give a number > 0")
    return value


def _count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _run_fetch(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    cfg = load_config(config_path)
    if args.names and args.all:
        raise UserError("give model names or --all, not both")
    dest_dir = Path(args.dest) if args.dest else cfg.root / DEFAULT_DEST
    pinned_any = False
    for name in names_to_fetch(cfg, args.names, args.all):
        path, sha, pinned = fetch_model(
            config_path,
            dest_dir,
            name,
            retries=args.retries,
            backoff_s=args.retry_wait,
            timeout=(args.connect_timeout, args.read_timeout),
            max_time_s=args.max_time,
            stall_s=args.stall_time,
            progress=sys.stderr.isatty() and not args.no_progress,
        )
        print(f"{path}: sha256 {sha} verified")
        if pinned:
            field = wanted(load_config(config_path), name).field
            print(f"pinned {field}.sha256 in {config_path.name} (it was null)")
            pinned_any = True
    if pinned_any:
        print("now run `rocky-vulkan render` and commit both")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "model", help="the models: pin a new url's sha256 (the build fetches them)"
    )
    model_sub = parser.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser(
        "fetch",
        help="download models (resumable), pin their sha256 when null, or verify a local copy",
        description="Download a model (resumable) into build/models/. Needed only when its "
        "sha256 is null (a new url): the file is checked to be a GGUF model and its sha256 is "
        "written into rocky-vulkan.yaml. With a pinned sha256 it only verifies a local copy: "
        "the image build downloads the models itself. By default: the reference model and "
        "the one serve.model names.",
    )
    fetch.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="reference (the model: section) or a models: name; default: reference and "
        "serve.model (what the image installs)",
    )
    fetch.add_argument("--all", action="store_true", help="every model of the config")
    fetch.add_argument("--dest", help=f"folder for the model (default: {DEFAULT_DEST}/)")
    fetch.add_argument("--retries", type=_count, default=5, help="retries after the first try")
    fetch.add_argument(
        "--retry-wait",
        type=_seconds,
        default=2.0,
        help="seconds before the first retry, doubled for each next one (default: %(default)g)",
    )
    fetch.add_argument("--connect-timeout", type=_positive_seconds, default=15.0, help="seconds")
    fetch.add_argument(
        "--read-timeout", type=_positive_seconds, default=60.0, help="seconds without data"
    )
    fetch.add_argument(
        "--stall-time",
        type=_positive_seconds,
        default=DEFAULT_STALL_S,
        help="give up when no data arrived for this many seconds, across retries "
        "(default: %(default)g)",
    )
    fetch.add_argument(
        "--max-time",
        type=_positive_seconds,
        default=DEFAULT_MAX_TIME_S,
        help="give up after this many seconds in all (default: %(default)g)",
    )
    fetch.add_argument("--no-progress", action="store_true", help="no progress bar")
    fetch.set_defaults(func=_run_fetch)
