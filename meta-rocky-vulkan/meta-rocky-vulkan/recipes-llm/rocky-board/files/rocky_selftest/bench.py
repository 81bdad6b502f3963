"""llama-bench runs: the ub sweep and the tuned / stock / CPU ratio, one process per run."""

from __future__ import annotations

import math
import time
from typing import Any

from .checks import Check, failed, passed
from .files import parse_json
from .kld import tiles_used
from .runner import RunResult, clip, run_tool
from .settings import MODES, Settings
from .terminal import say

MAX_FIELD = 200  # characters kept of a text field of llama-bench's JSON (gpu_info, ...)


class Deadline:
    """The run's overall time budget: each tool gets min(run timeout, time left)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def bench_command(
    s: Settings, mode: str, ubatch: int | None
) -> tuple[list[str], dict[str, str | None]]:
    """The llama-bench command line and extra environment for one run in `mode`."""
    cmd = [s.tool("llama-bench"), "-m", s.model_path, "-p", str(s.prompt_tokens), "-n", "0"]
    if mode == "cpu":
        cmd += ["-ngl", "0", "-dev", "none"]  # -ngl 0 alone still offloads big batches
    else:
        # Naming the device makes a missing GPU exit 1 instead of silently using the CPU; -v
        # keeps ggml-vulkan's info line saying which tiles run (stderr only: the JSON is stdout).
        cmd += ["-ngl", "99", "-dev", s.gpu_device, "-v"]
    if ubatch is not None:
        cmd += ["-ub", str(ubatch)]
    cmd += ["-r", "1", "-o", "json"]
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}  # gdb attach can hang
    if mode == "stock":
        env.update(s.stock_env)
    else:
        env.update({key: None for key in s.stock_env})  # tuned is the patched default
    return cmd, env


def _number(entry: dict[str, Any], key: str, positive: bool = False) -> float | str:
    """A finite number from the entry, or the reason it is not one (NaN, a string, ...)."""
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} is {value!r}, not a number"
    if not math.isfinite(value):
        return f"{key} is {value!r}, not a finite number"
    if positive and value <= 0:
        return f"{key} is {value!r}, not a positive rate"
    return float(value)


def _count(entry: dict[str, Any], key: str) -> int | None | str:
    """An integer field (None when absent), or the reason it is malformed."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{key} is {value!r}, not a count"
    return value


def _text(entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key)
    return clip(value, MAX_FIELD) if isinstance(value, str) else None


def clean_entry(entry: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The fields the self-test uses, type-checked: malformed or non-finite values are a failed
    run with the reason, never an exception and never a NaN in the result."""
    avg = _number(entry, "avg_ts", positive=True)
    if isinstance(avg, str):
        return None, avg
    samples = entry.get("samples_ts", [])
    if not isinstance(samples, list):
        return None, f"samples_ts is {samples!r}, not a list"
    clean_samples = []
    for i, sample in enumerate(samples):
        value = _number({"x": sample}, "x", positive=True)
        if isinstance(value, str):
            return None, value.replace("x is", f"samples_ts[{i}] is", 1)
        clean_samples.append(value)
    counts = {}
    for key in ("n_gpu_layers", "n_cpu_moe", "n_ubatch", "n_threads", "build_number"):
        value = _count(entry, key)
        if isinstance(value, str):
            return None, value
        counts[key] = value
    return {
        "avg_ts": avg,
        "samples_ts": clean_samples,
        **counts,
        "gpu_info": _text(entry, "gpu_info"),
        "devices": _text(entry, "devices"),
        "split_mode": _text(entry, "split_mode"),
        "build_commit": _text(entry, "build_commit"),
    }, None


def parse_bench_json(stdout: str) -> tuple[dict[str, Any] | None, str | None]:
    """The first test entry of llama-bench's JSON, type-checked, or why there is none."""
    try:
        data = parse_json(stdout, allow_nan=True)  # NaN is then named by clean_entry
    except ValueError:
        snippet = stdout.strip()[:60]
        return None, f"invalid JSON on stdout ({len(stdout)} bytes: {snippet!r})"
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None, "JSON holds no test entry"
    if "avg_ts" not in data[0]:
        return None, "JSON entry has no avg_ts"
    entry, reason = clean_entry(data[0])
    if reason:
        return None, f"malformed llama-bench JSON: {reason}"
    return entry, None


def device_problem(s: Settings, mode: str, entry: dict[str, Any]) -> str | None:
    """Did the run use what `mode` asks for? `backends` lists compiled-in backends: ignore it."""
    devices = entry.get("devices") or ""
    gpu_info = entry.get("gpu_info") or ""
    if mode == "cpu":
        if devices and devices != "none":
            return f"CPU run used devices {devices!r}"
        return None
    if not entry.get("n_gpu_layers"):
        return "no layers offloaded (n_gpu_layers 0)"
    if devices and devices != s.gpu_device:
        return f"ran on devices {devices!r}, not {s.gpu_device}"
    if s.gpu_name not in gpu_info:
        return f"gpu_info {gpu_info!r} does not name {s.gpu_name}"
    return None


def start_record(
    s: Settings,
    mode: str,
    cmd: list[str],
    env: dict[str, str | None],
    deadline: Deadline,
    record: dict[str, Any],
) -> RunResult | None:
    """Run one llama.cpp tool within the deadline, its exit code, time and (GPU modes) tiles in
    `record`; None, with the record FAILed, when the deadline has passed."""
    left = deadline.left()
    if left <= 1:
        record.update(status="FAIL", reason="not run: the self-test's deadline passed")
        return None
    res = run_tool(cmd, env, min(s.run_timeout_s, left))
    record.update(exit_code=res.returncode, elapsed_s=res.elapsed_s)
    if mode != "cpu":
        record["tiles"] = tiles_used(res.stderr)
    return res


def run_bench(s: Settings, mode: str, ubatch: int | None, deadline: Deadline) -> dict[str, Any]:
    """One llama-bench run, recorded whatever happens to it."""
    cmd, env = bench_command(s, mode, ubatch)
    record: dict[str, Any] = {"mode": mode, "ubatch": ubatch, "cmd": cmd}
    res = start_record(s, mode, cmd, env, deadline, record)
    if res is None:
        return record
    reason = res.failure()
    entry = None
    if reason is None:
        entry, reason = parse_bench_json(res.stdout)
    if entry is not None:
        record.update({k: v for k, v in entry.items() if k != "n_gpu_layers"})
        reason = device_problem(s, mode, entry)
    if reason:
        record.update(status="FAIL", reason=reason, stderr_tail=res.stderr_tail())
    else:
        record["status"] = "PASS"
    return record


def sweep(s: Settings, deadline: Deadline, log=say) -> tuple[Check, list[dict[str, Any]]]:
    """Every ub in every sweep mode, interleaved per ub; a crash is recorded, the sweep goes on."""
    runs = []
    for ub in s.ubatch_sizes:
        for mode in s.sweep_modes:
            rec = run_bench(s, mode, ub, deadline)
            log(_line(rec))
            runs.append(rec)
    bad = [r for r in runs if r["status"] != "PASS"]
    if bad:
        first = bad[0]
        text = f"{len(bad)}/{len(runs)} runs failed; first: {first['mode']} ub {first['ubatch']}: "
        return failed("sweep", text + first["reason"]), runs
    ubs = ",".join(map(str, s.ubatch_sizes))
    modes = "/".join(s.sweep_modes)
    return passed("sweep", f"{len(runs)} runs, ub {ubs}, modes {modes}: no crash"), runs


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _line(rec: dict[str, Any]) -> str:
    ub = f"ub {rec['ubatch']}" if rec["ubatch"] else "default ub"
    if rec["status"] == "PASS":
        return f"  {rec['mode']:5} {ub:>8}: {rec['avg_ts']:.2f} t/s"
    return f"  {rec['mode']:5} {ub:>8}: FAIL {rec['reason']}"


def ratio_verdict(s: Settings, tuned: float, stock: float, cpu: float) -> tuple[bool, str]:
    need = stock * s.tuned_vs_stock_ratio * (1 - s.ratio_tolerance)
    ok = tuned >= need and tuned > cpu
    ratio = tuned / stock if stock else float("inf")
    text = (
        f"tuned {tuned:.2f} t/s = {ratio:.2f}x stock {stock:.2f} (need >= {need:.2f} t/s: "
        f"{s.tuned_vs_stock_ratio}x -{s.ratio_tolerance:.0%}), CPU {cpu:.2f} t/s"
    )
    return ok, text


def ratio(s: Settings, deadline: Deadline, log=say) -> tuple[Check, dict[str, Any]]:
    """pp at the default ub, tuned/stock/CPU interleaved per repeat so drift hits all alike."""
    runs = []
    for rep in range(s.repetitions):
        for mode in MODES:
            rec = run_bench(s, mode, None, deadline)
            rec["repeat"] = rep
            log(_line(rec))
            runs.append(rec)
    bad = [r for r in runs if r["status"] != "PASS"]
    doc: dict[str, Any] = {"runs": runs, "prompt_tokens": s.prompt_tokens}
    if bad:
        first = bad[0]
        return failed("ratio", f"{first['mode']} run failed: {first['reason']}"), doc
    tps = {m: median([r["avg_ts"] for r in runs if r["mode"] == m]) for m in MODES}
    ok, text = ratio_verdict(s, tps["tuned"], tps["stock"], tps["cpu"])
    doc.update(
        tuned_tps=tps["tuned"],
        stock_tps=tps["stock"],
        cpu_tps=tps["cpu"],
        ratio=tps["tuned"] / tps["stock"] if tps["stock"] else None,
        required_ratio=s.tuned_vs_stock_ratio * (1 - s.ratio_tolerance),
    )
    return (passed if ok else failed)("ratio", text), doc
