"""Models at run time for real (issue 31, points 1, 2 and 5): the router that rocky-llm.service
starts (the real llama-server), changed while it serves by the image's own `rocky-llm pull`,
`use` and `rm` (the layer's copy, as the board runs it), with a second tiny model pulled from a
loopback HTTP server. Each model is asked for by name; a change never disturbs a request in
flight on another model.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.fetch_server import RawServer, file_script
from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.serve import TEXT_ONLY, unit_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.needs_llama_bin]
RM_REQUESTS = 12  # 400 tokens each on 2 slots: ~5 s of work for `rm` to wait out (~1 s to ask)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with unit_server(tmp_path_factory, "models", BIN_DIR) as (server, info, tmp):
        yield server, info


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> bytes:
    from rocky_vulkan.llama.testmodel import write_preset

    # 8 layers, 4x the reference's: its answers are slow enough (about 1 s per 400 tokens here)
    # that `rm` finds them still running; the 2-layer model's were done in ~1 s, about when
    # `rm` asked (CI saw `rm` find none: the test did not test the wait).
    path = tmp_path_factory.mktemp("second") / "s.gguf"
    return write_preset("tiny", path, seed=2, n_layer=8).read_bytes()


def rocky_llm(info: dict, *args: str) -> subprocess.CompletedProcess:
    """The image's rocky-llm as root runs it on the board, with the test's paths."""
    argv = [*info["prefix"], "--config", str(info["config"]), "--key-dir", str(info["key_dir"])]
    argv += ["--settings-file", str(info["settings_file"]), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def router_models(server) -> dict[str, str]:
    status, data = server.request("GET", "/models", timeout=30)
    assert status == 200, data[:300]
    return {m["id"]: m["status"]["value"] for m in json.loads(data)["data"]}


def settled_models(server, timeout_s: float = 120) -> dict[str, str]:
    """The router's model states once none is "loading": /models/load (sent by `rocky-llm use`)
    returns when the child starts, not when its model is in memory."""
    deadline = time.monotonic() + timeout_s
    while "loading" in (states := router_models(server)).values() and time.monotonic() < deadline:
        time.sleep(0.5)
    return states


def child_pid(server, name: str) -> int | None:
    """The llama-server the router runs for `name` (its --alias)."""
    for pid in server.pids()[1:]:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--alias" in argv and argv[argv.index(b"--alias") + 1] == name.encode():
            return pid
    return None


def pull(info, data: bytes, name: str, sha: str | None = None, cut: int | None = None):
    with RawServer(file_script(data, cut_first_at=cut)) as srv:
        sha = sha or hashlib.sha256(data).hexdigest()
        return rocky_llm(info, "pull", srv.url, "--sha256", sha, "--license", "MIT", "--name", name)


class StreamingChat:
    """A streamed chat request read to its end in a thread: (token events, usage, error)."""

    def __init__(self, server, model: str, max_tokens: int) -> None:
        self.server, self.model, self.max_tokens = server, model, max_tokens
        self.first = threading.Event()
        self.pieces, self.usage, self.error = 0, None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "Go on."}],
                "max_tokens": self.max_tokens, "temperature": 0, "logit_bias": TEXT_ONLY,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        conn = self.server.connection(300)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {
                "Authorization": f"Bearer {self.server.api_key}",
                "Content-Type": "application/json"})  # fmt: skip
            res = conn.getresponse()
            if res.status != 200:
                self.error = f"{res.status} {res.read()[:300]!r}"
                return
            for line in res:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    self.usage = event["usage"]
                if event.get("choices"):
                    self.pieces += 1
                    self.first.set()
        except (OSError, http.client.HTTPException, ValueError) as err:
            self.error = repr(err)
        finally:
            self.first.set()
            conn.close()

    def join(self) -> None:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive()


def test_the_image_starts_with_its_one_model(served):
    server, info = served
    # The router answers /health at once; its load-on-startup model loads beside it.
    assert settled_models(server) == {"reference": "loaded"}
    out = rocky_llm(info, "list")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("* reference ")


def test_a_wrong_sha256_while_serving_adds_nothing(served, second):
    server, info = served
    out = pull(info, second, "second", sha="ab" * 32)
    assert out.returncode == 2 and "sha256" in out.stderr, out.stderr
    assert router_models(server) == {"reference": "loaded"}
    assert "second" not in info["presets"].read_text()
    server.chat_ok()


def test_a_pull_while_serving_is_offered_at_once_and_answers_by_name(served, second):
    server, info = served
    out = pull(info, second, "second", cut=len(second) // 2)  # cut once, resumed
    assert out.returncode == 0, out.stderr
    assert "the server now offers: reference, second (default reference)" in out.stdout
    assert "[second]" in info["presets"].read_text()
    assert router_models(server) == {"reference": "loaded", "second": "unloaded"}
    # The router started with one model, so --models-max 1: the pull says how to raise it.
    assert "2 models fit in RAM at once but the server keeps 1" in out.stdout, out.stdout
    assert "sudo systemctl restart rocky-llm" in out.stdout
    server.chat_ok(model="second")  # loaded on demand, in place of the other
    assert router_models(server) == {"reference": "unloaded", "second": "loaded"}
    assert child_pid(server, "reference") is None
    server.chat_ok(model="reference")
    assert router_models(server) == {"reference": "loaded", "second": "unloaded"}


def test_after_a_restart_both_stay_loaded_and_answer_by_name(served):
    server, info = served
    server.stop()
    server.start()
    plan = json.loads(info["settings_file"].read_text())
    assert plan["models_max"]["value"] == 2, plan["models_max"]
    assert set(plan["models"]) == {"reference", "second"}
    a = server.chat_ok(max_tokens=8, model="reference")["choices"][0]["message"]["content"]
    b = server.chat_ok(max_tokens=8, model="second")["choices"][0]["message"]["content"]
    assert router_models(server) == {"reference": "loaded", "second": "loaded"}
    assert a != b  # different weights: each request went to its own model


def test_use_loads_the_new_default_beside_a_request_in_flight(served):
    server, info = served
    unload = server.request("POST", "/models/unload", {"model": "second"})
    assert unload[0] == 200, unload
    reading = StreamingChat(server, "reference", 400)
    assert reading.first.wait(60) and reading.error is None, reading.error
    pid = child_pid(server, "reference")
    out = rocky_llm(info, "use", "second")
    assert out.returncode == 0, out.stderr
    assert "(default second)" in out.stdout
    reading.join()
    assert reading.error is None and reading.usage["completion_tokens"] == 400, vars(reading)
    assert child_pid(server, "reference") == pid  # not restarted, not unloaded
    assert settled_models(server) == {"reference": "loaded", "second": "loaded"}
    assert rocky_llm(info, "list").stdout.splitlines()[1].startswith("* second ")
    # The load-on-startup mark stays where this start put it (moving it would restart a model);
    # it moves at the next start (settings.json records which one loaded at start).
    assert "load-on-startup" in info["presets"].read_text().split("[second]")[0]
    assert rocky_llm(info, "use", "reference").returncode == 0


def test_rm_of_a_model_in_use_waits_for_its_requests_then_the_rest_serve(served):
    server, info = served
    # More requests than slots: some run, the rest wait in the model's queue (seconds of work).
    readers = [StreamingChat(server, "second", 400) for _ in range(RM_REQUESTS)]
    assert readers[0].first.wait(60) and readers[0].error is None, readers[0].error
    out = rocky_llm(info, "rm", "second")
    assert out.returncode == 0, out.stderr
    # b9101 ends a stopped model's streams at once: rm waited for them, running and queued.
    assert re.search(r"waited [0-9.]+ s for [0-9]+ request\(s\) on second", out.stderr), out
    for reading in readers:
        reading.join()
        assert reading.error is None and reading.usage["completion_tokens"] == 400, vars(reading)
    assert "second" not in router_models(server)
    status, data = server.request("POST", "/v1/chat/completions", {
        "model": "second", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert status == 400 and b"second" in data, data[:300]
    assert child_pid(server, "second") is None
    server.chat_ok()
    out = rocky_llm(info, "rm", "reference")  # the image's model stays
    assert out.returncode == 2 and "cannot be removed" in out.stderr, out.stderr


def test_the_models_processes_are_bounded(served):
    server, _ = served
    # The router and one child per loaded model, no more: the removed model's child is gone.
    assert len(server.pids()) == 2, server.pids()
