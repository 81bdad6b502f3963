"""One GGUF model into a .part file on the board, provably the file asked for (standard library
only: this runs on the board as `rocky-llm pull` and behind the Ollama API's /api/pull).

- From http(s): resumed only with If-Range and a Content-Range that continues the saved part of
  the same file; redirects checked (http(s) only, never https to http, no credentials); every
  read bounded by a stall timeout and the whole fetch by a deadline; the file's announced size
  checked against the free space before a byte is written.
- From a local file (copied to the board with scp): a regular file only, copied in chunks.

Either way the sha256 is computed over every byte of the .part; the caller (model_store)
checks it, the size and the GGUF header before the model is offered.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from .files import UnreadableFile, os_error_text, read_json
from .results import write_atomic

CHUNK = 256 << 10
MAX_REDIRECTS = 10
STATE_SUFFIX = ".json"  # beside the .part: the validator and length a resume must match
MAX_STATE_BYTES = 4096
MAX_VALIDATOR = 512
NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
# Kept free on the store's disk beyond the model: the board's journal, logs and the KV cache
# spill must not find a full disk.
KEEP_FREE_BYTES = 1 << 30
Progress = Callable[[int, int | None], None]  # (bytes so far, total or None)


class FetchError(Exception):
    """The fetch failed; the message names the cause and the fix."""


@dataclass(frozen=True)
class Fetched:
    part: str
    size: int
    sha256: str


def check_url(url: str) -> None:
    """Refuse a URL the board must not fetch: not http(s), no host, credentials in it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise FetchError("the URL is not usable; give the model's direct download link") from None
    if not url.isprintable() or any(c.isspace() for c in url) or len(url) > 4096:
        raise FetchError("the URL has spaces or control characters; give the direct link")
    if "@" in parts.netloc:
        raise FetchError(
            "the URL carries a user name or password (before '@'); give a direct download link "
            "that needs no login"
        )
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise FetchError("the board pulls over https (or http) only; give the direct https link")


def free_bytes(folder: str) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def check_room(folder: str, need: int) -> None:
    """FetchError unless `need` bytes fit in `folder` with KEEP_FREE_BYTES to spare."""
    free = free_bytes(folder)
    if free is not None and need + KEEP_FREE_BYTES > free:
        gib = 1 << 30
        raise FetchError(
            f"the model needs {need / gib:.2f} GiB but {folder} has {free / gib:.2f} GiB free "
            f"({KEEP_FREE_BYTES / gib:.0f} GiB is kept free for the system); remove a model "
            "(`rocky-llm rm NAME`) or free space, then pull again"
        )


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to http(s), never from https to http, never with credentials."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urljoin(req.full_url, newurl)
        parts = urlsplit(target)
        if "@" in parts.netloc:
            raise FetchError("the server redirects to a URL with a user name or password")
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise FetchError("the server redirects to a URL that is not http(s)")
        if urlsplit(req.full_url).scheme.lower() == "https" and parts.scheme.lower() == "http":
            raise FetchError("the server redirects from https to plain http; refused")
        new = super().redirect_request(req, fp, code, msg, headers, target)
        if new is not None:  # the Range of a resume goes on to the file's real home
            for name in ("Range", "If-range", "Accept-encoding"):
                if req.has_header(name):
                    new.add_unredirected_header(name, req.get_header(name))
        return new


_OPENER = urllib.request.build_opener(_Redirects)


def _validator(headers) -> tuple[str, str] | None:
    etag = (headers.get("ETag") or "").strip()
    if etag and not etag.startswith("W/"):
        kind, value = "etag", etag
    else:
        kind, value = "last-modified", (headers.get("Last-Modified") or "").strip()
    if not value or len(value) > MAX_VALIDATOR or not value.isascii() or not value.isprintable():
        return None
    return kind, value


def _length(headers) -> int | None:
    value = (headers.get("Content-Length") or "").strip()
    return int(value) if re.fullmatch(r"[0-9]{1,19}", value) else None


def _read_state(path: str, url: str) -> dict | None:
    try:
        doc = read_json(path, MAX_STATE_BYTES, follow_links=False)
    except (OSError, UnreadableFile):
        return None
    ok = (
        isinstance(doc, dict)
        and doc.get("url") == url
        and doc.get("kind") in ("etag", "last-modified")
        and isinstance(doc.get("validator"), str)
        and 0 < len(doc["validator"]) <= MAX_VALIDATOR
        and type(doc.get("total")) is int
        and 0 < doc["total"] < 1 << 63
    )
    return doc if ok else None


def discard(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _open_part(part: str, append: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_TRUNC
    fd = os.open(part, flags, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FetchError(f"{part} is not a regular file; remove it, then pull again")
    return fd


def _hash_existing(part: str, size: int) -> hashlib._Hash:
    digest = hashlib.sha256()
    with open(part, "rb") as fh:
        left = size
        while left:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                raise FetchError(f"{part} shrank while it was read; pull again")
            digest.update(chunk)
            left -= len(chunk)
    return digest


def _write_all(fd: int, data: bytes, part: str) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as err:
        if err.errno in NO_ROOM:
            os.close(fd)
            discard(part, part + STATE_SUFFIX)  # a full disk hurts the whole board: give it back
            raise FetchError(
                f"the disk filled up while writing the model ({os_error_text(err)}); the partial "
                "file was removed; free space or remove a model (`rocky-llm rm NAME`), then pull "
                "again"
            ) from None
        raise FetchError(f"cannot write {part}: {os_error_text(err)}") from None


def _request(url: str, offset: int, state: dict | None, timeout: float):
    headers = {"Accept-Encoding": "identity", "User-Agent": "rocky-llm"}
    if offset and state:
        headers["Range"] = f"bytes={offset}-"
        headers["If-Range"] = state["validator"]
    req = urllib.request.Request(url, headers=headers)
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and offset:
            return None  # nothing past the saved part: it is not this file's; start over
        hint = "check the URL (a direct download link that needs no login)"
        if err.code in (400, 401, 403, 404, 410):
            raise FetchError(f"HTTP {err.code} from the server; {hint}") from None
        raise _Retry(f"HTTP {err.code} from the server") from None
    except FetchError:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, FetchError):
            raise reason from None
        raise _Retry(f"cannot reach the server ({_words(reason)})") from None


class _Retry(Exception):
    """One attempt failed in a way another attempt may not."""


def _words(err: object) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = " ".join(str(err).split())[:120]
    return text or type(err).__name__


def _attempt(url, part, state_path, deadline, stall_s, progress) -> Fetched:
    """One GET from where the .part ends (or from 0); returns when the body is complete."""
    size = os.lstat(part).st_size if os.path.lexists(part) else 0
    state = _read_state(state_path, url) if size else None
    if size and (state is None or size >= state["total"]):
        discard(part, state_path)
        size, state = 0, None
    # The socket timeout bounds the connect and every read: a stalled server is a retry.
    timeout = max(min(stall_s, deadline - time.monotonic()), 0.1)
    resp = _request(url, size, state, timeout)
    if resp is None:
        discard(part, state_path)
        raise _Retry("the server has nothing past the saved part: started over")
    with resp:
        status = resp.status
        if status not in (200, 206):
            raise FetchError(f"the server answered HTTP {status}, not the file; check the URL")
        encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise FetchError("the server sent the file compressed although asked not to")
        length = _length(resp.headers)
        if status == 206:
            want = f"bytes {size}-{state['total'] - 1}/{state['total']}" if state else None
            got = (resp.headers.get("Content-Range") or "").strip()
            same = _validator(resp.headers) == (state["kind"], state["validator"]) if state else 0
            if not size or got != want or not same:
                discard(part, state_path)
                raise _Retry("the server's part does not continue the saved one: started over")
            total = state["total"]
            digest = _hash_existing(part, size)
        else:
            size, total, digest = 0, length, hashlib.sha256()
            discard(state_path)
            if total is None:
                raise FetchError(
                    "the server does not say how large the file is (no Content-Length); the "
                    "board pulls only files of known size: use another link, or scp the file "
                    "to the board and pull it from there"
                )
        check_room(os.path.dirname(part), total - size)
        fd = _open_part(part, append=size > 0)
        try:
            validator = _validator(resp.headers)
            if status == 200 and validator:
                doc = {"url": url, "kind": validator[0], "validator": validator[1], "total": total}
                write_atomic(state_path, json.dumps(doc).encode())
            while size < total:
                if time.monotonic() > deadline:
                    raise _OutOfTime
                try:
                    chunk = resp.read1(min(CHUNK, total - size))  # what has arrived
                except (OSError, http.client.HTTPException) as err:
                    raise _Retry(f"the connection broke ({_words(err)})") from None
                if not chunk:
                    raise _Retry(f"the server closed the connection at {size} of {total} bytes")
                _write_all(fd, chunk, part)
                digest.update(chunk)
                size += len(chunk)
                progress(size, total)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    discard(state_path)
    return Fetched(part, size, digest.hexdigest())


class _OutOfTime(Exception):
    pass


def fetch_url(
    url: str,
    part: str,
    *,
    retries: int = 5,
    max_time_s: float = 6 * 3600.0,
    stall_s: float = 60.0,
    backoff_s: float = 2.0,
    progress: Progress = lambda done, total: None,
) -> Fetched:
    """Download `url` into `part` (resuming a part of the same file); FetchError for good."""
    check_url(url)
    state_path = part + STATE_SUFFIX
    deadline = time.monotonic() + max_time_s
    why = ""
    for attempt in range(retries + 1):
        try:
            return _attempt(url, part, state_path, deadline, stall_s, progress)
        except _OutOfTime:
            why = f"gave up after {max_time_s:g} s"
            break
        except _Retry as err:
            why = str(err)
        if time.monotonic() + backoff_s > deadline:
            break
        if attempt < retries:
            time.sleep(backoff_s * (2**attempt))
    kept = os.lstat(part).st_size if os.path.lexists(part) else 0
    resume = f"; {kept} bytes kept: pull again to resume" if kept else ""
    raise FetchError(f"download failed ({why}){resume}")


def copy_local(source: str, part: str, progress: Progress = lambda d, t: None) -> Fetched:
    """Copy a regular file (never a FIFO, device or directory) into `part`, hashing it."""
    try:
        src = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise FetchError(f"cannot read {source}: {os_error_text(err)}") from None
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            raise FetchError(f"{source} is not a regular file; give the path of the .gguf file")
        total = info.st_size
        check_room(os.path.dirname(part), total)
        discard(part + STATE_SUFFIX)
        fd = _open_part(part, append=False)
        digest, size = hashlib.sha256(), 0
        try:
            while chunk := os.read(src, CHUNK):
                _write_all(fd, chunk, part)
                digest.update(chunk)
                size += len(chunk)
                progress(size, total)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    finally:
        os.close(src)
    return Fetched(part, size, digest.hexdigest())
