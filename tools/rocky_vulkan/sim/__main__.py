"""`python -m rocky_vulkan.sim ARGS` = `rocky-vulkan sim ARGS` (used by the tests and CI)."""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from . import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocky-vulkan")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"rocky-vulkan: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
