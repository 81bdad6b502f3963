"""The `rocky-vulkan` command line: one sub-command per module, each with `register(sub)`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from rocky_vulkan import __version__
from rocky_vulkan.errors import UserError

# Each module named here has `register(subparsers)`, which adds its parser and sets `func`.
COMMAND_MODULES = (
    "rocky_vulkan.layer.render",
    "rocky_vulkan.layer.lint",
    "rocky_vulkan.host.doctor",
    "rocky_vulkan.host.build",
    "rocky_vulkan.host.flash",
    "rocky_vulkan.llama.testmodel",
    "rocky_vulkan.host.model",
    "rocky_vulkan.host.report",
    "rocky_vulkan.host.board",
    "rocky_vulkan.host.cluster_pair",
    "rocky_vulkan.llama.sources",
    "rocky_vulkan.sim",
    "rocky_vulkan.vm",
    "rocky_vulkan.tiles.cli",
    "rocky_vulkan.packaging.cli",
)


# What `rocky-vulkan --help` tells a user: what the tool is for and the usual order of commands.
DESCRIPTION = """\
Build, flash and check a Yocto image that runs llama.cpp on the Mali-G610 GPU of an RK3588 board
(Radxa ROCK 5 ITX / ITX+, ROCK 5B) with the open driver stack: mainline Linux (panthor), Mesa
panvk and llama.cpp's Vulkan backend. Everything comes from one config file, rocky-vulkan.yaml."""

WORKFLOW = """\
the usual order:
  rocky-vulkan doctor                 check this build host
  rocky-vulkan build --fragment model-licence --ssh-key ~/.ssh/id_ed25519.pub
                                      accept the model's licence (read it first, see
                                      docs/user/build.md), add your SSH public key to
                                      rocky-vulkan.yaml, then render, doctor, lint and build the
                                      image with kas (it downloads the model itself, checked
                                      against model.sha256)
  rocky-vulkan flash IMAGE DEVICE     write the image to a microSD card, verified
  (boot the board: a self-test runs once and writes /var/lib/rocky-selftest/result.json)
  ssh rocky@rock-5-itx.local          log in with that key (`image.user`@`hostname`.local)
  rocky-vulkan report result.json     the board's numbers against the reference, and a verdict
  rocky-vulkan board HOST             over SSH: the same report, the API's URL, TLS fingerprint, key

After changing rocky-vulkan.yaml, run `rocky-vulkan render` and commit both (build renders too).
`rocky-vulkan model fetch` is only for a new model.url with `sha256: null`: it downloads the model
once to pin its checksum (the build downloads it again into DL_DIR).
`rocky-vulkan COMMAND --help` describes one command; docs/user/ has the walk-through."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocky-vulkan",
        description=DESCRIPTION,
        epilog=WORKFLOW,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_option(parser)
    parser.add_argument("--version", action="version", version=f"rocky-vulkan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        default="rocky-vulkan.yaml",
        help="the project config (default: %(default)s)",
    )


def _dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"rocky-vulkan: error: {err}", file=sys.stderr)
        return err.exit_code


def main(argv: list[str] | None = None) -> int:
    return _dispatch(build_parser(), argv)


def run_subcommand(register: Callable, name: str, argv: list[str] | None = None) -> int:
    """`rocky-vulkan NAME ARGS` with only that module imported (for `python -m` entry points
    that run where the rest of the CLI's dependencies may be missing)."""
    parser = argparse.ArgumentParser(prog="rocky-vulkan")
    _add_config_option(parser)
    register(parser.add_subparsers(dest="command", required=True))
    return _dispatch(parser, [name, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
