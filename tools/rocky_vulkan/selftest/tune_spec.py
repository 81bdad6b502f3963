"""GGML_VK_MALI_WARPTILE tile specs: the exact string format and the rules a spec must obey.

Our llama.cpp patch reads, besides `0` and `force`, a spec of the large matmul tiles per pipeline
family, e.g.

    int=256,64,64,32,16,16,2,2,2,1,16,2;int_k=256,64,64,32,16,16,1,2,2,1,16,2

Families: mm (float mul_mm, 11 values), mmq (dequant mul_mm, 11), int (integer-dot mul_mmq, 12)
and int_k (k-quant integer-dot mul_mmq, 12); values in the order of FIELDS, the 12th is BK_STEP.
A family the spec leaves out keeps the built-in Mali tile. The rules below are the ones the
shaders (mul_mm.comp, mul_mmq.comp at ggml f76511eb) assume, checked here so a spec this tool
writes is one ggml-vulkan accepts. Standard library only: the board's tuner uses it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIELDS = ("BLOCK_SIZE", "BM", "BN", "BK", "WM", "WN", "WMITER", "TM", "TN", "TK", "WARP")
BK_STEP = "BK_STEP"
# Family -> number of values; the order is the order a formatted spec lists them in.
FAMILIES = {"mm": 11, "mmq": 11, "int": 12, "int_k": 12}
INTEGER_FAMILIES = ("int", "int_k")
ENV_VAR = "GGML_VK_MALI_WARPTILE"
MMQ_BK = 32  # mul_mmq.comp: `#define BK 32`, the spec constant 3 is not used
MAX_VALUE = 4096  # no tile constant is larger; keeps hostile numbers out of the arithmetic
MAX_SPEC_CHARS = 400
_VALUE = r"[1-9][0-9]{0,3}"
_FAMILY = re.compile(rf"(mm|mmq|int|int_k)=({_VALUE}(?:,{_VALUE}){{10,11}})", re.ASCII)
# Worst-case bytes per shared-memory entry of mul_mmq.comp (mul_mmq_shmem_types.glsl) when the
# device has no fp16 (FLOAT_TYPE float): block_a_cache of q8_0/q5_K/q6_K/iq4_nl is 8 x int32 + a
# float or vec2 (<= 40), block_b_cache 8 x int32 + vec2 (40). With fp16 both are 36: 40 is safe.
MMQ_A_BYTES = 40
MMQ_B_BYTES = 40
MM_TYPE_BYTES = 4  # mul_mm.comp stages FLOAT_TYPE: float without fp16


class SpecError(ValueError):
    """A spec string that is malformed or breaks a rule; the message names which."""


@dataclass(frozen=True)
class Limits:
    """The device limits a spec is checked against (Mali-G610 on panvk by default)."""

    max_invocations: int = 1024  # maxComputeWorkGroupInvocations
    max_shared_bytes: int = 32768  # maxComputeSharedMemorySize
    subgroup: int = 16


G610 = Limits()


def parse_spec(text: str) -> dict[str, tuple[int, ...]]:
    """{family: values} from a spec string; SpecError naming the first thing wrong. Only the
    format is checked here; `tile_problems` / `spec_problems` check the rules."""
    if not isinstance(text, str) or not text:
        raise SpecError("empty spec; expected e.g. int=256,64,...;int_k=256,64,...")
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"spec is {len(text)} characters, at most {MAX_SPEC_CHARS}")
    spec: dict[str, tuple[int, ...]] = {}
    for part in text.split(";"):
        m = _FAMILY.fullmatch(part)  # fullmatch: `$` would let a newline through
        if not m:
            raise SpecError(
                f"{part[:60]!r} is not FAMILY=V1,...,Vn (family mm, mmq, int or int_k; values "
                "positive integers without leading zeros, 11 or 12 of them)"
            )
        family, values = m.group(1), tuple(int(v) for v in m.group(2).split(","))
        if family in spec:
            raise SpecError(f"{family}: named twice")
        if len(values) != FAMILIES[family]:
            raise SpecError(f"{family}: {len(values)} values, needs {FAMILIES[family]}")
        spec[family] = values
    return spec


def format_spec(spec: dict[str, tuple[int, ...]]) -> str:
    """The spec string, families in FAMILIES order; refuses what parse_spec would refuse."""
    text = ";".join(
        f"{fam}={','.join(str(v) for v in spec[fam])}" for fam in FAMILIES if fam in spec
    )
    if set(spec) - set(FAMILIES):
        raise SpecError(f"unknown families {sorted(set(spec) - set(FAMILIES))}")
    if parse_spec(text) != {k: tuple(v) for k, v in spec.items()}:
        raise SpecError(f"{text!r} does not read back as the same spec")
    return text


def shared_bytes(family: str, values: tuple[int, ...]) -> int:
    """Shared memory of the family's shader, from the shader's own declarations (worst case)."""
    v = dict(zip(FIELDS, values, strict=False))
    if family in INTEGER_FAMILIES:
        # shared block_a_cache buf_a[BM * BK_STEP]; shared block_b_cache buf_b[BN * BK_STEP];
        return values[11] * (v["BM"] * MMQ_A_BYTES + v["BN"] * MMQ_B_BYTES)
    # mul_mm.comp: buf_a[BM * SHMEM_STRIDE], buf_b[BN * SHMEM_STRIDE], stride BK + 1 (padding)
    return (v["BM"] + v["BN"]) * (v["BK"] + 1) * MM_TYPE_BYTES


def tile_problems(family: str, values: tuple[int, ...], limits: Limits = G610) -> list[str]:
    """Every rule one family's tile breaks, as 'family: rule' (empty when legal)."""
    if family not in FAMILIES:
        return [f"{family}: unknown family"]
    if len(values) != FAMILIES[family] or any(
        not isinstance(x, int) or not 0 < x <= MAX_VALUE for x in values
    ):
        return [f"{family}: needs {FAMILIES[family]} integers from 1 to {MAX_VALUE}"]
    v = dict(zip(FIELDS, values, strict=False))
    bs, bm, bn, wm, wn, wmiter, tm, tn, warp = (
        v[k] for k in ("BLOCK_SIZE", "BM", "BN", "WM", "WN", "WMITER", "TM", "TN", "WARP")
    )
    out: list[str] = []

    def rule(ok: bool, text: str) -> None:
        if not ok:
            out.append(f"{family}: {text}")

    rule(bs <= limits.max_invocations, f"BLOCK_SIZE <= {limits.max_invocations}")
    rule(bs % warp == 0, "BLOCK_SIZE % WARP == 0")
    rule(bm % wm == 0 and bn % wn == 0, "BM % WM == 0 and BN % WN == 0")
    if out:
        return out
    rule((bm // wm) * (bn // wn) == bs // warp, "(BM/WM)*(BN/WN) == BLOCK_SIZE/WARP")
    # mul_mm*.comp: WNITER = WM*WN / (WARP*TM*TN*WMITER); WSUBM = WM/WMITER; WSUBN = WN/WNITER;
    # each thread of a warp owns a TM x TN piece of every WSUBM x WSUBN sub-tile.
    per_warp = warp * tm * tn * wmiter
    rule((wm * wn) % per_warp == 0, "WM*WN % (WARP*TM*TN*WMITER) == 0")
    if not out:
        wniter = wm * wn // per_warp
        rule(wm % wmiter == 0 and (wm // wmiter) % tm == 0, "WM % WMITER, (WM/WMITER) % TM == 0")
        rule(wn % wniter == 0 and (wn // wniter) % tn == 0, "WN % WNITER, (WN/WNITER) % TN == 0")
    rule(v["TK"] == 1, "TK == 1 (only coopmat uses TK)")
    if family in INTEGER_FAMILIES:
        rule(v["BK"] == MMQ_BK, f"BK == {MMQ_BK} (mul_mmq.comp fixes BK)")
    else:
        rule(v["BK"] % 4 == 0 and v["BK"] <= 64, "BK % 4 == 0 and BK <= 64")
    shared = shared_bytes(family, values)
    rule(
        shared <= limits.max_shared_bytes,
        f"shared memory {shared} B <= {limits.max_shared_bytes} B",
    )
    return out


def spec_problems(
    spec: dict[str, tuple[int, ...]],
    builtin: dict[str, tuple[int, ...]],
    limits: Limits = G610,
) -> list[str]:
    """Every rule the spec breaks, with the families it leaves out at their built-in tiles.

    wg_denoms: ggml sets l_mmq_wg_denoms = l_wg_denoms once for all four large tiles, and the
    dispatch divides M and N by them, so every large tile must share one BM and one BN."""
    out = [p for fam, values in spec.items() for p in tile_problems(fam, values, limits)]
    merged = {**builtin, **spec}
    shapes = {fam: (vals[1], vals[2]) for fam, vals in merged.items()}
    if len(set(shapes.values())) > 1:
        named = ", ".join(f"{f} {bm}x{bn}" for f, (bm, bn) in shapes.items())
        out.append(f"wg_denoms: every large tile needs the same BM x BN ({named})")
    return out


def check_spec(
    text: str, builtin: dict[str, tuple[int, ...]], limits: Limits = G610
) -> dict[str, tuple[int, ...]]:
    """parse_spec + spec_problems: the spec, or SpecError listing every broken rule."""
    spec = parse_spec(text)
    problems = spec_problems(spec, builtin, limits)
    if problems:
        raise SpecError("; ".join(problems))
    return spec
