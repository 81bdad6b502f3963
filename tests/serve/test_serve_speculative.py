"""The self-test's decode choice reaching the board's server (issue 31, part 4): rocky-llm's
ExecStart on the real router (llama-server b9101) with the tiny model, its result.json carrying
a `speculative` section.

Stand-in, said here: the section's decode times are synthetic (a mode 1.5x faster than plain
decode), because on this host no mode wins with a random tiny model; the real measurement is in
tests/selftest/test_selftest_speculative_real.py. What is real: the presets the router reads,
the child llama-server it starts with those flags, the draft model it loads and the requests it
answers through them."""

from __future__ import annotations

import configparser
import json

import pytest
from rocky_selftest.speculation import GOAL

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.selftest import make_tiny_model
from tests.helpers.serve import unit_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.needs_llama_bin]


def section(model: str, mode: str, draft: str | None = None) -> dict:
    """A measured section where `mode` decodes 1.5x faster than plain decode (synthetic)."""

    def entry(ms: float, drafts: int) -> dict:
        runs = [{"request": r, "status": "PASS", "predicted_ms": ms, "predicted_n": 16,
                 "decode_tps": 16000 / ms, "draft_n": drafts, "draft_n_accepted": drafts // 2}
                for r in ("chat", "repeat")]  # fmt: skip
        return {"status": "PASS", "runs": runs}

    return {
        "goal": GOAL,
        "model": model,
        "draft_model": draft,
        "requests": [{"name": "chat"}, {"name": "repeat"}],
        "modes": {"off": entry(150.0, 0), mode: entry(100.0, 12)},
    }


def _child_args(server, name: str = "reference") -> list[str]:
    status, data = server.request("GET", "/models")
    assert status == 200, data[:300]
    (model,) = [m for m in json.loads(data)["data"] if m["id"] == name]
    assert model["status"]["value"] == "loaded", model
    return model["status"]["args"]


def _speculative_setting(info) -> dict:
    plan = json.loads(info["settings_file"].read_text())
    return plan["models"]["reference"]["settings"]["speculative"]


@pytest.mark.parametrize("mode", ["ngram-mod", "draft"])
def test_the_measured_mode_reaches_the_child_server(tmp_path_factory, mode):
    model = make_tiny_model(tmp_path_factory)
    draft = str(model) if mode == "draft" else None  # same vocabulary: its own draft
    sections = {"speculative": section(str(model), mode, draft)}
    with unit_server(tmp_path_factory, f"spec-{mode}", BIN_DIR, model,
                     result_sections=sections) as (server, info, _):  # fmt: skip
        setting = _speculative_setting(info)
        assert setting["value"]["mode"] == mode and "1.50x plain decode" in setting["reason"]
        presets = configparser.ConfigParser()
        presets.read_string(info["presets"].read_text())
        child = _child_args(server)
        if mode == "draft":
            assert presets["reference"]["model-draft"] == str(model)
            assert presets["reference"]["spec-draft-device"] == "none"  # the CPU placement
            # the router passes each option by its last name (b9101's common/preset.cpp)
            for flag, val in (("--model-draft", str(model)), ("--n-gpu-layers-draft", "0"),
                              ("--device-draft", "none")):  # fmt: skip
                assert flag in child and child[child.index(flag) + 1] == val, " ".join(child)
            assert f"load_model: loading draft model '{model}'" in server.tail(400_000)
        else:
            assert presets["reference"]["spec-type"] == "ngram-mod"
            assert child[child.index("--spec-type") + 1] == "ngram-mod", child
        doc = server.chat_ok(max_tokens=24)  # the child answers through that mode
        assert doc["choices"][0]["message"]["content"]


def test_a_measurement_of_another_model_leaves_plain_decode(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory)
    sections = {"speculative": section("/elsewhere/other.gguf", "ngram-mod")}
    with unit_server(tmp_path_factory, "spec-other", BIN_DIR, model,
                     result_sections=sections) as (server, info, _):  # fmt: skip
        setting = _speculative_setting(info)
        assert setting["value"] is None and "another model" in setting["reason"]
        assert "spec-type" not in info["presets"].read_text()
        assert "--spec-type" not in _child_args(server)
        server.chat_ok(max_tokens=4)
