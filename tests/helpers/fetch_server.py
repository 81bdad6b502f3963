"""A raw-socket HTTP server on 127.0.0.1 for the model-fetch tests: a script answers each
request byte by byte, so it can cut a body, drip a status line, lie in Content-Range or send what
no well-behaved server (http.server included) would."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

REASONS = {200: "OK", 206: "Partial Content", 301: "Moved Permanently", 302: "Found",
           303: "See Other", 307: "Temporary Redirect", 308: "Permanent Redirect",
           416: "Range Not Satisfiable"}  # fmt: skip


@dataclass(frozen=True)
class Req:
    method: str
    target: str
    headers: dict[str, str]  # names in lower case


class RawServer:
    """`with RawServer(script) as srv:` serves srv.url; script(n, req, srv) answers request n
    (from 1) with srv.send / respond; the connection is closed when it returns."""

    def __init__(self, script: Callable[[int, Req, RawServer], None], path: str = "/m/x.gguf"):
        self.script, self.path = script, path
        self.requests: list[Req] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RawServer:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # frees a client still blocked on us
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=1.0)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        self._local.conn = conn
        try:
            req = _read_request(conn)
            if req is None:
                return
            with self._lock:
                self.requests.append(req)
                n = len(self.requests)
            self.script(n, req, self)
        except Exception:  # noqa: BLE001 - a client that hung up: its problem, not ours
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def send(self, data: bytes) -> bool:
        """Send on this request's connection; False once the client is gone."""
        if self._stop.is_set():
            return False
        try:
            self._local.conn.sendall(data)
            return True
        except OSError:
            return False


def _read_request(conn: socket.socket) -> Req | None:
    conn.settimeout(5.0)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) > 65536:
            return None
        data += chunk
    conn.settimeout(None)
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    method, target, _ = (lines[0].split(" ") + ["", ""])[:3]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Req(method, target, headers)


def respond(
    srv: RawServer,
    status: int,
    headers: list[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    cut: int | None = None,
    length: bool = True,
    length_value: int | None = None,
) -> None:
    """One response: `headers`, Content-Length (unless length=False; length_value to lie),
    then `body`, or its first `cut` bytes before the connection is cut."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length:
        lines.append(f"Content-Length: {len(body) if length_value is None else length_value}")
    lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    srv.send(head + (body if cut is None else body[:cut]))


def file_script(data: bytes, *, etag: str = '"v1"', cut_first_at: int | None = None):
    """A server with Range and If-Range, as a CDN answers; the first answer optionally cut."""

    def script(n, req, srv):
        rng = req.headers.get("range")
        if rng and req.headers.get("if-range") == etag:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            head = [("ETag", etag), ("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")]
            respond(srv, 206, head, data[start:])
            return
        cut = cut_first_at if n == 1 else None
        respond(srv, 200, [("ETag", etag)], data, cut=cut, length_value=len(data))

    return script
