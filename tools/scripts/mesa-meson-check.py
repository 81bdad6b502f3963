#!/usr/bin/env python3
"""Check every -Dname=value bitbake passes to Mesa's meson against a Mesa tree's meson.options.

    tools/scripts/mesa-meson-check.py BITBAKE_E_DUMP MESON_OPTIONS

BITBAKE_E_DUMP: `bitbake -e mesa` (or mesa-tools-native) output, e.g. from
tools/scripts/bitbake-env.sh.
MESON_OPTIONS: meson.options of the pinned Mesa release. Meson stops on an unknown option or a
value outside an option's choices, so a Mesa bump on oe-core's older mesa.inc must pass this.
Exit 0: every option exists and every value is allowed; 1 otherwise.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def bitbake_var(env: str, name: str) -> str:
    match = re.search(r"^(?:export )?" + name + r'="(.*)"$', env, re.M)
    return match.group(1) if match else ""


def meson_options(text: str) -> dict[str, tuple[str, list[str] | None]]:
    """option name -> (type, allowed values or None for free values)."""
    options = {}
    for match in re.finditer(r"option\(\s*'([^']+)'(.*?)\n\)", text, re.S):
        body = match.group(2)
        kind = re.search(r"type\s*:\s*'(\w+)'", body).group(1)
        choices = re.search(r"choices\s*:\s*(\[.*?\])", body, re.S)
        allowed = ast.literal_eval(re.sub(r"#.*", "", choices.group(1))) if choices else None
        if kind == "feature":
            allowed = ["enabled", "disabled", "auto"]
        elif kind == "boolean":
            allowed = ["true", "false"]
        options[match.group(1)] = (kind, allowed)
    return options


def main(argv: list[str]) -> int:
    env = Path(argv[1]).read_text(errors="replace")
    options = meson_options(Path(argv[2]).read_text())
    args = bitbake_var(env, "EXTRA_OEMESON") + " " + bitbake_var(env, "PACKAGECONFIG_CONFARGS")
    given = sorted({a for a in args.split() if a.startswith("-D")})
    problems = 0
    for arg in given:
        name, _, value = arg[2:].partition("=")
        if name not in options:
            print(f"unknown option: {arg}")
            problems += 1
            continue
        kind, allowed = options[name]
        values = [v for v in value.strip("'").split(",") if v] if kind == "array" else [value]
        wrong = [v for v in values if allowed is not None and v.strip("'") not in allowed]
        if wrong:
            print(f"value not allowed: {arg} (choices: {', '.join(allowed)})")
            problems += 1
    print(
        f"{len(given)} distinct -D options, {problems} problems ({len(options)} in meson.options)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
