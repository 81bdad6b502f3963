"""`rocky-vulkan report RESULT.json`: the board's self-test result beside the reference numbers,
as a table, a PNG plot of t/s against ub, and one verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .config import Reference, load_config
from .errors import UserError
from .selftest import RESULT_SCHEMA, RESULT_SCHEMA_VERSION

MODES = ("tuned", "stock", "cpu")
LABELS = {"tuned": "GPU tuned tiles", "stock": "GPU stock tiles", "cpu": "CPU (-dev none)"}
COLOURS = {"tuned": "tab:green", "stock": "tab:orange", "cpu": "tab:blue"}


class ResultError(UserError):
    """The result file is unreadable, truncated or not a self-test result."""


def load_result(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(
            f"{path}: no such file; copy /var/lib/rocky-selftest/result.json from the board first"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultError(f"{path}: cannot read: {err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        cut = not text.rstrip().endswith("}")
        hint = " (the file does not end with '}': truncated? copy it again)" if cut else ""
        raise ResultError(
            f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}{hint}"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != RESULT_SCHEMA:
        raise ResultError(f'{path}: not a rocky-selftest result (no "schema": "{RESULT_SCHEMA}")')
    if doc.get("schema_version") != RESULT_SCHEMA_VERSION:
        raise ResultError(
            f"{path}: result schema_version {doc.get('schema_version')!r}; this tool reads "
            f"{RESULT_SCHEMA_VERSION}: use the rocky-vulkan version that matches the image"
        )
    for key in ("verdict", "checks"):
        if key not in doc:
            raise ResultError(f"{path}: result has no {key!r}: the run did not finish writing it")
    return doc


def sweep_series(doc: dict[str, Any]) -> dict[str, list[tuple[int, float | None, str]]]:
    """Per mode: (ub, t/s or None for a failed run, reason) in ub order."""
    series: dict[str, list[tuple[int, float | None, str]]] = {m: [] for m in MODES}
    for run in doc.get("sweep") or []:
        mode = run.get("mode")
        if mode in series and run.get("ubatch"):
            tps = run.get("avg_ts") if run.get("status") == "PASS" else None
            series[mode].append((int(run["ubatch"]), tps, run.get("reason", "")))
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
    prompt = (doc.get("thresholds") or {}).get("prompt_tokens", 512)
    path = (doc.get("model") or {}).get("path", "")
    if prompt != 512:
        return f"note: the reference is pp512 with {model_name}; this run used pp{prompt} ({path})"
    return None


def table_rows(doc: dict[str, Any], ref: Reference) -> list[tuple[str, str, str, str]]:
    """(what, board, reference, status) rows."""
    checks = {c["name"]: c for c in doc["checks"]}
    rows = []
    sweep = doc.get("sweep") or []
    crashed = [r for r in sweep if r.get("status") != "PASS"]
    ubs = sorted({r["ubatch"] for r in sweep if r.get("ubatch")})
    board_sweep = (
        f"{len(sweep) - len(crashed)}/{len(sweep)} runs ok, ub {','.join(map(str, ubs))}"
        if sweep
        else "not run"
    )
    rows.append(
        (
            "crash-free ub sweep",
            board_sweep,
            "no crash at ub 64..1024",
            checks.get("sweep", {}).get("status", "—"),
        )
    )
    ratio = doc.get("ratio") or {}
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
        "gpu_driver",
        "csf_firmware",
        "no_vendor_driver",
        "vulkan_device",
        "model_sha256",
    ):
        if name in checks:
            rows.append((name, checks[name]["evidence"], "", checks[name]["status"]))
    return rows


def plot(doc: dict[str, Any], ref: Reference, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    # Crash markers sit at the bottom edge (x in data, y in axes units): fine for log and linear.
    bottom = blended_transform_factory(ax.transData, ax.transAxes)
    series = sweep_series(doc)
    crash_label = True
    values: list[float] = []
    for mode in MODES:
        points = series[mode]
        ok = [(u, t) for u, t, _ in points if t is not None]
        values += [t for _, t in ok]
        if ok:
            ax.plot(*zip(*ok, strict=True), marker="o", color=COLOURS[mode], label=LABELS[mode])
        for u, t, _ in points:
            if t is not None:
                continue
            label = "crash / failed run" if crash_label else None
            ax.plot([u], [0.03], transform=bottom, marker="x", markersize=11, mew=2.5,
                    color="red", linestyle="none", label=label, clip_on=False)  # fmt: skip
            ax.text(u, 0.07, mode, transform=bottom, ha="center", fontsize=7, color="red")
            crash_label = False
    pp512 = (doc.get("thresholds") or {}).get("prompt_tokens", 512) == 512
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
    if all_ubs:
        ax.set_xticks(all_ubs, [str(u) for u in all_ubs])
    ax.set_xlabel("micro-batch size (-ub)")
    ax.set_ylabel("prompt processing (tokens/s)")
    host = doc.get("host", {}).get("hostname", "board")
    prompt = (doc.get("thresholds") or {}).get("prompt_tokens", 512)
    ax.set_title(f"rocky-selftest on {host}, pp{prompt}: {doc['verdict']}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    doc = load_result(Path(args.result))
    ref = load_config(args.config).selftest.reference
    console = Console(highlight=False)
    table = Table(title=f"rocky-selftest {doc.get('finished_at', '')} vs reference")
    for column in ("what", "board", "reference", "status"):
        table.add_column(column)
    colours = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}
    for what, board, reference, status in table_rows(doc, ref):
        colour = colours.get(status, "white")
        table.add_row(what, board, reference, f"[{colour}]{status}[/{colour}]")
    console.print(table)
    note = reference_note(doc, load_config(args.config).model.name)
    if note:
        console.print(note)
    out = Path(args.plot) if args.plot else Path(args.result).with_suffix(".png")
    plot(doc, ref, out)
    console.print(f"plot: {out}")
    failed = [c["name"] for c in doc["checks"] if c["status"] == "FAIL"]
    if doc["verdict"] == "PASS" and not failed:
        console.print("[bold green]VERDICT: PASS[/bold green] — every check passed on the board")
        return 0
    console.print(f"[bold red]VERDICT: FAIL[/bold red] — failed: {', '.join(failed) or '?'}")
    return 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report", help="table + PNG plot of a board's self-test result vs the reference"
    )
    parser.add_argument("result", help="result.json copied from /var/lib/rocky-selftest/")
    parser.add_argument("--plot", help="PNG to write (default: RESULT.png beside the JSON)")
    parser.set_defaults(func=_run)
