"""`rocky-vulkan report RESULT.json`: the board's self-test result beside the reference numbers,
as a table, a PNG plot of t/s against ub, and one verdict. With the server's sections (placement:
GPU / CPU / hybrid for a typical request; serving: the GPU server against the CPU server) also
their rows and a second PNG (`-serving.png`)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from rocky_selftest.cts import FAILING as FAILING_STATUSES
from rocky_selftest.placement import modes_for
from rocky_selftest.sequence import CHECK_ORDER

from rocky_vulkan.config import Reference, load_config
from rocky_vulkan.host.cluster_doc import cluster_rows
from rocky_vulkan.host.plot_files import check_plot_out, save_png, sibling
from rocky_vulkan.host.result_doc import (
    MODES,
    PLACEMENT_MODES,
    RATIO_SLACK,
    VERDICTS,
    ResultError,
    checked,
    clean_text,
    load_result,
    serving_pairs,
)
from rocky_vulkan.host.spec_doc import spec_rows
from rocky_vulkan.regularfile import shown

__all__ = [
    "ResultError",
    "load_result",
    "placement_rows",
    "plot",
    "plot_serving",
    "serving_rows",
    "show",
    "sweep_series",
    "table_rows",
]

LABELS = {"tuned": "GPU tuned tiles", "stock": "GPU stock tiles", "cpu": "CPU (-dev none)"}
COLOURS = {"tuned": "tab:green", "stock": "tab:orange", "cpu": "tab:blue"}
SERVER_COLOURS = {"gpu": "tab:green", "cpu": "tab:blue", "hybrid": "tab:purple",
                  "experts-cpu": "tab:orange"}  # fmt: skip
STATUS_STYLES = {
    "PASS": "green",
    "FAIL": "red",
    "ERROR": "red",
    "SKIP": "yellow",
    "BAD": "red",
    "met": "green",
    "NOT met": "red",
    "not judged": "yellow",
}
ABSENT = "—"
MAX_BAD_ROWS = 50  # a file with thousands of broken fields gets a table of readable length
# Failure reasons listed under the plot: at most this many lines, each at most this wide.
MAX_REASON_LINES = 8
REASON_WIDTH = 110
MAX_TICKS = 24  # more micro-batch sizes than this: matplotlib's own ticks, not one per size
MAX_SIZES = 20  # serving prompt sizes in the table
TITLE_TEXT = 60  # characters of board text (host name, time) in a title
MAX_NAMES = 8  # check names on the verdict line
MAX_TUNE_ROWS = 60


def sweep_series(doc: dict[str, Any]) -> dict[str, list[tuple[int, float | None, str]]]:
    """Per mode: (ub, t/s or None for a failed run, reason) in ub order."""
    doc = checked(doc)
    series: dict[str, list[tuple[int, float | None, str]]] = {m: [] for m in MODES}
    for run in doc["sweep"]:
        tps = run["avg_ts"] if run["status"] == "PASS" else None
        series[run["mode"]].append((run["ubatch"], tps, run["reason"] or run["status"]))
    for values in series.values():
        values.sort()
    return series


def _fmt(value: float | None, unit: str = " t/s") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def _pass_rule(ratio: dict[str, Any]) -> str:
    need = ratio.get("required_ratio")
    return f" (pass: >= {need:.2f}x and > CPU)" if need else ""


def reference_note(doc: dict[str, Any], model_name: str) -> str | None:
    """Say so when the board ran something the reference numbers do not describe."""
    doc = checked(doc)
    prompt = doc["thresholds"]["prompt_tokens"]
    path = doc["model"]["path"]
    if prompt != 512:
        return f"the reference is pp512 with {model_name}; this run used pp{prompt} ({path})"
    return None


def table_rows(doc: dict[str, Any], ref: Reference) -> list[tuple[str, str, str, str]]:
    """(what, board, reference, status) rows; the last ones name malformed fields, if any."""
    doc = checked(doc)
    checks = {c["name"]: c for c in doc["checks"]}
    rows = []
    sweep = doc["sweep"]
    crashed = [r for r in sweep if r["status"] != "PASS"]
    ubs = sorted({r["ubatch"] for r in sweep})
    shown_ubs = ",".join(map(str, ubs[:MAX_TICKS])) + (",..." if len(ubs) > MAX_TICKS else "")
    board_sweep = (
        f"{len(sweep) - len(crashed)}/{len(sweep)} runs ok, ub {shown_ubs}" if sweep else "not run"
    )
    rows.append(
        (
            "crash-free ub sweep",
            board_sweep,
            "no crash at ub 64..1024",
            checks.get("sweep", {}).get("status", "—"),
        )
    )
    ratio = doc["ratio"]
    status = checks.get("ratio", {}).get("status", "—")
    for mode, reference in (
        ("stock", ref.stock_tps),
        ("tuned", ref.tuned_tps),
        ("cpu", ref.cpu_tps),
    ):
        rows.append(
            (
                f"pp{ratio.get('prompt_tokens', 512)} {LABELS[mode]}",
                _fmt(ratio.get(f"{mode}_tps")),
                _fmt(reference),
                status,
            )
        )
    rows.append(
        (
            "tuned / stock",
            _fmt(ratio.get("ratio"), "x"),
            f"{ref.tuned_tps / ref.stock_tps:.2f}x{_pass_rule(ratio)}",
            status,
        )
    )
    for name in (
        "output_match",
        "placement",
        "serving",
        "speculative",
        "cluster",
        "gpu_driver",
        "csf_firmware",
        "no_vendor_driver",
        "vulkan_device",
        "model_sha256",
    ):
        if name in checks:
            rows.append((name, checks[name]["evidence"], "", checks[name]["status"]))
    rows += placement_rows(doc) + serving_rows(doc) + spec_rows(doc.get("speculative"))
    rows += cluster_rows(doc.get("cluster"))
    problems = doc.get("problems", [])
    for problem in problems[:MAX_BAD_ROWS]:
        rows.append(("malformed", problem, "", "BAD"))
    if len(problems) > MAX_BAD_ROWS:
        more = len(problems) - MAX_BAD_ROWS
        rows.append(("malformed", f"... and {more} more malformed fields", "", "BAD"))
    return rows


def _secs(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.2f} s"


def _absent_or_malformed(section: dict[str, Any] | None, what: str) -> list[tuple[str, ...]]:
    if section is None:
        return [(what, "not in this result (a self-test without it)", "", ABSENT)]
    if section["state"] != "ok":
        return [(what, "malformed: the fields are named in the BAD rows below", "", "BAD")]
    return []


def placement_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Per mode (GPU, CPU, hybrid): prefill, decode, the typical request's time; the choice."""
    doc = checked(doc)
    section = doc.get("placement")
    rows = _absent_or_malformed(section, "placement (where the server runs)")
    if section is None:
        return rows
    req = section["request"]
    p, g = req.get("prompt_tokens"), req.get("generated_tokens")
    request = f"{p} + {g} tokens" if p and g else "request size not given"
    for mode in modes_for(section["experts_per_layer"]):
        entry = section["modes"].get(mode)
        if entry is None:
            rows.append((f"placement {mode}", "not measured", request, ABSENT))
            continue
        board = (
            f"pp {_fmt(entry['pp_tps'])}, tg {_fmt(entry['tg_tps'])}, "
            f"request {_secs(entry['request_s'])}"
        )
        if entry["status"] != "PASS" and entry["reason"]:
            board += f" ({entry['reason']})"
        rows.append((f"placement {mode}", board, request, entry["status"]))
    chosen = section["chosen"]
    board = chosen or "none given"
    if section["reason"]:
        board += f": {section['reason']}"
    rows.append(("placement chosen", board, "the least request time", ABSENT))
    return rows


def serving_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The GPU server against the CPU server at each prompt size, then the goal."""
    doc = checked(doc)
    section = doc.get("serving")
    rows = _absent_or_malformed(section, "serving (GPU vs CPU server)")
    if section is None:
        return rows
    goal = section["goal"]
    ttft_max, decode_min = goal["ttft_ratio_max"], goal["decode_ratio_min"]
    ttft_goal = f"GPU <= {ttft_max:.2f}x CPU" if ttft_max is not None else "goal not given"
    decode_goal = f"GPU >= {decode_min:.2f}x CPU" if decode_min is not None else "goal not given"
    pairs = serving_pairs(section["runs"])
    for size, pair in list(pairs.items())[:MAX_SIZES]:
        gpu, cpu = pair.get("gpu"), pair.get("cpu")
        both = gpu is not None and cpu is not None
        status = "PASS" if both and gpu["status"] == cpu["status"] == "PASS" else "FAIL"
        for key, label, fmt, goal_text in (
            ("ttft_s", "TTFT", _secs, ttft_goal),
            ("decode_tps", "decode", _fmt, decode_goal),
        ):
            cells = []
            for name, run in (("GPU", gpu), ("CPU", cpu)):
                if run is None:
                    cells.append(f"{name} not run")
                elif run["status"] != "PASS":
                    cells.append(f"{name} FAIL" + (f" ({run['reason']})" if run["reason"] else ""))
                else:
                    cells.append(f"{name} {fmt(run[key])}")
            board = " / ".join(cells)
            if status == "PASS":
                board += f" = {gpu[key] / cpu[key]:.2f}x"
            rows.append((f"serving p{size} {label}", board, goal_text, status))
    if len(pairs) > MAX_SIZES:
        more = len(pairs) - MAX_SIZES
        rows.append(("serving", f"... and {more} more prompt sizes (in result.json)", "", ABSENT))
    ttft, decode = section["ttft_ratio"], section["decode_ratio"]
    board = f"TTFT {_fmt(ttft, 'x')}, decode {_fmt(decode, 'x')}"
    reference = f"TTFT {ttft_goal}, decode {decode_goal}"
    met = section["goal_met"]
    status = "met" if met is True else "NOT met" if met is False else "not judged"
    if met is not True:
        board += f" ({section['goal_why']})"
    rows.append(("serving goal", board, reference, status))
    return rows


def failure_lines(series: dict[str, list[tuple[int, float | None, str]]]) -> list[str]:
    """One line per failed run, "ub 1024 stock: reason", cut to fit under the plot."""
    failed = sorted((u, MODES.index(m), m, why) for m, pts in series.items()
                    for u, t, why in pts if t is None)  # fmt: skip
    lines = [
        textwrap.shorten(f"ub {u} {mode}: {why}", REASON_WIDTH, placeholder=" ...")
        for u, _, mode, why in failed
    ]
    if len(lines) > MAX_REASON_LINES:
        more = len(lines) - MAX_REASON_LINES + 1
        lines = lines[: MAX_REASON_LINES - 1] + [
            f"... and {more} more failed runs (each reason is in result.json)"
        ]
    return lines


def plot(doc: dict[str, Any], ref: Reference, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    doc = checked(doc)
    series = sweep_series(doc)
    reasons = failure_lines(series)
    # The failure reasons go under the axes, one text line each: the figure grows to fit them.
    line_in = 0.16
    foot_in = (len(reasons) * line_in + 0.15) if reasons else 0.0
    height = 5 + foot_in
    fig, ax = plt.subplots(figsize=(8, height), dpi=120)
    # Crash markers sit at the bottom edge (x in data, y in axes units): fine for log and linear.
    bottom = blended_transform_factory(ax.transData, ax.transAxes)
    crash_label = True
    values: list[float] = []
    failed_at: dict[int, list[str]] = {}
    for mode in MODES:
        points = series[mode]
        ok = [(u, t) for u, t, _ in points if t is not None]
        values += [t for _, t in ok]
        if ok:
            ax.plot(*zip(*ok, strict=True), marker="o", color=COLOURS[mode], label=LABELS[mode])
        failed_at_mode = [u for u, t, _ in points if t is None]
        for u in failed_at_mode:
            failed_at.setdefault(u, []).append(mode)
    for u, modes in sorted(failed_at.items()):
        label = "crash / failed run (reasons below)" if crash_label else None
        ax.plot([u], [0.03], transform=bottom, marker="x", markersize=11, mew=2.5,
                color="red", linestyle="none", label=label, clip_on=False)  # fmt: skip
        crash_label = False
        # One label per failed mode, stacked upwards: two failures at one ub never overprint.
        for k, mode in enumerate(modes):
            ax.text(u, 0.07 + 0.045 * k, mode, transform=bottom, ha="center", va="bottom",
                    fontsize=7, color="red", parse_math=False)  # fmt: skip
    pp512 = doc["thresholds"]["prompt_tokens"] == 512
    if pp512:  # the reference numbers describe pp512 only
        for mode, value in (("tuned", ref.tuned_tps), ("stock", ref.stock_tps),
                            ("cpu", ref.cpu_tps)):  # fmt: skip
            ax.axhline(value, color=COLOURS[mode], linestyle=":", linewidth=1)
            ax.annotate(f"reference pp512 {mode} {value:g}", (1.0, value),
                        xycoords=("axes fraction", "data"), ha="right", va="bottom",
                        fontsize=7, color=COLOURS[mode])  # fmt: skip
        values += [ref.tuned_tps, ref.stock_tps, ref.cpu_tps]
    if values and max(values) > 30 * min(values):
        ax.set_yscale("log")  # tuned, stock and CPU can be orders of magnitude apart
    else:
        ax.set_ylim(bottom=0, top=max(values, default=1) * 1.1)
    ax.set_xscale("log", base=2)
    all_ubs = sorted({u for pts in series.values() for u, _, _ in pts})
    if all_ubs and len(all_ubs) <= MAX_TICKS:
        ax.set_xticks(all_ubs, [str(u) for u in all_ubs])
    ax.set_xlabel("micro-batch size (-ub)")
    ax.set_ylabel("prompt processing (tokens/s)")
    host = clean_text(doc["host"]["hostname"], TITLE_TEXT)
    prompt = doc["thresholds"]["prompt_tokens"]
    # Text from the file is shown as it is: no mathtext ($...$) parsing of board data.
    ax.set_title(f"rocky-selftest on {host}, pp{prompt}: {doc['verdict']}", parse_math=False)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left")
    foot = foot_in / height
    fig.tight_layout(rect=(0, foot, 1, 1))
    for i, line in enumerate(reasons):
        y = foot - (0.1 + (i + 1) * line_in) / height
        fig.text(0.02, y, line, fontsize=7, color="red", va="bottom", parse_math=False)
    return save_png(fig, out)


def plot_serving(doc: dict[str, Any], out: Path) -> Path | None:
    """TTFT and decode by prompt size, GPU server against CPU server, and the placement modes'
    request times; None (nothing written) when the result has neither section's numbers."""
    doc = checked(doc)
    serving, placement = doc.get("serving"), doc.get("placement")
    pairs = serving_pairs(serving["runs"]) if serving else {}
    modes = placement["modes"] if placement else {}
    timed = {m: e for m, e in modes.items() if e["status"] == "PASS" and e["request_s"]}
    if not pairs and not timed:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_dec, ax_place) = plt.subplots(1, 3, figsize=(14, 4.5), dpi=110)
    sizes = list(pairs)
    tops = {ax_ttft: 0.0, ax_dec: 0.0}
    for server in ("gpu", "cpu"):
        for ax, key in ((ax_ttft, "ttft_s"), (ax_dec, "decode_tps")):
            pts = [(n, p[server][key]) for n, p in pairs.items()
                   if server in p and p[server]["status"] == "PASS"]  # fmt: skip
            if pts:
                tops[ax] = max(tops[ax], *(v for _, v in pts))
                ax.plot(*zip(*pts, strict=True), marker="o", color=SERVER_COLOURS[server],
                        label=f"{server.upper()} server")  # fmt: skip
            failed = [n for n, p in pairs.items() if server in p and p[server]["status"] != "PASS"]
            for n in failed:
                ax.plot([n], [0], marker="x", color="red", markersize=10, mew=2.5,
                        linestyle="none", clip_on=False)  # fmt: skip
    for ax, title, ylabel in (
        (ax_ttft, "time to first token (lower is better)", "TTFT (s)"),
        (ax_dec, "decode (higher is better)", "decode (tokens/s)"),
    ):
        ax.set_title(title, fontsize=10, parse_math=False)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(ylabel)
        if sizes:
            ax.set_xscale("log", base=2)
        if sizes and len(sizes) <= MAX_TICKS:
            ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_ylim(bottom=0, top=(tops[ax] or 1) * 1.25)  # room for the legend
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
        if not sizes:
            ax.text(0.5, 0.5, "no serving runs in this result", ha="center",
                    transform=ax.transAxes, parse_math=False)  # fmt: skip
    if serving and serving["state"] == "ok":
        ax_ttft.set_title(
            f"TTFT, GPU/CPU {_fmt(serving['ttft_ratio'], 'x')}: goal {serving['goal_why']}",
            fontsize=10, parse_math=False,
        )  # fmt: skip
    names = [m for m in PLACEMENT_MODES if m in timed]
    if names:
        chosen = placement["chosen"] if placement else None
        bars = ax_place.bar(names, [timed[m]["request_s"] for m in names],
                            color=[SERVER_COLOURS[m] for m in names])  # fmt: skip
        for bar, mode in zip(bars, names, strict=True):
            if mode == chosen:
                bar.set_edgecolor("black")
                bar.set_linewidth(2.5)
        req = placement["request"]
        ax_place.set_title(
            f"placement: {req.get('prompt_tokens')}+{req.get('generated_tokens')}-token request"
            f" (chosen: {chosen or 'none'})", fontsize=10, parse_math=False,
        )  # fmt: skip
    else:
        ax_place.text(0.5, 0.5, "no placement measurements", ha="center",
                      transform=ax_place.transAxes, parse_math=False)  # fmt: skip
    ax_place.set_ylabel("request time (s, lower is better)")
    ax_place.grid(True, axis="y", alpha=0.3)
    host = clean_text(doc["host"]["hostname"], TITLE_TEXT)
    fig.suptitle(f"rocky-llm serving on {host}", parse_math=False)
    fig.tight_layout()
    return save_png(fig, out)


# The checks a PASS needs as evidence, each present and PASS: all but the serving ones, which
# the board skips when serve.listen is off, and the cluster's, which only a head runs.
SERVER_CHECKS = ("placement", "serving", "speculative")
EVIDENCE_CHECKS = tuple(n for n in CHECK_ORDER if n not in (*SERVER_CHECKS, "cluster"))


def missing_evidence(doc: dict[str, Any]) -> list[str]:
    """Why a PASS is not borne out: an evidence check absent or not PASS (SKIP is no evidence) or
    without its text, the sweep's or the ratio's PASS against their own numbers."""
    checks = {c["name"]: c for c in doc["checks"]}
    gaps = []
    for name in EVIDENCE_CHECKS:
        check = checks.get(name)
        if check is None or check["status"] != "PASS":
            gaps.append(name)
        elif not check["evidence"].strip():
            gaps.append(f"{name} (no evidence text)")
    if "sweep" not in gaps:
        gaps += _sweep_gaps(doc["sweep"])
    if "ratio" not in gaps:
        gaps += _ratio_gaps(doc["ratio"])
    return gaps


def _sweep_gaps(sweep: list[dict[str, Any]]) -> list[str]:
    if not sweep:
        return ["sweep (no runs in the result)"]
    if any(r["status"] != "PASS" for r in sweep):
        return ["sweep (a run in it failed)"]
    return []


def _ratio_gaps(ratio: dict[str, Any]) -> list[str]:
    tuned, stock, cpu = ratio.get("tuned_tps"), ratio.get("stock_tps"), ratio.get("cpu_tps")
    told, need = ratio.get("ratio"), ratio.get("required_ratio")
    if None in (tuned, stock, cpu, told):
        return ["ratio (its t/s numbers are not in the result)"]
    if abs(told - tuned / stock) > RATIO_SLACK * tuned / stock:
        return [f"ratio ({told:.2f}x is not tuned/stock = {tuned / stock:.2f}x)"]
    if need is not None and tuned / stock < need * (1 - 1e-9):
        return [f"ratio (tuned/stock {tuned / stock:.2f}x is below the {need:.2f}x needed)"]
    if tuned <= cpu:
        return [f"ratio (tuned {tuned:.2f} t/s is not above the CPU's {cpu:.2f})"]
    return []


def _names(names: list[str]) -> str:
    more = len(names) - MAX_NAMES
    return ", ".join(names[:MAX_NAMES]) + (f" and {more} more" if more > 0 else "")


def show(doc: dict[str, Any], cfg, plot_out: Path | None, console=None) -> int:
    """Print the report of a loaded result (table, plots when `plot_out`, verdict); returns the
    exit code: 0 for a passing result, 1 otherwise."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    ref = cfg.selftest.reference
    # Everything from the file goes in as Text (or with markup=False): rich never reads markup
    # in board data, so a kernel line like "panthor fb000000.gpu: [drm] ..." prints as it is.
    console = console or Console(highlight=False)
    # Board text outside the table's borders is one line (cut, never wrapped): no line of it can
    # start where the verdict line starts.
    when = clean_text(doc["finished_at"], TITLE_TEXT)
    table = Table(title=Text(f"rocky-selftest {when} vs reference", no_wrap=True,
                             overflow="ellipsis"))  # fmt: skip
    for column in ("what", "board", "reference", "status"):
        table.add_column(column)
    for what, board, reference, status in table_rows(doc, ref):
        style = STATUS_STYLES.get(status, "white")
        table.add_row(Text(what), Text(board), Text(reference), Text(status, style=style))
    note = reference_note(doc, cfg.model.name)
    if note:  # in the table: the model path wraps inside its cell
        table.add_row(Text("note"), Text(note), Text(""), Text(ABSENT))
    console.print(table)
    if plot_out is not None:
        plot(doc, ref, plot_out)
        console.print(Text(f"plot: {shown(plot_out)}"), soft_wrap=True)
        serving_png = plot_serving(doc, sibling(plot_out, "-serving"))
        if serving_png:
            console.print(Text(f"serving plot: {shown(serving_png)}"), soft_wrap=True)
    if doc["tune"]:
        tune_png = sibling(plot_out, "-tune") if plot_out else None
        _print_tune(console, doc["tune"], ref, tune_png)
    if doc.get("cts"):
        _print_cts(console, doc["cts"])
    if doc.get("driver"):  # shown; the run's verdict below does not depend on it
        from rocky_vulkan.host.driver_report import print_driver

        print_driver(console, doc["driver"])
    # Only the self-test's own words reach this line: check names and verdicts are checked
    # against their lists when the result is read.
    failed = [c["name"] for c in doc["checks"] if c["status"] != "PASS" and c["status"] != "SKIP"]
    unproven = missing_evidence(doc)
    problems = doc["problems"]
    if doc["verdict"] == "PASS" and not failed and not unproven and not problems:
        passed = Text("VERDICT: PASS", style="bold green")
        console.print(Text.assemble(passed, " — every check passed on the board"), soft_wrap=True)
        return 0
    if failed:
        why = f"failed: {_names(failed)}"
    elif doc["verdict"] == "PASS" and unproven:
        why = f"the board says PASS without the evidence of: {_names(unproven)}"
    elif doc["verdict"] in VERDICTS:
        why = f"board verdict {doc['verdict']}"
    else:
        why = "the board's verdict is not one the self-test writes"
    if problems:
        why += f"; {len(problems)} malformed field(s) in the result (rows marked BAD)"
    verdict = Text("VERDICT: FAIL", style="bold red")
    console.print(Text.assemble(verdict, " — ", why), soft_wrap=True)  # one line to grep
    return 1


def _run(args: argparse.Namespace) -> int:
    result = Path(args.result)
    doc = load_result(result)
    cfg = load_config(args.config)
    out = Path(args.plot) if args.plot else result.with_suffix(".png")
    check_plot_out(out, [result])
    return show(doc, cfg, out)


def _print_tune(console, tune: dict[str, Any], ref: Reference, out: Path | None) -> None:
    """The tile tuning (rocky-selftest tune): t/s per candidate with its registers/spills."""
    from rich.table import Table
    from rich.text import Text

    from rocky_vulkan.tiles.report import plot_tune, sim_by_spec, tune_rows

    used = f"{tune['elapsed_s']:.0f}" if tune["elapsed_s"] is not None else "?"
    budget = f"{tune['budget_s']:.0f}" if tune["budget_s"] is not None else "?"
    title = f"tile tuning ({clean_text(tune['phase'], TITLE_TEXT)}, {used} of {budget} s"
    title += ", budget reached)" if tune["budget_exhausted"] else ")"
    table = Table(title=Text(title, no_wrap=True, overflow="ellipsis"))
    for column in ("candidate", "pp512 t/s", "runs", "registers", "spills/fills", "status"):
        table.add_column(column)
    rows = tune_rows(tune, ref, sim_by_spec())
    for row in rows[:MAX_TUNE_ROWS]:
        style = "red" if row[-1] == "ref" else "white"
        table.add_row(*(Text(cell, style=style) for cell in row))
    if len(rows) > MAX_TUNE_ROWS:
        more = f"... and {len(rows) - MAX_TUNE_ROWS} more candidates (in result.json)"
        table.add_row(Text(more), "", "", "", "", "")
    console.print(table)
    if out is not None:
        console.print(Text(f"tuning plot: {shown(plot_tune(tune, ref, out))}"), soft_wrap=True)


def _print_cts(console, cts: dict[str, Any]) -> None:
    """dEQP-VK on the board (rocky-selftest cts): counts and failed cases, for information (the
    verdict below is the self-test's)."""
    from rich.table import Table
    from rich.text import Text

    from rocky_vulkan.host.cts_doc import cts_rows

    took = f"{cts['duration_s']:.0f} s" if cts["duration_s"] is not None else "? s"
    budget = f"{cts['budget_s']:.0f} s" if cts["budget_s"] is not None else "?"
    verdict = cts["verdict"] or "BAD"
    title = f"dEQP-VK subset: {verdict} ({took} of {budget}"
    title += ", budget reached)" if cts["budget_exhausted"] else ")"
    table = Table(title=Text(title, no_wrap=True, overflow="ellipsis"))
    table.add_column("what")
    table.add_column("board")
    for what, value in cts_rows(cts):
        style = "red" if what in FAILING_STATUSES else "white"
        table.add_row(Text(what, style=style), Text(clean_text(value)))
    console.print(table)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report", help="table + PNG plot of a board's self-test result vs the reference"
    )
    parser.add_argument("result", help="result.json copied from /var/lib/rocky-selftest/")
    parser.add_argument("--plot", help="PNG to write (default: RESULT.png beside the JSON)")
    parser.set_defaults(func=_run)
