"""Speculative decoding for the server: the modes llama-server has at the pin, their flags, and
the choice from the self-test's `speculative` measurement.

Decode on RK3588 is memory-bound: every token reads all the weights once. Speculation drafts
several tokens cheaply and verifies them in one batch of the real model, so a read of the
weights yields more than one token when drafts are accepted. Whether that wins depends on the
model, the request and the board: the self-test measures each mode against plain decode on the
typical requests (speculation_bench), and the server enables a mode only where it wins.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .placement import ON_GPU

# b9101's draft-free modes (--spec-type): drafts from n-grams of the context itself.
NGRAM_MODES = ("ngram-simple", "ngram-mod")
DRAFT = "draft"  # a small model of the same vocabulary (--model-draft)
OFF = "off"
MODES = (OFF, *NGRAM_MODES, DRAFT)
# A mode is enabled only when it took drafts and the typical requests' decode time falls by this
# much or more: below it, run-to-run noise could be the whole difference.
WIN_MIN = 1.05
# The goal on the reference model: decode with the chosen mode >= 1.3x plain decode.
GOAL = 1.3
MAX_RATIO = 1000.0


def mode_flags(value: dict[str, Any] | None, placement: str, gpu_device: str) -> list[str]:
    """llama-server's flags for a chosen mode (`value` as derive() gives it; None: none). The
    draft model runs where the model does: on the GPU for gpu, else on the CPU."""
    if not value:
        return []
    mode = value["mode"]
    if mode in NGRAM_MODES:
        return ["--spec-type", mode]
    if mode == DRAFT:
        flags = ["--model-draft", value["draft_model"]]
        if placement in ON_GPU:
            return flags + ["--spec-draft-ngl", "99", "--spec-draft-device", gpu_device]
        return flags + ["--spec-draft-ngl", "0", "--spec-draft-device", "none"]
    raise ValueError(f"unknown speculative mode {mode!r}")


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not 0 < value <= 1e12:
        return None
    return float(value) if math.isfinite(value) and 0 < value <= 1e12 else None


def decode_ms(entry: Any, requests: list[str]) -> float | None:
    """A mode's decode time (the server's predicted_ms) summed over every request, or None when
    any request is missing, failed or malformed."""
    if not isinstance(entry, dict) or entry.get("status") != "PASS":
        return None
    runs = entry.get("runs")
    if not isinstance(runs, list):
        return None
    by_name = {r.get("request"): r for r in runs if isinstance(r, dict)}
    total = 0.0
    for name in requests:
        run = by_name.get(name)
        ms = _ms(run.get("predicted_ms")) if isinstance(run, dict) else None
        if ms is None or run.get("status") != "PASS":
            return None
        total += ms
    return total


def speedups(section: Any) -> tuple[dict[str, float], str | None]:
    """{mode: plain decode time / mode's decode time} over the typical requests, for every mode
    measured in full; and why there are none."""
    if not isinstance(section, dict):
        return {}, "no speculative decoding measurement in the self-test's result"
    modes, requests = section.get("modes"), section.get("requests")
    if not isinstance(modes, dict) or not isinstance(requests, list) or not requests:
        return {}, "the speculative measurement is malformed"
    names = [r.get("name") for r in requests if isinstance(r, dict)]
    if len(names) != len(requests) or not all(isinstance(n, str) for n in names):
        return {}, "the speculative measurement's requests are malformed"
    plain = decode_ms(modes.get(OFF), names)
    if plain is None:
        return {}, "plain decode was not measured"
    out = {}
    for mode in MODES[1:]:
        ms = decode_ms(modes.get(mode), names)
        if ms is not None and plain / ms <= MAX_RATIO:
            out[mode] = plain / ms
    return out, None


def accepted(entry: Any) -> int:
    """Drafted tokens the model accepted over a mode's runs (0 when it says none)."""
    runs = entry.get("runs") if isinstance(entry, dict) else None
    total = 0
    for run in runs if isinstance(runs, list) else []:
        n = run.get("draft_n_accepted") if isinstance(run, dict) else None
        total += n if type(n) is int and 0 < n <= 1 << 31 else 0
    return total


def winner(section: dict[str, Any], ratios: dict[str, float]) -> str:
    """The mode the measurement makes the server's: the fastest that took drafts and beats plain
    decode by WIN_MIN (a mode whose drafts were all refused can only look faster by noise)."""
    modes = section.get("modes") if isinstance(section.get("modes"), dict) else {}
    able = {m: r for m, r in ratios.items() if r >= WIN_MIN and accepted(modes.get(m)) > 0}
    return max(able, key=lambda m: (able[m], -MODES.index(m)), default=OFF)


def choose(section: Any, model_path: str) -> tuple[dict[str, Any] | None, str]:
    """(value, reason): the mode the server runs for `model_path`, None for plain decode. Only
    the model that was measured gets a mode; a draft model must still be a file."""
    ratios, why = speedups(section)
    if why:
        return None, f"{why}: plain decode"
    if section.get("model") != model_path:
        return None, "speculative decoding was measured on another model: plain decode"
    if not ratios:
        return None, "no speculative mode was measured in full: plain decode"
    best = winner(section, ratios)
    measured = ", ".join(
        f"{m} {r:.2f}x ({accepted(section['modes'][m])} drafts taken)" for m, r in ratios.items()
    )
    if best == OFF:
        why = f"no mode that took drafts beats plain decode by {WIN_MIN}x"
        return None, f"{why} ({measured}): plain decode"
    value: dict[str, Any] = {"mode": best}
    if best == DRAFT:
        draft = section.get("draft_model")
        if not isinstance(draft, str) or not os.path.isfile(draft):
            return None, f"the draft model {draft!r} is not a file any more: plain decode"
        value["draft_model"] = draft
    return value, f"{best}: {ratios[best]:.2f}x plain decode on the typical requests ({measured})"


def goal(ratios: dict[str, float], chosen: dict[str, Any] | None, draft: str) -> tuple[bool, str]:
    """Is decode with the chosen mode >= GOAL x plain decode? (met, why)"""
    best = ratios.get(chosen["mode"], 1.0) if chosen else 1.0
    if best >= GOAL:
        return True, f"{chosen['mode']} {best:.2f}x >= {GOAL}x"
    top = max(ratios.values(), default=None)
    why = f"the chosen setting gives {best:.2f}x plain decode, below {GOAL}x"
    if top is not None:
        why += f" (the best mode measured: {top:.2f}x)"
    if not draft:
        why += "; no draft model was configured (serve.draft_model), only draft-free n-gram modes"
    return False, why
