"""Waits per llama.cpp graph on the simulated G610, from the `panvk-csf:` counters.

The simulation-only patch `patches/mesa-panvk-csf-wait-count.patch` counts, per process, the
WAIT instructions panvk records (by scoreboard mask) and its RUN_COMPUTE jobs, and prints

    panvk-csf: run_compute R, waits W, waits on all iterators A (mask 0xM)

when the driver is unloaded. The drm-shim executes nothing, but the command streams are recorded
as on the board, so the counts are the board's. One graph's share is the difference between two
llama-bench runs that differ by one graph evaluation (`-r 2` vs `-r 1` for prefill, `-n 2` vs
`-n 1` for decode, no warm-up): model load, context set-up and pipeline creation cancel out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (name, llama-bench arguments for one graph, for two graphs)
GRAPHS = (
    ("prefill", ("-p", "512", "-n", "0", "-ub", "512", "-r", "1"), ("-r", "2")),
    ("decode", ("-p", "0", "-n", "1", "-r", "1"), ("-n", "2")),
)

# Not anchored at the line's start: the driver writes it to stderr at unload, which can land
# right after llama-bench's last stdout bytes when both go to one log.
_LINE = re.compile(
    r"panvk-csf: run_compute ([0-9]{1,15}), waits ([0-9]{1,15}), "
    r"waits on all iterators ([0-9]{1,15}) \(mask 0x([0-9a-f]{1,8})\)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Counts:
    run_compute: int
    waits: int
    waits_all_iters: int

    def minus(self, other: Counts) -> Counts:
        return Counts(
            self.run_compute - other.run_compute,
            self.waits - other.waits,
            self.waits_all_iters - other.waits_all_iters,
        )


def parse_counts(stderr: str) -> Counts | None:
    """The process's counters: the last `panvk-csf:` line (the driver prints once, when it is
    unloaded); None without one, e.g. a driver built without the instrumentation."""
    found = _LINE.findall(stderr)
    if not found:
        return None
    run, waits, all_iters, _mask = found[-1]
    return Counts(int(run), int(waits), int(all_iters))


def bench_args(graph: str, twice: bool) -> list[str]:
    """llama-bench arguments (after -m MODEL) for one or two evaluations of `graph`."""
    for name, one, override in GRAPHS:
        if name == graph:
            args = list(one)
            if twice:
                flag, value = override
                args[args.index(flag) + 1] = value
            return ["--no-warmup", "-ngl", "99", "-o", "json", *args]
    raise ValueError(f"unknown graph {graph!r}")


def per_graph(one: Counts | None, two: Counts | None) -> Counts | None:
    """One graph's counts; None when a run lacks its counters or the difference is negative
    (the runs did not differ by exactly one graph)."""
    if one is None or two is None:
        return None
    diff = two.minus(one)
    if min(diff.run_compute, diff.waits, diff.waits_all_iters) < 0:
        return None
    return diff


def waits_table(per_driver: dict[str, dict[str, Counts | None]]) -> str:
    """Markdown: per driver and graph, jobs, waits and waits on all compute iterators."""
    lines = [
        "| driver | graph | compute jobs | waits | waits on all iterators |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for driver, graphs in per_driver.items():
        for graph, c in graphs.items():
            cells = ("?", "?", "?") if c is None else (c.run_compute, c.waits, c.waits_all_iters)
            lines.append(f"| {driver} | {graph} | {cells[0]} | {cells[1]} | {cells[2]} |")
    return "\n".join(lines) + "\n"
