"""The few GGUF header values the server's memory plan needs, read with hard bounds.

A GGUF file starts with its metadata (key, type, value), then the tensor infos and the weights;
only the metadata is read, and at most MAX_HEADER_BYTES of it (a 150k-token vocabulary is about
5 MB), so a hostile or truncated file gives GgufError, never a hang or a huge allocation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

MAX_HEADER_BYTES = 64 << 20
MAX_KEYS = 100_000
MAX_STRING = 1 << 20

# GGUF value types: struct format of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS.update({11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9


class GgufError(Exception):
    """Not a GGUF file, or its header is malformed or beyond the bounds."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    context_length: int  # n_ctx_train
    kv_bytes_per_token: int  # K and V of every layer at f16, llama.cpp's default cache type


class _Reader:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.used = fh, 0

    def take(self, n: int) -> bytes:
        self.used += n
        if self.used > MAX_HEADER_BYTES:
            raise GgufError(f"metadata larger than {MAX_HEADER_BYTES} bytes")
        data = self.fh.read(n)
        if len(data) != n:
            raise GgufError("file ends inside its metadata")
        return data

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        if n > MAX_STRING:
            raise GgufError(f"a string of {n} bytes")
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
            values = [self.value(item, keep) for _ in range(count)]
            return values if keep else None
        raise GgufError(f"unknown value type {kind}")


def read_metadata(path: str, wanted: set[str]) -> dict[str, Any]:
    """The values of the `wanted` keys that the file has."""
    with open(path, "rb") as fh:
        r = _Reader(fh)
        if r.take(4) != b"GGUF":
            raise GgufError(f"{path}: not a GGUF file")
        version = r.scalar(4)
        if version not in (2, 3):
            raise GgufError(f"{path}: GGUF version {version}, expected 2 or 3")
        r.scalar(10)  # tensor count
        n_keys = r.scalar(10)
        if n_keys > MAX_KEYS:
            raise GgufError(f"{path}: {n_keys} metadata keys")
        found: dict[str, Any] = {}
        for _ in range(n_keys):
            key = r.string()
            kind = r.scalar(4)
            value = r.value(kind, keep=key in wanted)
            if key in wanted:
                found[key] = value
        return found


def _positive(value: Any, key: str) -> int:
    if isinstance(value, list):  # per-layer values (some architectures): the largest
        value = max(value, default=0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
        raise GgufError(f"{key} is {value!r}, not a positive count")
    return value


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
    return ModelShape(arch, value["context_length"], per_token)
