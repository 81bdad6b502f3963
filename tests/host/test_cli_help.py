"""`rocky-vulkan --help` is for a user: what the tool does and the usual order of commands."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from rocky_vulkan.cli import COMMAND_MODULES, main


def _help() -> str:
    # The installed entry point's own output, as a user sees it.
    done = subprocess.run(
        [sys.executable, "-m", "rocky_vulkan.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_help_says_what_the_tool_does_not_how_the_code_is_laid_out():
    text = _help()
    for words in ("Yocto image", "llama.cpp", "Mali-G610", "panvk", "rocky-vulkan.yaml"):
        assert words in text, words
    for code_talk in ("register(", "sub-command per module", "module"):
        assert code_talk not in text, code_talk


def test_help_gives_the_workflow_in_order():
    text = _help()
    steps = ["doctor", "render", "build", "flash", "report"]
    where = [text.find(f"rocky-vulkan {step}", text.find("the usual order")) for step in steps]
    assert -1 not in where and where == sorted(where), dict(zip(steps, where, strict=True))


def test_every_command_is_still_listed():
    text = _help()
    names = re.findall(r"(?m)^    ([a-z][a-z-]*) ", text)
    assert len(names) == len(COMMAND_MODULES)
    assert {"render", "build", "flash", "model", "report"} <= set(names)


def test_every_command_has_a_working_help(capsys):
    # argparse %-formats help texts: a stray % (an IPv6 zone, a percentage) crashes --help.
    names = re.findall(r"(?m)^    ([a-z][a-z-]*) ", _help())
    for name in names:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code == 0, name
        assert "usage: rocky-vulkan" in capsys.readouterr().out
