"""systemd-analyze on the self-test's units: the exposure score and the [Service] settings.
Tests that run it carry `needs_analyze` (systemd-analyze on PATH)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

MAX_EXPOSURE = 4.0  # issue 11: "target exposure <= 4.0"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.needs_tool(
    "systemd-analyze", "Debian: apt-get install systemd; .ci/run does"
)


def settings(unit: str) -> dict[str, list[str]]:
    """Key -> values of the [Service] section, comments dropped."""
    out: dict[str, list[str]] = {}
    section = None
    for line in unit.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def exposure(unit: Path) -> tuple[float, str]:
    proc = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if "--offline" in out and "unrecognized" in out:
        pytest.skip(f"this systemd-analyze has no --offline (systemd < 250): {out.strip()}")
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), out
