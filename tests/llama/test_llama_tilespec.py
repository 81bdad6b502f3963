"""The runtime tile spec, GGML_VK_MALI_WARPTILE=<spec>, on lavapipe (the patched test-backend-ops).

The slow tests need ROCKY_LLAMA_BIN_DIR: a bin/ with test-backend-ops built by .ci/llama.sh (trixie
glslc, the test-only lavapipe hooks; see tests/llama/test_llama_intdot.py for what the hooks do).
The grammar and rules are in docs/dev/formats.md, section "Tile spec"; every
rule has a spec here that breaks it (and only it, the earlier rules hold) and must get its own
one-line rejection and the built-in Mali tiles.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import intdot_cases
from tests.helpers.llama_bin import run_backend_ops

MALI_LINE = "ggml_vulkan: using Mali matmul warptiles (GGML_VK_MALI_WARPTILE=0 to disable)"
STOCK_LINE = "using stock matmul warptiles"
REJECTED = "ggml_vulkan: GGML_VK_MALI_WARPTILE spec rejected: "
BUILTIN = "; using the built-in Mali tiles"
SEEN = re.compile(r"ggml_vulkan: pipeline stats for (matmul_\w+_l):")

# Not the built-in Mali tiles: a 128-thread int tile, a 128x128 int_k tile with 64 accumulators
# per thread and WARP 32 (lavapipe's subgroup is 8), a 128-thread float tile and a 128x64 dequant
# tile: the large pipelines of the four families no longer share BM, BN.
VALID = {
    "mm": "128,64,64,32,16,32,2,2,2,1,16",
    "mmq": "256,128,64,32,32,16,2,2,2,1,16",
    "int": "128,64,64,32,16,32,2,2,2,1,16,2",
    "int_k": "256,128,128,32,32,64,2,4,4,1,32,2",
}


def _spec(families: dict[str, str]) -> str:
    return ";".join(f"{k}={v}" for k, v in families.items())


def _canonical(families: dict[str, str]) -> str:
    return ";".join(f"{k}={families[k]}" for k in ("mm", "mmq", "int", "int_k") if k in families)


# One spec per rule, in the rules' order; the text is what the rejection line must say.
BAD = [
    (
        "int=4096,64,64,32,16,16,2,2,2,1,16,2",
        "int: BLOCK_SIZE <= maxComputeWorkGroupInvocations broken",
    ),
    ("int=256,64,64,32,16,16,2,2,2,1,24,2", "int: BLOCK_SIZE % WARP == 0 broken"),
    ("int=256,64,64,32,12,16,2,2,2,1,16,2", "int: BM % WM == 0 && BN % WN == 0 broken"),
    (
        "int=256,64,64,32,16,16,2,2,2,1,32,2",
        "int: (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP broken (16 != 8)",
    ),
    (
        "int_k=256,64,64,32,16,16,1,3,2,1,16,2",
        "int_k: WM % WMITER == 0 && (WM/WMITER) % TM == 0 broken",
    ),
    ("int=256,64,64,32,16,16,4,4,2,1,16,2", "int: (WM*WN) % (WARP*TM*TN*WMITER) == 0 broken"),
    ("int=8,32,32,32,16,32,1,1,1,1,4,1", "int: WN % WNITER == 0 && (WN/WNITER) % TN == 0 broken"),
    ("int=256,64,64,32,16,16,2,2,2,2,16,2", "int: TK == 1 broken"),
    ("mmq=256,64,64,32,16,16,2,1,2,1,16", "mmq: TM % 2 == 0 broken"),
    ("mm=256,64,64,12,16,16,2,2,2,1,16", "mm: BK % 4 == 0 && 128 % BK == 0 broken"),
    ("int=256,64,64,16,16,16,2,2,2,1,16,2", "int: BK == 32 broken"),
    (
        "mmq=512,64,128,32,16,16,2,2,2,1,16",
        "mmq: BLOCK_SIZE % 16 == 0 && BM % (BLOCK_SIZE/4) == 0 && BN % (BLOCK_SIZE/4) == 0 broken",
    ),
    (
        "mm=256,64,64,4,16,16,2,2,2,1,16",
        "mm: BLOCK_SIZE % r == 0 && BM % (BLOCK_SIZE/r) == 0 && BN % (BLOCK_SIZE/r) == 0 "
        "for r = BK/2, BK/4 broken (r 2)",
    ),
    ("int=12,48,32,32,16,32,1,4,1,1,4,1", "int: BLOCK_SIZE % 8 == 0 broken"),
    # BK_STEP 64: the upper bound 64 * (64 + 64) * 48 + 16 + 2048, more than any device's
    (
        "int=256,64,64,32,16,16,2,2,2,1,16,64",
        "int: shared memory <= maxComputeSharedMemorySize broken (up to 395280 > ",
    ),
    # D4: 16 rows per workgroup; D2: BN 96 under-pads with ROUNDUP_POW2; D4: 256 accumulators
    ("int=256,16,64,32,16,16,2,2,2,1,16,2", "int: BM >= 32 && BN >= 32 broken (BM 16, BN 64)"),
    ("int=96,64,96,32,32,32,1,2,2,1,16,1", "int: BN a power of two broken (BN 96)"),
    ("int=16,64,64,32,64,64,1,4,4,1,16,1", "int: WM*WN/WARP <= 128 accumulators per thread broken"),
    # grammar
    (
        "int=256,64",
        "int: 2 values, expected 12 (BLOCK_SIZE,BM,BN,BK,WM,WN,WMITER,TM,TN,TK,WARP,BK_STEP)",
    ),
    (
        "mm=" + VALID["int"],
        "mm: 12 values, expected 11 (BLOCK_SIZE,BM,BN,BK,WM,WN,WMITER,TM,TN,TK,WARP)",
    ),
    ("foo=1,2", "entry 1: unknown family (expected mm, mmq, int or int_k)"),
    ("int=" + VALID["int"] + ";", "entry 2: expected <family>=<values>"),
    ("=1", "entry 1: expected <family>=<values>"),
    ("int=x" + VALID["int"][3:], "int: value 1 is not a number from 1 to 65535"),
    ("int=0" + VALID["int"][3:], "int: value 1 is not a number from 1 to 65535"),
    ("int=128,64,64,32,16,32,2,2,2,1,16,65536", "int: value 12 is not a number from 1 to 65535"),
    ("int=128, 64,64,32,16,32,2,2,2,1,16,2", "int: value 2 is not a number from 1 to 65535"),
    ("int=" + VALID["int"] + ";int=" + VALID["int"], "int: named twice"),
    # a valid family before a broken one: all or nothing
    ("int=" + VALID["int"] + ";int_k=256,64,64,32,16,16,2,2,2,1,32,2", "int_k: (BM/WM)*(BN/WN)"),
]


def _float_cases() -> list[str]:
    """f32, f16, bf16 (mul_mm.comp, mm family) and iq4_nl (dequant, mmq family), m and n > 64.

    k 224 is not a multiple of the large alignment (128): the unaligned pipelines run too."""
    lines = []
    for ggml_type, block, size in ((0, 1, 4), (1, 1, 2), (30, 1, 2), (20, 32, 18)):
        for m, n, k in ((128, 128, 256), (136, 72, 224)):
            row = k // block * size
            a = [ggml_type, k, m, 1, 1, size, row, row * m, row * m]
            b = [0, k, n, 1, 1, 4, 4 * k, 4 * k * n, 4 * k * n]
            fields = [intdot_cases.GGML_OP_MUL_MAT, 0, m, n, 1, 1, 0, 2, *a, *b, "-"]
            lines.append(" ".join(str(f) for f in fields))
    return lines


def test_bad_specs_cover_every_rule_once():
    rules = [want.split(": ", 1)[1].split(" broken")[0] for _, want in BAD if " broken" in want]
    # R1-R16 of the doc, R10 (BK) in its two forms and R11 in two parts: 18 distinct conditions
    assert len(rules) == len(set(rules)) == 18
    assert all(";" not in v and "=" not in v for v in VALID.values())
    assert _canonical(VALID) == _spec(VALID)


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_valid_spec_runs_every_large_int_dot_pipeline(tmp_path):
    spec = _spec(VALID)
    env = {
        "GGML_VK_MALI_WARPTILE": spec,
        "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1",
        "GGML_VK_PIPELINE_STATS": "_q8_1_l",
    }
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines())
    assert REJECTED not in out, out[:3000]
    want = f"ggml_vulkan: using Mali matmul warptiles (spec: {_canonical(VALID)}) "
    assert want + "(GGML_VK_MALI_WARPTILE=0 to disable)" in out, out[:3000]
    assert sorted(set(SEEN.findall(out))) == sorted(intdot_cases.pipelines())


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_valid_spec_runs_the_float_and_dequant_large_pipelines(tmp_path):
    # Spec families named out of order: the log line gives them in the canonical order.
    spec = _spec({k: VALID[k] for k in ("mmq", "mm")})
    env = {"GGML_VK_MALI_WARPTILE": spec, "GGML_VK_PIPELINE_STATS": "matmul_"}
    # One process per source type: all 8 cases in one test-backend-ops process crash about 1 run
    # in 5 on bookworm's lavapipe (segfault in libvulkan_lvp.so or "corrupted double-linked
    # list"), also without the spec; any 4-6 of them in one process never did
    # (docs/verification/layout.md, "A lavapipe crash").
    cases = _float_cases()
    seen: set[str] = set()
    for i in range(0, len(cases), 2):
        out = run_backend_ops(tmp_path, env, cases[i : i + 2])
        assert f"(spec: mm={VALID['mm']};mmq={VALID['mmq']})" in out, out[:3000]
        seen |= set(SEEN.findall(out))
    for src in ("f32", "f16", "bf16", "iq4_nl"):
        large = {p for p in seen if p.startswith(f"matmul_{src}_")}
        assert any("aligned" in p for p in large) and any("aligned" not in p for p in large), (
            src,
            sorted(seen),
        )


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize(("spec", "want"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_each_broken_rule_gets_one_line_and_the_builtin_tiles(tmp_path, spec, want):
    env = {"GGML_VK_MALI_WARPTILE": spec, "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1"}
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines()[:1])
    lines = [ln for ln in out.splitlines() if "GGML_VK_MALI_WARPTILE" in ln and "rejected" in ln]
    assert len(lines) == 1, out[:3000]
    assert lines[0].startswith(REJECTED + want) and lines[0].endswith(BUILTIN), lines[0]
    assert MALI_LINE in out and "(spec:" not in out and STOCK_LINE not in out


@pytest.mark.slow
@pytest.mark.needs_llama_bin
@pytest.mark.parametrize("value", [None, "0", "force", "1"])
def test_without_a_spec_nothing_changes(tmp_path, value):
    """Unset, 0, force and an unknown value keep their lines; none mentions a spec."""
    env = {"GGML_VK_MALI_WARPTILE": value, "GGML_VK_TEST_INT_DOT_UNACCELERATED": "1"}
    out = run_backend_ops(tmp_path, env, intdot_cases.case_lines()[:1])
    assert "spec rejected" not in out and "(spec:" not in out
    assert (MALI_LINE in out) == (value == "force")
    assert (STOCK_LINE in out) == (value in ("0", "1"))
    unknown = "ignoring GGML_VK_MALI_WARPTILE=1 (use 0, force or a tile spec <family>=<values>"
    assert (unknown in out) == (value == "1")
