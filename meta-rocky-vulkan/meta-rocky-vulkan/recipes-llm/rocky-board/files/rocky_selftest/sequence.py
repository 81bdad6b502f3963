"""The checks in order, each guarded: one that breaks is an ERROR line, the others still run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .bench import Deadline, ratio, sweep
from .checks import CHECK_ORDER, ERROR, PASS, SKIP, Check, failed, verdict_of
from .cluster_step import cluster
from .match import output_match
from .outcome import base_doc, now
from .placement_bench import placement
from .serving import serving
from .settings import Settings
from .speculation_bench import speculative
from .stack import (
    check_firmware,
    check_gpu_driver,
    check_model,
    check_no_vendor_driver,
    check_vulkan_device,
)
from .terminal import say as _say

__all__ = ["CHECK_ORDER", "overall", "run_selftest"]
# A check's one line of evidence, as saved (the data behind it is in its own section).
MAX_EVIDENCE = 2000


def _broken(name: str, err: Exception) -> Check:
    return Check(name, ERROR, f"the check itself failed: {type(err).__name__}: {err}")


def overall(checks: list[Check]) -> str:
    return verdict_of(c.status for c in checks)


def run_selftest(
    s: Settings, progress: Callable[[str], None] = lambda _: None, started: str | None = None
) -> dict[str, Any]:
    """Every check in order; returns the result document (not yet written). `progress` is told
    each step's name before it starts (the IN-PROGRESS marker)."""
    started, t0 = started or now(), time.monotonic()
    deadline = Deadline(s.deadline_s)
    skip = set(s.skip_checks)
    checks: list[Check] = []
    doc = base_doc(ERROR, started)

    def record(check: Check) -> None:
        if len(check.evidence) > MAX_EVIDENCE:
            check.evidence = check.evidence[: MAX_EVIDENCE - 3] + "..."
        checks.append(check)
        _say(f"{check.status:4} {check.name}: {check.evidence}")

    def guarded(name: str, fn: Callable[[], Check]) -> None:
        if name in skip:
            record(Check(name, SKIP, "left out by skip_checks in the config"))
            return
        progress(name)
        try:
            record(fn())
        except Exception as err:  # a bug or an unreadable file: an ERROR line, not a traceback
            record(_broken(name, err))

    def bound() -> bool:
        return any(c.name == "gpu_driver" and c.status == PASS for c in checks)

    guarded("gpu_driver", lambda: check_gpu_driver(s))
    guarded("csf_firmware", lambda: check_firmware(s, driver_bound=bound()))
    guarded("no_vendor_driver", lambda: check_no_vendor_driver(s))
    guarded("vulkan_device", lambda: check_vulkan_device(s))
    guarded("model_sha256", lambda: check_model(s))
    model_there = os.path.isfile(s.model_path)
    for name, step in (("sweep", sweep), ("ratio", ratio), ("output_match", output_match)):

        def one(name=name, step=step) -> Check:
            if not model_there:
                return failed(name, f"not run: model {s.model_path} is missing")
            _say(f"---- {name}")
            check, data = step(s, deadline, log=_say)
            doc[name] = data
            return check

        guarded(name, one)
    # The server's placement, what its users feel and its decode mode: each reads the run so far
    # (the GPU checks, the sweep, then the placement), as the board's server will read the saved
    # result. Then, on a cluster's head, the board alone against the cluster.
    steps = (
        ("placement", placement),
        ("serving", serving),
        ("speculative", speculative),
        ("cluster", cluster),
    )
    for name, step in steps:

        def measured(name=name, step=step) -> Check:
            if not model_there:
                return failed(name, f"not run: model {s.model_path} is missing")
            _say(f"---- {name}")
            so_far = {**doc, "checks": [c.to_json() for c in checks]}
            check, data = step(s, deadline, so_far, log=_say)
            doc[name] = data
            return check

        guarded(name, measured)
    doc.update(
        verdict=overall(checks),
        finished_at=now(),
        duration_s=round(time.monotonic() - t0, 1),
        thresholds={
            "tuned_vs_stock_ratio": s.tuned_vs_stock_ratio,
            "ratio_tolerance": s.ratio_tolerance,
            "match_tokens": s.match_tokens,
            "kld_max_mean": s.kld_max_mean,
            "kld_min_same_top_p": s.kld_min_same_top_p,
            "prompt_tokens": s.prompt_tokens,
            "repetitions": s.repetitions,
            "ubatch_sizes": list(s.ubatch_sizes),
        },
        model={"path": s.model_path, "sha256": s.model_sha256},
        checks=[c.to_json() for c in checks],
    )
    return doc
