"""The WAIT counters of the simulation-only patch: parsing, one graph's share, the claims."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocky_vulkan.sim import prove, waits

LINE = "panvk-csf: run_compute {}, waits {}, waits on all iterators {} (mask 0x3c)\n"


def test_parse_counts_takes_the_last_line():
    text = "noise\n" + LINE.format(1, 2, 3) + "more\n" + LINE.format(10, 20, 7)
    assert waits.parse_counts(text) == waits.Counts(10, 20, 7)
    # As seen: llama-bench's JSON ends without a newline, the driver's line follows on stderr.
    assert waits.parse_counts("  }" + LINE.format(5, 6, 7)) == waits.Counts(5, 6, 7)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "panvk-csf: run_compute 1, waits 2\n",
        LINE.format(-1, 2, 3),
        LINE.format("1" * 16, 2, 3),
        LINE.format(1, 2, 3).replace("waits 2", "waits 2 extra"),
    ],
)
def test_parse_counts_refuses_other_lines(text: str):
    assert waits.parse_counts(text) is None


def test_per_graph_is_the_difference_and_refuses_negative_ones():
    one, two = waits.Counts(100, 50, 10), waits.Counts(160, 80, 14)
    assert waits.per_graph(one, two) == waits.Counts(60, 30, 4)
    assert waits.per_graph(two, one) is None
    assert waits.per_graph(None, two) is None


def test_bench_args_differ_by_one_graph():
    for graph, _one, (flag, value) in waits.GRAPHS:
        a, b = waits.bench_args(graph, False), waits.bench_args(graph, True)
        assert "--no-warmup" in a and a[a.index(flag) + 1] == "1" and b[b.index(flag) + 1] == value
        assert len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1
    with pytest.raises(ValueError):
        waits.bench_args("training", False)


def test_wait_claims():
    c = waits.Counts
    ok = {"stock": {"prefill": c(9, 9, 1)}, "patched": {"prefill": c(9, 9, 2)}}
    assert [x.ok for x in prove.check_wait_claims(ok)] == [True]
    missing = {"stock": {"prefill": None}, "patched": {"prefill": c(9, 9, 2)}}
    assert [x.ok for x in prove.check_wait_claims(missing)] == [False]
    better = {**ok, "previous": {"prefill": c(9, 9, 5)}}
    assert [x.ok for x in prove.check_wait_claims(better)] == [True, True]
    worse = {**ok, "previous": {"prefill": c(9, 9, 1)}}
    claims = prove.check_wait_claims(worse)
    assert [x.ok for x in claims] == [True, False] and claims[1].seen == "1 -> 2"
    assert "| patched | prefill | 9 | 9 | 2 |" in waits.waits_table(ok)


def test_previous_patch_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(prove.os, "geteuid", lambda: 0)
    monkeypatch.setattr(prove, "_check_commit", lambda *a: None)
    args = prove.ProveArgs(
        tmp_path, prove.DEFAULT_MESA_COMMIT, tmp_path, tmp_path, tmp_path,
        previous_mesa_patches=(tmp_path / "nope.patch",),
    )  # fmt: skip
    with pytest.raises(prove.UserError, match="nope.patch: no such file"):
        prove.check_args(args)


def test_the_wait_count_patch_is_in_every_driver():
    assert prove.WAIT_COUNT.is_file()
    text = prove.WAIT_COUNT.read_text()
    assert "Upstream-Status: Inappropriate [debugging instrumentation]" in text
    assert "waits on all iterators %" in text
