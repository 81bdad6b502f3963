"""The tile candidate space and the GGML_VK_MALI_WARPTILE spec format and rules."""

from __future__ import annotations

import pytest
from rocky_vulkan import tilespace
from rocky_vulkan.selftest import tune_spec as ts

BUILTIN_SPEC = "int=256,64,64,32,16,16,2,2,2,1,16,2;int_k=256,64,64,32,16,16,1,2,2,1,16,2"


@pytest.fixture(scope="module")
def builtin():
    return tilespace.builtin_tiles()


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
        assert c.accumulators in (8, 16, 32)
        assert max(c.est_registers.values()) <= 64
        assert max(c.shared_bytes.values()) <= 32768
        assert all(t[1:3] == (64, 64) for t in spec.values())


def test_register_estimate_keeps_the_stock_tile_out():
    stock_k = (128, 128, 128, 32, 32, 64, 1, 4, 4, 1, 16, 4)  # upstream's l_warptile_mmq_int_k
    assert tilespace.accumulators(stock_k) == 128
    assert tilespace.estimated_registers(stock_k) > 64


@pytest.mark.parametrize(
    ("values", "rule"),
    [
        ((2048, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2), "BLOCK_SIZE <= 1024"),
        ((250, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2), "BLOCK_SIZE % WARP"),
        ((128, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 2), "(BM/WM)*(BN/WN) == BLOCK_SIZE/WARP"),
        ((256, 64, 64, 32, 24, 16, 1, 2, 2, 1, 16, 2), "BM % WM == 0"),
        ((256, 64, 64, 32, 16, 16, 1, 4, 8, 1, 16, 2), "WM*WN % (WARP*TM*TN*WMITER)"),
        ((256, 64, 64, 16, 16, 16, 1, 2, 2, 1, 16, 2), "BK == 32"),
        ((256, 64, 64, 32, 16, 16, 1, 2, 2, 2, 16, 2), "TK == 1"),
        ((256, 64, 64, 32, 16, 16, 1, 2, 2, 1, 16, 8), "shared memory 40960 B <= 32768 B"),
    ],
)
def test_rule_breakers_are_rejected_naming_the_rule(values, rule):
    problems = ts.tile_problems("int_k", values)
    assert problems and any(rule in p for p in problems), problems
    assert all(p.startswith("int_k: ") for p in problems)


def test_wg_denoms_rule_needs_one_shape_for_all_large_tiles(builtin):
    other = "int_k=128,128,32,32,32,16,1,2,2,1,16,2"
    assert ts.tile_problems("int_k", ts.parse_spec(other)["int_k"]) == []
    with pytest.raises(ts.SpecError, match="wg_denoms: every large tile needs the same BM x BN"):
        ts.check_spec(other, builtin)


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
