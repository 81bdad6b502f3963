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

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import intdot_cases

BIN = os.environ.get("ROCKY_LLAMA_BIN_DIR")
DEVICE = os.environ.get("ROCKY_VK_DEVICE", "0")
MALI_LINE = "using Mali matmul warptiles"
STOCK_LINE = "using stock matmul warptiles"
SEEN = re.compile(r"ggml_vulkan: pipeline stats for (matmul_\w+_q8_1_l):")


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


def _tbo(tmp_path: Path, env: dict[str, str | None], cases: list[str]) -> str:
    """Run test-backend-ops on the given --test-file cases; every case must run and pass.
    `env` values of None leave the variable unset (inherited tile settings are always cleared)."""
    if not BIN:
        pytest.skip("ROCKY_LLAMA_BIN_DIR unset: build llama.cpp with .ci/llama.sh")
    tbo = Path(BIN) / "test-backend-ops"
    if not tbo.is_file():
        pytest.skip(f"{tbo} missing")
    path = tmp_path / "intdot.cases"
    path.write_text("\n".join(cases) + "\n")
    # test-backend-ops b9101: test_generic_op (the --test-file cases) initializes only its sources,
    # not the sentinels around them, so a sentinel holds whatever the allocator left there and a
    # stale NaN pattern fails the case with "[NONE] NaN at index ..." on CPU and Vulkan alike.
    # MALLOC_PERTURB_=255 makes glibc hand out zeroed memory (lavapipe's device memory included);
    # the sentinels' overflow check (CPU vs Vulkan bytes equal) is unchanged.
    full = dict(
        os.environ, GGML_NO_BACKTRACE="1", GGML_VK_VISIBLE_DEVICES=DEVICE, MALLOC_PERTURB_="255"
    )
    for key in ("GGML_VK_MALI_WARPTILE", "GGML_VK_DISABLE_INTEGER_DOT_PRODUCT"):
        full.pop(key, None)
    full.update({key: value for key, value in env.items() if value is not None})
    cmd = [str(tbo), "-b", "Vulkan0", "--test-file", str(path)]
    proc = subprocess.run(cmd, env=full, capture_output=True, timeout=1800)
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    # Without the Vulkan device, test-backend-ops skips it and still exits 0: count the cases.
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m, "no test count: the Vulkan device was skipped?\n" + out[-2000:]
    assert m.group(2) == str(len(cases)), out[-3000:]
    results = [ln for ln in out.splitlines() if "MUL_MAT(" in ln and ("OK" in ln or "FAIL" in ln)]
    assert len(results) == len(cases), out[-3000:]
    bad = [ln for ln in results if "FAIL" in ln]
    assert not bad, "\n".join(bad)
    assert m.group(1) == m.group(2) and proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["force", "0"])
def test_every_q8_1_large_pipeline_runs_and_passes(tmp_path, mode):
    env = {
        "GGML_VK_MALI_WARPTILE": mode,
        "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1",
        "GGML_VK_PIPELINE_STATS": "_q8_1_l",
    }
    out = _tbo(tmp_path, env, intdot_cases.case_lines())
    # The device info line keeps its own "int dot: 0" on lavapipe (it checks the accelerated flag
    # apart from device creation): the pipeline names are the proof.
    assert (MALI_LINE in out) == (mode == "force")
    assert (STOCK_LINE in out) == (mode == "0")
    assert sorted(set(SEEN.findall(out))) == sorted(intdot_cases.pipelines())


@pytest.mark.slow
def test_without_the_hook_lavapipe_keeps_the_float_path(tmp_path, monkeypatch):
    """The product's rule: no int-dot pipelines on a driver that reports them unaccelerated."""
    monkeypatch.delenv("GGML_VK_TEST_INT_DOT_UNACCELERATED", raising=False)
    env = {"GGML_VK_MALI_WARPTILE": "force", "GGML_VK_PIPELINE_STATS": "_q8_1_l"}
    out = _tbo(tmp_path, env, intdot_cases.case_lines()[:1])
    assert re.search(r"ggml_vulkan: 0 = .*\| int dot: 0 \|", out), out[:3000]
    assert SEEN.findall(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("value", [None, "1", "yes"])
def test_auto_and_unknown_values_keep_stock_tiles_off_panvk(tmp_path, monkeypatch, value):
    """lavapipe is not panvk: auto keeps the stock tiles; a value other than 0/force warns."""
    monkeypatch.delenv("GGML_VK_MALI_WARPTILE", raising=False)
    env = {} if value is None else {"GGML_VK_MALI_WARPTILE": value}
    out = _tbo(tmp_path, env, intdot_cases.case_lines()[:1])
    assert MALI_LINE not in out
    warning = f"ignoring GGML_VK_MALI_WARPTILE={value} (use 0 or force)"
    assert (warning in out) == (value is not None)
    assert (STOCK_LINE in out) == (value is not None)
