"""`render --check`: the tree on disk against a fresh render, as a unified diff."""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from rocky_vulkan.layer.manifest import MAX_COPIED_BYTES
from rocky_vulkan.regularfile import read_regular


def read_tree(root: Path, tops: Iterable[str]) -> dict[str, bytes]:
    """Every entry under the folders `tops` of `root` but folders, by path relative to root:
    a regular file's bytes (bounded), for anything else (a link, a FIFO, a top that is no
    folder) a line saying what it is, which no render writes, so --check reports it. Links
    are not followed and nothing but regular files is opened."""
    found = {}
    for top in tops:
        base = root / top
        if not os.path.lexists(base):
            continue
        if base.is_symlink() or not base.is_dir():
            found[top] = b"(not a folder)\n"
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            for name in sorted(dirnames + filenames):
                path = Path(dirpath, name)
                mode = os.lstat(path).st_mode
                rel = path.relative_to(root).as_posix()
                if stat.S_ISREG(mode):
                    found[rel] = read_regular(path, MAX_COPIED_BYTES, "rendered")
                elif not stat.S_ISDIR(mode):
                    found[rel] = b"(not a regular file)\n"
    return dict(sorted(found.items()))


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
