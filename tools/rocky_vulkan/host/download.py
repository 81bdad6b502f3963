"""Downloading one file over http(s) so that what ends up in the .part is provably the file:
resumed only with If-Range and a Content-Range that continues the saved part of the same length,
redirects checked (http(s) only, never https to http, no credentials), every phase bounded by one
deadline and a stall budget, nothing written through a link or into a FIFO."""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from rocky_selftest.results import write_atomic

from rocky_vulkan.errors import UserError
from rocky_vulkan.host.result_doc import clean_text
from rocky_vulkan.regularfile import file_kind

# Small network reads: what arrived before a connection dies is on disk for the resume.
NET_CHUNK = 64 << 10
# Statuses that will not change by asking again.
PERMANENT = {400, 401, 403, 404, 410}
# Bounds on one `model fetch`: all of it, and how long it may go without receiving a byte
# (across retries), so a stalled or trickling server cannot keep it busy for long.
DEFAULT_MAX_TIME_S = 4 * 3600.0
DEFAULT_STALL_S = 120.0
SCHEMES = ("https", "http")
MAX_REDIRECTS = 10
# Beside the .part: what the response that started it said about the file (its validator for
# If-Range and its length), so a resume continues the same file or starts over.
STATE_SUFFIX = ".part.json"
MAX_STATE_BYTES = 4096
MAX_VALIDATOR = 512
# A resume the server answers for another file starts over from byte 0; this many times at most
# in one run without counting as a failed attempt.
MAX_START_OVERS = 3
# Local write failures that more space fixes.
NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


# What one attempt can fail with that another attempt may not.
RETRYABLE = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError)


class DownloadError(UserError):
    """The download failed for good (after retries, or with a permanent HTTP status)."""


class _OutOfTime(Exception):
    """The overall deadline or the stall budget ran out."""


class _StartOver(Exception):
    """The server's answer to a resume is not the rest of the saved part: start from byte 0."""


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
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _say(bar, text: str) -> None:
    bar.console.print(text, markup=False, highlight=False, soft_wrap=True)


def _pieces(resp: requests.Response):
    """The body as it arrives, one socket read at a time where urllib3 can (read1): what
    arrived is on disk when the connection dies or the deadline ends the attempt."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 older than 2.3: whole chunks only
        yield from resp.iter_content(NET_CHUNK)
        return
    while chunk := read1(NET_CHUNK):
        yield chunk


# --- URLs -----------------------------------------------------------------------------------------


def check_url(url: str, field: str) -> None:
    """Refuse a URL `model fetch` must not use: not http(s), or with a user name or password
    (which would be shown and end up in the committed config and the image's recipe)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise UserError(f"{field}.url is not a usable URL; give the model's direct link") from None
    if "@" in parts.netloc:
        raise UserError(
            f"{field}.url carries a user name or password (before '@'): never put secrets in "
            "rocky-vulkan.yaml (it is committed, and the URL goes into the image's recipe); give "
            "a direct download link that needs no login"
        )
    if parts.scheme.lower() not in SCHEMES or not parts.hostname:
        raise UserError(
            f"{field}.url: `model fetch` downloads over https (or http) only, not "
            f"{clean_text(parts.scheme, 20) or 'a URL without a scheme'}; give the model's "
            "direct https download link"
        )


def _redirect_target(current: str, location: str, url: str, field: str) -> str:
    """Where a redirect leads, if `model fetch` may follow it: http(s) only, never from https
    to http, no credentials. Messages name only the redirect's scheme and host."""
    try:
        location = location.encode("latin-1").decode("utf-8")  # as requests decodes it
    except UnicodeError:
        pass
    try:
        target = urljoin(current, location.strip())
        parts = urlsplit(target)
    except ValueError:
        parts, target = None, ""
    fix = f"check {field}.url (a direct download link)"
    if parts is None or not location.strip():
        raise DownloadError(f"{url}: the server redirects to an unusable Location; {fix}")
    if "@" in parts.netloc:
        raise DownloadError(
            f"{url}: the server redirects to a URL with a user name or password; refused (it "
            f"would be sent and shown); {fix}"
        )
    scheme = clean_text(parts.scheme, 20)
    if parts.scheme.lower() not in SCHEMES or not parts.hostname:
        raise DownloadError(
            f"{url}: the server redirects to a {scheme or 'scheme-less'}: URL; `model fetch` "
            f"follows http(s) redirects only; {fix}"
        )
    if urlsplit(current).scheme.lower() == "https" and parts.scheme.lower() == "http":
        raise DownloadError(
            f"{url}: the server redirects from https to plain http "
            f"({clean_text(parts.hostname, 100)}); refused, the file would come unprotected; {fix}"
        )
    return target


# --- the saved part and its state -----------------------------------------------------------------


def not_regular(path: Path) -> str | None:
    """None when `path` is absent or a regular file (not a link), else what it is, in words."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return file_kind(mode)


def _read_state(path: Path) -> dict[str, Any] | None:
    """The saved state beside the .part, or None when there is none fit to resume with (a
    file fetch did not write is never followed or waited on: no links, FIFOs, huge files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_STATE_BYTES:
            return None
        data = os.read(fd, MAX_STATE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not (
        isinstance(doc, dict)
        and isinstance(doc.get("url_sha256"), str)
        and doc.get("kind") in ("etag", "last-modified")
        and isinstance(doc.get("validator"), str)
        and 0 < len(doc["validator"]) <= MAX_VALIDATOR
        and type(doc.get("total")) is int
        and 0 < doc["total"] < 1 << 63
    ):
        return None
    return doc


def _validator(resp: requests.Response) -> tuple[str, str] | None:
    """(kind, value) of the response's If-Range validator: a strong ETag, else Last-Modified."""
    etag = resp.headers.get("ETag", "").strip()
    if etag and not etag.startswith("W/"):
        kind, value = "etag", etag
    else:
        kind, value = "last-modified", resp.headers.get("Last-Modified", "").strip()
    if not value or len(value) > MAX_VALIDATOR or not value.isascii() or not value.isprintable():
        return None
    return kind, value


def _content_length(resp: requests.Response) -> int | None:
    """The Content-Length when it is one plain number, else None (then the body ends where the
    server closes, and download's `shortfall` says whether that was the end of the file)."""
    value = resp.headers.get("Content-Length", "").strip()
    return int(value) if re.fullmatch(r"[0-9]{1,19}", value) else None


def _no_room_hint(err: OSError) -> str:
    if err.errno in NO_ROOM:
        return "free some space (or pass --dest a folder on a disk with room)"
    return "pass --dest a folder you can write"


def discard(*paths: Path) -> None:
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            raise DownloadError(
                f"cannot remove {path} ({err.strerror}); remove it by hand, then run the command "
                "again"
            ) from None


def _open_part(part: Path, append: bool) -> BinaryIO:
    """The .part for writing, never through a link and never a FIFO or device."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_TRUNC
    try:
        fd = os.open(part, flags, 0o644)
    except OSError as err:
        raise DownloadError(
            f"cannot write {part} ({err.strerror}); {_no_room_hint(err)}, then run the command "
            "again"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DownloadError(f"{part} is not a regular file; move it away, then run again")
    return os.fdopen(fd, "ab" if append else "wb", buffering=0)


def _write(fh: BinaryIO, chunk: bytes, part: Path) -> None:
    view = memoryview(chunk)
    try:
        while view:
            view = view[fh.write(view) :]
    except OSError as err:
        kept = part.stat().st_size if part.exists() else 0
        raise DownloadError(
            f"cannot write {part} ({err.strerror}, {kept} bytes written); {_no_room_hint(err)}, "
            "then run the command again"
        ) from None


# --- one attempt ----------------------------------------------------------------------------------


class _Transfer:
    """One attempt: a GET from where the .part ends (or from byte 0), its redirects and its
    body. It runs in a worker thread and `run` waits for it only until the clock runs out, so
    --max-time bounds every phase (DNS, connect, a status line dripped byte by byte, the body);
    once abandoned the worker writes nothing more."""

    def __init__(self, session, url, part, state, timeout, clock, bar, field, shortfall) -> None:
        self.session, self.url, self.part, self.state = session, url, part, state
        self.timeout, self.clock, self.bar, self.field = timeout, clock, bar, field
        self.shortfall = shortfall
        self.lock = threading.Lock()
        self.abandoned = False
        self.saved: dict[str, Any] | None = None
        self.resp: requests.Response | None = None

    def run(self) -> None:
        box: list[BaseException] = []

        def work() -> None:
            try:
                self._attempt()
            except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
                box.append(err)

        worker = threading.Thread(target=work, name="model-fetch", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                left = self.clock.left()
                if left <= 0:
                    raise _OutOfTime
                worker.join(min(left, 0.25))
        finally:
            if worker.is_alive():
                self._abandon()
        if box:
            raise box[0]

    def _abandon(self) -> None:
        with self.lock:
            self.abandoned = True
        resp = self.resp
        if resp is not None:
            try:  # wakes the worker if it is reading the body
                resp.close()
            except Exception:  # noqa: BLE001, S110 - the worker is being dropped either way
                pass

    def _resume_offset(self) -> int:
        """Bytes of the .part to resume after, or 0 (then any .part is discarded): only a part
        whose saved state names this URL, a validator and a length beyond the part."""
        problem = not_regular(self.part)
        if problem:
            raise DownloadError(f"{self.part} is {problem}; move it away, then run again")
        size = self.part.stat().st_size if self.part.exists() else 0
        saved = _read_state(self.state) if size else None
        url_sha = hashlib.sha256(self.url.encode()).hexdigest()
        if saved and saved["url_sha256"] == url_sha and size < saved["total"]:
            self.saved = saved
            return size
        if size or self.state.exists():
            with self.lock:
                if not self.abandoned:
                    discard(self.part, self.state)
        return 0

    def _get(self, headers: dict[str, str]) -> requests.Response:
        """The response after following at most MAX_REDIRECTS redirects, each checked."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            left = self.clock.left()
            if left <= 0:
                raise _OutOfTime
            capped = (min(self.timeout[0], left), min(self.timeout[1], left))
            resp = self.session.get(
                url, headers=headers, stream=True, timeout=capped, allow_redirects=False
            )
            if not (300 <= resp.status_code < 400 and "Location" in resp.headers):
                return resp
            location = resp.headers["Location"]
            resp.close()
            url = _redirect_target(url, location, self.url, self.field)
        raise DownloadError(
            f"{self.url}: more than {MAX_REDIRECTS} redirects (a redirect loop?); check "
            f"{self.field}.url (a direct download link)"
        )

    def _attempt(self) -> None:
        offset = self._resume_offset()
        # The bytes as stored: Range offsets and Content-Length then count the same bytes.
        headers = {"Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            headers["If-Range"] = self.saved["validator"]
        with self._get(headers) as resp:
            self.resp = resp
            total = self._check_answer(resp, offset)
            if resp.status_code != 206:
                offset = 0
            if total is not None:
                self._check_room(total - offset)
            with self.lock:
                if self.abandoned:
                    return
                # A new whole file: its state is saved only once the old part is gone, so a
                # kill in between never leaves one file's part under another's validator.
                if resp.status_code == 200:
                    discard(self.state)
                fh = _open_part(self.part, append=offset > 0)
                if resp.status_code == 200:
                    self._save_state(resp, total)
            bar = self.bar
            bar.update(bar.task_ids[0], total=total, completed=offset)
            with fh:
                for chunk in _pieces(resp):
                    with self.lock:
                        if self.abandoned:
                            return
                        _write(fh, chunk, self.part)
                    self.clock.got_bytes()
                    bar.advance(bar.task_ids[0], len(chunk))
                    if self.clock.deadline_left() <= 0:
                        raise _OutOfTime
        size = self.part.stat().st_size
        if total is not None and size > total:
            raise _StartOver(f"the server sent {size - total} bytes more than it announced")
        if total is not None and size != total:
            raise requests.exceptions.ChunkedEncodingError(f"got {size} of {total} bytes")
        short = self.shortfall(self.part) if total is None and self.shortfall else None
        if short:
            raise requests.exceptions.ChunkedEncodingError(short)

    def _check_answer(self, resp: requests.Response, offset: int) -> int | None:
        """The file's length when known; raises for an answer that is not (the rest of) it."""
        status, url, field = resp.status_code, self.url, self.field
        reason = clean_text(resp.reason or "", 80)
        if status == 416 and offset:
            raise _StartOver(
                f"the server has nothing past byte {offset} of the saved part: it is not part "
                "of this file"
            )
        if status in PERMANENT:
            raise DownloadError(
                f"{url}: HTTP {status} {reason}; check {field}.url in rocky-vulkan.yaml (and "
                "access to the file)"
            )
        if status >= 500 or status in (408, 425, 429):
            resp.raise_for_status()
        if 300 <= status < 400:
            raise DownloadError(
                f"{url}: the server answered HTTP {status} {reason}, a redirect without a "
                f"Location to follow; check {field}.url in rocky-vulkan.yaml (a direct link)"
            )
        if status not in (200, 206):
            raise DownloadError(
                f"{url}: the server answered HTTP {status} {reason}, not the file; check "
                f"{field}.url in rocky-vulkan.yaml (a direct download link)"
            )
        encoding = resp.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise DownloadError(
                f"{url}: the server sent the file with Content-Encoding "
                f"{clean_text(encoding, 40)!r} although asked for the bytes as stored, so what "
                f"arrives is not the file; try again later or use another link in {field}.url"
            )
        length = _content_length(resp)
        if status == 200:
            return length
        if not offset or self.saved is None:
            raise DownloadError(
                f"{url}: the server answered 206 (a part) to a request for the whole file; "
                f"check {field}.url (a direct download link)"
            )
        total = self.saved["total"]
        got = resp.headers.get("Content-Range", "").strip()
        m = re.fullmatch(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19})", got)
        if not m or tuple(int(g) for g in m.groups()) != (offset, total - 1, total):
            raise _StartOver(
                f"the server's part ({clean_text(got, 80) or 'no Content-Range'}) does not "
                f"continue the saved {offset} of {total} bytes"
            )
        if length is not None and length != total - offset:
            raise _StartOver(f"the server's part is {length} bytes, not the {total - offset} left")
        if _validator(resp) != (self.saved["kind"], self.saved["validator"]):
            raise _StartOver("the file on the server changed since the saved part was downloaded")
        return total

    def _check_room(self, need: int) -> None:
        folder = self.part.parent
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return
        if need > free:
            raise DownloadError(
                f"{self.url}: the server says {need} more bytes are coming, but {folder} has "
                f"{free} bytes free; free some space (or pass --dest a folder on a disk with "
                "room), then run the command again"
            )

    def _save_state(self, resp: requests.Response, total: int | None) -> None:
        """What a later resume needs to ask for the same file (If-Range) and check its length;
        without a validator and a length a cut download starts over."""
        validator = _validator(resp)
        if validator is None or total is None:
            return
        try:
            doc = {
                "url_sha256": hashlib.sha256(self.url.encode()).hexdigest(),
                "kind": validator[0],
                "validator": validator[1],
                "total": total,
            }
            write_atomic(str(self.state), json.dumps(doc).encode())
        except OSError as err:
            raise DownloadError(
                f"cannot write {self.state} ({err.strerror}); {_no_room_hint(err)}, then run the "
                "command again"
            ) from None


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
    """One short line for a failed attempt (no repr of urllib3 objects, no wrapped tracebacks,
    nothing from the server that could drive the terminal)."""
    return clean_text(_describe(err, url), 100)


def _describe(err: BaseException, url: str) -> str:
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
    return text


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
    shortfall: Callable[[Path], str | None] | None = None,
) -> Path:
    """Download `url` into `dest`.part, resuming what is there when it is provably a part of
    the same file; return the .part path. `field`: the config section the URL comes from, for
    messages; `shortfall(part)`: why a body that ended where the server closed (no
    Content-Length) is not the whole file, or None.

    Gives up after `retries` retries, after `max_time_s` in all, or when no byte arrived for
    `stall_s` (across retries), whichever comes first."""
    part = dest.with_name(dest.name + ".part")
    state = dest.with_name(dest.name + STATE_SUFFIX)
    own = session is None
    session = session or requests.Session()
    clock = _Clock(max_time_s, stall_s)
    last_error, started, failed, start_overs = "", 0, 0, 0
    try:
        with _progress(progress) as bar:
            bar.add_task(dest.name, total=None)
            while True:
                started += 1
                try:
                    _Transfer(
                        session, url, part, state, timeout, clock, bar, field, shortfall
                    ).run()
                    return part
                except DownloadError:
                    raise
                except _OutOfTime:
                    last_error = clock.why()
                    break
                except _StartOver as err:
                    discard(part, state)
                    last_error = f"{err}; started over"
                    if start_overs < MAX_START_OVERS:
                        start_overs += 1
                        _say(bar, f"{err}: starting over from the first byte")
                        continue
                except RETRYABLE as err:
                    last_error = describe_error(err, url)
                failed += 1
                if failed > retries:
                    break
                wait = min(backoff_s * (2 ** (failed - 1)), max(clock.left(), 0.0))
                _say(bar, f"attempt {failed} failed: {last_error}; retry in {wait:.0f} s")
                time.sleep(wait)
    finally:
        if own:
            session.close()
    have = part.stat().st_size if part.exists() else 0
    if part.exists() and not have:
        discard(part, state)  # an empty .part resumes nothing
    resumable = have and _read_state(state) is not None
    kept = (
        f"{have} bytes kept in {part}: run the command again to resume"
        if resumable
        else f"{have} bytes kept in {part}, but the server gave nothing to resume them with; "
        "run the command again (it starts over)"
        if have
        else f"nothing was downloaded: check the network and {field}.url, then run it again"
    )
    raise DownloadError(
        f"{url}: download failed after {started} attempt{'s' if started > 1 else ''} "
        f"({last_error}); {kept}"
    )
