"""The example CI jobs parse, lint, and build with kas-container through our own commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers.project import ROOT

EXAMPLES = sorted((ROOT / "docs/ci-examples").glob("*.yml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_ci_example_lints_and_builds_in_kas_container(path: Path):
    data = yaml.safe_load(path.read_text())
    text = path.read_text()
    assert isinstance(data, dict)
    assert ".venv/bin/rocky-vulkan lint" in text
    assert ".venv/bin/rocky-vulkan render --check" in text
    assert "rocky-vulkan build --container --fragment sstate-mirror" in text
    assert "bmap-tools" in text  # the flash tests need bmaptool


def test_both_kinds_exist():
    assert {p.name for p in EXAMPLES} == {"github-actions.yml", "gitlab-ci.yml"}
