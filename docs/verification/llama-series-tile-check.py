#!/usr/bin/env python3
"""Checks the `ggml_vulkan: test tile NAME denoms=A,B spec=...` lines (GGML_VK_TEST_LOG_TILES=1)
of a test-backend-ops log: every matmul pipeline's denominators are its tile's BM, BN (spec 1, 2),
and every scalar tile (11+ constants: BLOCK_SIZE, BM, BN, BK, WM, WN, WMITER, TM, TN, TK, WARP, ...)
obeys (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP. coopmat2 tiles (fewer constants) get the denominator
check only. Prints one summary line; the large-tile pipelines are those ending in _l (b9101) or _2
(b11312's size index), "mali" counts large tiles with BLOCK_SIZE 256, BM = BN = 64."""

import re
import sys

tiles = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"ggml_vulkan: test tile (\S+) denoms=(\d+),(\d+) spec=([\d,]*)", line)
    if m and m.group(1).startswith("matmul"):
        tiles[m.group(1)] = (
            int(m.group(2)),
            int(m.group(3)),
            [int(v) for v in m.group(4).split(",") if v],
        )
bad = []
for name, (d0, d1, sp) in sorted(tiles.items()):
    if len(sp) < 3 or (d0, d1) != (sp[1], sp[2]):
        bad.append(f"{name}: denoms {d0},{d1} vs BM,BN {sp[1:3]}")
    elif len(sp) >= 11:
        bs, bm, bn, wm, wn, warp = sp[0], sp[1], sp[2], sp[4], sp[5], sp[10]
        if bs % warp or bm % wm or bn % wn or (bm // wm) * (bn // wn) != bs // warp:
            bad.append(f"{name}: {(bm // wm) * (bn // wn)} warp tiles for {bs // warp} warps")
large = [n for n in tiles if re.search(r"_(l|2)$", n) or re.search(r"_aligned_(l|2)$", n)]
mali = [n for n in large if tiles[n][2][:3] == [256, 64, 64]]
q81_large = sorted({re.sub(r"_(l|2)$", "", n) for n in large if "_q8_1_" in n})
print(
    f"tiles={len(tiles)} large={len(large)} mali-large={len(mali)} q8_1-large={len(q81_large)} "
    f"rule/denoms broken={len(bad)}" + (" :: " + "; ".join(bad[:6]) if bad else "")
)
