"""`render --check`: the tree on disk against a fresh render, as a unified diff."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


def read_tree(root: Path, tops: Iterable[str]) -> dict[str, bytes]:
    """Every file under the folders `tops` of `root`, by path relative to root."""
    found = {}
    for top in tops:
        base = root / top
        if base.is_dir():
            for path in sorted(base.rglob("*")):
                if path.is_file():
                    found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def diff_trees(current: dict[str, bytes], fresh: dict[str, bytes]) -> str:
    """A unified diff from `current` to `fresh` ('' when identical); a file missing on one side
    is /dev/null there."""
    chunks = []
    for rel in sorted(set(fresh) | set(current)):
        old, new = current.get(rel), fresh.get(rel)
        if old == new:
            continue
        old_lines = old.decode("utf-8", "replace").splitlines(True) if old is not None else []
        new_lines = new.decode("utf-8", "replace").splitlines(True) if new is not None else []
        chunks.extend(
            difflib.unified_diff(
                old_lines,
                new_lines,
                fromfile=f"a/{rel}" if old is not None else "/dev/null",
                tofile=f"b/{rel}" if new is not None else "/dev/null",
            )
        )
    return "".join(chunks)
