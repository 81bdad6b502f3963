"""`rocky-vulkan packaging ...` (or `python -m rocky_vulkan.packaging ...`): what CI calls.

cmake-args RECIPE --workdir W      OE's install layout + the recipe's EXTRA_OECMAKE, one a line
task RECIPE TASK [--part P] [--var K=V]   the recipe's shell task, expanded, as a bash script
install RECIPE DEST --workdir W    run the recipe's own do_install from its files/ into DEST
check RECIPE ROOT --build-path P   split ROOT into the recipe's packages, run OE's QA checks
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.packaging import oerules, qa, trees


def _vars(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"--var wants KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _cmake_args(args: argparse.Namespace) -> int:
    path = trees.recipe_file(args.recipe, Path(args.project))
    print("\n".join(trees.cmake_args(path, oerules.load(), Path(args.workdir).resolve())))
    return 0


def _task(args: argparse.Namespace) -> int:
    path = trees.recipe_file(args.recipe, Path(args.project))
    overrides = {**trees.HOST_BUILD_VARS, **_vars(args.var)}
    parts = tuple("" if p == "main" else p for p in args.part) or ("prepend", "", "append")
    print(trees.task_script(path, oerules.load(), args.task, overrides, parts))
    return 0


def _install(args: argparse.Namespace) -> int:
    path = trees.recipe_file(args.recipe, Path(args.project))
    trees.install_from_files(
        path, oerules.load(), Path(args.dest).resolve(), Path(args.workdir).resolve()
    )
    print(f"{args.recipe}: do_install into {args.dest}")
    return 0


def _check(args: argparse.Namespace) -> int:
    p = trees.packaged(args.recipe, Path(args.project), Path(args.root), args.build_path,
                       oerules.load())  # fmt: skip
    rules = oerules.load()
    print(trees.manifest(p))
    findings = qa.run_all(p)
    for finding in findings:
        print(f"{rules.severity(finding.check).upper()}: {finding}")
    errors = [f for f in findings if rules.severity(f.check) == "error"]
    print(
        f"{args.recipe}: {len(p.files())} files, {len(errors)} QA errors, {len(findings)} findings"
    )
    return 1 if errors else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "packaging", help="OE's packaging QA on a recipe's install tree, without bitbake"
    )
    parser.add_argument("--project", default=".", help="the checkout holding meta-rocky-vulkan/")
    sub = parser.add_subparsers(dest="command_packaging", required=True)
    q = sub.add_parser("cmake-args", help="the recipe's cmake options with OE's layout")
    q.add_argument("recipe")
    q.add_argument("--workdir", required=True, help="stands for ${WORKDIR}")
    q.set_defaults(func=_cmake_args)
    q = sub.add_parser("task", help="print a recipe's shell task as a bash script")
    q.add_argument("recipe")
    q.add_argument("task")
    q.add_argument("--part", action="append", default=[], choices=("prepend", "main", "append"))
    q.add_argument("--var", action="append", default=[], help="KEY=VALUE (D, WORKDIR, ...)")
    q.set_defaults(func=_task)
    q = sub.add_parser("install", help="run a recipe's own do_install from its files/")
    q.add_argument("recipe")
    q.add_argument("dest")
    q.add_argument("--workdir", required=True)
    q.set_defaults(func=_install)
    q = sub.add_parser("check", help="OE's packaging QA on an install tree")
    q.add_argument("recipe")
    q.add_argument("root", help="the install tree (the recipe's ${D})")
    q.add_argument("--build-path", action="append", default=[], help="a path that must not leak")
    q.set_defaults(func=_check)


def main(argv: list[str] | None = None) -> int:
    from rocky_vulkan.cli import run_subcommand

    return run_subcommand(register, "packaging", argv)


if __name__ == "__main__":
    sys.exit(main())
