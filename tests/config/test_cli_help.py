"""What `rocky-vulkan --help` and `--version` tell a newcomer (the top-level parser)."""

from __future__ import annotations

import re

import pytest
from rocky_vulkan import __version__
from rocky_vulkan.cli import build_parser


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"rocky-vulkan {__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


@pytest.mark.parametrize("command", ["render", "lint", "vm"])
def test_commands_describe_themselves(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert not description.startswith(("options:", "positional")), text  # a description first
