"""`rocky-vulkan model fetch [NAME...]`: download the reference model and the models of
models:, resumable and verified by sha256, and pin the checksum into rocky-vulkan.yaml on the
first download when it is still null (only after the file proved to be a GGUF model, so a login
page is never pinned)."""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import re
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3
import yaml

from rocky_vulkan.config import REFERENCE_MODEL, Config, load_config
from rocky_vulkan.errors import UserError

CHUNK = 1 << 20
# Small network reads: what arrived before a connection dies is on disk for the resume.
NET_CHUNK = 64 << 10
DEFAULT_DEST = "build/models"
# Statuses that will not change by asking again.
PERMANENT = {400, 401, 403, 404, 410}
# Bounds on one `model fetch`: all of it, and how long it may go without receiving a byte
# (across retries), so a stalled or trickling server cannot keep it busy for long.
DEFAULT_MAX_TIME_S = 4 * 3600.0
DEFAULT_STALL_S = 120.0
# GGUF header: magic, uint32 version, uint64 tensor count, uint64 metadata count (little endian).
GGUF_MAGIC = b"GGUF"
GGUF_HEADER = struct.Struct("<4sIQQ")
GGUF_VERSIONS = (2, 3)  # what the pinned llama.cpp reads; v1 is no longer supported there
MIN_MODEL_BYTES = 1 << 20  # no usable LLM is smaller; a login or error page usually is
MAX_GGUF_COUNT = 1 << 20  # tensor / metadata counts beyond this are not a header


# What one attempt can fail with that another attempt may not.
RETRYABLE = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError)


class DownloadError(UserError):
    """The download failed for good (after retries, or with a permanent HTTP status)."""


class _OutOfTime(Exception):
    """The overall deadline or the stall budget ran out."""


class _Clock:
    """The overall deadline and the stall budget (time without a byte, across retries)."""

    def __init__(self, max_time_s: float, stall_s: float) -> None:
        now = time.monotonic()
        self.max_time_s, self.stall_s = max_time_s, stall_s
        self.end, self.last_byte = now + max_time_s, now

    def got_bytes(self) -> None:
        self.last_byte = time.monotonic()

    def deadline_left(self) -> float:
        return self.end - time.monotonic()

    def left(self) -> float:
        """Seconds until either bound runs out."""
        return min(self.deadline_left(), self.last_byte + self.stall_s - time.monotonic())

    def why(self) -> str:
        if self.deadline_left() <= 0:
            return f"gave up after --max-time {self.max_time_s:g} s"
        return f"gave up: no data for --stall-time {self.stall_s:g} s"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _pieces(resp: requests.Response):
    """The body as it arrives, one socket read at a time where urllib3 can (read1): a server
    that trickles bytes then cannot hold a read past the deadline for more than one read."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 older than 2.3: whole chunks only
        yield from resp.iter_content(NET_CHUNK)
        return
    while chunk := read1(NET_CHUNK):
        yield chunk


def _attempt(
    session: requests.Session,
    url: str,
    part: Path,
    timeout: tuple[float, float],
    clock: _Clock,
    bar,
    field: str = "model",
) -> None:
    """One GET from where the .part file ends; returns when the body ended cleanly. `field`:
    the config section the URL comes from, for messages."""
    left = clock.left()
    if left <= 0:
        raise _OutOfTime
    offset = part.stat().st_size if part.exists() else 0
    # The bytes as stored: Range offsets and Content-Length then count the same bytes as the file.
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    capped = (min(timeout[0], left), min(timeout[1], left))
    with session.get(url, headers=headers, stream=True, timeout=capped) as resp:
        if resp.status_code == 416 and offset:
            # Nothing left past our offset: the .part is complete (or longer than the file).
            return
        if resp.status_code in PERMANENT:
            raise DownloadError(
                f"{url}: HTTP {resp.status_code} {resp.reason}; check {field}.url in "
                "rocky-vulkan.yaml (and access to the file)"
            )
        resp.raise_for_status()
        mode = "ab"
        if resp.status_code == 206:
            start = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
            if not start or int(start.group(1)) != offset:
                raise requests.exceptions.ContentDecodingError("server resumed at the wrong offset")
        else:
            mode, offset = "wb", 0  # the server ignored Range: start over
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        bar.update(bar.task_ids[0], total=total, completed=offset)
        with open(part, mode) as fh:
            for chunk in _pieces(resp):
                fh.write(chunk)
                clock.got_bytes()
                bar.advance(bar.task_ids[0], len(chunk))
                if clock.deadline_left() <= 0:
                    raise _OutOfTime
        size = part.stat().st_size
        if total is not None and size != total:
            if clock.deadline_left() <= 0:
                raise _OutOfTime
            raise requests.exceptions.ChunkedEncodingError(f"got {size} of {total} bytes")


def _root_cause(err: BaseException) -> BaseException:
    """The innermost cause: requests wraps urllib3, which wraps the socket error."""
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = getattr(err, "reason", None)  # urllib3's MaxRetryError / NewConnectionError
        if not isinstance(inner, BaseException):
            inner = err.__cause__ or err.__context__
        if not isinstance(inner, BaseException):
            break
        err = inner
    return err


def describe_error(err: BaseException, url: str) -> str:
    """One short line for a failed attempt (no repr of urllib3 objects, no wrapped tracebacks)."""
    host = requests.utils.urlparse(url).netloc or url
    if isinstance(err, requests.exceptions.HTTPError) and err.response is not None:
        return f"HTTP {err.response.status_code} {err.response.reason}"
    if isinstance(err, requests.exceptions.ConnectTimeout):
        return f"no connection to {host} within the connect timeout"
    if isinstance(err, requests.exceptions.ReadTimeout):
        return f"{host} sent no data within the read timeout"
    root = _root_cause(err)
    if isinstance(root, socket.gaierror) or "NameResolution" in type(root).__name__:
        return f"cannot resolve {host.split(':')[0]} (offline, or DNS not working?)"
    if isinstance(root, ConnectionRefusedError) or "refused" in str(root).lower():
        return f"connection to {host} refused"
    if isinstance(root, (ConnectionResetError, BrokenPipeError)):
        return f"connection to {host} reset"
    if "IncompleteRead" in type(root).__name__ or isinstance(root, http.client.IncompleteRead):
        return f"{host} closed the connection before the end of the file"
    if isinstance(root, (TimeoutError, socket.timeout)):
        return f"{host} timed out"
    text = " ".join(str(root).split()) or type(root).__name__
    if isinstance(root, OSError) and root.strerror:
        text = root.strerror
    if isinstance(err, requests.exceptions.ConnectionError) and "object at 0x" in text:
        text = "connection failed"
    return text if len(text) <= 100 else text[:97] + "..."


def download(
    url: str,
    dest: Path,
    *,
    retries: int = 5,
    backoff_s: float = 2.0,
    timeout: tuple[float, float] = (15.0, 60.0),
    max_time_s: float = DEFAULT_MAX_TIME_S,
    stall_s: float = DEFAULT_STALL_S,
    progress: bool = True,
    session: requests.Session | None = None,
    field: str = "model",
) -> Path:
    """Download `url` into `dest`.part, resuming what is there; return the .part path.

    Gives up after `retries` retries, after `max_time_s` in all, or when no byte arrived for
    `stall_s` (across retries), whichever comes first."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    session = session or requests.Session()
    clock = _Clock(max_time_s, stall_s)
    last_error, attempts = "", 0
    with _progress(progress) as bar:
        bar.add_task(dest.name, total=None)
        for attempt in range(retries + 1):
            attempts = attempt + 1
            try:
                _attempt(session, url, part, timeout, clock, bar, field)
                return part
            except DownloadError:
                raise
            except _OutOfTime:
                last_error = clock.why()
                break
            except RETRYABLE as err:
                last_error = describe_error(err, url)
                status = getattr(getattr(err, "response", None), "status_code", None)
                if status in PERMANENT:
                    raise DownloadError(f"{url}: HTTP {status}") from None
            if attempt < retries:
                wait = min(backoff_s * (2**attempt), max(clock.left(), 0.0))
                bar.console.print(
                    f"attempt {attempt + 1} failed: {last_error}; retry in {wait:.0f} s",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
                time.sleep(wait)
    have = part.stat().st_size if part.exists() else 0
    if part.exists() and not have:
        part.unlink()  # an empty .part resumes nothing
    kept = (
        f"{have} bytes kept in {part}: run the command again to resume"
        if have
        else f"nothing was downloaded: check the network and {field}.url, then run it again"
    )
    raise DownloadError(
        f"{url}: download failed after {attempts} attempt{'s' if attempts > 1 else ''} "
        f"({last_error}); {kept}"
    )


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a GGUF model (an HTML login page, an error text, a stub)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(GGUF_HEADER.size)
    problem = None
    if head[:4] != GGUF_MAGIC:
        start = head[:16].decode("ascii", "replace")
        looks = (
            " (an HTML page: the URL needs a login or is not a direct link)"
            if (head.lstrip()[:1] == b"<")
            else ""
        )
        problem = f"it does not start with the GGUF magic but with {start!r}{looks}"
    elif len(head) < GGUF_HEADER.size:
        problem = f"its GGUF header is cut short ({size} bytes)"
    else:
        _, version, n_tensors, n_kv = GGUF_HEADER.unpack(head)
        if version not in GGUF_VERSIONS:
            problem = f"GGUF version {version}; llama.cpp here reads versions 2 and 3"
        elif not (0 < n_tensors <= MAX_GGUF_COUNT and 0 < n_kv <= MAX_GGUF_COUNT):
            problem = f"its GGUF header claims {n_tensors} tensors and {n_kv} metadata keys"
        elif size < MIN_MODEL_BYTES:
            problem = f"it is only {size} bytes; a model is at least {MIN_MODEL_BYTES} bytes"
    if problem:
        raise DownloadError(f"the download is not a GGUF model: {problem}")


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


def _sha256_node(root: yaml.Node, field: str, name: str) -> yaml.Node | None:
    """The value node of `sha256` in the model: section (field 'model') or in the models:
    entry named `name`."""
    if not isinstance(root, yaml.MappingNode):
        return None
    section = next((v for k, v in root.value if k.value == field.split("[")[0]), None)
    entries = [section] if field == "model" else getattr(section, "value", [])
    for entry in entries:
        if not isinstance(entry, yaml.MappingNode):
            continue
        keys = {k.value: v for k, v in entry.value}
        if field != "model" and getattr(keys.get("name"), "value", None) != name:
            continue
        return keys.get("sha256")
    return None


def pin_sha256(config_path: Path, sha256: str, name: str = REFERENCE_MODEL) -> None:
    """Replace the `null` of the model's sha256 (model:, or the models: entry `name`) with
    `sha256`, touching nothing else in the file."""
    text = config_path.read_text(encoding="utf-8")
    field = wanted(load_config(config_path), name).field
    where = "model:" if field == "model" else f"models: entry {name!r}"
    node = _sha256_node(yaml.compose(text, Loader=yaml.SafeLoader), field, name)
    if not (
        isinstance(node, yaml.ScalarNode)
        and node.tag == "tag:yaml.org,2002:null"
        and node.value in ("null", "Null", "NULL", "~")
    ):
        raise UserError(
            f"{config_path}: no `sha256: null` line under {where}; "
            f"set {field}.sha256 to {sha256} by hand"
        )
    text = text[: node.start_mark.index] + sha256 + text[node.end_mark.index :]
    fd, tmp = tempfile.mkstemp(prefix=".rocky-vulkan.", dir=config_path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, config_path.stat().st_mode & 0o777)
    os.replace(tmp, config_path)
    if wanted(load_config(config_path), name).sha256 != sha256:  # the edit must read back
        raise UserError(f"{config_path}: pinning {field}.sha256 did not read back; check the file")


def fetch_model(
    config_path: Path, dest_dir: Path, name: str = REFERENCE_MODEL, **kwargs
) -> tuple[Path, str, bool]:
    """Fetch the model `name` (`reference`: the model: section, else an entry of models:) into
    dest_dir; return (path, sha256, pinned_now)."""
    model = wanted(load_config(config_path), name)
    dest = dest_dir / model.filename
    expected = model.sha256
    again = "`rocky-vulkan model fetch" + ("`" if name == REFERENCE_MODEL else f" {name}`")
    if expected and dest.is_file() and sha256_of(dest) == expected:
        return dest, expected, False
    part = download(model.url, dest, field=model.field, **kwargs)
    if not expected:
        # Nothing to compare with: before this checksum becomes the pin, the file must at least
        # be a model. A refused download is moved aside, so it is neither pinned nor resumed.
        try:
            check_gguf(part)
        except DownloadError as err:
            bad = dest.with_name(dest.name + ".not-gguf")
            os.replace(part, bad)
            raise DownloadError(
                f"{model.url}: {err}. Nothing was pinned and nothing was written to {dest}; "
                f"the download is in {bad} to look at. Check {model.field}.url in "
                f"{config_path.name} (a direct download link, reachable without a login), then "
                f"run {again} again."
            ) from None
    actual = sha256_of(part)
    if expected and actual != expected:
        bad = dest.with_name(dest.name + ".sha256-mismatch")
        os.replace(part, bad)
        kept = f"; {dest} was left as it was" if dest.exists() else ""
        raise UserError(
            f"{model.url}: downloaded file has sha256 {actual}, but {model.field}.sha256 in "
            f"{config_path.name} is {expected}. Nothing was replaced{kept}; the download is in "
            f"{bad}. If upstream replaced the file on purpose, check where the new one comes "
            f"from, then set {model.field}.sha256 to the new value and run `rocky-vulkan "
            f"render`; otherwise delete {bad} and run {again} again."
        )
    os.replace(part, dest)
    if not expected:
        pin_sha256(config_path, actual, name)
        return dest, actual, True
    return dest, actual, False


def names_to_fetch(cfg: Config, names: list[str], every: bool) -> list[str]:
    """The models one `model fetch` gets: those named; with --all every model; with neither
    what the image installs (the reference model and the one serve.model names)."""
    if every:
        return [REFERENCE_MODEL, *(m.name for m in cfg.models)]
    if names:
        for name in names:
            wanted(cfg, name)  # an unknown name fails before anything is downloaded
        return list(dict.fromkeys(names))
    return list(dict.fromkeys([REFERENCE_MODEL, cfg.serve.model]))


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
