"""The tile tuning in `rocky-vulkan report`: t/s per candidate beside what the simulated G610
said of it (registers, spills: tile_candidates.json), the reference's 28.1 t/s marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rocky_vulkan.config import Reference
from rocky_vulkan.host.plot_files import plain, save_png
from rocky_vulkan.host.result_doc import clean_text
from rocky_vulkan.tiles import CANDIDATES_PATH

MAX_BARS = 40
LABEL_TEXT = 40  # characters of a candidate's name under its bar


def sim_by_spec(path: Path = CANDIDATES_PATH) -> dict[str, dict[str, Any]]:
    """{spec: candidate entry} of the shipped list ({} when it is missing or unreadable)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {e["spec"]: e for e in doc["candidates"] if isinstance(e, dict) and "spec" in e}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _sim_cells(entry: dict[str, Any] | None) -> tuple[str, str]:
    """(registers, spills/fills) measured on the simulated G610, or the estimate."""
    if not entry:
        return "?", "?"
    sim = entry.get("sim") or {}
    pipes = sim.get("pipelines") or {}
    if pipes:
        regs = max((p.get("registers") or 0) for p in pipes.values())
        spills = sum((p.get("spills") or 0) for p in pipes.values())
        fills = sum((p.get("fills") or 0) for p in pipes.values())
        return str(regs), f"{spills}/{fills}"
    est = entry.get("est_registers") or {}
    return (f"~{max(est.values())} (est.)" if est else "?"), "not pruned"


def tune_rows(
    tune: dict[str, Any], ref: Reference, sims: dict[str, dict[str, Any]]
) -> list[tuple[str, str, str, str, str, str]]:
    """(candidate, t/s, runs, registers, spills/fills, status) sorted fastest first; the
    reference's tuned t/s is a row of its own where it falls in the order."""
    rows = []
    for c in tune["candidates"]:
        regs, spills = _sim_cells(sims.get(c["spec"]))
        name = c["name"] + (" (built-in)" if c["builtin"] else "")
        if c["name"] == tune["winner"]:
            name += " * chosen"
        status = f"{c['status']}: {c['reason']}" if c["reason"] else c["status"]
        rows.append((c["median_tps"], name, regs, spills, status, c["runs"]))
    rows.sort(key=lambda r: -(r[0] if r[0] is not None else -1.0))
    out = []
    marked = False
    for tps, name, regs, spills, status, runs in rows:
        if not marked and (tps is None or tps < ref.tuned_tps):
            out.append(("reference (hand-picked tile)", f"{ref.tuned_tps:.1f}", "", "", "", "ref"))
            marked = True
        shown = "—" if tps is None else f"{tps:.2f}"
        out.append((name, shown, str(runs), regs, spills, status))
    if not marked:
        out.append(("reference (hand-picked tile)", f"{ref.tuned_tps:.1f}", "", "", "", "ref"))
    return out


def plot_tune(tune: dict[str, Any], ref: Reference, out: Path) -> Path:
    """Bars of t/s per measured candidate (fastest first), the reference's t/s as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in tune["candidates"] if c["median_tps"] is not None]
    ok.sort(key=lambda c: -c["median_tps"])
    ok = ok[:MAX_BARS]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    colours = [
        "tab:green" if c["name"] == tune["winner"] else "tab:gray" if c["builtin"] else "tab:blue"
        for c in ok
    ]
    ax.bar(range(len(ok)), [c["median_tps"] for c in ok], color=colours)
    names = [plain(clean_text(c["name"], LABEL_TEXT)) for c in ok]
    ax.set_xticks(range(len(ok)), names, rotation=70, ha="right", fontsize=6)
    ax.axhline(ref.tuned_tps, color="tab:red", linestyle=":", linewidth=1.2)
    ax.annotate(f"reference {ref.tuned_tps:g} t/s", (1.0, ref.tuned_tps),
                xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7,
                color="tab:red")  # fmt: skip
    ax.set_ylabel("pp512 (tokens/s), median")
    ax.set_title(
        f"tile tuning: {len(ok)} candidates measured, chosen "
        f"{clean_text(tune['winner'] or 'built-in', LABEL_TEXT)}"
        " (green; grey = built-in)",
        parse_math=False,
        fontsize=9,
    )
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, out)
