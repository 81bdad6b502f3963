"""The router waits for a model as long as the model works (our patch
llama.cpp-server-router-proxy-read-timeout.patch): b9101's router read its child's answer with
the server's own --timeout, which the image sets to 30 s to bound idle clients. A model's
server sends nothing while a request waits for a slot or while it works out a non-streamed
answer, so on the board (a few tokens/s) any such request past 30 s got 500 "proxy error:
Failed to read connection". Here the real llama-server router runs with --timeout 1 and one
slot, and requests queue behind each other for several seconds.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.serve import TEXT_ONLY, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.needs_llama_bin]
IDLE_TIMEOUT_S = 1  # the router's --timeout: the bound for idle clients
# On one slot (~0.7 s each here, ~0.5 s on CI): the last one waits ~5 s for the nine before it.
REQUESTS = 10
TOKENS = 400


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from rocky_vulkan.llama.testmodel import write_preset

    tmp = tmp_path_factory.mktemp("proxy")
    # 16 layers: about a second per answer here, so the queue is several times the timeout.
    model = write_preset("tiny", tmp / "slow.gguf", seed=3, n_layer=16)
    ini = tmp / "models.ini"
    keys = f"model = {model}\nparallel = 1\nctx-size = 512\nload-on-startup = true\n"
    ini.write_text(f"[slow]\n{keys}")
    port = free_port()
    argv = [str(Path(BIN_DIR) / "llama-server"), "--models-preset", str(ini), "--models-max", "1"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--timeout", str(IDLE_TIMEOUT_S)]
    log = (tmp / "router.log").open("wb")
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _loaded(port):
            assert proc.poll() is None, (tmp / "router.log").read_text()[-3000:]
            time.sleep(0.3)
        assert _loaded(port), (tmp / "router.log").read_text()[-3000:]
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _loaded(port: int) -> bool:
    try:
        status, data = _call(port, "GET", "/models", None)
    except OSError:
        return False
    return status == 200 and any(m["status"]["value"] == "loaded" for m in json.loads(data)["data"])


def _call(port: int, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, json.dumps(body).encode() if body else None,
                     {"Content-Type": "application/json"})  # fmt: skip
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def test_queued_non_streamed_answers_outlast_the_idle_timeout(router):
    body = {"model": "slow", "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": TOKENS, "temperature": 0, "logit_bias": TEXT_ONLY}  # fmt: skip
    results: list[tuple[int, bytes, float]] = []

    def ask() -> None:
        t0 = time.monotonic()
        status, data = _call(router, "POST", "/v1/chat/completions", body)
        results.append((status, data, time.monotonic() - t0))

    threads = [threading.Thread(target=ask) for _ in range(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert len(results) == REQUESTS, results
    for status, data, elapsed in results:
        assert status == 200, (status, data[:300], elapsed)
        assert json.loads(data)["usage"]["completion_tokens"] == TOKENS, data[:300]
    # The case the patch is for happened: an answer came only after the router's proxy had
    # read nothing for twice its --timeout (the unpatched router gives up at 1.0 s).
    slowest = max(elapsed for _, _, elapsed in results)
    assert slowest > 2 * IDLE_TIMEOUT_S, f"answers too quick ({slowest:.1f} s) to test the timeout"
