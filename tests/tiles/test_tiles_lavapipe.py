"""A handful of the shipped tile candidates give correct large int-dot matmuls on lavapipe.

Slow, needs ROCKY_LLAMA_BIN_DIR with a spec-capable test-backend-ops (see
tests/llama/test_llama_intdot.py for the lavapipe hooks). Each candidate runs the L-tile cases of
intdot_cases (all 11 matmul_*_q8_1_l pipelines) with GGML_VK_MALI_WARPTILE=<spec>; ggml-vulkan's
info line must name the spec, so a spec it silently refused cannot pass as the built-in tiles.
"""

from __future__ import annotations

import json
import os

import pytest
from rocky_vulkan.tiles import CANDIDATES_PATH

from tests.helpers import intdot_cases
from tests.helpers.llama_bin import SEEN, run_backend_ops

ALL = os.environ.get("ROCKY_TILES_ALL") == "1"


def _kept() -> list[dict]:
    doc = json.loads(CANDIDATES_PATH.read_text())
    return [c for c in doc["candidates"] if c["kept"] and not c["builtin"]]


def _shape(c: dict) -> tuple[int, int, int]:
    k = c["tiles"]["int_k"]
    return (k[1], k[2], k[0])  # BM, BN, BLOCK_SIZE


def _handful() -> list[dict]:
    """Kept candidates of each shape and thread count, the built-in left out (test_llama_intdot
    covers it): one per (BM, BN, BLOCK_SIZE), BK_STEP 4 (the largest shared use) where kept.
    ROCKY_TILES_ALL=1: every kept candidate (about 40 s each on lavapipe)."""
    kept = _kept()
    if ALL:
        return kept
    picked: dict[tuple[int, int, int], dict] = {}
    for c in sorted(kept, key=lambda c: -c["tiles"]["int_k"][11]):
        picked.setdefault(_shape(c), c)
    return list(picked.values())


@pytest.mark.skipif(ALL, reason="ROCKY_TILES_ALL=1 takes every candidate")
def test_the_handful_spans_the_shapes():
    assert {_shape(c) for c in _handful()} == {_shape(c) for c in _kept()}
    assert len({(bm, bn) for bm, bn, _ in map(_shape, _handful())}) >= 2


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize("cand", _handful(), ids=lambda c: c["name"])
def test_candidate_passes_the_large_int_dot_cases(tmp_path, cand):
    env = {
        "GGML_VK_MALI_WARPTILE": cand["spec"],
        "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1",
        "GGML_VK_PIPELINE_STATS": "_q8_1_l",
    }
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines())
    if "ignoring GGML_VK_MALI_WARPTILE" in out:
        pytest.skip("this test-backend-ops predates GGML_VK_MALI_WARPTILE=<spec>")
    assert f"(spec: {cand['spec']})" in out, out[:3000]
    assert "spec rejected" not in out
    assert sorted(set(SEEN.findall(out))) == sorted(intdot_cases.pipelines())
