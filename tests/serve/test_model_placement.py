"""A model's own placement file (rocky_selftest.model_placement), read as hostile input, and the
router's plan using it; the real `rocky-llm place`: test_serve_place.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from rocky_selftest import model_placement as mp
from rocky_selftest.model_store import Model, StoreError
from rocky_selftest.router import plan
from rocky_selftest.settings import Settings

GOOD_CHECKS = [{"name": n, "status": "PASS", "evidence": "synthetic"}
               for n in ("gpu_driver", "vulkan_device", "sweep", "output_match")]  # fmt: skip
SECTION = {"experts_per_layer": 8, "chosen": "experts-cpu", "modes": {
    "gpu": {"status": "PASS", "pp_tps": 30.0, "tg_tps": 4.0},
    "experts-cpu": {"status": "PASS", "pp_tps": 28.0, "tg_tps": 9.0}}}  # fmt: skip


@pytest.fixture
def board(tmp_path):
    from rocky_vulkan.llama.testmodel import write_preset

    ref = write_preset("tiny", tmp_path / "ref.gguf")
    (tmp_path / "models").mkdir()
    s = Settings(model_path=str(ref), model_sha256=None, ubatch_sizes=(64,))
    s = replace(s, models_dir=str(tmp_path / "models"), results_dir=str(tmp_path / "results"))
    moe = write_preset("tiny-moe", tmp_path / "moe.gguf")
    model = Model("moe", str(moe), moe.stat().st_size, "ab" * 32, "https://x/moe.gguf", "MIT")
    return s, model, tmp_path


def test_saved_next_to_the_store_and_read_back(board):
    s, model, tmp = board
    path = mp.save(s, model, SECTION)
    assert os.path.dirname(path) == str(tmp / "placement")  # not inside the store's folder
    section, why, _ = mp.load(s, model)
    assert section == SECTION and why.startswith("measured for moe by `rocky-llm place` (20")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{", "ignored (" ),
        ("[]", "not a rocky-llm-placement file"),
        (json.dumps({"schema": "other"}), "not a rocky-llm-placement file"),
        ("x" * (2 << 20), "ignored ("),  # larger than any placement section
    ],
)  # fmt: skip
def test_a_broken_file_is_ignored_and_said(board, content, expected):
    s, model, tmp = board
    (tmp / "placement").mkdir()
    (tmp / "placement" / "moe.json").write_text(content)
    section, why, _ = mp.load(s, model)
    assert section is None and expected in why, why


@pytest.mark.parametrize("field", ["model", "size", "sha256"])
def test_a_file_for_other_bytes_is_ignored(board, field):
    s, model, tmp = board
    mp.save(s, model, SECTION)
    if field == "model":  # the same file under another name: renamed by hand
        os.rename(tmp / "placement" / "moe.json", tmp / "placement" / "other.json")
        other = replace(model, name="other")
    else:
        other = replace(model, **{field: {"size": 1, "sha256": "cd" * 32}[field]})
    section, why, _ = mp.load(s, other)
    assert section is None and "measured on other bytes" in why, why


def test_a_link_is_not_followed_and_a_bad_name_is_refused(board):
    s, model, tmp = board
    (tmp / "placement").mkdir()
    (tmp / "elsewhere.json").write_text("{}")
    os.symlink(tmp / "elsewhere.json", tmp / "placement" / "moe.json")
    section, why, _ = mp.load(s, model)
    assert section is None and "ignored" in why
    with pytest.raises(StoreError):
        mp.save(s, replace(model, name="../../etc/x"), SECTION)


def test_the_plan_serves_a_model_by_its_own_measurements(board, monkeypatch):
    s, model, tmp = board
    doc = {"checks": GOOD_CHECKS, "placement": {"modes": {"gpu": {"pp_tps": 30.0, "tg_tps": 4.0}}}}
    from rocky_selftest.model_store import Store

    class OneMore(Store):
        def models(self):
            return [*super().models(), model]

    store = OneMore(s.models_dir, {"reference": s.model_path})
    mp.save(s, model, SECTION)
    models = plan(s, store=store, doc=doc)["models"]
    assert models["moe"]["settings"]["placement"]["value"] == "experts-cpu"
    assert models["moe"]["settings"]["placement"]["reason"].startswith("measured for moe by")
    assert models["reference"]["settings"]["placement"]["value"] == "gpu"
    mp.remove(s, "moe")
    item = plan(s, store=store, doc=doc)["models"]["moe"]["settings"]["placement"]
    assert item["value"] == "gpu" and "`sudo rocky-llm place moe`" in item["reason"], item
    # its own measurements never bypass the self-test's GPU checks
    mp.save(s, model, SECTION)
    failed = {**doc, "checks": [{**c, "status": "FAIL"} for c in GOOD_CHECKS]}
    item = plan(s, store=store, doc=failed)["models"]["moe"]["settings"]["placement"]
    assert item["value"] == "cpu", item


# ---- a cluster head's `rocky-llm cluster bench` record, for serve.model ----------------------

CLUSTER = {"subnet": "10.77.0.0/24", "head": "head", "workers": ["w1"]}


def _bench(tensor_tps: float) -> dict:
    def mode(rate: float) -> dict:
        return {"status": "PASS", "pp_tps": rate, "tg_tps": rate}

    return {"workers": ["10.77.0.2:50052"], "modes": {
        "alone": mode(10.0), "cluster": mode(8.0), "tensor": mode(tensor_tps)}}  # fmt: skip


@pytest.mark.parametrize(
    ("started_at", "uses_record"),
    [
        (None, True),  # no self-test result yet
        ("2026-01-01T00:00:00Z", True),  # the self-test ran before the record
        ("2999-01-01T00:00:00Z", False),  # the self-test ran after it: its own section
        ("2999-01-01T00:00:00Z\x1b[2J", True),  # a hostile timestamp is no timestamp
    ],
)
def test_a_cluster_bench_after_the_self_test_decides_serve_model_s_split(
    board, monkeypatch, started_at, uses_record
):
    import rocky_selftest.serve_settings as ss

    monkeypatch.setattr(ss, "reachable", lambda eps, timeout_s=3.0: (eps, []))
    s, _, tmp = board
    s = replace(s, cluster=CLUSTER, hostname="head")
    from rocky_selftest.router import store_for

    reference = store_for(s).get("reference")
    path = mp.save(s, reference, _bench(tensor_tps=20.0), "cluster")
    assert os.path.dirname(path) == str(tmp / "cluster-bench")
    doc = {"checks": GOOD_CHECKS, "cluster": _bench(tensor_tps=1.0)}  # the self-test: layers
    if started_at is not None:
        doc["started_at"] = started_at
    settings = plan(s, doc=doc)["models"]["reference"]["settings"]
    assert settings["split_mode"]["value"] == ("tensor" if uses_record else "layer"), settings
    said = "the cluster measured for reference by `rocky-llm cluster bench` (20"
    assert (said in settings["cluster"]["reason"]) == uses_record, settings["cluster"]
    # a record for other bytes is never used
    os.truncate(reference.path, reference.size - 32)
    assert plan(s, doc=doc)["models"]["reference"]["settings"]["split_mode"]["value"] == "layer"


def test_removing_a_model_removes_all_its_measurements(board):
    s, model, tmp = board
    mp.save(s, model, SECTION)
    mp.save(s, model, {"modes": {}}, "cluster")
    mp.remove(s, "moe")
    assert not (tmp / "placement" / "moe.json").exists()
    assert not (tmp / "cluster-bench" / "moe.json").exists()


def test_a_folder_this_user_cannot_write_is_said_before_measuring(board, monkeypatch):
    """The tests run as root, for whom every folder is writable: os.access is replaced to
    inject the refusal a normal user gets."""
    s, _, tmp = board
    assert mp.not_writable(s, "cluster", "rocky-llm cluster bench") is None
    monkeypatch.setattr(mp.os, "access", lambda path, mode: path != str(tmp))
    why = mp.not_writable(s, "cluster", "rocky-llm cluster bench")
    assert why == f"{tmp} is not writable by this user: `sudo rocky-llm cluster bench`"
    (tmp / "cluster-bench").mkdir()  # once the folder exists, it is the one asked
    assert mp.not_writable(s, "cluster", "rocky-llm cluster bench") is None
