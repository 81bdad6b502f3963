"""The router's preset lines and memory footprint for a model served with speculative decoding
(rocky_selftest.router), from hand-made plans; the real router reading them:
test_serve_speculative.py."""

from __future__ import annotations

import configparser

import pytest
from rocky_selftest.model_store import Model
from rocky_selftest.router import RouterError, _footprint, preset_ini


def _plan(path: str, placement: str, spec: dict | None) -> dict:
    values = {"placement": placement, "ubatch": 64, "context_per_slot": 512, "parallel": 1,
              "model": path, "speculative": spec}  # fmt: skip
    return {"settings": {k: {"value": v, "reason": "test"} for k, v in values.items()}}


def _presets(plans: dict) -> configparser.ConfigParser:
    router = {"models": plans, "gpu_device": "Vulkan0", "loaded_at_start": next(iter(plans))}
    ini = configparser.ConfigParser()
    ini.read_string(preset_ini(router))
    return ini


def test_each_model_gets_only_its_own_mode():
    draft = {"mode": "draft", "draft_model": "/models/small.gguf"}
    ini = _presets({
        "reference": _plan("/models/ref.gguf", "gpu", draft),
        "ngram": _plan("/models/b.gguf", "cpu", {"mode": "ngram-mod"}),
        "plain": _plan("/models/c.gguf", "gpu", None),
    })  # fmt: skip
    ref = ini["reference"]
    assert ref["model-draft"] == "/models/small.gguf" and ref["spec-draft-ngl"] == "99"
    assert ref["spec-draft-device"] == "Vulkan0" and "spec-type" not in ref
    assert ini["ngram"]["spec-type"] == "ngram-mod" and "model-draft" not in ini["ngram"]
    assert not [k for k in ini["plain"] if "spec" in k or "draft" in k]


def test_a_plan_from_before_speculation_still_serves():
    plan = _plan("/models/ref.gguf", "gpu", None)
    del plan["settings"]["speculative"]  # a settings file written by the previous release
    assert "spec" not in preset_ini({"models": {"reference": plan}, "gpu_device": "Vulkan0",
                                     "loaded_at_start": "reference"})  # fmt: skip


def test_a_draft_path_the_preset_cannot_hold_is_refused():
    bad = {"mode": "draft", "draft_model": "/models/a=b.gguf"}
    with pytest.raises(RouterError, match="cannot go into the router's preset file"):
        _presets({"reference": _plan("/models/ref.gguf", "gpu", bad)})


def test_the_draft_model_counts_in_the_footprint(tmp_path):
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"\0" * 4096)
    model = Model("reference", str(tmp_path / "missing.gguf"), 1 << 20, None, "image", "MIT")
    plain = _footprint(_plan(model.path, "gpu", None), model)
    spec = {"mode": "draft", "draft_model": str(draft)}
    assert _footprint(_plan(model.path, "gpu", spec), model) == plain + 4096
    draft.unlink()  # gone since: counted as nothing (derive() then leaves the mode out)
    assert _footprint(_plan(model.path, "gpu", spec), model) == plain


def test_experts_cpu_keeps_the_experts_in_ram_and_its_draft_on_the_gpu():
    draft = {"mode": "draft", "draft_model": "/models/small.gguf"}
    ini = _presets({"moe": _plan("/models/moe.gguf", "experts-cpu", draft),
                    "dense": _plan("/models/d.gguf", "gpu", None)})  # fmt: skip
    moe = ini["moe"]
    assert moe["cpu-moe"] == "true" and moe["n-gpu-layers"] == "99"
    assert moe["device"] == "Vulkan0" and moe["spec-draft-device"] == "Vulkan0"
    assert "cpu-moe" not in ini["dense"]
