"""`rocky-vulkan render`: meta-rocky-vulkan/ and kas/ from the config; deterministic, atomic,
checkable. Each job has its module: `manifest` (what the tree holds, from templates/),
`board` (the board's paths and its config.json), `atomic` (writing it all or nothing) and
`check` (the diff of --check); this one ties them to the command."""

from __future__ import annotations

import argparse
from pathlib import Path

from rocky_vulkan.config import Config, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.layer import atomic, check
from rocky_vulkan.layer.manifest import KAS_DIR, LAYER_DIR, OUTPUT_DIRS, render_files


def write_rendered(cfg: Config, root: Path | None = None) -> list[str]:
    """Render into a temp dir beside the outputs, then swap it in; on error nothing changes.
    Errors from the file system (permissions, read-only, disk full) are a RenderError."""
    root = root or cfg.root
    files = render_files(cfg)
    atomic.write_tree(files, root, OUTPUT_DIRS)
    return list(files)


def diff_against_disk(cfg: Config, root: Path | None = None) -> str:
    """A unified diff from the tree on disk to a fresh render ('' when identical)."""
    root = root or cfg.root
    return check.diff_trees(check.read_tree(root, OUTPUT_DIRS), render_files(cfg))


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.check:
        diff = diff_against_disk(cfg)
        if diff:
            print(diff, end="" if diff.endswith("\n") else "\n")
            raise UserError(
                "the committed layer/kas files differ from a fresh render (diff above); "
                "run `rocky-vulkan render` and commit the result"
            )
        print("render --check: meta-rocky-vulkan/ and kas/ match a fresh render")
        return 0
    written = write_rendered(cfg)
    print(f"rendered {len(written)} files into {LAYER_DIR}/ and {KAS_DIR}/")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "render",
        help="render meta-rocky-vulkan/ and kas/ from the config",
        description="Render the Yocto layers in meta-rocky-vulkan/ and the kas files in kas/ from "
        "rocky-vulkan.yaml. Both are committed: run this after changing the config and commit "
        "the result. Only files an earlier render wrote are replaced (rendered-files.txt).",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail with a diff if the tree on disk differs from a fresh render",
    )
    parser.set_defaults(func=_run)
