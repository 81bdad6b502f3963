"""GPU vs CPU output: the KL divergence check (kld.py) decides; greedy text from llama-simple
(llama-completion sometimes loses its output) is kept as information only, since near-tied logits
make a correct GPU and the CPU pick different tokens from rounding alone."""

from __future__ import annotations

import re
from typing import Any

from .bench import Deadline
from .checks import Check, failed, passed
from .kld import measure, tiles_used, verdict
from .runner import clip, run_tool
from .settings import Settings
from .terminal import say

# Fixed and long enough to be well over 64 tokens, so the prompt is one big batch and takes
# the GPU's matmul path (short batches go through other shaders).
PROMPT = (
    "The Rockchip RK3588 is a system on chip with four Cortex-A76 cores, four Cortex-A55 cores "
    "and a Mali-G610 MC4 graphics processor. On a fully open software stack the GPU is driven by "
    "the panthor kernel driver and the panvk Vulkan driver from Mesa, and llama.cpp reaches it "
    "through its Vulkan backend. Prompt processing multiplies large matrices, which suits the "
    "GPU, while token generation is limited by memory bandwidth. Write a short technical summary "
    "of why matrix tile sizes matter for prompt processing on this GPU, and"
)
# Characters of greedy text kept per run: match_tokens (at most 4096) tokens fit many times over.
MAX_TEXT = 64 << 10
DECODED = re.compile(r"decoded (\d+) tokens")
PROMPT_TOKENS = re.compile(r"prompt eval time\s*=.*?/\s*(\d+) tokens")
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def _int(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def _generate(s: Settings, gpu: bool, deadline: Deadline) -> dict[str, Any]:
    cmd = [s.tool("llama-simple"), "-m", s.model_path, "-n", str(s.match_tokens)]
    cmd += ["-ngl", "99" if gpu else "0", PROMPT]
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}
    env.update({key: None for key in s.stock_env})  # the tuned tiles, whatever the shell set
    if not gpu:
        # An empty device list hides every Vulkan device: -ngl 0 alone still offloads big batches.
        env["GGML_VK_VISIBLE_DEVICES"] = ""
    rec: dict[str, Any] = {"device": "gpu" if gpu else "cpu", "cmd": cmd[:-1] + ["PROMPT"]}
    left = deadline.left()
    if left <= 1:
        rec["reason"] = "not run: the self-test's deadline passed"
        return rec
    res = run_tool(cmd, env, min(s.run_timeout_s, left))
    off = OFFLOADED.search(res.stderr)
    rec.update(
        exit_code=res.returncode,
        elapsed_s=res.elapsed_s,
        text=clip(res.stdout, MAX_TEXT),
        decoded=_int(DECODED, res.stderr),
        prompt_tokens=_int(PROMPT_TOKENS, res.stderr),
        offloaded=f"{off.group(1)}/{off.group(2)}" if off else None,
    )
    if gpu:
        rec["tiles"] = tiles_used(res.stderr)
    reason = res.failure()
    if reason is None and rec["decoded"] is None:
        reason = "no 'decoded N tokens' line: the run did not finish generating"
    if reason is None and gpu and (not off or int(off.group(1)) == 0):
        reason = "GPU run offloaded no layers to the GPU"
    if reason is None and gpu and not _uses_gpu(res.stderr, s.gpu_name):
        reason = f"GPU run did not report using a {s.gpu_name} device"
    if reason is None and not gpu and _uses_gpu(res.stderr, ""):
        reason = "CPU run reported using a GPU device"
    if reason:
        rec.update(reason=reason, stderr_tail=res.stderr_tail())
    return rec


def _uses_gpu(stderr: str, name: str) -> bool:
    return any("using device" in line and name in line for line in stderr.splitlines())


def greedy_info(s: Settings, deadline: Deadline) -> dict[str, Any]:
    """The first match_tokens greedy tokens on GPU and CPU, compared; never decides the check."""
    gpu = _generate(s, True, deadline)
    cpu = _generate(s, False, deadline)
    doc: dict[str, Any] = {"gpu": gpu, "cpu": cpu, "match_tokens": s.match_tokens}
    failed_run = next((r for r in (gpu, cpu) if "reason" in r), None)
    if failed_run:
        doc["summary"] = f"not compared: {failed_run['device']} run: {failed_run['reason']}"
        return doc
    a, b = gpu["text"], cpu["text"]
    doc["identical"] = gpu["decoded"] == cpu["decoded"] and a == b
    if doc["identical"]:
        doc["summary"] = f"identical for {gpu['decoded']} tokens"
    else:
        pairs = enumerate(zip(a, b, strict=False))
        at = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
        doc["first_difference_at"] = at
        doc["summary"] = (
            f"differs from character {at} (GPU {a[at : at + 20]!r}, CPU {b[at : at + 20]!r})"
        )
    return doc


def output_match(s: Settings, deadline: Deadline, log=say) -> tuple[Check, dict[str, Any]]:
    name = "output_match"
    kld = measure(s, deadline)
    log(f"  KLD: cpu {_state(kld['cpu'])}, gpu {_state(kld['gpu'])}")
    greedy = greedy_info(s, deadline)
    log(f"  greedy text (information only): {greedy['summary']}")
    doc = {
        "kld": kld,
        "greedy": greedy,
        "thresholds": {"kld_max_mean": s.kld_max_mean, "kld_min_same_top_p": s.kld_min_same_top_p},
    }
    for rec in (kld["cpu"], kld["gpu"]):
        if "reason" in rec:
            return failed(name, f"{rec['device']} llama-perplexity run: {rec['reason']}"), doc
    ok, text = verdict(s, kld["gpu"])
    text += f"; greedy text {greedy['summary']} (information only)"
    return (passed if ok else failed)(name, text), doc


def _state(rec: dict[str, Any]) -> str:
    if "reason" in rec:
        return f"FAIL {rec['reason']}"
    if "mean_kld" in rec:
        return f"mean KLD {rec['mean_kld']:.6f}, same top p {rec['same_top_p']:.2f}%"
    return f"ok ({rec.get('elapsed_s', 0):.0f} s)"
