"""The board's server for real (issue 20): rocky-llm.service's ExecStart run here, exec'ing the
real llama-server (ROCKY_LLAMA_BIN_DIR) on the tiny test model, with keys and a certificate made
by `rocky-llm keys` (real openssl); the official `openai` client over HTTPS with the certificate
pinned; a bounded concurrent load; bad input (issue 20, point 7).

systemd is not running it (no PID 1 in CI): the test does the unit's part, see
tests/helpers/serve.py. The self-test's result is synthetic: its GPU checks failed, so the
server's settings put it on the CPU (`-ngl 0 -dev none`); test_serve_restart.py runs the GPU
placement on lavapipe. The tiny model has no chat template; llama-server b9101 then applies its
default (chatml), which is what these requests get.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import openai
import pytest
from rocky_selftest.serve_keys import cert_fingerprint

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.serve import (
    TEXT_ONLY,
    served_fingerprint,
    unit_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.needs_llama_bin]

MODEL_NAME = "reference"  # serve_model_name in the board's config: llama-server's --alias
LOAD_REQUESTS = 16
LOAD_TOKENS = 16
# Growth of the server's resident memory over all the bad input below, after warm-up.
RSS_GROWTH_LIMIT_KIB = 128 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with unit_server(tmp_path_factory, "serve", BIN_DIR) as (server, info, tmp):
        yield server, info


@pytest.fixture(scope="module")
def client(served):
    server, _ = served
    http = openai.DefaultHttpxClient(verify=server.ctx)
    with openai.OpenAI(
        base_url=f"https://127.0.0.1:{server.port}/v1",
        api_key=server.api_key,
        http_client=http,
        max_retries=0,
        timeout=300,
    ) as c:
        yield c


def _metrics(server) -> dict[str, float]:
    # The router forwards /metrics to the named model's llama-server.
    status, data = server.request("GET", f"/metrics?model={MODEL_NAME}", timeout=30)
    assert status == 200, data[:300]
    out = {}
    for line in data.decode().splitlines():
        m = re.match(r"llamacpp:(\w+) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_the_unit_command_execs_llama_server_with_the_derived_settings(served):
    server, info = served
    assert info["keys_output"].strip() == "made: API key, TLS certificate"
    # rocky-llm exec'd llama-server: the same process is now the binary from the bin dir.
    assert os.path.realpath(server.exe()) == os.path.realpath(Path(BIN_DIR) / "llama-server")
    plan = json.loads(info["settings_file"].read_text())
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in cmdline] == plan["command"]
    argv = plan["command"]
    # Router mode: the router's own argv holds what every model shares ...
    assert argv[argv.index("--models-preset") + 1] == str(info["presets"])
    assert argv[argv.index("--api-key-file") + 1] == str(info["cred_dir"] / "api-key")
    assert "-ngl" not in argv and "--ctx-size" not in argv
    # ... each model's own settings are its section of the preset file, as derived.
    assert plan["default"] == MODEL_NAME == plan["loaded_at_start"]
    assert plan["models"][MODEL_NAME]["settings"]["placement"]["value"] == "cpu"
    presets = configparser.ConfigParser()
    presets.read_string(info["presets"].read_text())
    assert presets.sections() == ["*", MODEL_NAME]  # the global section holds only the version
    section = presets[MODEL_NAME]
    assert section["n-gpu-layers"] == "0" and section["device"] == "none"
    assert section["parallel"] == "2"
    assert section["ctx-size"] == "1024"  # 512 per slot x 2 slots
    assert section["load-on-startup"] == "true"
    assert "serving on the CPU, not the GPU" in plan["warnings"][0]
    # The real router read them: the model is listed as loaded with those arguments.
    status, data = server.request("GET", "/models")
    assert status == 200, data[:300]
    (model,) = json.loads(data)["data"]  # the store's one model, no other preset
    assert model["id"] == MODEL_NAME
    assert model["status"]["value"] == "loaded", model
    child = model["status"]["args"]  # the child llama-server's argv, as the router ran it
    for flag, val in [("--n-gpu-layers", "0"), ("--device", "none"), ("--ctx-size", "1024"),
                      ("--parallel", "2"), ("--alias", MODEL_NAME)]:  # fmt: skip
        assert child[child.index(flag) + 1] == val, (flag, child)
    assert child[child.index("--host") + 1] == "127.0.0.1"  # children only on loopback


def test_tls_certificate_is_the_boards_and_pinned(served):
    server, info = served
    pinned = cert_fingerprint(str(info["cert"]))
    assert served_fingerprint(server.port) == pinned
    # openssl agrees with serve_keys' fingerprint.
    out = subprocess.run(
        ["openssl", "x509", "-in", str(info["cert"]), "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert out.strip().split("=", 1)[1] == pinned
    # The pinned context trusts it (hostname checked against the certificate's IP SAN) ...
    status, _ = server.request("GET", "/health", key=None)
    assert status == 200
    # ... a context with the system's CAs does not: the pin is what makes it trusted.
    default = ssl.create_default_context()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            default.wrap_socket(raw, server_hostname="127.0.0.1")


def test_models_lists_the_configured_name(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL_NAME in ids, ids


def test_chat_completion_and_stream_agree(client):
    messages = [{"role": "user", "content": "Write one word."}]
    common = dict(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    res = client.chat.completions.create(**common, logit_bias=TEXT_ONLY)
    choice = res.choices[0]
    assert res.usage.completion_tokens == 8 and choice.finish_reason == "length"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.message.role == "assistant"
    parts, finish = [], None
    for chunk in client.chat.completions.create(**common, logit_bias=TEXT_ONLY, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                parts.append(delta.content)
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and len(parts) >= 2
    # Greedy decoding of the same prompt: the stream carries the same text.
    assert "".join(parts) == choice.message.content


def test_wrong_or_missing_key_is_401(served, client):
    server, _ = served
    bad = client.with_options(api_key="rk-" + "0" * 48)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert err.value.status_code == 401
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, data = server.request("POST", "/v1/chat/completions", body, key=None)
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    for path in ("/props", "/metrics", "/slots"):
        assert server.request("GET", path, key=None)[0] == 401, path
    # b9101 keeps these public whatever the key: /health, /v1/models (and /models), the web
    # UI's files. /v1/models names the model without a key; recorded in docs/verification.
    assert server.request("GET", "/v1/models", key=None)[0] == 200
    assert server.request("GET", "/health", key=None)[0] == 200
    server.chat_ok()


class TestBadInput:
    """Issue 20, point 7: each bad request gets its answer, the server keeps serving (a normal
    request succeeds after each), and its memory stays bounded. What b9101 really answers is
    asserted, also where it is not a 4xx (docs/verification/serving.md lists those)."""

    @pytest.fixture(scope="class")
    @classmethod
    def baseline(cls, served):
        server, _ = served
        server.chat_ok()
        assert len(server.pids()) == 2  # the router and the model's llama-server
        return server.rss_kib()

    def test_prompt_longer_than_the_context_is_400(self, served, baseline):
        server, _ = served
        long = " ".join(f"word{i}" for i in range(2000))  # far over 512 tokens per slot
        messages = [{"role": "user", "content": long}]
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 4}
        status, data = server.request("POST", "/v1/chat/completions", body)
        err = json.loads(data)["error"]
        assert status == 400 and err["type"] == "exceed_context_size_error", data[:500]
        assert err["n_ctx"] == 512 and err["n_prompt_tokens"] > 512, err
        server.chat_ok()

    def test_malformed_json(self, served, baseline):
        server, _ = served
        status, data = server.request(
            "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"',
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        print(f"malformed JSON: {status} {data[:200]!r}")
        # b9101: nlohmann's parse_error is not a std::invalid_argument, so ex_wrapper (server.cpp)
        # answers 500 server_error, not 400. Asserted as it is; reported upstream-worthy.
        err = json.loads(data)["error"]
        assert status == 500 and err["type"] == "server_error", data[:500]
        assert "parse error" in err["message"]
        server.chat_ok()

    def test_valid_json_of_the_wrong_shape_is_400(self, served, baseline):
        server, _ = served
        body = {"model": MODEL_NAME, "messages": "hi"}
        status, data = server.request("POST", "/v1/chat/completions", body)
        print(f"messages not a list: {status} {data[:200]!r}")
        assert 400 <= status < 500, data[:500]
        server.chat_ok()

    def test_unknown_model_name_is_400_naming_it(self, served, baseline):
        server, _ = served
        body = {
            "model": "no-such-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "logit_bias": TEXT_ONLY,
        }
        status, data = server.request("POST", "/v1/chat/completions", body)
        print(f"unknown model: {status} {data[:300]!r}")
        # The router (b9101) refuses a model it has no preset for (the one-model server of
        # earlier images answered with its model: recorded in docs/verification/serving.md).
        assert status == 400 and b"no-such-model" in data, data[:500]
        del body["model"]
        status, data = server.request("POST", "/v1/chat/completions", body)
        print(f"no model: {status} {data[:300]!r}")
        assert status == 400 and b"model" in data, data[:500]
        server.chat_ok()

    def test_huge_body_is_413(self, served, baseline):
        """A body over cpp-httplib's payload limit (100 MiB in b9101's vendored copy): 413. The
        limit is enforced while reading, not from Content-Length: the server takes in up to
        100 MiB of a request before it refuses (docs/verification/serving.md)."""
        server, _ = served
        size = 101 * 1024 * 1024
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {server.api_key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n"
        ).encode()
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=120)
        with server.ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(head)
            block, sent = b'{"messages": "' + b"x" * (1 << 20), 0
            try:
                while sent < size:
                    n = min(len(block), size - sent)
                    tls.sendall(block[:n])
                    sent += n
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                pass  # the server stopped reading: its answer is already on the way
            answer = b""
            try:
                while not answer.endswith(b"\r\n\r\n") and len(answer) < 65536:
                    chunk = tls.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            except (ConnectionResetError, ssl.SSLError):
                pass
        status_line = answer.split(b"\r\n", 1)[0]
        print(f"{size} B body, {sent} B sent: {status_line!r}")
        assert status_line.startswith(b"HTTP/1.1 413"), answer[:500]
        server.chat_ok()

    def test_huge_body_without_the_key_is_401_unread(self, served, baseline):
        """The key is checked before the body is read (cpp-httplib's pre-routing handler): a
        client without the key cannot make the server buffer anything. Only the headers are
        sent; the 401 comes back at once."""
        server, _ = served
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {100 << 20}\r\n\r\n"
        ).encode()
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        with server.ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(head)
            answer = tls.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
        server.chat_ok()

    def test_large_prompt_under_the_limit_is_400(self, served, baseline):
        server, _ = served
        # ~1 MiB of prompt: b9101 tokenizes all of it (~620k tokens) before refusing it. Its
        # peak memory grows ~80x the prompt's size (docs/verification/serving.md: 16 MiB ->
        # 1.3 GiB peak): kept small here, reported.
        text = "lorem ipsum dolor sit amet " * (1024 * 1024 // 27)
        messages = [{"role": "user", "content": text}]
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 4}
        status, data = server.request("POST", "/v1/chat/completions", body, timeout=300)
        assert status == 400, data[:500]
        assert json.loads(data)["error"]["type"] == "exceed_context_size_error"
        server.chat_ok()

    def test_client_that_disconnects_mid_stream(self, served, baseline):
        server, _ = served
        offset = len(server.log.read_bytes())
        max_tokens = 400  # the slot has 512 tokens: room for all of them after the prompt
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": max_tokens,
            "stream": True,
            "logit_bias": TEXT_ONLY,
        }
        conn = server.connection(timeout=60)
        conn.request(
            "POST", "/v1/chat/completions", body=json.dumps(body),
            headers={"Authorization": f"Bearer {server.api_key}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        sock = conn.sock  # the router's streamed answer may leave conn.sock to the response
        res = conn.getresponse()
        assert res.status == 200
        first = res.readline()
        assert first.startswith(b"data: "), first
        sock.shutdown(socket.SHUT_RDWR)  # gone mid-stream, without reading the rest
        conn.close()
        deadline = time.monotonic() + 60
        while _metrics(server).get("requests_processing", 1) != 0:
            assert time.monotonic() < deadline, "the abandoned request still holds a slot"
            time.sleep(0.2)
        log = server.log.read_bytes()[offset:].decode(errors="replace")
        (task, prompt), *_ = re.findall(r"task (\d+) \| new prompt, .*task\.n_tokens = (\d+)", log)
        end = re.search(rf"task {task} \| stop processing: n_tokens = (\d+)", log)
        assert end, log[-3000:]
        generated = int(end.group(1)) - int(prompt)
        print(f"disconnect: task {task} stopped after {generated} of {max_tokens} tokens")
        # The server noticed the client was gone and stopped generating for it.
        assert generated < max_tokens and f"cancel task, id_task = {task}" in log, log[-3000:]
        server.chat_ok()

    def test_memory_stayed_bounded(self, served, baseline):
        server, _ = served
        rss, hwm = server.rss_kib()
        print(
            f"server RSS: {baseline[0] // 1024} MiB after warm-up, {rss // 1024} MiB after the "
            f"bad input (peak {hwm // 1024} MiB)"
        )
        assert rss - baseline[0] < RSS_GROWTH_LIMIT_KIB
        assert server.alive()
