"""Pipeline statistics (spills, fills, registers, threads) of llama.cpp's matmul pipelines on the
simulated G610, through ggml-vulkan's GGML_VK_PIPELINE_STATS (VK_KHR_pipeline_executable_properties
in panvk). ggml prints them to stderr as each pipeline is created:

    ggml_vulkan: pipeline stats for matmul_q4_k_q8_1_2:
    ggml_vulkan:   Spills: 604
"""

from __future__ import annotations

import re
from pathlib import Path

from rocky_vulkan.sim.guest import Driver, guest_argv, guest_env
from rocky_vulkan.sim.root import Bind, SimRoot, say
from rocky_vulkan.sim.sweep import MODEL_DIR, OUT_DIR, bench_argv

DEFAULT_FILTER = "matmul"
_HEADER = re.compile(r"ggml_vulkan: pipeline stats for (\S+):\s*$")
_STAT = re.compile(r"ggml_vulkan:\s{2,}([^:]+):\s*(\S+)\s*$")
# Columns shown first; any other statistic panvk reports follows in name order.
KEY_STATS = ("Spills", "Fills", "Registers used", "Threads", "Spill cost")


def parse_stats(stderr: str) -> list[dict[str, str]]:
    """One dict per pipeline: {'pipeline': name, stat name: value, ...}, in creation order."""
    rows: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in stderr.splitlines():
        head = _HEADER.match(line)
        if head:
            current = {"pipeline": head.group(1)}
            rows.append(current)
            continue
        stat = _STAT.match(line)
        if stat and current is not None:
            current[stat.group(1).strip()] = stat.group(2)
        elif not line.startswith("ggml_vulkan:   "):
            current = None
    return rows


def stats_table(rows: list[dict[str, str]], label: str = "") -> str:
    names = {k for row in rows for k in row if k != "pipeline"}
    cols = [c for c in KEY_STATS if c in names] + sorted(names - set(KEY_STATS))
    lines = [f"{label}\n" if label else ""]
    lines.append("| pipeline | " + " | ".join(cols) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in cols) + " |")
    for row in rows:
        lines.append(f"| {row['pipeline']} | " + " | ".join(row.get(c, "") for c in cols) + " |")
    return "\n".join(ln for ln in lines if ln) + "\n"


def compare_table(
    a: list[dict[str, str]], b: list[dict[str, str]], label_a: str, label_b: str
) -> str:
    """Pipelines present in either run, with each key statistic as `a -> b`."""
    by_a = {r["pipeline"]: r for r in a}
    by_b = {r["pipeline"]: r for r in b}
    names = list(by_a) + [n for n in by_b if n not in by_a]
    lines = [
        f"{label_a} -> {label_b}",
        "",
        "| pipeline | " + " | ".join(KEY_STATS) + " |",
        "| --- | " + " | ".join("---:" for _ in KEY_STATS) + " |",
    ]
    for name in names:
        ra, rb = by_a.get(name, {}), by_b.get(name, {})
        cells = [f"{ra.get(k, '-')} -> {rb.get(k, '-')}" for k in KEY_STATS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def collect_stats(
    root: SimRoot,
    driver: Driver,
    model: Path,
    out_dir: Path,
    name_filter: str,
    ub: int = 512,
    program: str = "/usr/bin/llama-bench",
    timeout: float = 1800,
    extra_env: dict[str, str] | None = None,
) -> list[dict[str, str]]:
    """Run llama-bench once with GGML_VK_PIPELINE_STATS and return the parsed statistics."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = guest_env(driver, None, {"GGML_VK_PIPELINE_STATS": name_filter, **(extra_env or {})})
    # The statistics are printed when a pipeline is compiled; a cached pipeline is compiled
    # again by ggml (the Mesa cache only makes it fast), so reruns still print them.
    argv = guest_argv(program, bench_argv(f"{MODEL_DIR}/{model.name}", ub, 512, 1), env)
    binds = (Bind(model.parent.resolve(), MODEL_DIR), Bind(out_dir.resolve(), OUT_DIR, False))
    say(f"llama-bench ub={ub} with GGML_VK_PIPELINE_STATS={name_filter} ({program})")
    proc = root.run(argv, binds=binds, check=False, capture=True, timeout=timeout)
    (out_dir / "stats.stderr").write_text(proc.stderr)
    (out_dir / "stats.stdout").write_text(proc.stdout)
    return parse_stats(proc.stderr)
