"""The test-model writer: valid GGUF that gguf's own reader accepts, with the asked shapes."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np
import pytest
from rocky_vulkan.errors import UserError
from rocky_vulkan.llama.testmodel import (
    PRESETS,
    build_vocab,
    write_preset,
    write_quant_source,
    write_test_model,
)

gguf = pytest.importorskip("gguf")


def _field(reader, key):
    field = reader.fields[key]
    return field.parts[field.data[0]]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_preset_reads_back_with_requested_shapes(tmp_path):
    out = write_preset("tiny", tmp_path / "tiny.gguf", seed=3)
    reader = gguf.GGUFReader(out)
    shape = PRESETS["tiny"]
    assert bytes(_field(reader, "general.architecture")).decode() == "llama"
    assert int(_field(reader, "llama.block_count")[0]) == shape.n_layer
    assert int(_field(reader, "llama.embedding_length")[0]) == shape.n_embd
    assert int(_field(reader, "llama.attention.head_count_kv")[0]) == shape.n_head_kv
    tensors = {t.name: t for t in reader.tensors}
    # gguf stores dims innermost first: (n_embd, vocab).
    assert list(tensors["token_embd.weight"].shape) == [shape.n_embd, shape.vocab_size]
    assert list(tensors["blk.1.ffn_down.weight"].shape) == [shape.n_ff, shape.n_embd]
    assert f"blk.{shape.n_layer}.attn_q.weight" not in tensors
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == shape.vocab_size


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    kw = dict(n_layer=1, n_embd=64, n_ff=128, n_head=2, n_head_kv=1, vocab_size=300, ftype="q8_0")
    a = write_test_model(tmp_path / "a.gguf", seed=7, **kw)
    b = write_test_model(tmp_path / "b.gguf", seed=7, **kw)
    c = write_test_model(tmp_path / "c.gguf", seed=8, **kw)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_gqa_and_q8_0_tensor_types(tmp_path):
    out = write_test_model(
        tmp_path / "g.gguf",
        n_layer=1,
        n_embd=256,
        n_ff=704,
        n_head=4,
        n_head_kv=2,
        vocab_size=400,
        ftype="q8_0",
        seed=1,
    )
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    k = tensors["blk.0.attn_k.weight"]
    assert list(k.shape) == [256, 128]  # kv_dim = 2 heads * 64
    assert k.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    # Dequantized weights are finite and not all zero.
    w = gguf.quants.dequantize(tensors["blk.0.ffn_up.weight"].data, k.tensor_type)
    assert np.isfinite(w).all() and np.abs(w).max() > 0


def test_vocab_has_byte_fallback_and_unique_pieces():
    tokens, scores, types = build_vocab(2000)
    assert len(tokens) == len(scores) == len(types) == 2000
    assert len(set(tokens)) == 2000
    assert tokens[3 + 0x41] == "<0x41>" and types[3 + 0x41] == int(gguf.TokenType.BYTE)


def test_bad_shapes_are_user_errors(tmp_path):
    shape = {"n_layer": 1, "n_ff": 64, "n_head_kv": 1, "vocab_size": 300}
    for match, bad in (
        ("n_head", {"n_embd": 100, "n_head": 3}),
        ("ftype", {"n_embd": 64, "n_head": 2, "ftype": "q4_k"}),
    ):
        with pytest.raises(UserError, match=match):
            write_test_model(tmp_path / "x.gguf", **shape, **bad)
    assert not (tmp_path / "x.gguf").exists()


def test_cli_subcommand_writes_preset(tmp_path, capsys):
    import argparse

    from rocky_vulkan.llama import testmodel

    parser = argparse.ArgumentParser()
    testmodel.register(parser.add_subparsers())
    args = parser.parse_args(
        ["testmodel", "--preset", "tiny", "--seed", "5", str(tmp_path / "m.gguf")]
    )
    assert args.func(args) == 0
    assert (tmp_path / "m.gguf").is_file()
    assert capsys.readouterr().out.strip().endswith("m.gguf")


def test_q4km_preset_needs_llama_quantize(tmp_path):
    # gguf-py writes no Q4_K: the preset must not silently come out as F16.
    with pytest.raises(UserError, match="Q4_K_M, which gguf-py cannot write"):
        write_preset("qwen2.5-3b-shape-q4km", tmp_path / "m.gguf")
    assert not list(tmp_path.iterdir())
    with pytest.raises(UserError, match="not a k-quant preset"):
        write_quant_source("tiny", tmp_path / "m.gguf")


def test_quant_source_is_f16_in_the_preset_shape(tmp_path, monkeypatch):
    # The real preset's shapes at one layer would take seconds; shrink its vocab only.
    shape = PRESETS["qwen2.5-3b-shape-q4km"]
    monkeypatch.setitem(
        PRESETS, "qwen2.5-3b-shape-q4km", dataclasses.replace(shape, vocab_size=300)
    )
    out = write_quant_source("qwen2.5-3b-shape-q4km", tmp_path / "src.gguf", n_layer=1)
    r = gguf.GGUFReader(str(out))
    t = {x.name: x for x in r.tensors}
    assert t["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert list(t["blk.0.ffn_up.weight"].shape) == [2048, 11008]
    assert "blk.1.attn_q.weight" not in t


@pytest.mark.slow
@pytest.mark.needs_llama_quantize
def test_q4km_preset_through_llama_quantize(tmp_path):
    """Needs ROCKY_LLAMA_QUANTIZE: a llama-quantize binary (e.g. the pinned tree's)."""
    exe = os.environ["ROCKY_LLAMA_QUANTIZE"]
    out = write_preset("qwen2.5-3b-shape-q4km", tmp_path / "q.gguf", n_layer=1, llama_quantize=exe)
    types = {x.name: x.tensor_type for x in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q4_K
    assert types["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q6_K
