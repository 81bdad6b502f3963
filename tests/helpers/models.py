"""A project config with entries under models: (GGUF models besides the reference one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.helpers.hostile import EXTRA_MODEL
from tests.helpers.project import ROOT


def write_config(
    dest: Path, models: list[dict], serve: str = "reference", draft: str | None = None
) -> Path:
    """The committed config with `models`, serve.model and serve.draft_model set; patches
    copied beside it."""
    text = (ROOT / "rocky-vulkan.yaml").read_text()
    assert "\nmodels: []\n" in text and "\n  model: reference\n" in text
    assert "\n  draft_model: null\n" in text
    block = yaml.safe_dump({"models": models}, sort_keys=False) if models else "models: []\n"
    text = text.replace("\nmodels: []\n", "\n" + block, 1)
    text = text.replace("\n  model: reference\n", f"\n  model: {serve}\n", 1)
    text = text.replace("\n  draft_model: null\n", f"\n  draft_model: {draft or 'null'}\n", 1)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "rocky-vulkan.yaml"
    path.write_text(text)
    if not (dest / "patches").exists():
        shutil.copytree(ROOT / "patches", dest / "patches")
    return path


def model(**changes) -> dict:
    """The hostile run's extra model (a served, licence-flagged one) with `changes`."""
    return {**EXTRA_MODEL, **changes}
