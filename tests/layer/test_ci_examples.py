"""The example CI jobs parse, lint, and build with kas-container through our own commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rocky_vulkan.cli import build_parser

from tests.helpers.project import ROOT

EXAMPLES = sorted((ROOT / "docs/ci-examples").glob("*.yml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_ci_example_lints_and_builds_in_kas_container(path: Path):
    data = yaml.safe_load(path.read_text())
    text = path.read_text()
    assert isinstance(data, dict)
    assert ".venv/bin/rocky-vulkan lint" in text
    assert ".venv/bin/rocky-vulkan render --check" in text
    builds = [
        line.split(".venv/bin/rocky-vulkan ", 1)[1].split()
        for line in text.splitlines()
        if ".venv/bin/rocky-vulkan build" in line
    ]
    assert len(builds) == 1
    args = build_parser().parse_args(builds[0])  # the CLI takes it as written
    assert args.container and args.fragment == ["model-licence", "sstate-mirror"]
    assert "bmap-tools" in text  # the flash tests need bmaptool


def test_both_kinds_exist():
    assert {p.name for p in EXAMPLES} == {"github-actions.yml", "gitlab-ci.yml"}
