"""Shared fixtures: a scratch copy of the project (config, patches, generated tree)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's config, patches and generated tree to break at will."""
    dest = tmp_path / "proj"
    dest.mkdir()
    shutil.copy(ROOT / "rocky-vulkan.yaml", dest)
    for tree in ("patches", "meta-rocky-vulkan", "kas"):
        if (ROOT / tree).exists():
            shutil.copytree(ROOT / tree, dest / tree)
    return dest
