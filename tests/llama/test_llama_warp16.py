"""The matmul tiles at the Mali-G610's subgroup size, 16, on lavapipe (issue 23).

lavapipe reports `warp size: 16` with LP_NATIVE_VECTOR_WIDTH=512, so the tiles ggml-vulkan builds
there are the ones panvk gets. Bookworm's lavapipe has a use-after-free in its queue thread that
int-dot MUL_MAT_ID runs with small n trigger; .ci/llama.sh fetches bookworm-backports' lavapipe for
these tests (ROCKY_LAVAPIPE_ICD, ROCKY_LAVAPIPE_LIB).

For the Mali tiles forced, the stock tiles and a tile spec, MUL_MAT with n <= 32 (small tiles) and
n > 64 (large) and MUL_MAT_ID with n 17, 32 (small) and 129 must pass; the test-only hook
GGML_VK_TEST_LOG_TILES makes ggml-vulkan log every pipeline it compiled with its workgroup
denominators and specialization constants, and every matmul pipeline that ran must obey

    (BM / WM) * (BN / WN) == BLOCK_SIZE / WARP,  denominators == (BM, BN)

Output comparisons cannot catch a break of this rule (the extra warp's stores are dropped), the
log can: the patch before this series ran MUL_MAT_ID's small int-dot tiles with 2 warps over one
warp tile (issue 23, D1). CI runs q4_0 and q8_0 in every mode and q4_K (the reference model's
type) with the Mali tiles; docs/verification/llama-warp16.md records the other MoE types.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import intdot_cases
from tests.helpers.llama_bin import run_backend_ops, run_tool_cases

TILE_LINE = re.compile(r"^ggml_vulkan: test tile (\S+) denoms=(\d+),(\d+) spec=([\d,]+)$", re.M)
WARP16 = {"LP_NATIVE_VECTOR_WIDTH": "512", "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1"}
# Not the built-in Mali tiles: a 128-thread int tile and a 64x128 int_k tile.
SPEC = "int=128,64,64,32,16,32,2,2,2,1,16,2;int_k=256,64,128,32,16,32,1,2,2,1,16,2"
MODES = {"mali": "force", "stock": "0", "spec": SPEC}
CI_TYPES = ("q4_0", "q8_0")
BOARD_TYPE = "q4_k"  # Qwen2.5-3B-Instruct Q4_K_M's matmuls
# test-backend-ops' own cases (--test-file cases can trip over uninitialized sentinels): MUL_MAT
# 16x16 takes the small tile; m, n > 64 (a --test-file case, the tool has none per type) the large.
ID_NS = (17, 32, 129)


def tile_problems(log: str) -> list[str]:
    """Every logged matmul pipeline whose tile breaks the warp rule or whose denominators are not
    its BM and BN."""
    out = []
    for name, d0, d1, spec in TILE_LINE.findall(log):
        v = [int(x) for x in spec.split(",")]
        if not name.startswith("matmul_") or len(v) < 11:
            continue
        bs, bm, bn, wm, wn, warp = v[0], v[1], v[2], v[4], v[5], v[10]
        if bm % wm or bn % wn or bs % warp or (bm // wm) * (bn // wn) != bs // warp:
            out.append(f"{name}: {(bm // wm) * (bn // wn)} warp tiles for {bs // warp} warps")
        if (int(d0), int(d1)) != (bm, bn):
            out.append(f"{name}: denominators {d0},{d1} for a {bm}x{bn} tile")
    return out


def test_the_rule_check_catches_the_old_patch_tiles():
    # The previous patch's s_warptile_mmqid_int at subgroup 16, and a good Mali large tile.
    head = "ggml_vulkan: test tile"
    old = f"{head} matmul_id_subgroup_q4_0_q8_1_s denoms=32,32 spec=32,32,32,32,32,32,2,2,1,1,16"
    good = f"{head} matmul_q4_0_q8_1_l denoms=64,64 spec=256,64,64,32,16,16,2,2,2,1,16,2"
    assert tile_problems(good) == []
    assert tile_problems(old) == ["matmul_id_subgroup_q4_0_q8_1_s: 1 warp tiles for 2 warps"]
    assert tile_problems(good.replace("denoms=64,64", "denoms=128,128")) != []


def _large_lines(types: tuple[str, ...]) -> list[str]:
    by_name = {t.name: t for t in intdot_cases.QUANT_TYPES}
    return [intdot_cases.case_line(by_name[t], 128, 128, 256) for t in types]


def _ggml_names(types: tuple[str, ...]) -> str:
    return "|".join(t.replace("_k", "_K") for t in types)


def _env(mode: str) -> dict[str, str]:
    icd, lib = os.environ.get("ROCKY_LAVAPIPE_ICD"), os.environ.get("ROCKY_LAVAPIPE_LIB")
    if not icd or not lib:
        pytest.skip("ROCKY_LAVAPIPE_ICD/LIB unset (.ci/llama.sh fetches backports' lavapipe)")
    ld = ":".join(p for p in (lib, os.environ.get("LD_LIBRARY_PATH")) if p)
    return {
        **WARP16,
        "VK_DRIVER_FILES": icd,
        "LD_LIBRARY_PATH": ld,
        "GGML_VK_MALI_WARPTILE": MODES[mode],
        "GGML_VK_TEST_LOG_TILES": "1",
    }


def _run(tmp_path, env: dict[str, str], types: tuple[str, ...]) -> str:
    """Small-tile MUL_MAT, large-tile MUL_MAT and MUL_MAT_ID (4 experts, 2 used, m 512, k 256)."""
    names = _ggml_names(types)
    small = rf"type_a=({names}),type_b=f32,m=16,n=16,k=256,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\]"
    out = run_tool_cases(env, ["-o", "MUL_MAT", "-p", small], "MUL_MAT", None)
    out += run_backend_ops(tmp_path, env, _large_lines(types))
    ns = "|".join(map(str, ID_NS))
    moe = rf"type_a=({names}),type_b=f32,n_mats=4,n_used=2,b=0,m=512,n=({ns}),k=256($|,)"
    out += run_tool_cases(env, ["-o", "MUL_MAT_ID", "-p", moe], "MUL_MAT_ID", None)
    for t in _ggml_names(types).split("|"):  # the tool lists some cases twice: each one ran
        for n in ID_NS:
            assert f"MUL_MAT_ID(type_a={t},type_b=f32,n_mats=4,n_used=2,b=0,m=512,n={n}," in out
    return out


# Pipeline size suffixes: the pin names them _s, _m, _l; newer upstream trees (b11312, for the
# ported series in docs/verification/llama-upstream.md) number them _0, _1, _2.
SMALL, LARGE = ("s", "0"), ("l", "2")
# With the stock tiles, b11312 switches q8_0's large int-dot tile off when it does not fit in
# 32 KiB of shared memory (upstream's ggml_vk_matmul_int_shmem_support): the 128x128 case then runs
# on the medium tile. Beyond the small tile is what stock must show; the Mali tiles fit.
BEYOND_SMALL = ("m", "1", *LARGE)


def _check(out: str, mode: str, types: tuple[str, ...]) -> None:
    tiles = TILE_LINE.findall(out)
    # Every matmul pipeline was built for a warp of 16 (the pin also prints `warp size: 16`).
    warps = {spec.split(",")[10] for name, _, _, spec in tiles if name.startswith("matmul_")}
    assert warps == {"16"}, (warps, out[:2000])
    assert ("using Mali matmul warptiles" in out) == (mode != "stock"), out[:2000]
    if mode == "spec":
        assert "spec rejected" not in out and "(spec: int=" in out, out[:2000]
    ran = {name for name, *_ in tiles}
    for t in types:
        for sizes in (SMALL, BEYOND_SMALL if mode == "stock" else LARGE):
            assert any(f"matmul_{t}_q8_1_{x}" in ran for x in sizes), (t, sizes, sorted(ran))
        assert any(f"matmul_id_subgroup_{t}_q8_1_{x}" in ran for x in SMALL), (t, sorted(ran))
    assert tile_problems(out) == []


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize("mode", list(MODES))
def test_small_and_large_tiles_and_mul_mat_id_at_subgroup_16(tmp_path, mode):
    _check(_run(tmp_path, _env(mode), CI_TYPES), mode, CI_TYPES)


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_the_reference_models_quant_type_with_the_mali_tiles(tmp_path):
    types = (BOARD_TYPE,)
    _check(_run(tmp_path, _env("mali"), types), "mali", types)
