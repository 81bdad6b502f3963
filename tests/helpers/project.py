"""Paths into this checkout that tests read (the code under test gets them as arguments)."""

from __future__ import annotations

from pathlib import Path

from rocky_vulkan.tiles import WARPTILE_PATCH, space

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def builtin_tiles() -> dict[str, tuple[int, ...]]:
    """The built-in Mali tiles of this checkout's warptile patch."""
    return space.builtin_tiles(ROOT / "patches" / WARPTILE_PATCH)


def candidates() -> list[space.Candidate]:
    """The tuner's candidate space for this checkout's built-in tiles."""
    return space.candidates(builtin_tiles())
