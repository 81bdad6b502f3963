"""A mixture-of-experts model through the real llama.cpp binaries: the placement step measures it
with its experts on the CPU too (llama-bench -ncmoe), and the router serves the mode the plan
chose (the preset's `cpu-moe = true`): the experts stay in CPU memory, the rest on the Vulkan
device. The model is the tiny MoE (8 experts, 2 per token, random weights); lavapipe is the
Vulkan device. The timings say nothing about the Mali-G610 or Qwen3-30B-A3B.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from rocky_selftest.bench import Deadline
from rocky_selftest.placement_bench import placement
from rocky_selftest.router import preset_ini
from rocky_selftest.settings import load_settings
from rocky_selftest.stack import sha256_file

from tests.helpers.llama_bin import BIN_DIR, BUFFER_RE, VK_ENV, vulkan_device
from tests.helpers.selftest import write_config
from tests.helpers.serve import TEXT_ONLY, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.needs_llama_bin]
N_LAYER = 3


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    from rocky_vulkan.llama.testmodel import write_preset

    path = tmp_path_factory.mktemp("moe") / "moe.gguf"
    return write_preset("tiny-moe", path, n_layer=N_LAYER, text_only=True)


@pytest.fixture(scope="module")
def device() -> str:
    found = vulkan_device()
    if not found:
        pytest.skip("no Vulkan device (lavapipe) on this host")
    return found


def test_the_placement_step_measures_the_experts_on_the_cpu(tmp_path, moe, device):
    cfg = write_config(
        tmp_path / "config.json", model_path=str(moe), model_sha256=sha256_file(str(moe)),
        ubatch_sizes=[32], prompt_tokens=64, repetitions=1, run_timeout_s=600, deadline_s=800,
        bin_dir=BIN_DIR, results_dir=str(tmp_path / "results"), gpu_name=device, env=VK_ENV,
        sweep_modes=["tuned"], serve_request_prompt_tokens=64, serve_request_generated_tokens=16,
    )  # fmt: skip
    s = load_settings(str(cfg))
    checks = [{"name": n, "status": "PASS", "evidence": "stand-in: needs the board"}
              for n in ("gpu_driver", "vulkan_device", "sweep", "output_match")]  # fmt: skip
    log: list[str] = []
    check, data = placement(s, Deadline(s.deadline_s), {"checks": checks}, log=log.append)
    print("\n".join(log))
    assert data["experts_per_layer"] == 8
    assert set(data["modes"]) == {"gpu", "cpu", "hybrid", "experts-cpu"}
    for mode, entry in data["modes"].items():
        assert entry["status"] == "PASS", (mode, entry)
    (run,) = data["modes"]["experts-cpu"]["runs"]
    cmd = run["cmd"]
    assert cmd[cmd.index("-ncmoe") + 1] == str(N_LAYER) and run["n_cpu_moe"] == N_LAYER
    assert run["n_gpu_layers"] == 99 and device in run["gpu_info"]
    assert all(r["n_cpu_moe"] == 0 for r in data["modes"]["gpu"]["runs"])
    assert check.status == "PASS" and data["chosen"] in check.evidence


def _plan(model: Path, placement_mode: str) -> dict:
    values = {"placement": placement_mode, "ubatch": 64, "context_per_slot": 256, "parallel": 1,
              "model": str(model), "speculative": None}  # fmt: skip
    return {"settings": {k: {"value": v, "reason": "test"} for k, v in values.items()}}


def _call(port: int, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST" if body else "GET", path, json.dumps(body) if body else None,
                     {"Content-Type": "application/json"})  # fmt: skip
        res = conn.getresponse()
        return res.status, json.loads(res.read() or b"{}")
    finally:
        conn.close()


def test_the_router_serves_experts_cpu_with_the_experts_in_cpu_memory(tmp_path, moe, device):
    # One model file under two presets: the plan's gpu and experts-cpu modes.
    router = {"models": {"on-gpu": _plan(moe, "gpu"), "experts": _plan(moe, "experts-cpu")},
              "gpu_device": "Vulkan0", "loaded_at_start": None}  # fmt: skip
    ini = tmp_path / "models.ini"
    ini.write_text(preset_ini(router))
    assert "cpu-moe = true" in ini.read_text()
    port = free_port()
    argv = [str(Path(BIN_DIR) / "llama-server"), "--models-preset", str(ini), "--models-max", "1"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    log_path = tmp_path / "router.log"
    env = {**os.environ, **VK_ENV, "GGML_NO_BACKTRACE": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if _call(port, "/models")[0] == 200:
                    break
            except OSError:
                time.sleep(0.3)
        buffers = {}
        for name in ("on-gpu", "experts"):
            mark = len(log_path.read_bytes())
            body = {"model": name, "messages": [{"role": "user", "content": "Go on."}],
                    "max_tokens": 8, "temperature": 0, "logit_bias": TEXT_ONLY}  # fmt: skip
            status, data = _call(port, "/v1/chat/completions", body)
            assert status == 200, (status, data, log_path.read_text()[-3000:])
            assert data["usage"]["completion_tokens"] == 8
            text = log_path.read_bytes()[mark:].decode(errors="replace")
            buffers[name] = {dev: float(mib) for dev, mib in BUFFER_RE.findall(text)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(buffers)
    gpu, experts = buffers["on-gpu"], buffers["experts"]
    assert "Vulkan0" in gpu and "Vulkan0" in experts, buffers
    cpu = {k: v for k, v in experts.items() if k.startswith("CPU")}
    # The experts are most of the weights: with them in CPU memory the device holds far less,
    # and the CPU holds more than the embeddings it holds in the gpu mode.
    assert experts["Vulkan0"] < gpu["Vulkan0"] / 2, buffers
    gpu_cpu = sum(v for k, v in gpu.items() if k.startswith("CPU"))
    assert sum(cpu.values()) > gpu_cpu + gpu["Vulkan0"] / 2, buffers
