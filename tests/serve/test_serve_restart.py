"""kill -9 of the server, then the restart (issue 20), on the GPU placement (lavapipe here).

systemd is not running it: there is no PID 1 in CI. The restart policy (Restart=on-failure,
RestartSec, StartLimit*) is checked on the unit itself in test_serve_unit.py
(`systemd-analyze verify` and parsing); this test proves the other half: after a SIGKILL, the
unit's ExecStart run again (what systemd would do RestartSec later) serves again with the same
key, certificate and settings.
"""

from __future__ import annotations

import json
import signal

import openai
import pytest
from rocky_selftest.serve_keys import cert_fingerprint

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.selftest import make_tiny_model
from tests.helpers.serve import TEXT_ONLY, served_fingerprint, start_unit_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.needs_llama_bin]


def _ask(server) -> str:
    with openai.OpenAI(
        base_url=f"https://127.0.0.1:{server.port}/v1",
        api_key=server.api_key,
        http_client=openai.DefaultHttpxClient(verify=server.ctx),
        max_retries=0,
        timeout=300,
    ) as client:
        res = client.chat.completions.create(
            model="reference", messages=[{"role": "user", "content": "Hello?"}],
            max_tokens=6, temperature=0, logit_bias=TEXT_ONLY,
        )  # fmt: skip
    assert res.usage.completion_tokens == 6
    return res.choices[0].message.content


def test_sigkill_then_the_same_command_serves_again(tmp_path_factory):
    device = vulkan_device()
    if not device:
        pytest.skip("no Vulkan device here (lavapipe: GGML_VK_VISIBLE_DEVICES=0)")
    tmp = tmp_path_factory.mktemp("restart")
    model = make_tiny_model(tmp_path_factory)
    server, info = start_unit_server(tmp, BIN_DIR, model, gpu=True, extra_env=VK_ENV)
    try:
        plan = json.loads(info["settings_file"].read_text())
        argv = plan["command"]
        derived = plan["models"]["reference"]["settings"]
        assert derived["placement"]["value"] == "gpu"
        assert derived["ubatch"]["value"] == 64  # the synthetic sweep's best
        presets = info["presets"].read_text()
        assert "\ndevice = Vulkan0\n" in presets and "\nn-gpu-layers = 99\n" in presets
        first = _ask(server)
        # After the first answer: the router is healthy before its default model has loaded.
        log = server.tail(200_000)
        assert device in log and "offloaded 3/3 layers to GPU" in log, log[-3000:]
        fingerprint = served_fingerprint(server.port)
        assert fingerprint == cert_fingerprint(str(info["cert"]))
        pid = server.proc.pid

        rc = server.kill9()
        assert rc == -signal.SIGKILL  # an unclean signal: Restart=on-failure restarts it
        assert not server.alive()

        # What systemd does RestartSec later: the same ExecStart, the same credentials.
        server.start()
        assert server.proc.pid != pid
        second = _ask(server)
        assert second == first  # same model, same settings, greedy: the same answer
        assert served_fingerprint(server.port) == fingerprint  # same certificate
        assert json.loads(info["settings_file"].read_text())["command"] == argv
        print(
            f"restart after SIGKILL: ready in {server.starts[1]:.1f} s "
            f"(first start {server.starts[0]:.1f} s), same key, certificate and answer"
        )
    finally:
        server.stop()
