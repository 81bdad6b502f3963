"""`rocky-vulkan model fetch` against a real HTTP server on 127.0.0.1 that cuts connections,
ignores or honours Range, stalls, or has no such file."""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.model import fetch_model

pytestmark = pytest.mark.timeout(60)

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
OTHER = b"\x55" * len(PAYLOAD)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that timed out leaves a broken pipe behind: expected here


class Server:
    def __init__(self) -> None:
        self.mode = "ok"
        self.body = PAYLOAD
        self.requests: list[str | None] = []  # the Range header of each GET
        self.stall_first = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                server.requests.append(self.headers.get("Range"))
                first = len(server.requests) == 1
                if server.mode == "404":
                    self.send_error(404, "Not Found")
                    return
                if server.mode == "stall" or (server.stall_first and first):
                    time.sleep(server.stall_first or 3)
                body, start = server.body, 0
                m = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if m and server.mode != "no-range":
                    start = int(m.group(1))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                rest = body[start:]
                self.send_header("Content-Length", str(len(rest)))
                self.end_headers()
                if server.mode == "cut-once" and first:
                    # Half the body, then the connection dies.
                    self.wfile.write(rest[: len(rest) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(rest)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/models/test-model.gguf"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.close()


def _project(tmp_path: Path, url: str, sha: str | None) -> Path:
    from .conftest import ROOT

    text = (ROOT / "rocky-vulkan.yaml").read_text()
    head, model = text.split("\nmodel:\n", 1)
    model = re.sub(r"(?m)^  url: .*$", f"  url: {url}", model, count=1)
    model = re.sub(r"(?m)^  filename: .*$", "  filename: test-model.gguf", model, count=1)
    model = re.sub(
        r"(?m)^  sha256: .*$", f"  sha256: {sha or 'null'}  # pinned by fetch", model, count=1
    )
    path = tmp_path / "rocky-vulkan.yaml"
    path.write_text(head + "\nmodel:\n" + model)
    shutil.copytree(ROOT / "patches", tmp_path / "patches")  # the config names patches
    return path


FAST = dict(retries=3, backoff_s=0.0, timeout=(2.0, 1.0), progress=False)


def test_resume_after_cut_connection_then_pin_the_one_line(tmp_path, server):
    server.mode = "cut-once"
    cfg = _project(tmp_path, server.url, None)
    before = cfg.read_text().splitlines()
    path, sha, pinned = fetch_model(cfg, tmp_path / "models", **FAST)
    assert path.read_bytes() == PAYLOAD
    assert sha == hashlib.sha256(PAYLOAD).hexdigest() and pinned
    assert server.requests[0] is None
    assert server.requests[1] == f"bytes={len(PAYLOAD) // 2}-"  # resumed, not restarted
    after = cfg.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [("  sha256: null  # pinned by fetch", f"  sha256: {sha}  # pinned by fetch")]
    assert load_config(cfg).model.sha256 == sha
    assert not (tmp_path / "models/test-model.gguf.part").exists()


def test_verified_file_is_not_downloaded_again(tmp_path, server):
    cfg = _project(tmp_path, server.url, hashlib.sha256(PAYLOAD).hexdigest())
    (tmp_path / "models").mkdir()
    (tmp_path / "models/test-model.gguf").write_bytes(PAYLOAD)
    fetch_model(cfg, tmp_path / "models", **FAST)
    assert server.requests == []


def test_server_ignoring_range_restarts_cleanly(tmp_path, server):
    server.mode = "no-range"
    (tmp_path / "models").mkdir()
    (tmp_path / "models/test-model.gguf.part").write_bytes(b"stale bytes from elsewhere")
    cfg = _project(tmp_path, server.url, hashlib.sha256(PAYLOAD).hexdigest())
    path, _, pinned = fetch_model(cfg, tmp_path / "models", **FAST)
    assert path.read_bytes() == PAYLOAD and not pinned


def test_wrong_checksum_replaces_nothing_and_says_what_to_do(tmp_path, server):
    server.body = OTHER
    expected = hashlib.sha256(PAYLOAD).hexdigest()
    cfg = _project(tmp_path, server.url, expected)
    config_before = cfg.read_text()
    dest = tmp_path / "models/test-model.gguf"
    dest.parent.mkdir()
    dest.write_bytes(b"an older copy the user still has")
    with pytest.raises(UserError) as err:
        fetch_model(cfg, tmp_path / "models", **FAST)
    msg = str(err.value)
    assert hashlib.sha256(OTHER).hexdigest() in msg and expected in msg
    assert "Nothing was replaced" in msg and "rocky-vulkan render" in msg
    assert dest.read_bytes() == b"an older copy the user still has"
    assert (tmp_path / "models/test-model.gguf.sha256-mismatch").read_bytes() == OTHER
    assert cfg.read_text() == config_before


def test_404_fails_at_once_with_the_url(tmp_path, server, capsys):
    server.mode = "404"
    cfg = _project(tmp_path, server.url, None)
    rc = main(["--config", str(cfg), "model", "fetch", "--dest", str(tmp_path / "m"),
               "--no-progress"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "HTTP 404" in err and server.url in err and "model.url" in err
    assert len(server.requests) == 1  # a 404 is not retried
    assert not (tmp_path / "m/test-model.gguf").exists()


def test_stalled_first_response_times_out_and_the_retry_succeeds(tmp_path, server):
    server.stall_first = 3.0
    cfg = _project(tmp_path, server.url, hashlib.sha256(PAYLOAD).hexdigest())
    t0 = time.monotonic()
    path, _, _ = fetch_model(cfg, tmp_path / "models", **FAST)
    assert path.read_bytes() == PAYLOAD
    assert len(server.requests) == 2 and time.monotonic() - t0 < 10


def test_server_that_always_stalls_gives_up_keeping_the_part(tmp_path, server):
    server.mode = "stall"
    cfg = _project(tmp_path, server.url, None)
    with pytest.raises(UserError, match=r"failed after 2 attempts.*run the command again"):
        fetch_model(cfg, tmp_path / "models", **{**FAST, "retries": 1})
    assert load_config(cfg).model.sha256 is None
    assert not (tmp_path / "models/test-model.gguf").exists()


def test_cli_says_to_render_after_pinning(tmp_path, server, capsys):
    cfg = _project(tmp_path, server.url, None)
    rc = main(["--config", str(cfg), "model", "fetch", "--dest", str(tmp_path / "m"),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "verified" in out and "run `rocky-vulkan render`" in out
    # A second fetch finds the verified file and neither downloads nor pins again.
    assert main(["--config", str(cfg), "model", "fetch", "--dest", str(tmp_path / "m")]) == 0
    assert len(server.requests) == 1 and "pinned" not in capsys.readouterr().out


def test_pin_refuses_a_config_without_the_null_line(tmp_path):
    from rocky_vulkan.model import pin_sha256

    cfg = _project(tmp_path, "https://example.invalid/m.gguf", "cd" * 32)
    before = cfg.read_text()
    with pytest.raises(UserError, match="no `sha256: null` line under model:"):
        pin_sha256(cfg, "ab" * 32)
    assert cfg.read_text() == before
