"""A check's outcome: PASS/FAIL/SKIP/ERROR with the one line of evidence that decided it.

ERROR means the check itself broke (an exception, a file it could not read): no evidence either
way, so the verdict cannot be PASS."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"
STATUSES = (PASS, FAIL, SKIP, ERROR)
# Every check of a run, in the order they run (the config's skip_checks names some of them).
CHECK_ORDER = (
    "gpu_driver",
    "csf_firmware",
    "no_vendor_driver",
    "vulkan_device",
    "model_sha256",
    "sweep",
    "ratio",
    "output_match",
    "placement",
    "serving",
    "speculative",
    "cluster",
)


@dataclass
class Check:
    name: str
    status: str
    evidence: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def passed(name: str, evidence: str, **details: Any) -> Check:
    return Check(name, PASS, evidence, details)


def failed(name: str, evidence: str, **details: Any) -> Check:
    return Check(name, FAIL, evidence, details)


def verdict_of(statuses: Iterable[str]) -> str:
    """ERROR if a check broke (nothing proven), else FAIL if one failed, else PASS; and no PASS
    without a passing check (every check skipped proves nothing: ERROR)."""
    found = set(statuses)
    if ERROR in found:
        return ERROR
    if found - {PASS, SKIP}:
        return FAIL
    return PASS if PASS in found else ERROR
