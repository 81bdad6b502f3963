"""Write small llama-architecture GGUF models with random weights, for kernel and pipeline tests.

The models are nonsense but well formed: llama.cpp loads them, tokenizes any text (SentencePiece
vocab with byte fallback) and runs every matmul a real model of the same shape runs. The bytes
depend only on the arguments and the seed, so two runs give identical files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rocky_vulkan.errors import UserError

# gguf-py writes these itself; anything else (Q4_K, ...) needs llama-quantize.
FTYPES = {"f32": 0, "f16": 1, "q8_0": 7}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
N_BYTE_TOKENS = 256
SPM_SPACE = "\u2581"
# Characters the normal tokens are built from: single characters first, then pairs.
ALPHABET = (
    "etaoinshrdlucmfwypvbgkjqxz" + "ETAOINSHRDLUCMFWYPVBGKJQXZ" + "0123456789" + ".,;:!?'\"-()"
)


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    vocab_size: int
    ftype: str = "f16"
    # A k-quant layout (e.g. Q4_K_M) gguf-py cannot write: the preset is written in `ftype`
    # and converted with llama-quantize.
    quant: str | None = None
    # Mixture of experts (Mixtral's layout in the llama architecture): n_expert FFNs per layer,
    # n_expert_used of them per token, picked by a router matrix; the FFN runs through
    # MUL_MAT_ID. 0: a dense model.
    n_expert: int = 0
    n_expert_used: int = 0


PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=4, vocab_size=512),
    # Qwen2.5-3B's matmul shapes (hidden 2048, FFN 11008, 16 heads of 128, 2 KV heads), few layers.
    "qwen2.5-3b-shape": ModelShape(
        n_layer=4, n_embd=2048, n_ff=11008, n_head=16, n_head_kv=2, vocab_size=8192, ftype="q8_0"
    ),
    # The same shapes in Q4_K_M's layout (Q4_K for most matmuls, Q6_K for attn_v, ffn_down and
    # output, as llama-quantize picks): the product's hot path, the int-dot q4_K L tile.
    "qwen2.5-3b-shape-q4km": ModelShape(
        n_layer=4,
        n_embd=2048,
        n_ff=11008,
        n_head=16,
        n_head_kv=2,
        vocab_size=8192,
        ftype="f16",
        quant="Q4_K_M",
    ),
    # A small MoE: 8 experts, 2 per token (Qwen3-30B-A3B has 128 and 8).
    "tiny-moe": ModelShape(
        n_layer=2,
        n_embd=256,
        n_ff=256,
        n_head=4,
        n_head_kv=4,
        vocab_size=512,
        n_expert=8,
        n_expert_used=2,
    ),  # fmt: skip
}


def build_vocab(
    vocab_size: int, text_only: bool = False
) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocab: specials, 256 byte tokens, then word pieces with scores.
    `text_only`: the byte tokens typed NORMAL, so they read as their "<0xNN>" spelling and any
    output is valid UTF-8 (for clients that cannot ban tokens, e.g. Ollama's)."""
    from gguf import TokenType

    n_fixed = len(SPECIAL_TOKENS) + N_BYTE_TOKENS
    if vocab_size < n_fixed + 1:
        raise UserError(f"vocab_size {vocab_size} is too small: use at least {n_fixed + 1}")
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.NORMAL if text_only else TokenType.BYTE] * N_BYTE_TOKENS
    scores = [0.0] * n_fixed
    pieces: list[str] = [SPM_SPACE]
    pieces += [SPM_SPACE + c for c in ALPHABET] + list(ALPHABET)
    pieces += [a + b for a in ALPHABET[:26] for b in ALPHABET[:26]]
    pieces += [SPM_SPACE + a + b for a in ALPHABET[:26] for b in ALPHABET[:26]]
    unique = list(dict.fromkeys(pieces))
    n_normal = vocab_size - n_fixed
    # Filler pieces beyond the generated ones keep large vocabs unique and never win a merge.
    unique += [f"{SPM_SPACE}w{i}" for i in range(max(0, n_normal - len(unique)))]
    for rank, piece in enumerate(unique[:n_normal]):
        tokens.append(piece)
        types.append(TokenType.NORMAL)
        scores.append(-float(rank))
    return tokens, scores, [int(t) for t in types]


def _tensor_shapes(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) for every tensor, in llama.cpp's order; numpy shape is (rows, cols)."""
    head_dim = shape.n_embd // shape.n_head
    kv_dim = head_dim * shape.n_head_kv
    e, f = shape.n_embd, shape.n_ff
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (shape.vocab_size, e))]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (e,)),
            (b + "attn_q.weight", (e, e)),
            (b + "attn_k.weight", (kv_dim, e)),
            (b + "attn_v.weight", (kv_dim, e)),
            (b + "attn_output.weight", (e, e)),
            (b + "ffn_norm.weight", (e,)),
        ]
        if shape.n_expert:
            x = shape.n_expert
            out += [
                (b + "ffn_gate_inp.weight", (x, e)),
                (b + "ffn_gate_exps.weight", (x, f, e)),
                (b + "ffn_up_exps.weight", (x, f, e)),
                (b + "ffn_down_exps.weight", (x, e, f)),
            ]
        else:
            out += [
                (b + "ffn_gate.weight", (f, e)),
                (b + "ffn_up.weight", (f, e)),
                (b + "ffn_down.weight", (e, f)),
            ]
    out += [("output_norm.weight", (e,)), ("output.weight", (shape.vocab_size, e))]
    return out


def _check_shape(shape: ModelShape) -> None:
    if shape.ftype not in FTYPES:
        raise UserError(
            f"ftype {shape.ftype!r} is not one gguf-py can write: use one of {sorted(FTYPES)}, "
            "or pass a llama-quantize binary for k-quants"
        )
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise UserError(
            f"n_embd {shape.n_embd} must divide by n_head {shape.n_head}, "
            f"and n_head by n_head_kv {shape.n_head_kv}"
        )
    if shape.n_expert and not 0 < shape.n_expert_used <= shape.n_expert:
        raise UserError(
            f"n_expert_used {shape.n_expert_used} must be 1..n_expert ({shape.n_expert})"
        )
    if shape.ftype == "q8_0" and (shape.n_embd % 32 or shape.n_ff % 32):
        raise UserError("q8_0 needs n_embd and n_ff to be multiples of 32")


def write_test_model(
    path: str | os.PathLike[str],
    *,
    n_layer: int,
    n_embd: int,
    n_ff: int,
    n_head: int,
    n_head_kv: int,
    vocab_size: int,
    ftype: str = "f16",
    seed: int = 0,
    text_only: bool = False,
    n_expert: int = 0,
    n_expert_used: int = 0,
) -> Path:
    """Write a random-weight llama GGUF to `path` (atomically) and return the path
    (`text_only`: see build_vocab)."""
    import gguf

    shape = ModelShape(
        n_layer, n_embd, n_ff, n_head, n_head_kv, vocab_size, ftype,
        n_expert=n_expert, n_expert_used=n_expert_used,
    )  # fmt: skip
    _check_shape(shape)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"rocky-vulkan test model seed {seed}")
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(FTYPES[ftype])
    writer.add_vocab_size(vocab_size)
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_expert_used)

    tokens, scores, types = build_vocab(vocab_size, text_only)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)

    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[ftype]
    for name, tshape in _tensor_shapes(shape):
        if len(tshape) == 1:
            # Norm weights near 1 keep activations in range; llama.cpp wants them F32.
            writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(tshape)).astype(np.float32))
            continue
        scale = 1.0 / np.sqrt(tshape[-1])
        data = (scale * rng.standard_normal(tshape)).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, path)
    return path


def quantize_model(
    llama_quantize: str | os.PathLike[str], src: Path, dst: Path, qtype: str
) -> Path:
    """Re-quantize `src` into `dst` with a llama-quantize binary (for k-quants such as Q4_K_M)."""
    tmp = dst.with_name(dst.name + ".tmp")
    cmd = [str(llama_quantize), str(src), str(tmp), qtype]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise UserError(
            f"cannot run llama-quantize {llama_quantize}: {err}; check the path"
        ) from err
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise UserError(f"llama-quantize failed (exit {proc.returncode}) for {qtype}:\n{tail}")
    os.replace(tmp, dst)
    return dst


def _preset_params(preset: str, n_layer: int | None) -> tuple[dict, str | None]:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}: use one of {sorted(PRESETS)}")
    params = asdict(PRESETS[preset])
    quant = params.pop("quant")
    if n_layer is not None:
        params["n_layer"] = n_layer
    return params, quant


def write_quant_source(
    preset: str, path: str | os.PathLike[str], *, seed: int = 0, n_layer: int | None = None
) -> Path:
    """Write the unquantized (F16) source of a k-quant preset, for a llama-quantize run elsewhere
    (e.g. inside a chroot); `write_preset` with `llama_quantize` does both steps."""
    params, quant = _preset_params(preset, n_layer)
    if quant is None:
        raise UserError(f"preset {preset!r} is not a k-quant preset: use write_preset")
    params["ftype"] = "f16"
    return write_test_model(path, seed=seed, **params)


def write_preset(
    preset: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int | None = None,
    llama_quantize: str | os.PathLike[str] | None = None,
    quant_type: str | None = None,
    text_only: bool = False,
) -> Path:
    """Write a preset model; with `llama_quantize`, quantize an F16 write to `quant_type`
    (default: the preset's own k-quant layout, else Q4_K_M)."""
    params, quant = _preset_params(preset, n_layer)
    path = Path(path)
    if llama_quantize is None:
        if quant is not None:
            raise UserError(
                f"preset {preset!r} is {quant}, which gguf-py cannot write: pass a llama-quantize "
                "binary (--llama-quantize), e.g. one built from the pinned tree"
            )
        return write_test_model(path, seed=seed, text_only=text_only, **params)
    params["ftype"] = "f16"
    with tempfile.TemporaryDirectory(dir=path.parent if path.parent.exists() else None) as tmp:
        f16 = write_test_model(Path(tmp) / "f16.gguf", seed=seed, text_only=text_only, **params)
        return quantize_model(llama_quantize, f16, path, quant_type or quant or "Q4_K_M")


def _run(args: argparse.Namespace) -> int:
    out = write_preset(
        args.preset,
        args.out,
        seed=args.seed,
        n_layer=args.n_layer,
        llama_quantize=args.llama_quantize,
        quant_type=args.quant_type,
    )
    print(out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("testmodel", help="write a small random-weight llama GGUF model")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=None, help="override the preset's layer count")
    p.add_argument(
        "--llama-quantize", default=None, help="llama-quantize binary, to write a k-quant model"
    )
    p.add_argument(
        "--quant-type",
        default=None,
        help="type for --llama-quantize (default: the preset's layout, else Q4_K_M)",
    )
    p.set_defaults(func=_run)
