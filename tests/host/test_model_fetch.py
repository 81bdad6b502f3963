"""`rocky-vulkan model fetch` against a real HTTP server on 127.0.0.1 that cuts connections,
ignores or honours Range, stalls, trickles, serves a login page, or has no such file; and
against a closed port (what an offline host sees)."""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import numpy as np
import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.model import fetch_model

pytestmark = pytest.mark.timeout(60)


def _gguf_bytes() -> bytes:
    """A real (1 MiB, one-tensor) GGUF file written by the gguf package."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_name("fetch-test")
        writer.add_tensor("w", (np.arange(256 * 1024, dtype=np.float32) % 251).reshape(256, 1024))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


PAYLOAD = _gguf_bytes()
OTHER = b"\x55" * len(PAYLOAD)
LOGIN_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>Login required</title></head>"
    b"<body><form action='/login'>Sign in to download this file</form></body></html>\n"
)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that timed out leaves a broken pipe behind: expected here


class Server:
    def __init__(self) -> None:
        self.mode = "ok"
        self.body = PAYLOAD
        self.requests: list[str | None] = []  # the Range header of each GET
        self.stall_first = 0.0
        self.stall_s = 3.0
        self.etag: str | None = '"v1"'  # what If-Range must name for a resume
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
                    time.sleep(server.stall_first or server.stall_s)
                body, start = server.body, 0
                m = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
                same = self.headers.get("If-Range") in (None, server.etag)
                if m and same and server.mode != "no-range":
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
                if server.etag:
                    self.send_header("ETag", server.etag)
                self.send_header("Content-Length", str(len(rest)))
                self.end_headers()
                if server.mode == "trickle":
                    # One byte every 0.1 s: every read gets data, no read timeout fires.
                    for i in range(len(rest)):
                        self.wfile.write(rest[i : i + 1])
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
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
    from tests.helpers.project import ROOT

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
    resumed_at = int(re.fullmatch(r"bytes=(\d+)-", server.requests[1]).group(1))
    # Resumed, not restarted: from what reached the .part (at most the half that was sent).
    assert 0 < resumed_at <= len(PAYLOAD) // 2
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


def test_server_that_always_stalls_gives_up_and_says_nothing_was_downloaded(tmp_path, server):
    server.mode = "stall"
    cfg = _project(tmp_path, server.url, None)
    with pytest.raises(UserError, match=r"failed after 2 attempts") as err:
        fetch_model(cfg, tmp_path / "models", **{**FAST, "retries": 1})
    # Not "0 bytes kept in ....part": no .part exists, and the message says what to check.
    assert "bytes kept" not in str(err.value) and "nothing was downloaded" in str(err.value)
    assert load_config(cfg).model.sha256 is None
    assert not (tmp_path / "models/test-model.gguf").exists()
    assert not (tmp_path / "models/test-model.gguf.part").exists()


def test_part_that_got_bytes_is_kept_and_named(tmp_path, server):
    server.mode = "cut-once"
    cfg = _project(tmp_path, server.url, None)
    with pytest.raises(UserError, match=r"\d+ bytes kept in .*\.part: run the command again"):
        fetch_model(cfg, tmp_path / "models", **{**FAST, "retries": 0})
    assert 0 < (tmp_path / "models/test-model.gguf.part").stat().st_size < len(PAYLOAD)


def test_stalled_server_is_bounded_by_the_overall_deadline(tmp_path, server):
    # Per-read timeouts alone (2 s connect, 1 s read, 50 retries) would take over 50 s here.
    server.mode = "stall"
    server.stall_s = 30.0
    cfg = _project(tmp_path, server.url, None)
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"gave up after --max-time 2\.5 s"):
        fetch_model(cfg, tmp_path / "models", **{**FAST, "retries": 50, "max_time_s": 2.5})
    assert time.monotonic() - t0 < 4.0
    assert not (tmp_path / "models/test-model.gguf").exists()


def test_stall_budget_counts_across_retries(tmp_path, server):
    server.mode = "stall"
    server.stall_s = 30.0
    cfg = _project(tmp_path, server.url, None)
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"no data for --stall-time 2\.5 s"):
        fetch_model(cfg, tmp_path / "models", **{**FAST, "retries": 50, "stall_s": 2.5})
    assert time.monotonic() - t0 < 4.0


def test_trickling_server_is_cut_at_the_deadline(tmp_path, server):
    # Data keeps arriving, so neither the read timeout nor the stall budget ever fires.
    server.mode = "trickle"
    cfg = _project(tmp_path, server.url, None)
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"gave up after --max-time 2 s.*bytes kept in"):
        fetch_model(cfg, tmp_path / "models", **{**FAST, "max_time_s": 2.0})
    assert time.monotonic() - t0 < 3.5
    assert not (tmp_path / "models/test-model.gguf").exists()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the with-block ends


def test_offline_each_retry_is_one_short_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{_closed_port()}/models/test-model.gguf"
    cfg = _project(tmp_path, url, None)
    args = ["--no-progress", "--retries", "2", "--retry-wait", "0", "--connect-timeout", "1"]
    rc = main(["--config", str(cfg), "model", "fetch", "--dest", str(tmp_path / "m"), *args])
    assert rc == 2
    lines = capsys.readouterr().err.strip().splitlines()
    retries = [line for line in lines if line.startswith("attempt ")]
    assert len(retries) == 2, lines
    for line in retries:
        assert "refused" in line and len(line) <= 100, line
    assert len(lines) == 3, lines  # the two retries and the final error, nothing else
    for text in ("HTTPConnectionPool", "object at 0x", "Caused by", "Traceback", "bytes kept"):
        assert text not in lines[-1]
    assert "nothing was downloaded" in lines[-1]
    assert not list((tmp_path / "m").iterdir())


def test_login_page_is_refused_not_pinned(tmp_path, server, capsys):
    server.body = LOGIN_PAGE
    cfg = _project(tmp_path, server.url, None)
    before = cfg.read_text()
    rc = main(["--config", str(cfg), "model", "fetch", "--dest", str(tmp_path / "m"),
               "--no-progress"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "not a GGUF model" in err and "HTML page" in err and "Nothing was pinned" in err
    assert cfg.read_text() == before
    assert not (tmp_path / "m/test-model.gguf").exists()
    assert not (tmp_path / "m/test-model.gguf.part").exists()  # not resumed into next time


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (PAYLOAD[:4] + (1).to_bytes(4, "little") + PAYLOAD[8:], "GGUF version 1"),
        (PAYLOAD[:4] + (3 << 24).to_bytes(4, "little") + PAYLOAD[8:], "GGUF version 50331648"),
        (PAYLOAD[:8] + (0).to_bytes(8, "little") + PAYLOAD[16:], "claims 0 tensors"),
        (PAYLOAD[:4096], "only 4096 bytes"),
        (b"GGUF\x03", "cut short"),
    ],
)
def test_implausible_gguf_is_refused_not_pinned(tmp_path, server, body, message):
    server.body = body
    cfg = _project(tmp_path, server.url, None)
    with pytest.raises(UserError, match=message):
        fetch_model(cfg, tmp_path / "models", **FAST)
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
    from rocky_vulkan.host.model import pin_sha256

    cfg = _project(tmp_path, "https://example.invalid/m.gguf", "cd" * 32)
    before = cfg.read_text()
    with pytest.raises(UserError, match="no `sha256: null` line under model:"):
        pin_sha256(cfg, "ab" * 32)
    assert cfg.read_text() == before


def _with_models(cfg: Path, url: str, served: str = "reference", sha: str | None = None) -> Path:
    """The project config with two models: entries (tiny: sha256 `sha`, other: pinned)."""
    block = (
        "models:\n"
        f"  - name: tiny\n    url: {url}/tiny\n    filename: tiny.gguf\n"
        f"    sha256: {sha or 'null'}\n    license: Apache-2.0\n    license_flags: ''\n"
        "    homepage: https://example.org/tiny\n"
        f"  - name: other\n    url: {url}/other\n    filename: other.gguf\n"
        f"    sha256: {'cd' * 32}\n    license: MIT\n    license_flags: ''\n"
        "    homepage: https://example.org/other\n"
    )
    text = cfg.read_text().replace("models: []\n", block, 1)
    cfg.write_text(text.replace("\n  model: reference\n", f"\n  model: {served}\n", 1))
    return cfg


def test_an_extra_model_is_fetched_and_its_own_line_pinned(tmp_path, server):
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    cfg = _with_models(_project(tmp_path, server.url, "ab" * 32), server.url)
    before = cfg.read_text().splitlines()
    path, got, pinned = fetch_model(cfg, tmp_path / "models", "tiny", **FAST)
    assert path == tmp_path / "models/tiny.gguf" and got == sha and pinned
    after = cfg.read_text().splitlines()
    assert [(a, b) for a, b in zip(before, after, strict=True) if a != b] == [
        ("    sha256: null", f"    sha256: {sha}")
    ]
    loaded = load_config(cfg)
    assert loaded.models[0].sha256 == sha and loaded.model.sha256 == "ab" * 32
    assert loaded.models[1].sha256 == "cd" * 32


def test_a_wrong_checksum_of_an_extra_model_names_its_entry(tmp_path, server):
    cfg = _with_models(_project(tmp_path, server.url, "ab" * 32), server.url)
    with pytest.raises(UserError, match=r"models\[1\]\.sha256 in rocky-vulkan\.yaml is cdcd") as e:
        fetch_model(cfg, tmp_path / "models", "other", **FAST)
    assert "`rocky-vulkan model fetch other` again" in str(e.value)
    assert (tmp_path / "models/other.gguf.sha256-mismatch").exists()


def test_cli_fetches_the_reference_and_the_served_model_by_default(tmp_path, server, capsys):
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    cfg = _with_models(_project(tmp_path, server.url, None), server.url, served="tiny")
    dest = tmp_path / "m"
    args = ["--config", str(cfg), "model", "fetch", "--dest", str(dest), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "pinned model.sha256" in out and "pinned models[0].sha256" in out
    assert out.rstrip().endswith("now run `rocky-vulkan render` and commit both")
    assert sorted(p.name for p in dest.iterdir()) == ["test-model.gguf", "tiny.gguf"]
    loaded = load_config(cfg)
    assert loaded.model.sha256 == sha and loaded.models[0].sha256 == sha
    assert server.requests == [None, None]  # `other` (not served) was not downloaded


def test_cli_fetches_named_models_and_refuses_unknown_names(tmp_path, server, capsys):
    cfg = _with_models(_project(tmp_path, server.url, None), server.url)
    dest = tmp_path / "m"
    args = ["--config", str(cfg), "model", "fetch", "--dest", str(dest), "--no-progress"]
    assert main([*args, "nope"]) == 2
    err = capsys.readouterr().err
    assert "no model named 'nope'" in err and "reference, tiny, other" in err
    assert main([*args, "tiny", "--all"]) == 2
    assert "not both" in capsys.readouterr().err
    assert server.requests == []
    assert main([*args, "tiny"]) == 0
    assert [p.name for p in dest.iterdir()] == ["tiny.gguf"]
    assert load_config(cfg).model.sha256 is None  # the reference was not asked for


def test_pin_refuses_an_extra_model_that_is_already_pinned(tmp_path):
    from rocky_vulkan.host.model import pin_sha256

    cfg = _with_models(
        _project(tmp_path, "https://example.invalid/m.gguf", None), "https://x.invalid"
    )
    before = cfg.read_text()
    with pytest.raises(UserError, match="no `sha256: null` line under models: entry 'other'"):
        pin_sha256(cfg, "ab" * 32, "other")
    assert cfg.read_text() == before
