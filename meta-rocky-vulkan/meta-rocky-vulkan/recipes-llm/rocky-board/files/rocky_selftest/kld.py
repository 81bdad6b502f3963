"""GPU vs CPU output, measured the way llama.cpp validates backends and quants: the KL divergence
of the GPU's token distributions from the CPU's, and how often both rank the same token first.

`llama-perplexity --kl-divergence-base FILE` on the CPU saves the CPU's log-probabilities for a
fixed text; `--kl-divergence` on the GPU compares its own against them, token by token. Exact
greedy text is not the criterion: with near-tied logits a correct GPU and the CPU pick different
tokens from rounding alone (issue 13). The text (kld_text.txt, written for this project) gives
KLD_CHUNKS chunks of KLD_CTX tokens; each chunk is one batch of KLD_CTX tokens, so the GPU runs
the large (L) matmul tiles of the product's prefill path.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from typing import Any

from .runner import run_tool
from .settings import Settings
from .tune_spec import MALI_TILES_MARKER, STOCK_TILES_MARKER

TEXT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kld_text.txt")
KLD_CTX = 512  # context per chunk = batch size (>= 128: L tiles)
KLD_CHUNKS = 2  # 2 x 512 tokens of text; KLD over the last half of each chunk
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)"
STATS = {
    "mean_kld": re.compile(rf"^Mean\s+KLD:\s*{_NUM}\s*±\s*{_NUM}", re.M | re.I),
    "max_kld": re.compile(rf"^Maximum KLD:\s*{_NUM}", re.M | re.I),
    "kld_99_9": re.compile(rf"^99\.9%\s+KLD:\s*{_NUM}", re.M | re.I),
    "same_top_p": re.compile(rf"^Same top p:\s*{_NUM}\s*±\s*{_NUM}\s*%", re.M | re.I),
    "ppl_gpu": re.compile(rf"^Mean PPL\(Q\)\s*:\s*{_NUM}", re.M | re.I),
    "ppl_cpu": re.compile(rf"^Mean PPL\(base\)\s*:\s*{_NUM}", re.M | re.I),
}
REQUIRED = ("mean_kld", "same_top_p")
TOO_SHORT = re.compile(r"you need at least (\d+) tokens.*?tokenizes to only (\d+) tokens", re.S)
# Debug-level lines of llama.cpp's loader. Seeing one proves the tool ran verbose (llama-bench -v,
# or -lv 4 given before -dev) while the devices were set up, so ggml-vulkan's info line about the
# tiles was not dropped: without it the tiles were the stock ones. ggml-vulkan's device list is no
# such proof: llama-bench prints it before it silences the log.
DEBUG_LOG = re.compile(
    r"^(create_tensor: loading tensor|llama_context: enumerating backends)", re.M
)


def tiles_used(stderr: str) -> str:
    """'mali' when the patched ggml-vulkan announced its Mali tiles, 'stock' when the log was
    verbose without that line, 'unknown' when the tool kept ggml's log to itself."""
    if MALI_TILES_MARKER in stderr:
        return "mali"
    if STOCK_TILES_MARKER in stderr or DEBUG_LOG.search(stderr):
        return "stock"
    return "unknown"


VERBOSE = ["-lv", "4"]  # must come before -dev: the devices are set up while -dev is parsed


def perplexity_command(
    s: Settings, base_file: str, gpu: bool
) -> tuple[list[str], dict[str, str | None]]:
    # llama-perplexity drops ggml-vulkan's info lines at its default threshold (3), the tile
    # line included; with VERBOSE first the record can say which tiles ran.
    cmd = [s.tool("llama-perplexity"), *(VERBOSE if gpu else []), "-m", s.model_path]
    cmd += ["-f", TEXT_PATH]
    cmd += ["-c", str(KLD_CTX), "-b", str(KLD_CTX), "--chunks", str(KLD_CHUNKS)]
    cmd += ["--kl-divergence-base", base_file]
    if gpu:
        # Naming the device makes a missing GPU an error instead of a silent CPU run.
        cmd += ["-ngl", "99", "-dev", s.gpu_device, "--kl-divergence"]
    else:
        cmd += ["-ngl", "0", "-dev", "none"]  # -ngl 0 alone still offloads big batches
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}
    env.update({key: None for key in s.stock_env})  # the product's (tuned) tiles
    return cmd, env


def parse_kld(text: str) -> tuple[dict[str, float] | None, str | None]:
    """Mean KLD and 'Same top p' (percent) from llama-perplexity's summary, or why not."""
    found: dict[str, float] = {}
    for key, pattern in STATS.items():
        matches = pattern.findall(text)
        if not matches:
            continue
        first = matches[-1]
        value = first[0] if isinstance(first, tuple) else first
        try:
            number = float(value)
        except ValueError:
            return None, f"{key} is {value!r}, not a number"
        if not math.isfinite(number):
            return None, f"{key} is {value}, not a finite number"
        found[key] = number
    missing = [key for key in REQUIRED if key not in found]
    if missing:
        return None, f"no {' / '.join(missing)} line in llama-perplexity's output"
    if found["mean_kld"] < 0 or not 0 <= found["same_top_p"] <= 100:
        return None, f"implausible statistics {found}"
    return found, None


def _device_problem(stderr: str, gpu: bool, s: Settings) -> str | None:
    off = OFFLOADED.search(stderr)
    if gpu:
        if not off or int(off.group(1)) == 0:
            return "GPU run offloaded no layers to the GPU"
        uses = [ln for ln in stderr.splitlines() if "using device" in ln and s.gpu_name in ln]
        if not uses:
            return f"GPU run did not report using a {s.gpu_name} device"
    elif off and int(off.group(1)) != 0:
        return f"CPU run offloaded {off.group(1)}/{off.group(2)} layers"
    return None


def _run(s: Settings, base_file: str, gpu: bool, timeout_s: float) -> dict[str, Any]:
    cmd, env = perplexity_command(s, base_file, gpu)
    rec: dict[str, Any] = {"device": "gpu" if gpu else "cpu", "cmd": cmd}
    if timeout_s <= 1:
        rec["reason"] = "not run: the self-test's deadline passed"
        return rec
    res = run_tool(cmd, env, timeout_s)
    rec.update(exit_code=res.returncode, elapsed_s=res.elapsed_s)
    if gpu:
        rec["tiles"] = tiles_used(res.stderr)
    out = res.stdout + "\n" + res.stderr
    reason = res.failure() or _device_problem(res.stderr, gpu, s)
    short = TOO_SHORT.search(out)
    if reason is None and short:
        reason = f"the text gives {short.group(2)} tokens, {short.group(1)} needed"
    if reason is None and gpu:
        stats, reason = parse_kld(out)
        if stats:
            rec.update(stats)
    if reason is None and not gpu:
        size = os.path.getsize(base_file) if os.path.exists(base_file) else 0
        rec["base_bytes"] = size
        if size == 0:
            reason = f"no logits saved to {base_file}"
    if reason:
        rec.update(reason=reason, stderr_tail=res.stderr_tail())
    return rec


def measure(s: Settings, deadline) -> dict[str, Any]:
    """The CPU base run, then the GPU run against it; each record says why it failed, if so."""
    work = tempfile.mkdtemp(prefix="rocky-kld-")
    try:
        base = os.path.join(work, "cpu-logits.kld")
        cpu = _run(s, base, False, min(s.run_timeout_s, deadline.left()))
        if "reason" in cpu:
            gpu = {"device": "gpu", "reason": "not run: the CPU base run failed"}
        else:
            gpu = _run(s, base, True, min(s.run_timeout_s, deadline.left()))
        return {"cpu": cpu, "gpu": gpu, "ctx": KLD_CTX, "chunks": KLD_CHUNKS}
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the base file is ~n_vocab x 1 KB: not kept


def verdict(s: Settings, gpu: dict[str, Any]) -> tuple[bool, str]:
    kld, top = gpu["mean_kld"], gpu["same_top_p"]
    ok = kld <= s.kld_max_mean and top >= s.kld_min_same_top_p
    text = (
        f"GPU vs CPU over {KLD_CHUNKS}x{KLD_CTX} tokens: mean KLD {kld:.6f} "
        f"(max {s.kld_max_mean}), same top token {top:.2f}% (min {s.kld_min_same_top_p}%), "
        f"tiles {gpu.get('tiles', '?')}"
    )
    return ok, text
