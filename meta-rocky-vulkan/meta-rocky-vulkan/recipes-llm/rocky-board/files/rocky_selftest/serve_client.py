"""A small client of llama-server's HTTP API for the `serving` step (plain HTTP on 127.0.0.1,
standard library http.client): /health, /props, /tokenize and a streamed /v1/completions.

Everything the server sends is hostile data: responses are read with size caps, every wait has a
deadline, the event stream is parsed line by line with a cap on a line, on the whole stream and
on the number of events, and numbers are checked to be finite. A problem is a reason (a string),
never an exception out of this module's measuring functions.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

MAX_BODY = 16 << 20  # /props, /tokenize, an error body
MAX_LINE = 1 << 20  # one line of the event stream
MAX_STREAM = 64 << 20  # the whole event stream
MAX_EVENTS = 1_000_000
POLL_S = 0.5


class ClientError(Exception):
    """The request failed or its answer is unusable; the message says how."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _finite(value: Any, positive: bool = False) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN / Infinity are refused like any other malformed text."""
    return json.loads(data, parse_constant=_reject_constant)


class Api:
    """One llama-server on host:port with its API key; every call has `timeout_s`. With `tls`
    (a context that pins the server's certificate) over HTTPS."""

    def __init__(self, host: str, port: int, key: str, tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port, self.key, self.tls = host, port, key, tls

    def _conn(self, timeout_s: float) -> http.client.HTTPConnection:
        timeout = max(timeout_s, 0.1)
        if self.tls is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.tls
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any, timeout_s: float) -> tuple[int, bytes]:
        """(status, body) of one request; ClientError on a connection problem or a body over
        MAX_BODY."""
        conn = self._conn(timeout_s)
        try:
            payload = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=payload, headers=self._headers())
            resp = conn.getresponse()
            data = resp.read(MAX_BODY + 1)
            if len(data) > MAX_BODY:
                raise ClientError(f"{path}: answer larger than {MAX_BODY} bytes")
            return resp.status, data
        except (OSError, http.client.HTTPException) as err:
            raise ClientError(f"{path}: {type(err).__name__}: {err}") from None
        finally:
            conn.close()

    def json_call(self, method: str, path: str, body: Any, timeout_s: float) -> Any:
        status, data = self.call(method, path, body, timeout_s)
        if status != 200:
            raise ClientError(f"{path}: HTTP {status}: {data[:200]!r}")
        try:
            return loads(data)
        except (ValueError, UnicodeDecodeError) as err:
            raise ClientError(f"{path}: not JSON ({err})") from None

    def healthy(self, timeout_s: float) -> bool:
        try:
            status, _ = self.call("GET", "/health", None, timeout_s)
        except ClientError:
            return False
        return status == 200

    def slot_context(self, timeout_s: float) -> int:
        """The context of one slot (/props default_generation_settings.n_ctx)."""
        props = self.json_call("GET", "/props", None, timeout_s)
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        n_ctx = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if not n_ctx:
            raise ClientError("/props: no default_generation_settings.n_ctx")
        return n_ctx

    def tokenize(self, text: str, timeout_s: float) -> list[int]:
        answer = self.json_call(
            "POST", "/tokenize", {"content": text, "add_special": False}, timeout_s
        )
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(_count(t) is not None for t in tokens):
            raise ClientError("/tokenize: no list of token ids")
        return tokens

    def prompt_tokens(self, text: str, n: int, timeout_s: float) -> list[int]:
        """Exactly n token ids: `text` repeated until the tokenizer gives at least n."""
        end = time.monotonic() + timeout_s
        once = self.tokenize(text, timeout_s)
        if not once:
            raise ClientError("/tokenize: the prompt text gives no tokens")
        tokens = once
        repeat = 1
        while len(tokens) < n:
            repeat = max(repeat + 1, math.ceil(n / len(once)) + 1)
            left = end - time.monotonic()
            if left <= 0:
                raise ClientError("/tokenize: out of time")
            tokens = self.tokenize(" ".join([text] * repeat), left)
        return tokens[:n]


def parse_timings(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The server's own `timings` of the final chunk, type-checked."""
    if not isinstance(value, dict):
        return None, f"timings is {type(value).__name__}, not an object"
    out: dict[str, Any] = {}
    for key in ("prompt_n", "predicted_n"):
        count = _count(value.get(key))
        if count is None:
            return None, f"timings.{key} is {value.get(key)!r}, not a count"
        out[key] = count
    cache_n = _count(value.get("cache_n"))
    out["cache_n"] = cache_n
    for key in ("prompt_ms", "predicted_ms"):
        number = _finite(value.get(key))
        if number is None or number < 0:
            return None, f"timings.{key} is {value.get(key)!r}, not a duration"
        out[key] = number
    for key in ("prompt_per_second", "predicted_per_second"):
        out[key] = _finite(value.get(key), positive=True)  # None: not measurable (n 0 or 1)
    return out, None


def consume_sse(
    readline: Callable[[int], bytes], clock: Callable[[], float], end: float
) -> tuple[dict[str, Any], str | None]:
    """Read a completion's event stream: the time of the first and last token chunk, how many,
    the last `timings`, whether [DONE] came. `readline(limit)` returns one line (b'' at the
    end); `end` is the clock value after which reading stops. (stats, reason or None)"""
    stats: dict[str, Any] = {"chunks": 0, "first_at": None, "last_at": None, "text_chars": 0}
    timings_raw: Any = None
    total = 0
    events = 0
    while True:
        if clock() > end:
            return stats, "the stream did not end in time"
        line = readline(MAX_LINE + 1)
        if not line:
            break
        total += len(line)
        if len(line) > MAX_LINE or total > MAX_STREAM:
            return stats, f"event stream over its size limit ({MAX_LINE} per line, {MAX_STREAM})"
        events += 1
        if events > MAX_EVENTS:
            return stats, f"more than {MAX_EVENTS} lines in the event stream"
        text = line.rstrip(b"\r\n")
        if not text or text.startswith(b":"):
            continue  # event separator or comment
        field, _, value = text.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"error":
            return stats, f"server error event: {value[:200]!r}"
        if field != b"data":
            continue
        if value == b"[DONE]":
            stats["done"] = True
            break
        try:
            chunk = loads(value)
        except (ValueError, UnicodeDecodeError):
            return stats, f"a data line is not JSON: {value[:80]!r}"
        if not isinstance(chunk, dict):
            return stats, "a data line is not a JSON object"
        if "error" in chunk:
            return stats, f"server error: {str(chunk['error'])[:200]}"
        if "timings" in chunk:
            timings_raw = chunk["timings"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            continue
        first = choices[0]
        piece = first.get("text") if isinstance(first, dict) else None
        if not isinstance(piece, str):
            return stats, "a chunk's choices[0].text is not a string"
        if piece or first.get("finish_reason") is None:
            now = clock()
            stats["chunks"] += 1
            stats["text_chars"] += len(piece)
            if stats["first_at"] is None:
                stats["first_at"] = now
            stats["last_at"] = now
    if timings_raw is None:
        return stats, "no chunk carried the server's timings"
    timings, reason = parse_timings(timings_raw)
    if reason:
        return stats, reason
    stats["timings"] = timings
    if stats["first_at"] is None:
        return stats, "no token arrived"
    return stats, None


def stream_completion(
    api: Api, body: dict[str, Any], timeout_s: float, clock: Callable[[], float] = time.monotonic
) -> tuple[dict[str, Any], str | None]:
    """POST /v1/completions with stream: true; stats with `sent_at` (just before the request
    went out) and consume_sse's fields, and the reason it failed, if it did."""
    end = clock() + timeout_s
    conn = api._conn(timeout_s)
    stats: dict[str, Any] = {}
    try:
        sent_at = clock()
        conn.request("POST", "/v1/completions", json.dumps(body).encode(), api._headers())
        resp = conn.getresponse()
        if resp.status != 200:
            data = resp.read(4096)
            return {"sent_at": sent_at}, f"/v1/completions: HTTP {resp.status}: {data[:200]!r}"

        def readline(limit: int) -> bytes:
            if conn.sock is not None:
                conn.sock.settimeout(max(end - clock(), 0.1))
            return resp.readline(limit)

        stats, reason = consume_sse(readline, clock, end)
        stats["sent_at"] = sent_at
        return stats, reason
    except (OSError, http.client.HTTPException) as err:
        return {**stats, "sent_at": stats.get("sent_at")}, (
            f"/v1/completions: {type(err).__name__}: {err}"
        )
    finally:
        conn.close()
