"""The large integer-dot matmul pipelines (`matmul_*_q8_1_l`, the board's prefill path) on lavapipe.

The slow tests need ROCKY_LLAMA_BIN_DIR: a bin/ with test-backend-ops built by .ci/llama.sh (trixie
glslc, so the int-dot shaders exist, and the test-only lavapipe hooks of llama_sources). lavapipe
implements integer dot products but does not report them as accelerated, which ggml-vulkan
requires: GGML_VK_TEST_INT_DOT_UNACCELERATED=1 lifts that; lavapipe has no pipeline statistics:
the hook makes GGML_VK_PIPELINE_STATS name each matching pipeline as it is compiled, and
ggml-vulkan compiles a pipeline only when a graph needs it. So the names seen are the pipelines
that ran.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import intdot_cases
from tests.helpers.llama_bin import SEEN, run_backend_ops

MALI_LINE = "using Mali matmul warptiles"
STOCK_LINE = "using stock matmul warptiles"


def test_cases_are_well_formed_and_reach_the_large_tile():
    lines = intdot_cases.case_lines()
    assert len(lines) == len(intdot_cases.QUANT_TYPES) * len(intdot_cases.SHAPES)
    for line, (t, (m, n, k)) in zip(
        lines,
        [(t, s) for t in intdot_cases.QUANT_TYPES for s in intdot_cases.SHAPES],
        strict=True,
    ):
        f = line.split()
        assert len(f) == 8 + 9 + 9 + 1 and f[-1] == "-"
        assert f[0] == str(intdot_cases.GGML_OP_MUL_MAT) and f[7] == "2"
        src0 = [int(x) for x in f[8:17]]
        assert src0[0] == t.ggml_type and src0[1:3] == [k, m] and k % t.block == 0
        assert src0[6] == k // t.block * t.size and src0[7] == src0[6] * m  # contiguous rows
        assert [int(x) for x in f[2:4]] == [m, n] and m > 64 and n > 64
    assert len(set(intdot_cases.pipelines())) == 11


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize("mode", ["force", "0"])
def test_every_q8_1_large_pipeline_runs_and_passes(tmp_path, mode):
    env = {
        "GGML_VK_MALI_WARPTILE": mode,
        "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1",
        "GGML_VK_PIPELINE_STATS": "_q8_1_l",
    }
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines())
    # The device info line keeps its own "int dot: 0" on lavapipe (it checks the accelerated flag
    # apart from device creation): the pipeline names are the proof.
    assert (MALI_LINE in out) == (mode == "force")
    assert (STOCK_LINE in out) == (mode == "0")
    assert sorted(set(SEEN.findall(out))) == sorted(intdot_cases.pipelines())


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_without_the_hook_lavapipe_keeps_the_float_path(tmp_path, monkeypatch):
    """The product's rule: no int-dot pipelines on a driver that reports them unaccelerated."""
    monkeypatch.delenv("GGML_VK_TEST_INT_DOT_UNACCELERATED", raising=False)
    env = {"GGML_VK_MALI_WARPTILE": "force", "GGML_VK_PIPELINE_STATS": "_q8_1_l"}
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines()[:1])
    assert re.search(r"ggml_vulkan: 0 = .*\| int dot: 0 \|", out), out[:3000]
    assert SEEN.findall(out) == []


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize("value", [None, "1", "yes"])
def test_auto_and_unknown_values_keep_stock_tiles_off_panvk(tmp_path, monkeypatch, value):
    """lavapipe is not panvk: auto keeps the stock tiles; a value other than 0/force warns."""
    monkeypatch.delenv("GGML_VK_MALI_WARPTILE", raising=False)
    env = {} if value is None else {"GGML_VK_MALI_WARPTILE": value}
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines()[:1])
    assert MALI_LINE not in out
    warning = f"ignoring GGML_VK_MALI_WARPTILE={value} (use 0, force or a tile spec"
    assert (warning in out) == (value is not None)
    assert (STOCK_LINE in out) == (value is not None)
