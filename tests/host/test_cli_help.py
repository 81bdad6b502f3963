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
    order = text[text.find("the usual order") :]
    steps = ["doctor", "build", "flash", "report"]
    where = [order.find(f"rocky-vulkan {step}") for step in steps]
    assert -1 not in where and where == sorted(where), dict(zip(steps, where, strict=True))
    # Its build accepts the model licence (without it the image is skipped) and adds a key
    # (without one nothing can log in over the network).
    build_line = order[where[1] :].splitlines()[0]
    assert "--fragment model-licence" in build_line and "--ssh-key" in build_line


def test_help_does_not_download_the_model_twice():
    """The build downloads the model itself; `model fetch` before it would fetch 2 GB twice, so
    it is not a step of the usual order, only the way to pin a new model.url's null sha256."""
    text = _help()
    order = text[text.find("the usual order") :]
    steps = order.split("\n\n", 1)[0]
    assert "model fetch" not in steps
    assert "`rocky-vulkan model fetch` is only for a new model.url with `sha256: null`" in order


def test_every_command_is_still_listed():
    text = _help()
    names = re.findall(r"(?m)^    ([a-z][a-z-]*) ", text)
    assert len(names) == len(COMMAND_MODULES)
    assert {"render", "build", "flash", "model", "report"} <= set(names)


def test_readme_first_command_builds_through_rocky_vulkan_build_and_parses():
    """The README's first command is the newcomer's build: through `rocky-vulkan build` (one
    cache, doctor, diagnosis), with the licence fragment and an SSH key, and the CLI takes it."""
    from rocky_vulkan.cli import build_parser

    from tests.helpers.project import ROOT

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    first, tests = blocks[0], blocks[1]
    assert tests.endswith(".venv/bin/pytest -q -rs")
    build = first.split("&&")[-1].split()
    assert build[0] == ".venv/bin/rocky-vulkan"
    args = build_parser().parse_args(build[1:])
    assert args.command == "build"
    assert args.fragment == ["model-licence"] and args.ssh_key == ["~/.ssh/id_ed25519.pub"]
    assert "kas build" not in first


def test_every_command_has_a_working_help(capsys):
    # argparse %-formats help texts: a stray % (an IPv6 zone, a percentage) crashes --help.
    names = re.findall(r"(?m)^    ([a-z][a-z-]*) ", _help())
    for name in names:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code == 0, name
        assert "usage: rocky-vulkan" in capsys.readouterr().out
