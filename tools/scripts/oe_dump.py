#!/usr/bin/env python3
"""Read what bitbake would run, from a recipe or a `bitbake -e` dump, for a rehearsal outside OE.

    oe_dump.py dump-var  DUMP VAR  [--map OLD=NEW]...   value of VAR in the dump (paths mapped)
    oe_dump.py dump-func DUMP FUNC [--map OLD=NEW]...   body of shell function FUNC in the dump
    oe_dump.py dump-meson DUMP [--map OLD=NEW]...       the `meson setup` arguments of
                                                        meson_do_configure, one per line
    oe_dump.py recipe-var  RECIPE VAR  [--set K=V]...   VAR as assigned in RECIPE, expanded,
                                                        one shell word per line
    oe_dump.py recipe-func RECIPE FUNC [--set K=V]...   FUNC's body in RECIPE, expanded
    oe_dump.py extract DUMP [--var VAR]... [--func FUNC]...
                                                        those lines of the dump, verbatim, as a
                                                        smaller dump that dump-* read the same way
    oe_dump.py same-words A B                           exit 0 if files A and B hold the same
                                                        shell words (order kept), else print the
                                                        difference and exit 1

Expansion of a recipe: ${NAME} from --set, else from the recipe's own `NAME = "..."`; inline
Python `${@...}` is evaluated with a `d` whose getVar() answers the same way. Anything left
unexpanded is an error (exit 2), never passed on silently. The recipe parser knows the plain
`NAME = "value"` form with backslash continuations and `name() {` ... `}` functions, which is all
our generated recipes use; `dump-*` reads bitbake's own `bitbake -e` output, where values are
final already.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path


class Unexpanded(Exception):
    pass


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"oe_dump: expected OLD=NEW or K=V, got {item!r}")
        out[key] = value
    return out


def _map(text: str, mapping: dict[str, str]) -> str:
    # Longest first, so a WORKDIR mapping wins over a mapping of one of its parents.
    for old in sorted(mapping, key=len, reverse=True):
        text = text.replace(old, mapping[old])
    return text


def dump_var(dump: str, name: str) -> str:
    match = re.search(r"^(?:export )?" + re.escape(name) + r'="(.*)"$', dump, re.M)
    if not match:
        raise SystemExit(f"oe_dump: {name} is not set in the dump")
    return match.group(1)


def dump_func(dump: str, name: str) -> str:
    match = re.search(r"^" + re.escape(name) + r"\(\) \{\n(.*?)^\}$", dump, re.M | re.S)
    if not match:
        raise SystemExit(f"oe_dump: no shell function {name}() in the dump")
    return match.group(1)


def dump_meson(dump: str) -> list[str]:
    body = dump_func(dump, "meson_do_configure")
    match = re.search(r"if ! meson setup (.*?); then$", body, re.M)
    if not match:
        raise SystemExit("oe_dump: meson_do_configure has no `meson setup ...; then` line")
    return shlex.split(match.group(1))


def recipe_assignments(text: str) -> dict[str, str]:
    joined = re.sub(r"\\\n", " ", text)
    out = {}
    for match in re.finditer(r'^([A-Za-z_][\w:-]*)\s*=\s*"(.*)"\s*$', joined, re.M):
        out[match.group(1)] = match.group(2)
    return out


def recipe_func(text: str, name: str) -> str:
    match = re.search(r"^" + re.escape(name) + r"\(\) \{\n(.*?)^\}$", text, re.M | re.S)
    if not match:
        raise SystemExit(f"oe_dump: no function {name}() in the recipe")
    return match.group(1)


class _D:
    def __init__(self, lookup):
        self._lookup = lookup

    def getVar(self, name, expand=True):  # noqa: N802 - bitbake's API name
        return self._lookup(name)


def expand(value: str, assigned: dict[str, str], given: dict[str, str], depth: int = 0) -> str:
    if depth > 20:
        raise Unexpanded(f"recursion expanding {value!r}")

    def lookup(name: str) -> str:
        if name in given:
            return given[name]
        if name in assigned:
            return expand(assigned[name], assigned, given, depth + 1)
        raise Unexpanded(f"${{{name}}} has no value: pass --set {name}=...")

    d = _D(lookup)

    def one(match: re.Match) -> str:
        inner = match.group(1)
        if inner.startswith("@"):
            return str(eval(inner[1:], {"d": d}))  # noqa: S307 - our own generated recipe
        return lookup(inner)

    # Innermost first: ${@d.getVar('X')} contains no nested ${...} in our recipes.
    pattern = re.compile(r"\$\{(@[^{}]*?|[A-Za-z_][\w:-]*)\}")
    for _ in range(50):
        new = pattern.sub(one, value)
        if new == value:
            break
        value = new
    if "${" in value:
        raise Unexpanded(f"left unexpanded: {value!r}")
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("dump-var", "dump-func", "dump-meson"):
        p = sub.add_parser(cmd)
        p.add_argument("dump", type=Path)
        if cmd != "dump-meson":
            p.add_argument("name")
        p.add_argument("--map", action="append", default=[])
    for cmd in ("recipe-var", "recipe-func"):
        p = sub.add_parser(cmd)
        p.add_argument("recipe", type=Path)
        p.add_argument("name")
        p.add_argument("--set", action="append", default=[])
    p = sub.add_parser("extract")
    p.add_argument("dump", type=Path)
    p.add_argument("--var", action="append", default=[])
    p.add_argument("--func", action="append", default=[])
    p = sub.add_parser("same-words")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = parser.parse_args(argv[1:])

    if args.cmd == "extract":
        dump = args.dump.read_text(errors="replace")
        for name in args.var:
            match = re.search(r"^(?:export )?" + re.escape(name) + r'=".*"$', dump, re.M)
            if not match:
                raise SystemExit(f"oe_dump: {name} is not set in the dump")
            print(match.group(0))
        for name in args.func:
            print(f"{name}() {{\n{dump_func(dump, name)}}}")
        return 0
    if args.cmd.startswith("dump-"):
        dump = args.dump.read_text(errors="replace")
        mapping = _pairs(args.map)
        if args.cmd == "dump-var":
            print(_map(dump_var(dump, args.name), mapping))
        elif args.cmd == "dump-func":
            print(_map(dump_func(dump, args.name), mapping), end="")
        else:
            for word in dump_meson(dump):
                print(_map(word, mapping))
        return 0
    if args.cmd == "same-words":
        a = shlex.split(args.a.read_text())
        b = shlex.split(args.b.read_text())
        if a == b:
            print(f"same {len(a)} words")
            return 0
        for word in a:
            if word not in b:
                print(f"only in {args.a}: {word}")
        for word in b:
            if word not in a:
                print(f"only in {args.b}: {word}")
        if sorted(a) == sorted(b):
            print("same words, other order")
        return 1
    text = args.recipe.read_text()
    given = _pairs(args.set)
    try:
        if args.cmd == "recipe-var":
            assigned = recipe_assignments(text)
            if args.name not in assigned:
                raise SystemExit(f"oe_dump: {args.name} is not assigned in {args.recipe}")
            for word in shlex.split(expand(assigned[args.name], assigned, given)):
                print(word)
        else:
            print(expand(recipe_func(text, args.name), recipe_assignments(text), given), end="")
    except Unexpanded as exc:
        print(f"oe_dump: {args.recipe}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
