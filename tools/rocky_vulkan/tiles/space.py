"""The candidate space of large integer-dot matmul tiles for the Mali-G610 (subgroup 16).

The board's prompt processing (Q4_K_M) runs mul_mmq.comp's `int_k` (q4_K, q6_K) and `int`
families. A candidate names both, as a GGML_VK_MALI_WARPTILE spec (selftest/tune_spec.py has the
format and the rules). The space is kept to a few dozen on purpose: each candidate costs a
shader compile on the simulated G610 (minutes under emulation) and a pp512 run on the board
(~18 s), and the tuner has 20 minutes. The bounds, and why:

- BM x BN in {64x64, 128x64, 64x128}: the built-in 64 x 64 and the two tiles twice its size
  (each large pipeline takes its wg_denoms from its own tile, so any shape works; larger tiles
  reuse each loaded block more but leave fewer workgroups for the G610's 4 cores at pp512).
- WARP = 16 (the G610's subgroup), BK = 32 (fixed in mul_mmq.comp), TK = 1 (coopmat only).
- 8 or 16 accumulators per thread (WM*WN/WARP): the built-in tile's 16 already reach 60
  registers with 7 spills on matmul_q4_k_q8_1_l on the simulated G610 (tile_candidates.json),
  so 32 cannot stay in the 64 registers a thread has at full occupancy (the stock 128 spill 604
  times); 4 leaves each thread too little work to hide a 1024-thread workgroup's barriers.
- Estimated live registers <= 64: accumulators + the register cache of A (WMITER*TM blocks of
  9 words for q6_K / q8_0) + one B block (9 words). An estimate: the sim prune measures the truth.
- TM, TN in {1, 2} with TM*TN >= 2: 1 x 1 reuses no loaded value; 4-wide pieces push the A cache
  over the register estimate at 16+ accumulators.
- int_k keeps WMITER 1 (k-quant A blocks are the largest); int takes WMITER 2 where legal and
  within the estimate, else 1 -- the same pairing as upstream's and our built-in tiles.
- Warp tiles no more than 2:1 (8x16, 16x16, 16x32, ...): a skinnier one loads more shared memory
  per accumulator ((WM + WN) / (WM * WN)) for no saving in registers.
- BK_STEP in {2, 4}: K blocks staged per pair of barriers (upstream: "AMD likes 4, Intel likes 1
  and Nvidia likes 2"); 1 doubles the barriers of a 256-thread workgroup, and shared memory
  (<= 32768 B) is not what limits 4 at 64 x 64.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

from rocky_selftest.tune_spec import (
    FIELDS,
    G610,
    MMQ_BK,
    Limits,
    SpecError,
    format_spec,
    parse_spec,
    shared_bytes,
    spec_problems,
    tile_problems,
)

from rocky_vulkan.errors import UserError
from rocky_vulkan.tiles.warptile import mali_tiles_from_patch

__all__ = [
    "FIELDS",
    "Candidate",
    "SpecError",
    "builtin_tiles",
    "candidates",
    "estimated_registers",
    "format_spec",
    "parse_spec",
]

SHAPES = ((64, 64), (128, 64), (64, 128))
WARP = 16
BLOCK_SIZES = (128, 256, 512)
WARP_TILE_SIDES = (8, 16, 32)
THREAD_TILES = ((1, 2), (2, 1), (2, 2))
BK_STEPS = (2, 4)
MAX_ASPECT = 2
ACCUMULATORS = (8, 16)
REGISTERS = 64
A_BLOCK_WORDS = 9  # q6_K / q8_0 block_a_cache: 8 x int32 + f16 scale(s)
B_BLOCK_WORDS = 9  # block_b_cache: 8 x int32 + f16vec2


@dataclass(frozen=True)
class Candidate:
    name: str
    spec: str
    tiles: dict[str, tuple[int, ...]]
    accumulators: int
    est_registers: dict[str, int]
    shared_bytes: dict[str, int]
    builtin: bool = False

    def to_json(self) -> dict:
        d = asdict(self)
        d["tiles"] = {k: list(v) for k, v in self.tiles.items()}
        return d


def accumulators(values: tuple[int, ...]) -> int:
    v = dict(zip(FIELDS, values, strict=False))
    return v["WM"] * v["WN"] // v["WARP"]


def estimated_registers(values: tuple[int, ...]) -> int:
    """Live 32-bit registers per thread in mul_mmq.comp's inner loop (estimate, see above)."""
    v = dict(zip(FIELDS, values, strict=False))
    return accumulators(values) + A_BLOCK_WORDS * v["WMITER"] * v["TM"] + B_BLOCK_WORDS


def builtin_tiles(patch: Path) -> dict[str, tuple[int, ...]]:
    """The built-in Mali large tiles per family, read from our llama.cpp patch (WARPTILE_PATCH)."""
    return mali_tiles_from_patch(patch)


def _tile(
    shape: tuple[int, int], bs: int, wm: int, wn: int, wmiter: int, tm: int, tn: int, step: int
) -> tuple[int, ...]:
    bm, bn = shape
    return (bs, bm, bn, MMQ_BK, wm, wn, wmiter, tm, tn, 1, WARP, step)


def _fits(family: str, tile: tuple[int, ...], limits: Limits) -> bool:
    return not tile_problems(family, tile, limits) and estimated_registers(tile) <= REGISTERS


def _name(tile_k: tuple[int, ...], tile_i: tuple[int, ...]) -> str:
    bs, bm, bn, _, wm, wn, _, tm, tn, _, _, step = tile_k
    return f"{bm}x{bn}-b{bs}-w{wm}x{wn}-t{tm}x{tn}-s{step}-i{tile_i[6]}"


def candidates(builtin: dict[str, tuple[int, ...]], limits: Limits = G610) -> list[Candidate]:
    """Every candidate of the bounded space, the built-in pair first (marked builtin=True)."""
    out: list[Candidate] = []
    seen: set[str] = set()

    def add(tile_i: tuple[int, ...], tile_k: tuple[int, ...], is_builtin: bool = False) -> None:
        spec = {"int": tile_i, "int_k": tile_k}
        text = format_spec(spec)
        if text in seen or spec_problems(spec, builtin, limits):
            return
        seen.add(text)
        out.append(
            Candidate(
                name="builtin" if is_builtin else _name(tile_k, tile_i),
                spec=text,
                tiles=spec,
                accumulators=accumulators(tile_k),
                est_registers={f: estimated_registers(t) for f, t in spec.items()},
                shared_bytes={f: shared_bytes(f, t) for f, t in spec.items()},
                builtin=is_builtin,
            )
        )

    add(builtin["int"], builtin["int_k"], is_builtin=True)
    for shape, bs, wm, wn, (tm, tn), step in itertools.product(
        SHAPES, BLOCK_SIZES, WARP_TILE_SIDES, WARP_TILE_SIDES, THREAD_TILES, BK_STEPS
    ):
        if wm * wn // WARP not in ACCUMULATORS or max(wm, wn) > MAX_ASPECT * min(wm, wn):
            continue
        tile_k = _tile(shape, bs, wm, wn, 1, tm, tn, step)
        if not _fits("int_k", tile_k, limits):
            continue
        tile_i = _tile(shape, bs, wm, wn, 2, tm, tn, step)
        if not _fits("int", tile_i, limits):
            tile_i = tile_k
        add(tile_i, tile_k)
    if not out or not out[0].builtin:
        raise UserError("the built-in Mali tiles break the rules tune_spec checks: fix one")
    return out
