"""Where the server runs a typical request fastest: GPU, CPU or hybrid, from measured rates.

Each mode has a prefill rate (pp, tokens/s) and a decode rate (tg, tokens/s) measured by
llama-bench on the board. A request of P prompt and G generated tokens takes P/pp + G/tg seconds;
the mode with the least time wins. On RK3588 decode is memory-bound, so the CPU can win decode
while the GPU wins prefill: `hybrid` (weights in CPU memory, -ngl 0 with the Vulkan device
present, large batches offloaded) is the mix llama.cpp offers for that.
"""

from __future__ import annotations

import math
from typing import Any

# A mixture-of-experts model only: every layer on the GPU but its experts, which stay in CPU
# memory and run on the CPU at small batches (llama.cpp's --cpu-moe). Decode reads only the few
# experts a token picks; whether the A76 cores or MUL_MAT_ID on the G610 read them faster is
# measured on the board, never assumed. Large batches still go to the GPU (op offload).
EXPERTS_CPU = "experts-cpu"
# How llama-bench and llama-server are told to use each mode (the same flags for both; the
# experts' flag differs: mode_flags).
MODE_FLAGS = {
    "gpu": ("-ngl", "99"),  # the device is named where the GPU device is known
    "cpu": ("-ngl", "0", "-dev", "none"),
    "hybrid": ("-ngl", "0"),
    EXPERTS_CPU: ("-ngl", "99"),
}
MODES = tuple(MODE_FLAGS)
ON_GPU = ("gpu", EXPERTS_CPU)  # the modes whose layers run on the named GPU device
SAFE_MODE = "cpu"  # needs no GPU at all


def modes_for(n_expert: int) -> tuple[str, ...]:
    """The modes worth measuring for a model with `n_expert` experts per layer (0: dense)."""
    return MODES if n_expert else tuple(m for m in MODES if m != EXPERTS_CPU)


def mode_flags(mode: str, tool: str, n_layer: int = 0) -> list[str]:
    """`mode`'s flags for llama-bench (`tool` "bench") or llama-server ("server"). llama-bench
    at b9101 has no --cpu-moe: -ncmoe over every layer (n_layer, the model's block_count) is
    the same placement."""
    flags = list(MODE_FLAGS[mode])
    if mode == EXPERTS_CPU:
        if tool == "bench":
            if n_layer <= 0:
                raise ValueError("experts-cpu needs the model's layer count for llama-bench")
            flags += ["-ncmoe", str(n_layer)]
        else:
            flags += ["--cpu-moe"]
    return flags


MAX_RATE = 1e9  # tokens/s: far above any board; larger is a broken number


def _rate(value: Any) -> float | None:
    """A usable rate, or None (not a number, NaN, infinite, <= 0, or absurdly large)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not 0 < value <= MAX_RATE:  # no float() of a 400-digit int
        return None
    return float(value) if math.isfinite(value) and 0 < value <= MAX_RATE else None


def request_seconds(pp_tps: Any, tg_tps: Any, prompt: int, generated: int) -> float | None:
    """Seconds for one request, or None when a rate is missing, non-finite or not positive."""
    pp, tg = _rate(pp_tps), _rate(tg_tps)
    if pp is None or tg is None:
        return None
    return prompt / pp + generated / tg


def choose(modes: Any, prompt: int, generated: int, gpu_ok: bool) -> tuple[str, str]:
    """(mode, reason). `modes` is the result's placement.modes ({mode: {pp_tps, tg_tps}}), as
    hostile as any file: anything unusable falls back to the CPU with the reason why."""
    if not gpu_ok:
        return SAFE_MODE, "the self-test's GPU checks did not pass: serving on the CPU"
    if not isinstance(modes, dict):
        return SAFE_MODE, "no placement measurements in the result: serving on the CPU"
    times: dict[str, float] = {}
    for mode in MODES:
        entry = modes.get(mode)
        if isinstance(entry, dict) and entry.get("status", "PASS") == "PASS":
            t = request_seconds(entry.get("pp_tps"), entry.get("tg_tps"), prompt, generated)
            if t is not None:
                times[mode] = t
    if not times:
        return SAFE_MODE, "no usable placement measurement: serving on the CPU"
    best = min(times, key=lambda m: (times[m], MODES.index(m)))
    others = ", ".join(f"{m} {t:.1f} s" for m, t in sorted(times.items()) if m != best)
    reason = f"{best} takes {times[best]:.1f} s for a {prompt}+{generated}-token request" + (
        f" (measured: {others})" if others else " (the only mode measured)"
    )
    return best, reason
