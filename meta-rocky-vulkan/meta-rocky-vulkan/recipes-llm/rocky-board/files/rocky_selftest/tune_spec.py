"""GGML_VK_MALI_WARPTILE tile specs: the exact string format and the rules a spec must obey.

Our llama.cpp patch reads, besides `0` and `force`, a spec of the large matmul tiles per pipeline
family, e.g.

    int=256,64,64,32,16,16,2,2,2,1,16,2;int_k=256,64,64,32,16,16,1,2,2,1,16,2

Families: mm (float mul_mm, 11 values), mmq (dequant mul_mm, 11), int (integer-dot mul_mmq, 12)
and int_k (k-quant integer-dot mul_mmq, 12); values in the order of FIELDS, the 12th is BK_STEP.
A family the spec leaves out keeps the built-in Mali tile. The rules mirror the patch's R1-R13
(docs/dev/formats.md, "Tile spec", from mul_mm.comp / mul_mmq.comp at ggml
f76511eb), never looser: values up to 4096 (patch: 65535) and shared memory at fp32 sizes (the
patch: fp16 sizes on fp16 devices). So a spec this tool writes is one ggml-vulkan accepts.
Standard library only: the board's tuner uses it too.
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
# Shared memory uses the fp32 sizes (FLOAT_TYPEV2 vec2 = 8 bytes, block_b_cache 40 bytes): the
# patch counts 4 / 36 on fp16 devices like the G610, so these bounds are never looser than its.
V2_BYTES = 8
MMQ_B_BYTES = 40
MMQ_Q8_0_A_BYTES = 36  # block_a_cache of q8_0 / mxfp4 (the `int` family's largest)
MMQ_PADDED_BLOCK_BYTES = 48  # any block_a_cache / block_b_cache (<= 40 B) at 16-byte alignment
DRIVER_SHARED_RESERVE = 2048  # left for what a driver adds to the declared shared memory
MAX_ACCUMULATORS = 128  # WM*WN/WARP of the stock large tile at subgroup size 16
MMQ_LUT_BYTES = 12288  # iq1_s / iq1_m lookup table, as ggml_vk_matmul_shmem_support counts it
MXFP4_KVALUES_BYTES = 16


# What our llama.cpp patch logs (ggml-vulkan.cpp), read by the self-test, the tuner and
# `rocky-vulkan tiles prune`.
MALI_TILES_MARKER = "using Mali matmul warptiles"  # info level, with the tiles in use
STOCK_TILES_MARKER = "using stock matmul warptiles"
REJECTED_MARKER = f"{ENV_VAR} spec rejected: "  # then the rule; the built-in tiles run
IGNORED_MARKER = f"ignoring {ENV_VAR}="  # a patch from before tile specs


def rejection(stderr: str) -> str | None:
    """The rule ggml-vulkan named when it refused the spec (it then runs the built-in tiles)."""
    for line in stderr.splitlines():
        if REJECTED_MARKER in line:
            rule = line.split(REJECTED_MARKER, 1)[1]
            return rule.split("; using the built-in", 1)[0].strip()[:200]
    return None


def spec_applied(stderr: str, spec: str) -> bool:
    """ggml-vulkan's info line names the tiles in use, the spec included."""
    return any(MALI_TILES_MARKER in ln and spec in ln for ln in stderr.splitlines())


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
    """Shared memory of the family's shader as the patch bounds it (R13), at fp32 sizes: an upper
    bound, since drivers pad shared structs their own way (NVIDIA: 14336 bytes for an int tile
    whose block caches add up to 9216)."""
    v = dict(zip(FIELDS, values, strict=False))
    bm, bn, bk = v["BM"], v["BN"], v["BK"]
    if family in INTEGER_FAMILIES:  # buf_a, buf_b[BM or BN * BK_STEP], kvalues_mxfp4
        declared = values[11] * (bm + bn) * MMQ_PADDED_BLOCK_BYTES + MXFP4_KVALUES_BYTES
    elif family == "mmq":  # SHMEM_STRIDE BK/2 + 1 vec2 at BK 32, plus the largest lookup table
        declared = (bm + bn) * 17 * V2_BYTES + MMQ_LUT_BYTES
    else:  # mm: bf16 takes BK from the spec
        declared = (bm + bn) * max(17 * V2_BYTES, (bk // 2 + 1) * 8)
    return declared + DRIVER_SHARED_RESERVE


def tile_problems(family: str, values: tuple[int, ...], limits: Limits = G610) -> list[str]:
    """Every rule one family's tile breaks, as 'family: <rule>' in the patch's words (its rules
    R1-R13, docs/dev/formats.md "Tile spec"); empty when legal."""
    if family not in FAMILIES:
        return [f"{family}: unknown family"]
    if len(values) != FAMILIES[family] or any(
        not isinstance(x, int) or not 0 < x <= MAX_VALUE for x in values
    ):
        return [f"{family}: needs {FAMILIES[family]} integers from 1 to {MAX_VALUE}"]
    v = dict(zip(FIELDS, values, strict=False))
    bs, bm, bn, bk, wm, wn, wmiter, tm, tn, warp = (
        v[k] for k in ("BLOCK_SIZE", "BM", "BN", "BK", "WM", "WN", "WMITER", "TM", "TN", "WARP")
    )
    out: list[str] = []

    def rule(ok: bool, text: str) -> None:
        if not ok:
            out.append(f"{family}: {text}")

    rule(bs <= limits.max_invocations, "BLOCK_SIZE <= maxComputeWorkGroupInvocations")  # R1
    rule(bs % warp == 0, "BLOCK_SIZE % WARP == 0")  # R2
    rule(bm % wm == 0 and bn % wn == 0, "BM % WM == 0 && BN % WN == 0")  # R3
    if out:
        return out  # the rules below divide by these
    # R1b: fewer rows per workgroup than 32 need more workgroups than a dispatch allows for a large
    # vocabulary; columns are padded with ROUNDUP_POW2(n, BN).
    rule(bm >= 32 and bn >= 32, "BM >= 32 && BN >= 32")
    rule(bn & (bn - 1) == 0, "BN a power of two")
    rule((bm // wm) * (bn // wn) == bs // warp, "(BM/WM)*(BN/WN) == BLOCK_SIZE/WARP")  # R4
    # R4b: more accumulators than the stock large tile keeps at subgroup size 16 only spill
    rule(wm * wn // warp <= MAX_ACCUMULATORS, "WM*WN/WARP <= 128 accumulators per thread")
    # The shaders: WNITER = WM*WN / (WARP*TM*TN*WMITER), WSUBM = WM/WMITER, WSUBN = WN/WNITER;
    # each thread of a warp owns a TM x TN piece of every WSUBM x WSUBN sub-tile.
    rule(wm % wmiter == 0 and (wm // wmiter) % tm == 0, "WM % WMITER == 0 && (WM/WMITER) % TM == 0")
    per_warp = warp * tm * tn * wmiter
    rule((wm * wn) % per_warp == 0, "(WM*WN) % (WARP*TM*TN*WMITER) == 0")  # R6
    wniter = wm * wn // per_warp
    if wniter >= 1:
        rule(
            wn % wniter == 0 and (wn // wniter) % tn == 0,
            "WN % WNITER == 0 && (WN/WNITER) % TN == 0",
        )
    rule(v["TK"] == 1, "TK == 1")  # R8
    if family in ("mm", "mmq"):
        rule(tm % 2 == 0, "TM % 2 == 0")  # R9
    if family == "mm":
        rule(bk % 4 == 0 and 128 % bk == 0, "BK % 4 == 0 && 128 % BK == 0")  # R10
    else:
        rule(bk == MMQ_BK, "BK == 32")  # R10: mul_mmq.comp `#define BK 32`, quants in mul_mm
    if family in ("mm", "mmq"):  # R11: load passes of BLOCK_SIZE/4 rows, no row bound
        pass_rows = bs // 4
        rule(
            bs % 16 == 0 and bm % pass_rows == 0 and bn % pass_rows == 0,
            "BLOCK_SIZE % 16 == 0 && BM % (BLOCK_SIZE/4) == 0 && BN % (BLOCK_SIZE/4) == 0",
        )
    if family == "mm":  # R11b: bf16 loads BK-wide rows, 2 or 4 values per thread
        ok = all(
            r > 0 and bs % r == 0 and bm % (bs // r) == 0 and bn % (bs // r) == 0
            for r in (bk // 2, bk // 4)
        )
        rule(ok, "BLOCK_SIZE % r == 0 && BM % (BLOCK_SIZE/r) == 0 && BN % (BLOCK_SIZE/r) == 0")
    if family in INTEGER_FAMILIES:
        rule(bs % 8 == 0, "BLOCK_SIZE % 8 == 0")  # R12
    shared = shared_bytes(family, values)
    rule(shared <= limits.max_shared_bytes, "shared memory <= maxComputeSharedMemorySize")  # R13
    return out


def spec_problems(
    spec: dict[str, tuple[int, ...]],
    builtin: dict[str, tuple[int, ...]] | None = None,
    limits: Limits = G610,
) -> list[str]:
    """Every rule the spec breaks. The families need not agree on BM x BN: each large pipeline
    takes its wg_denoms from its own tile (the patch). `builtin` is accepted for callers that
    check a spec beside the built-in tiles; no rule needs it."""
    return [p for fam, values in spec.items() for p in tile_problems(fam, values, limits)]


def check_spec(
    text: str, builtin: dict[str, tuple[int, ...]] | None = None, limits: Limits = G610
) -> dict[str, tuple[int, ...]]:
    """parse_spec + spec_problems: the spec, or SpecError listing every broken rule."""
    spec = parse_spec(text)
    problems = spec_problems(spec, builtin, limits)
    if problems:
        raise SpecError("; ".join(problems))
    return spec
