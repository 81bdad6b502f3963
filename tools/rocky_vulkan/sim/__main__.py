"""`python -m rocky_vulkan.sim ARGS` = `rocky-vulkan sim ARGS` (used by the tests and CI)."""

from __future__ import annotations

import sys

from rocky_vulkan.cli import run_subcommand
from rocky_vulkan.sim import register


def main(argv: list[str] | None = None) -> int:
    return run_subcommand(register, "sim", argv)


if __name__ == "__main__":
    sys.exit(main())
