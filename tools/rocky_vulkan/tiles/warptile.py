"""Read ggml-vulkan's matmul warptiles out of the source and compute what they cost per thread.

A warptile is the specialization-constant vector {BLOCK_SIZE, BM, BN, BK, WM, WN, WMITER, TM, TN,
TK, WARP[, BK_STEP]}. Per thread a tile keeps WM*WN/WARP accumulators; the warps cover the block
exactly only when (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP. The numbers are evaluated for a device like
the Mali-G610 on panvk: subgroup size 16, no matrix cores, fp16.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from rocky_selftest.tune_spec import FIELDS, MMQ_Q8_0_A_BYTES

from rocky_vulkan.errors import UserError

VULKAN_CPP = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
# Values of the variables the non-coopmat branch of ggml_vk_load_shaders uses, at subgroup 16.
SUBGROUP_16 = {
    "subgroup_size_8": 16,
    "subgroup_size_16": 16,
    "subgroup_size_32": 32,
    "mul_mat_subgroup_size_8": 16,
    "mul_mat_subgroup_size_16": 16,
    "mul_mat_subgroup_size_32": 32,
    "s_warptile_wm": 32,
    "tm_l": 4, "tm_m": 4, "tm_s": 2,
    "tn_l": 4, "tn_m": 2, "tn_s": 2,
    "tk_l": 1, "tk_m": 1, "tk_s": 1,
}  # fmt: skip
DEFAULT_BK_STEP = 4  # mul_mmq.comp's value when the pipeline passes no 12th constant
# Shared-memory bytes per BK block in mul_mmq.comp for q8_0 with fp16: block_a_cache is
# MMQ_Q8_0_A_BYTES (8 x int32 + float16_t, padded), block_b_cache 8 x int32 + f16vec2.
MMQ_Q8_0_B_BYTES = 36
TILES = tuple(f"{size}_warptile{kind}" for kind in ("", "_mmq", "_mmq_int", "_mmq_int_k", "_id",
               "_mmqid", "_mmqid_int", "_mmqid_int_k") for size in "lms")  # fmt: skip


@dataclass(frozen=True)
class Tile:
    name: str
    values: tuple[int, ...]
    accumulators: int  # per thread: WM*WN/WARP
    warps: int  # BLOCK_SIZE/WARP
    warp_tiles: int  # (BM/WM)*(BN/WN)
    rule_ok: bool
    bk_step: int | None  # integer-dot tiles only
    shared_bytes: int  # f32 float tile, or q8_0 integer-dot tile (estimate)


def _eval(expr: str, env: dict[str, int], tiles: dict[str, tuple[int, ...]] | None = None) -> int:
    """Evaluate `16`, `subgroup_size_8 * 2`, `l_warptile[1]` (a tile parsed before) and the like."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if (
            tiles is not None
            and isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in tiles
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and 0 <= node.slice.value < len(tiles[node.value.id])
        ):
            return tiles[node.value.id][node.slice.value]
        if (  # the small tiles' WM (patch 0001): 32 * WARP / BLOCK_SIZE
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "ggml_vk_small_warptile_wm"
            and len(node.args) == 2
        ):
            block_size, warp = walk(node.args[0]), walk(node.args[1])
            return 32 * warp // block_size
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add | ast.Sub):
            a, b = walk(node.left), walk(node.right)
            return (
                a * b
                if isinstance(node.op, ast.Mult)
                else a + b
                if isinstance(node.op, ast.Add)
                else a - b
            )
        raise UserError(f"cannot evaluate warptile element {expr!r}")

    return walk(ast.parse(expr.strip(), mode="eval").body)


_ASSIGN = re.compile(r"^\s*((?:\w+\s*=\s*)+)\{([^}]*)\};", re.M)


def _top_level_items(text: str) -> list[str]:
    """`a, f(b, c), d` -> ['a', 'f(b, c)', 'd']: commas inside parentheses stay."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [*items, cur]


def _assignments(
    block: str, env: dict[str, int], tiles: dict[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for m in _ASSIGN.finditer(block):
        names = [n.strip() for n in m.group(1).split("=") if n.strip()]
        values = tuple(_eval(e, env, tiles) for e in _top_level_items(m.group(2)))
        for n in names:
            out[n] = values
    return out


def parse_tiles(source: str) -> dict[str, dict[str, tuple[int, ...]]]:
    """{'stock': {...}, 'mali': {...}} warptiles of the non-coopmat2 branch at subgroup 16 ('mali'
    empty when the source has no Mali branch). Each pipeline's workgroup denominators are its
    tile's BM and BN (the patch series)."""
    start = source.find("// Matrix cores require different warp group sizes")
    tuning = source.find("// chip specific tuning", start)
    if min(start, tuning) < 0:
        raise UserError("ggml-vulkan.cpp does not have the expected ggml_vk_load_shaders layout")
    stock = _assignments(source[start:tuning], SUBGROUP_16)
    first = source[tuning : source.find("{", tuning) + 1]
    if "mali_warptile" not in first and "eMesaPanvk" not in first:
        return {"stock": stock, "mali": {}}
    branch_end = source.find("} else if", tuning)
    mali = dict(stock)
    mali.update(_assignments(source[tuning:branch_end], SUBGROUP_16, stock))
    return {"stock": stock, "mali": mali}


def analyse(name: str, values: tuple[int, ...]) -> Tile:
    v = dict(zip(FIELDS, values, strict=False))
    warps = v["BLOCK_SIZE"] // v["WARP"]
    warp_tiles = (v["BM"] // v["WM"]) * (v["BN"] // v["WN"])
    integer = "_int" in name
    default_step = 1 if "mmqid" in name else DEFAULT_BK_STEP  # MUL_MAT_ID: `#define BK_STEP 1`
    bk_step = (values[11] if len(values) > 11 else default_step) if integer else None
    if integer:
        shared = bk_step * (v["BM"] * MMQ_Q8_0_A_BYTES + v["BN"] * MMQ_Q8_0_B_BYTES)
    else:  # mul_mm.comp stages (BM + BN) * (BK + 1) FLOAT_TYPE values: float in f32acc pipelines
        shared = (v["BM"] + v["BN"]) * (v["BK"] + 1) * 4
    return Tile(
        name=name,
        values=values,
        accumulators=v["WM"] * v["WN"] // v["WARP"],
        warps=warps,
        warp_tiles=warp_tiles,
        rule_ok=warp_tiles == warps,
        bk_step=bk_step,
        shared_bytes=shared,
    )


def report(tree: Path) -> dict[str, list[Tile]]:
    src = Path(tree) / VULKAN_CPP
    if not src.is_file():
        raise UserError(f"{src} not found: pass a llama.cpp source tree")
    tiles = parse_tiles(src.read_text())
    return {
        kind: [analyse(n, tiles[kind][n]) for n in TILES if n in tiles[kind]]
        for kind in ("stock", "mali")
    }


def _run(args: argparse.Namespace) -> int:
    rep = report(Path(args.dir))
    if args.json:
        print(json.dumps({k: [asdict(t) for t in v] for k, v in rep.items()}))
        return 0
    print(f"{'tile':22} {'stock acc':>9} {'mali acc':>8} {'stock rule':>10} {'mali rule':>9} "
          f"{'stock shmem':>11} {'mali shmem':>10}")  # fmt: skip
    mali = {t.name: t for t in rep["mali"]}
    for t in rep["stock"]:
        m = mali.get(t.name, t)
        print(f"{t.name:22} {t.accumulators:9} {m.accumulators:8} "
              f"{t.warp_tiles}/{t.warps:<8} {m.warp_tiles}/{m.warps:<7} "
              f"{t.shared_bytes:11} {m.shared_bytes:10}")  # fmt: skip
    return 0


MALI_BRANCH = "if (device->driver_id == vk::DriverId::eMesaPanvk && device->subgroup_size == 16"
FAMILY_TILES = {
    "mm": "l_warptile",
    "mmq": "l_warptile_mmq",
    "int": "l_warptile_mmq_int",
    "int_k": "l_warptile_mmq_int_k",
}


def mali_tiles_from_patch(patch: Path) -> dict[str, tuple[int, ...]]:
    """The built-in Mali large tiles per spec family ({'int': (...), ...}), read from the added
    lines of our llama.cpp patch: the patch is the one source of these numbers."""
    try:
        text = Path(patch).read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot read {patch}: {err.strerror or err}") from None
    added = "\n".join(ln[1:] for ln in text.splitlines() if ln.startswith("+") and ln[1:2] != "+")
    start = added.find(MALI_BRANCH)
    if start < 0:
        raise UserError(f"{patch}: no `{MALI_BRANCH}` branch among the added lines")
    body = []
    for line in added[start:].splitlines()[1:]:
        if line.strip().startswith("}"):  # the branch's closing brace (or the next else if)
            break
        body.append(line)
    tiles = _assignments("\n".join(body), SUBGROUP_16)
    missing = [t for t in FAMILY_TILES.values() if t not in tiles]
    if missing:
        raise UserError(f"{patch}: the Mali branch sets no {', '.join(missing)}")
    return {family: tiles[name] for family, name in FAMILY_TILES.items()}
