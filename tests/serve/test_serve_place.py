"""`rocky-llm place NAME` for real (issue 31: a pulled model, a mixture of experts above all, gets
its own placement measured): the image's rocky-llm (the layer's copy) pulls the tiny MoE model
while the unit's server runs, refuses to measure while the server holds the GPU, measures with
the real llama-bench once it is stopped (lavapipe as the Vulkan device), and the next plan
serves that model from its own measurements; a file that does not fit the model is ignored and
said, and `rm` takes it away. The self-test result the GPU checks come from is the synthetic one
the serving tests use (the stack checks need the board).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.serve import start_unit_server
from tests.serve.test_serve_models import rocky_llm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.needs_llama_bin]


def _plan(info) -> dict:
    out = rocky_llm(info, "settings", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_place_measures_a_pulled_moe_model_and_its_plan_uses_it(tmp_path, tmp_path_factory):
    from rocky_vulkan.llama.testmodel import write_preset

    from tests.helpers.selftest import make_tiny_model

    device = vulkan_device()
    if not device:
        pytest.skip("no Vulkan device (lavapipe) on this host")
    moe = write_preset("tiny-moe", tmp_path / "moe.gguf", n_layer=3, text_only=True)
    sha = hashlib.sha256(moe.read_bytes()).hexdigest()
    server, info = start_unit_server(
        tmp_path / "unit", BIN_DIR, make_tiny_model(tmp_path_factory), gpu=True,
        gpu_name=device, env=VK_ENV, repetitions=1, serve_request_prompt_tokens=64,
        serve_request_generated_tokens=16,
    )  # fmt: skip
    try:
        out = rocky_llm(
            info, "pull", str(moe), "--sha256", sha, "--license", "MIT", "--name", "moe"
        )
        assert out.returncode == 0, out.stderr
        reason = _plan(info)["models"]["moe"]["settings"]["placement"]["reason"]
        assert "not measured for moe: `sudo rocky-llm place moe`" in reason, reason
        refused = rocky_llm(info, "place", "moe")
        assert refused.returncode == 2 and "the server answers on port" in refused.stderr
        assert "systemctl stop rocky-llm" in refused.stderr
    finally:
        server.stop()
    placed_dir = tmp_path / "unit" / "placement"
    assert not placed_dir.exists()  # the refusal measured and wrote nothing

    out = rocky_llm(info, "place", "moe")
    print(out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "experts-cpu measured too" in out.stderr and "saved in" in out.stdout
    saved = json.loads((placed_dir / "moe.json").read_text())
    assert saved["model"] == "moe" and saved["sha256"] == sha
    section = saved["placement"]
    assert section["experts_per_layer"] == 8
    assert set(section["modes"]) == {"gpu", "cpu", "hybrid", "experts-cpu"}
    assert all(m["status"] == "PASS" for m in section["modes"].values()), section
    (run,) = section["modes"]["experts-cpu"]["runs"]
    assert run["n_cpu_moe"] == 3 and device in run["gpu_info"]

    models = _plan(info)["models"]
    item = models["moe"]["settings"]["placement"]
    assert item["value"] == section["chosen"], item
    assert item["reason"].startswith("measured for moe by `rocky-llm place` ("), item
    # the image's model keeps the self-test's placement (synthetic: the GPU wins)
    ref = models["reference"]["settings"]["placement"]
    assert ref["value"] == "gpu" and "rocky-llm place" not in ref["reason"], ref

    # A file for other bytes (the same name pulled again) is not used, and says so.
    (placed_dir / "moe.json").write_text(json.dumps({**saved, "sha256": "0" * 64}))
    item = _plan(info)["models"]["moe"]["settings"]["placement"]
    assert "measured on other bytes" in item["reason"], item
    (placed_dir / "moe.json").write_text("{not json")
    item = _plan(info)["models"]["moe"]["settings"]["placement"]
    assert "ignored" in item["reason"] and "place moe` again" in item["reason"], item

    out = rocky_llm(info, "rm", "moe")
    assert out.returncode == 0, out.stderr
    assert not (placed_dir / "moe.json").exists()
