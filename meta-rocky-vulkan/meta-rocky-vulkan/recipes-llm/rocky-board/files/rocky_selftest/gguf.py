"""GGUF headers read with hard bounds: the few values the server's memory plan needs
(model_shape), and where the tensor data ends (layout: the host's `model fetch` takes a download
as complete only when its size is what its header describes).

A GGUF file starts with its metadata (key, type, value), then the tensor infos and the weights;
at most MAX_HEADER_BYTES of header are read (a 150k-token vocabulary is about 5 MB), every count,
length and dimension is bounded, so a hostile or truncated file gives GgufError, never a hang or
a huge allocation. The rules are those of the pinned llama.cpp's gguf.cpp (b9101).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

MAX_HEADER_BYTES = 64 << 20
MAX_KEYS = 100_000
MAX_STRING = 1 << 20
MAX_TENSORS = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME - 1: a tensor name's bytes
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT, unless general.alignment (a uint32) says
VERSIONS = (2, 3)  # what the pinned llama.cpp reads; v1 is no longer supported there
# ggml types: (elements per block, bytes per block), from the pinned llama.cpp's ggml-common.h;
# 4, 5 and 31-33, 36-38 are removed types that no GGUF file may use.
TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18),
}  # fmt: skip

# GGUF value types: struct format of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS.update({11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9


class GgufError(Exception):
    """Not a GGUF file, or its header is malformed or beyond the bounds."""


class GgufTruncated(GgufError):
    """The file ends inside its header: a download cut short (or a stub)."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    context_length: int  # n_ctx_train
    kv_bytes_per_token: int  # K and V of every layer at f16, llama.cpp's default cache type
    n_layer: int = 0  # block_count
    n_expert: int = 0  # experts per layer; 0: a dense model


class _Reader:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.used = fh, 0

    def take(self, n: int) -> bytes:
        self.used += n
        if self.used > MAX_HEADER_BYTES:
            raise GgufError(f"metadata larger than {MAX_HEADER_BYTES} bytes")
        data = self.fh.read(n)
        if len(data) != n:
            raise GgufTruncated("the file ends inside its header")
        return data

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, limit: int = MAX_STRING) -> str:
        n = self.scalar(10)
        if n > limit:
            raise GgufError(f"a string of {n} bytes (at most {limit} here)")
        return self.take(n).decode("utf-8", "replace")

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar(4), self.scalar(10)
            if item == _ARRAY or (item not in _SCALARS and item != _STRING):
                raise GgufError(f"array of unknown type {item}")
            if item in _SCALARS and not keep:  # skip without reading value by value
                self.take(count * struct.calcsize(_SCALARS[item]))
                return None
            if not keep:  # strings one by one; each takes at least 8 header bytes
                for _ in range(count):
                    self.value(item, keep)
                return None
            return [self.value(item, keep) for _ in range(count)]
        raise GgufError(f"unknown value type {kind}")


def _header(r: _Reader) -> tuple[int, int, int]:
    """(version, tensor count, metadata key count), each checked."""
    if r.take(4) != b"GGUF":
        raise GgufError("not a GGUF file")
    version = r.scalar(4)
    if version not in VERSIONS:
        raise GgufError(f"GGUF version {version}, expected 2 or 3")
    n_tensors, n_keys = r.scalar(10), r.scalar(10)
    if n_tensors > MAX_TENSORS:
        raise GgufError(f"{n_tensors} tensors (at most {MAX_TENSORS} here)")
    if n_keys > MAX_KEYS:
        raise GgufError(f"{n_keys} metadata keys")
    return version, n_tensors, n_keys


def read_metadata(path: str, wanted: set[str]) -> dict[str, Any]:
    """The values of the `wanted` keys that the file has."""
    with open(path, "rb") as fh:
        r = _Reader(fh)
        try:
            _, _, n_keys = _header(r)
        except GgufError as err:
            raise GgufError(f"{path}: {err}") from None
        found: dict[str, Any] = {}
        for _ in range(n_keys):
            key = r.string()
            kind = r.scalar(4)
            value = r.value(kind, keep=key in wanted)
            if key in wanted:
                found[key] = value
        return found


@dataclass(frozen=True)
class Layout:
    """Where a GGUF file's parts are, from its header alone."""

    version: int
    tensors: int
    alignment: int
    data_offset: int  # the header, padded to the alignment
    data_end: int  # the end of the last tensor's bytes
    padded_end: int  # ... padded to the alignment, as llama.cpp and gguf-py write it

    def complete(self, size: int) -> bool:
        """A file of `size` bytes holds exactly the data its header describes (writers pad the
        last tensor; a file without that padding is read as well)."""
        return size in (self.data_end, self.padded_end)


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _tensor_bytes(r: _Reader, i: int) -> tuple[str, int, int]:
    """(name, bytes, offset) of tensor info `i`, checked as gguf.cpp checks it."""
    try:
        name = r.string(MAX_NAME)
    except GgufTruncated:
        raise
    except GgufError as err:
        raise GgufError(f"tensor {i}: its name is {err}") from None
    n_dims = r.scalar(4)
    if n_dims > MAX_DIMS:
        raise GgufError(f"tensor {name!r}: {n_dims} dimensions (at most {MAX_DIMS})")
    dims = [r.scalar(11) for _ in range(n_dims)]
    elements = 1
    for d in dims:
        if d < 0:
            raise GgufError(f"tensor {name!r}: a negative dimension")
        elements *= d
    if elements >= 1 << 63:
        raise GgufError(f"tensor {name!r}: {elements} elements")
    kind = r.scalar(5)
    if kind not in TYPE_SIZES:
        raise GgufError(f"tensor {name!r}: unknown ggml type {kind}")
    block, size = TYPE_SIZES[kind]
    if dims and dims[0] % block:
        raise GgufError(f"tensor {name!r}: rows of {dims[0]}, not a multiple of {block}")
    return name, elements // block * size, r.scalar(10)


def layout(path: str) -> Layout:
    """The file's layout from its header: GgufTruncated when it ends inside the header,
    GgufError when the header is malformed or beyond the bounds."""
    with open(path, "rb") as fh:
        r = _Reader(fh)
        version, n_tensors, n_keys = _header(r)
        keys: set[str] = set()
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_keys):
            key = r.string()
            if key in keys:
                raise GgufError(f"metadata key {key!r} twice")
            keys.add(key)
            kind = r.scalar(4)
            if key == "general.alignment":
                if kind != 4:
                    raise GgufError(f"general.alignment of value type {kind}, not uint32")
                alignment = r.scalar(4)
                if alignment == 0 or alignment & (alignment - 1):
                    raise GgufError(f"general.alignment {alignment} is not a power of 2")
            else:
                r.value(kind, keep=False)
        names: set[str] = set()
        end = padded = 0
        for i in range(n_tensors):
            name, size, offset = _tensor_bytes(r, i)
            if name in names:
                raise GgufError(f"tensor {name!r} twice")
            names.add(name)
            if offset != padded:  # gguf.cpp: tensors follow each other, each padded
                raise GgufError(f"tensor {name!r} at data offset {offset}, expected {padded}")
            end, padded = padded + size, padded + _pad(size, alignment)
        start = _pad(r.used, alignment)
        return Layout(version, n_tensors, alignment, start, start + end, start + padded)


def _positive(value: Any, key: str) -> int:
    if isinstance(value, list):  # per-layer values (some architectures): the largest
        value = max(value, default=0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
        raise GgufError(f"{key} is {value!r}, not a positive count")
    return value


def _count(value: Any, key: str) -> int:
    """A count that may be 0 (absent keys read as 0)."""
    return 0 if value == 0 and type(value) is int else _positive(value, key)


def model_shape(path: str) -> ModelShape:
    """Context length and KV-cache bytes per token, from the model's own metadata."""
    arch_key = "general.architecture"
    arch = read_metadata(path, {arch_key}).get(arch_key)
    if not isinstance(arch, str) or not arch.replace("_", "").isalnum():
        raise GgufError(f"{path}: no usable {arch_key} ({arch!r})")
    keys = {
        name: f"{arch}.{name}"
        for name in (
            "context_length",
            "block_count",
            "embedding_length",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.key_length",
            "attention.value_length",
            "expert_count",
        )
    }
    meta = read_metadata(path, set(keys.values()))
    need = ("context_length", "block_count", "embedding_length", "attention.head_count")
    missing = [keys[k] for k in need if keys[k] not in meta]
    if missing:
        raise GgufError(f"{path}: metadata lacks {', '.join(missing)}")
    value = {name: _positive(meta[key], key) for name, key in keys.items() if key in meta}
    heads = value["attention.head_count"]
    head_dim = value["embedding_length"] // heads
    kv_heads = value.get("attention.head_count_kv", heads)
    k_len = value.get("attention.key_length", head_dim)
    v_len = value.get("attention.value_length", head_dim)
    per_token = value["block_count"] * kv_heads * (k_len + v_len) * 2  # f16
    experts = _count(meta.get(keys["expert_count"], 0), keys["expert_count"])
    return ModelShape(arch, value["context_length"], per_token, value["block_count"], experts)
