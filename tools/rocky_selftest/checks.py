"""A check's outcome: PASS/FAIL/SKIP/ERROR with the one line of evidence that decided it.

ERROR means the check itself broke (an exception, a file it could not read): no evidence either
way, so the verdict cannot be PASS."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"


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
