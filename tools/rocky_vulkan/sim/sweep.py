"""llama-bench over micro-batch sizes on the simulated G610: success or the exact error, and the
peak private VA (panvk's heap below 4 GiB) that each size needed.

One llama-bench process per ub, so a crash at one size does not hide the others. Throughput under
the noop shim means nothing (GPU work is not executed) and is not reported.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rocky_vulkan.sim.guest import Driver, guest_argv, guest_env, parse_vacount
from rocky_vulkan.sim.root import Bind, SimRoot, say

MODEL_DIR = "/mnt/rocky-model"
OUT_DIR = "/mnt/rocky-out"
DEFAULT_UBS = (64, 128, 256, 512, 1024)
MIB = 1024 * 1024

# A Vulkan result name (ErrorOutOfDeviceMemory), glibc's and assert()'s abort messages.
_VK_ERROR = re.compile(r"\bError[A-Z][A-Za-z]+|VK_ERROR_[A-Z_]+")
_ABORT = re.compile(
    r"double free|corrupted|free\(\)|malloc\(\)|Assertion .* failed|Illegal instruction|"
    r"Segmentation fault|GGML_ASSERT|timeout: "
)
_SIGNAL = re.compile(r"qemu: uncaught target signal \d+ \([^)]*\)")


@dataclass
class UbResult:
    ub: int
    ok: bool
    exit_code: int
    error: str
    priv_va_peak_mib: float | None
    priv_va_max_map_mib: float | None
    seconds: float


def first_error(stderr: str) -> str:
    """The line that names the failure: an exception's what(), a Vulkan error, an abort message;
    with the signal qemu reports, if any."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    signal = next((m.group(0) for ln in lines if (m := _SIGNAL.search(ln))), "")
    found = ""
    for i, ln in enumerate(lines):
        if "terminate called" in ln:
            found = " ".join(lines[i : i + 2])
            break
    if not found:
        found = next((ln for ln in lines if _VK_ERROR.search(ln)), "")
    if not found:
        found = next((ln for ln in lines if _ABORT.search(ln)), "")
    return "; ".join(x for x in (found, signal) if x)


def bench_argv(model: str, ub: int, prompt: int, reps: int) -> list[str]:
    return [
        "-m",
        model,
        "-p",
        str(prompt),
        "-n",
        "0",
        "-ub",
        str(ub),
        "-ngl",
        "99",
        "-r",
        str(reps),
        "-t",
        "1",
        "-o",
        "json",
    ]


def run_one(
    root: SimRoot,
    driver: Driver,
    model: Path,
    ub: int,
    out_dir: Path,
    prompt: int = 512,
    timeout: float = 1800,
    extra_env: dict[str, str] | None = None,
    program: str = "/usr/bin/llama-bench",
) -> UbResult:
    """One llama-bench run at micro-batch `ub`; logs and counter land in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counter = out_dir / f"vacount-ub{ub}.txt"
    counter.unlink(missing_ok=True)
    env = guest_env(driver, f"{OUT_DIR}/{counter.name}", extra_env or {})
    argv = guest_argv(program, bench_argv(f"{MODEL_DIR}/{model.name}", ub, prompt, 1), env)
    binds = (Bind(model.parent.resolve(), MODEL_DIR), Bind(out_dir.resolve(), OUT_DIR, False))
    say(f"llama-bench ub={ub} driver={driver.name}")
    start = time.monotonic()
    try:
        proc = root.run(argv, binds=binds, check=False, capture=True, timeout=timeout)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as err:
        code = 124
        stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        stderr += f"\ntimeout: no result after {timeout:.0f} s"
    seconds = time.monotonic() - start
    (out_dir / f"bench-ub{ub}.json").write_text(stdout)
    (out_dir / f"bench-ub{ub}.stderr").write_text(stderr)
    ok = code == 0 and _has_result(stdout, ub)
    error = "" if ok else (first_error(stderr) or f"exit {code} with no benchmark result")
    counts = parse_vacount(counter.read_text()) if counter.exists() else {}
    peak = counts.get("priv_va_peak")
    biggest = counts.get("priv_va_max_map")
    return UbResult(
        ub=ub,
        ok=ok,
        exit_code=code,
        error=error,
        priv_va_peak_mib=round(peak / MIB, 1) if peak is not None else None,
        priv_va_max_map_mib=round(biggest / MIB, 1) if biggest is not None else None,
        seconds=round(seconds, 1),
    )


def _has_result(stdout: str, ub: int) -> bool:
    """llama-bench printed a JSON result for this ub (exit 0 alone proves nothing)."""
    try:
        rows = json.loads(stdout)
    except ValueError:
        return False
    return any(row.get("n_ubatch") == ub and row.get("avg_ns", 0) > 0 for row in rows)


def table(results: list[UbResult], driver_label: str) -> str:
    lines = [
        f"driver: {driver_label}",
        "",
        "| ub | result | exit | peak private VA (MiB) | largest private map (MiB) | wall (s) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        result = "ok" if r.ok else f"FAIL: {r.error}"
        lines.append(
            f"| {r.ub} | {result} | {r.exit_code} | {_num(r.priv_va_peak_mib)} | "
            f"{_num(r.priv_va_max_map_mib)} | {r.seconds} |"
        )
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def sweep(
    root: SimRoot,
    driver: Driver,
    driver_label: str,
    model: Path,
    ubs: list[int],
    out_dir: Path,
    prompt: int = 512,
    timeout: float = 1800,
    extra_env: dict[str, str] | None = None,
    program: str = "/usr/bin/llama-bench",
) -> list[UbResult]:
    results = []
    for ub in ubs:
        results.append(
            run_one(root, driver, model, ub, out_dir, prompt, timeout, extra_env, program)
        )
        say(table(results[-1:], driver_label).splitlines()[-1])
    summary = {
        "driver": driver_label,
        "model": str(model),
        "prompt": prompt,
        "llama_bench": program,
        "env": extra_env or {},
        "results": [asdict(r) for r in results],
    }
    (out_dir / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "sweep.md").write_text(table(results, driver_label))
    return results
