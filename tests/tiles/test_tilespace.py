"""The tile candidate space and the GGML_VK_MALI_WARPTILE spec format and rules."""

from __future__ import annotations

import pytest
from rocky_selftest import tune_spec as ts
from rocky_vulkan.tiles import space as tilespace

from tests.helpers import project

BUILTIN_SPEC = "int=256,64,64,32,16,16,2,2,2,1,16,2;int_k=256,64,64,32,16,16,1,2,2,1,16,2"


@pytest.fixture(scope="module")
def builtin():
    return project.builtin_tiles()


def test_builtin_tiles_come_from_the_patch(builtin):
    assert builtin["int"] == (256, 64, 64, 32, 16, 16, 2, 2, 2, 1, 16, 2)
    assert builtin["int_k"] == (256, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2)
    assert builtin["mm"] == (256, 64, 64, 16, 16, 16, 2, 2, 2, 1, 16)
    assert len(builtin["mmq"]) == 11


def test_builtin_tiles_are_legal_and_first_in_the_space(builtin):
    for family, values in builtin.items():
        assert ts.tile_problems(family, values) == [], family
    space = tilespace.candidates(builtin)
    assert space[0].builtin and space[0].spec == BUILTIN_SPEC
    assert BUILTIN_SPEC in {c.spec for c in space}


def test_space_is_a_few_dozen_legal_distinct_specs(builtin):
    space = tilespace.candidates(builtin)
    assert 10 <= len(space) <= 60
    assert len({c.spec for c in space}) == len(space) == len({c.name for c in space})
    for c in space:
        spec = ts.check_spec(c.spec, builtin)  # round trip through the strict parser
        assert spec == c.tiles
        assert c.accumulators in (8, 16)
        assert max(c.est_registers.values()) <= 64
        assert max(c.shared_bytes.values()) <= 32768
        assert spec["int"][1:3] == spec["int_k"][1:3] in ((64, 64), (128, 64), (64, 128))


def test_register_estimate_keeps_the_stock_tile_out():
    stock_k = (128, 128, 128, 32, 32, 64, 1, 4, 4, 1, 16, 4)  # upstream's l_warptile_mmq_int_k
    assert tilespace.accumulators(stock_k) == 128
    assert tilespace.estimated_registers(stock_k) > 64


@pytest.mark.parametrize(
    ("values", "rule"),
    [
        (
            (2048, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2),
            "BLOCK_SIZE <= maxComputeWorkGroupInvocations",
        ),
        ((250, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2), "BLOCK_SIZE % WARP"),
        ((128, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2), "(BM/WM)*(BN/WN) == BLOCK_SIZE/WARP"),
        ((256, 64, 64, 32, 24, 16, 1, 2, 2, 1, 16, 2), "BM % WM == 0"),
        ((256, 64, 64, 32, 16, 16, 1, 4, 8, 1, 16, 2), "(WM*WN) % (WARP*TM*TN*WMITER)"),
        ((256, 64, 64, 16, 16, 16, 1, 2, 2, 1, 16, 2), "BK == 32"),
        ((256, 64, 64, 32, 16, 16, 1, 2, 2, 2, 16, 2), "TK == 1"),
        ((256, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 8), "shared memory <= maxComputeSharedMemory"),
        ((4, 8, 8, 32, 8, 8, 1, 1, 1, 1, 4, 1), "BLOCK_SIZE % 8 == 0"),
        # D4: a block of 8 rows needs vocab/8 workgroups; D2: columns pad to a power of two of BN
        ((64, 8, 64, 32, 8, 16, 1, 2, 2, 1, 16, 2), "BM >= 32 && BN >= 32"),
        ((96, 32, 96, 32, 16, 32, 1, 2, 2, 1, 16, 2), "BN a power of two"),
        ((16, 64, 64, 32, 64, 64, 1, 4, 4, 1, 16, 1), "WM*WN/WARP <= 128 accumulators"),
    ],
)
def test_rule_breakers_are_rejected_naming_the_rule(values, rule):
    problems = ts.tile_problems("int_k", values)
    assert problems and any(rule in p for p in problems), problems
    assert all(p.startswith("int_k: ") for p in problems)


def test_families_may_differ_in_shape_each_has_its_own_wg_denoms(builtin):
    # the patch: each large pipeline takes its dispatch denominators from its own tile
    other = "int_k=128,128,32,32,32,16,1,2,2,1,16,2"
    assert ts.check_spec(other, builtin)["int_k"][1:3] == (128, 32)


def test_mm_and_mmq_rules_of_the_patch():
    mm = (256, 64, 64, 16, 16, 16, 2, 2, 2, 1, 16)  # the built-in
    assert ts.tile_problems("mm", mm) == []
    assert any("TM % 2 == 0" in p for p in ts.tile_problems("mm", (*mm[:7], 1, 4, *mm[9:])))
    assert any("128 % BK == 0" in p for p in ts.tile_problems("mm", (*mm[:3], 48, *mm[4:])))
    assert any("BK == 32" in p for p in ts.tile_problems("mmq", (*mm[:3], 16, *mm[4:])))
    wide = (512, 64, 64, 16, 8, 16, 1, 2, 2, 1, 16)  # BLOCK_SIZE/4 = 128 rows per load pass
    assert any("BM % (BLOCK_SIZE/4)" in p for p in ts.tile_problems("mm", wide))


def test_shared_memory_is_the_patch_upper_bound_at_fp32_sizes(builtin):
    # 0004 counts each cached block as 48 bytes and leaves 2 KiB for the driver (NVIDIA reported
    # 14336 bytes for the int tile, whose declared block caches add up to 9216 at fp16)
    assert ts.shared_bytes("mmq", builtin["mmq"]) == 128 * 17 * 8 + 12288 + 2048
    assert ts.shared_bytes("int", builtin["int"]) == 2 * 128 * 48 + 16 + 2048 == 14352 > 14336
    assert ts.shared_bytes("int_k", builtin["int_k"]) == 14352


@pytest.mark.parametrize(
    "text",
    [
        "",
        "int=256,64,64,32,16,16,2,2,2,1,16",  # 11 values for a 12-value family
        "mm=256,64,64,16,16,16,2,2,2,1,16,2",  # 12 for an 11-value family
        "int=256,64,64,32,16,16,2,2,2,1,16,2;int=256,64,64,32,16,16,2,2,2,1,16,2",
        "INT=256,64,64,32,16,16,2,2,2,1,16,2",
        "int=0256,64,64,32,16,16,2,2,2,1,16,2",
        "int=256,64,64,32,16,16,2,2,2,1,16,0",
        "int=256,64,64,32,16,16,2,2,2,1,16,-2",
        "int=256,64,64,32,16,16,2,2,2,1,16,2;",
        "int=256,64,64,32,16,16,2,2,2,1,16,2\n",
        "int=256, 64,64,32,16,16,2,2,2,1,16,2",
        "int=256,64,64,32,16,16,2,2,2,1,16,99999",
        "int=256,64,64,32,16,16,2,2,2,1,16,2;$(reboot)",
        "int=２５６,64,64,32,16,16,2,2,2,1,16,2",  # full-width digits: \d would take them
        "int_k=256,64,64,32,16,16,1,2,2,1,16,2" + ";x" * 300,
    ],
)
def test_malformed_specs_are_refused(text):
    with pytest.raises(ts.SpecError):
        ts.parse_spec(text)


def test_format_orders_families_and_reads_back():
    spec = ts.parse_spec(BUILTIN_SPEC.split(";")[1] + ";" + BUILTIN_SPEC.split(";")[0])
    assert ts.format_spec(spec) == BUILTIN_SPEC
    with pytest.raises(ts.SpecError):
        ts.format_spec({"int": (256, 0)})
