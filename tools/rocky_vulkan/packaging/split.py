"""Which package ships each installed file, by OE's rules (meta/lib/oe/package.py at the pin).

populate_packages: PACKAGES is reordered (-src first, then -dbg, then the rest in order); each
package's FILES entries are globbed relative to D (`glob(recursive=True)`), a directory brings
everything under it, and a path goes to the first package that claims it. Every parent directory
of a shipped path counts as shipped; whatever is left is "installed but not shipped".
With PACKAGE_DEBUG_SPLIT_STYLE debug-with-srcpkg, FILES of ${PN}-src is /usr/src/debug.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Split:
    owner: dict[str, str]  # "/usr/bin/x" -> package, for every shipped file, link and directory
    unshipped: list[str]
    order: list[str]  # PACKAGES in populate_packages' order


def package_order(packages: list[str]) -> list[str]:
    rank = {p: (10 if p.endswith("-src") else 30 if p.endswith("-dbg") else 50, i)
            for i, p in enumerate(dict.fromkeys(packages))}  # fmt: skip
    return sorted(rank, key=rank.get)


def _expand_entries(root: Path, entries: list[str]) -> list[str]:
    """files_from_filevars: paths ("./usr/bin/x") an entry list claims, directories recursed."""
    files: list[str] = []
    for entry in entries:
        rel = "." + entry if entry.startswith("/") else entry
        if not rel.startswith("./"):
            rel = "./" + rel
        found = sorted(glob.glob(rel, root_dir=root, recursive=True))
        files += found if found and found != [rel] else [rel]
    i = 0
    while i < len(files):  # a directory brings its contents (the list grows as we go)
        full = root / files[i]
        if full.is_dir() and not full.is_symlink():
            files += [os.path.join(files[i], name) for name in sorted(os.listdir(full))]
        i += 1
    return files


def split(root: Path, packages: list[str], files: dict[str, list[str]]) -> Split:
    """Assign the tree under `root` (the recipe's D) to `packages`, FILES given per package."""
    root = Path(root)
    order = package_order(packages)
    owner: dict[str, str] = {}
    for pkg in order:
        for rel in _expand_entries(root, files.get(pkg, [])):
            full = root / rel
            if not full.is_symlink() and not full.exists():
                continue
            path = os.path.normpath(rel[1:]) if rel != "." else "/"
            if path in owner:
                continue
            owner[path] = pkg
            parent = os.path.dirname(path)
            while parent not in ("/", "") and parent not in owner:
                owner[parent] = pkg
                parent = os.path.dirname(parent)
    unshipped = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = "/" + os.path.relpath(os.path.join(dirpath, name), root)
            if path not in owner:
                unshipped.append(path)
    return Split(owner=owner, unshipped=sorted(unshipped), order=order)
