"""GGUF files for the model-fetch tests: real ones written by the gguf package (PAYLOAD, OTHER,
valid_variants) and hostile ones packed byte by byte (gguf_raw, HOSTILE_HEADERS, TRUNCATIONS).

Every file is at least 1 MiB, the smallest download `model fetch` takes for a model, so a refusal
comes from the header or the layout check, not from the size floor."""

from __future__ import annotations

import functools
import struct
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8
ROWS, COLS = 256, 1024  # one F32 tensor of 1 MiB


def write_gguf(tensors: list[tuple[str, np.ndarray, GGMLQuantizationType | None]], **kw) -> bytes:
    """A file written by gguf.GGUFWriter: `tensors` as (name, array, raw_dtype or None);
    kw: alignment, kv (name -> str), tokens (a string array)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_name("fetch-test")
        if kw.get("alignment"):
            writer.add_custom_alignment(kw["alignment"])
        for key, value in kw.get("kv", {}).items():
            writer.add_string(key, value)
        if kw.get("tokens"):
            writer.add_token_list(kw["tokens"])
        for name, array, raw in tensors:
            writer.add_tensor(name, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def _floats(seed: int, n: int = ROWS * COLS) -> np.ndarray:
    return ((np.arange(n, dtype=np.float32) * (seed + 1)) % 251).reshape(-1, COLS)


PAYLOAD = write_gguf([("w", _floats(0), None)])
OTHER = write_gguf([("w", _floats(1), None)])  # same length and header, other weights
assert len(OTHER) == len(PAYLOAD) and OTHER != PAYLOAD
LONGER = write_gguf([("w", _floats(6, (ROWS + 1) * COLS), None)])  # one row more


def payload_layout(data: bytes = PAYLOAD) -> dict[str, int]:
    """Offsets inside a file (by gguf's own reader): the data section, a point in the middle of
    the metadata and one inside the tensor infos."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(data)
        reader = gguf.GGUFReader(str(path))
        fields = list(reader.fields.values())
        kv_mid = fields[len(fields) // 2].offset + 3
        infos = reader.tensors[0].field.offset + 5
        return {"data_offset": reader.data_offset, "kv_mid": kv_mid, "infos_mid": infos}


# --- packed by hand ------------------------------------------------------------------------------


def _s(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


def kv_str(key: bytes, value: bytes) -> bytes:
    return _s(key) + struct.pack("<I", 8) + _s(value)


def kv_u32(key: bytes, value: int) -> bytes:
    return _s(key) + struct.pack("<I", 4) + struct.pack("<I", value)


def nbytes(kind: int, dims: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def gguf_raw(
    tensors: list[tuple[bytes, int, tuple[int, ...]]] = ((b"w", F32, (COLS, ROWS)),),
    *,
    kvs: list[bytes] | None = None,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
    info: bytes | None = None,
    offsets: list[int] | None = None,
    data_bytes: int | None = None,
) -> bytes:
    """A GGUF file packed by hand; every part can be overridden with hostile values."""
    kvs = [kv_str(b"general.architecture", b"llama")] if kvs is None else kvs
    sizes = [nbytes(kind, dims) for _, kind, dims in tensors]
    if offsets is None:
        offsets, at = [], 0
        for size in sizes:
            offsets.append(at)
            at += _pad(size, alignment)
    if info is None:
        info = b"".join(
            _s(name)
            + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<I", kind)
            + struct.pack("<Q", off)
            for (name, kind, dims), off in zip(tensors, offsets, strict=True)
        )
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors or len(tensors), n_kv or len(kvs))
    meta = head + b"".join(kvs) + info
    meta += b"\0" * (_pad(len(meta), alignment) - len(meta))
    if data_bytes is None:
        data_bytes = sum(_pad(s, alignment) for s in sizes)
    return meta + bytes(range(256)) * (data_bytes // 256) + b"\x07" * (data_bytes % 256)


def _info(name: bytes, dims: list[int], kind: int, offset: int = 0, n_dims=None, name_len=None):
    return (
        _s(name, name_len)
        + struct.pack("<I", len(dims) if n_dims is None else n_dims)
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<I", kind)
        + struct.pack("<Q", offset)
    )


MIB = ROWS * COLS * 4
ARCH = kv_str(b"general.architecture", b"llama")


def _hostile_headers() -> dict[str, bytes]:
    big = 1 << 40
    h: dict[str, bytes] = {}
    for v in (0, 1, 4, 2**32 - 1):
        h[f"version-{v}"] = gguf_raw(version=v)
    for label, n in (("2^40", big), ("2^64-1", 2**64 - 1), ("actual+1", 2)):
        h[f"tensor-count-{label}"] = gguf_raw(n_tensors=n)
        h[f"kv-count-{label}"] = gguf_raw(n_kv=n)
    h["key-length-2^60"] = gguf_raw(kvs=[_s(b"general.architecture", 2**60) + b"\x08\0\0\0"])
    h["key-length-2^64-1"] = gguf_raw(kvs=[_s(b"k", 2**64 - 1)])
    h["string-value-2^62"] = gguf_raw(kvs=[_s(b"k") + struct.pack("<I", 8) + _s(b"v", 2**62)])
    arr = _s(b"a") + struct.pack("<I", 9)
    h["array-u8-count-2^60"] = gguf_raw(kvs=[ARCH, arr + struct.pack("<IQ", 0, 2**60)])
    h["array-string-count-2^40"] = gguf_raw(kvs=[ARCH, arr + struct.pack("<IQ", 8, big)])
    h["array-of-arrays"] = gguf_raw(kvs=[ARCH, arr + struct.pack("<IQ", 9, 1)])
    h["kv-type-13"] = gguf_raw(kvs=[ARCH, _s(b"k") + struct.pack("<I", 13)])
    h["kv-type-2^32-1"] = gguf_raw(kvs=[ARCH, _s(b"k") + struct.pack("<I", 2**32 - 1)])
    h["duplicate-key"] = gguf_raw(kvs=[ARCH, ARCH])
    w = (b"w", F32, (COLS, ROWS))
    for label, inf in {
        "n-dims-5": _info(b"w", [COLS, ROWS, 1, 1, 1], F32),
        "n-dims-2^32-1": _info(b"w", [COLS, ROWS], F32, n_dims=2**32 - 1),
        "dim-negative": _info(b"w", [2**63 + 1, ROWS], F32),
        "dims-product-2^70": _info(b"w", [2**35, 2**35], F32),
        "dims-2^40-elements": _info(b"w", [2**20, 2**20], F32),
        "type-4-removed": _info(b"w", [COLS, ROWS], 4),
        "type-42": _info(b"w", [COLS, ROWS], 42),
        "type-2^31": _info(b"w", [COLS, ROWS], 2**31),
        "row-not-a-multiple-of-the-block": _info(b"w", [33, ROWS], Q4_0),
        "offset-32": _info(b"w", [COLS, ROWS], F32, 32),
        "offset-2^63": _info(b"w", [COLS, ROWS], F32, 2**63),
        "name-64-bytes": _info(b"w" * 64, [COLS, ROWS], F32),
        "name-length-2^40": _info(b"w", [COLS, ROWS], F32, name_len=big),
    }.items():
        h[f"tensor-{label}"] = gguf_raw([w], info=inf)
    two = [(b"a", F32, (COLS, ROWS // 2)), (b"a", F32, (COLS, ROWS // 2))]
    h["tensor-duplicate-name"] = gguf_raw(two)
    h["tensor-offsets-out-of-order"] = gguf_raw(two[:1] + [(b"b", F32, (COLS, ROWS // 2))],
                                                offsets=[MIB // 2, 0])  # fmt: skip
    for label, kv in {
        "alignment-0": kv_u32(b"general.alignment", 0),
        "alignment-3": kv_u32(b"general.alignment", 3),
        "alignment-2^31": kv_u32(b"general.alignment", 2**31),
        "alignment-as-string": kv_str(b"general.alignment", b"32"),
        "alignment-as-u64": _s(b"general.alignment") + struct.pack("<IQ", 10, 32),
        "alignment-as-array": _s(b"general.alignment") + struct.pack("<IIQI", 9, 4, 1, 32),
    }.items():
        h[label] = gguf_raw(kvs=[ARCH, kv])
    return h


HOSTILE_HEADERS = _hostile_headers()

# PAYLOAD with its last tensor padded: an F32 tensor of 1 MiB + 4 bytes (28 bytes of padding).
PADDED = write_gguf([("w", np.arange(ROWS * COLS + 1, dtype=np.float32) % 7, None)])


def _truncations() -> dict[str, bytes]:
    return {
        "last-byte-missing": PAYLOAD[:-1],
        "last-4096-missing": PAYLOAD[:-4096],
        "one-trailing-byte": PAYLOAD + b"\0",
        "4096-trailing-bytes": PAYLOAD + b"\0" * 4096,
        "twice": PAYLOAD + PAYLOAD,
        "cut-inside-final-padding": PADDED[:-10],
        "cut-before-final-padding-minus-1": PADDED[:-29],
    }


TRUNCATIONS = _truncations()


@functools.cache
def valid_variants() -> dict[str, bytes]:
    """Files llama.cpp reads, of other shapes: accepted and pinned."""
    q8 = np.zeros((ROWS * 2, COLS // 32 * 34), dtype=np.uint8)
    q4 = np.ones((ROWS * 2, COLS // 32 * 18), dtype=np.uint8)
    tokens = [f"tok{i}" for i in range(5000)]
    return {
        "q8_0-f16-f32": write_gguf(
            [
                ("a", q8, GGMLQuantizationType.Q8_0),
                ("b", _floats(2).astype(np.float16), None),
                ("c", np.ones(3, dtype=np.float32), None),
            ]  # fmt: skip
        ),
        "q4_0-alignment-64": write_gguf(
            [("a", q4, GGMLQuantizationType.Q4_0), ("b", _floats(3), None)], alignment=64
        ),  # fmt: skip
        "alignment-4096": write_gguf([("w", _floats(4), None)], alignment=4096),
        "5000-tokens-and-keys": write_gguf(
            [("w", _floats(5), None)], tokens=tokens, kv={f"x.k{i}": "v" * i for i in range(300)}
        ),
        "last-tensor-padded": PADDED,
        "last-tensor-unpadded": PADDED[:-28],
        "packed-by-hand": gguf_raw(),
    }
