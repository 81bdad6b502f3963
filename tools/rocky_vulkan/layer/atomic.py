"""Write the rendered tree atomically: stage it beside the outputs, then swap each top folder in
by rename; on any error the old tree is put back. One render at a time (a lock on the root), and
a render that was killed leaves nothing behind once the next one ran."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rocky_vulkan.layer.errors import RenderError, os_hint

# Staging dirs of a render, beside the outputs (same file system, so the swap is a rename);
# .gitignore lists them and the next render removes any a killed one left behind.
STAGING_PREFIX = ".render-"


def write_tree(files: dict[str, bytes], root: Path, tops: Iterable[str]) -> None:
    """Replace the folders `tops` under `root` with `files` (paths relative to root, each under
    one of `tops`), all or nothing. File system errors are a RenderError."""
    tops = tuple(tops)
    try:
        lock = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise RenderError(f"cannot open {root}: {err.strerror or err}; {os_hint(err)}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one render at a time in this checkout
        _remove_leftovers(root, tops)
        _swap_in(files, root, tops)
    except OSError as err:
        where = err.filename or root
        raise RenderError(
            f"cannot write the rendered tree into {root} ({where}: {err.strerror or err}); "
            f"{os_hint(err)}. Nothing was changed."
        ) from None
    finally:
        os.close(lock)


def _write_files(files: dict[str, bytes], root: Path) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _remove_leftovers(root: Path, tops: tuple[str, ...]) -> None:
    """Staging dirs of a render that was killed: put back an output it had moved aside and
    not yet replaced, then delete them (the caller holds the render lock, so none is live)."""
    for staging in sorted(root.glob(STAGING_PREFIX + "*")):
        if not staging.is_dir() or staging.is_symlink():
            continue
        for top in tops:
            backup = staging / f"{top}.old"
            if backup.is_dir() and not (root / top).exists():
                os.rename(backup, root / top)
        shutil.rmtree(staging)


def _swap_in(files: dict[str, bytes], root: Path, tops: tuple[str, ...]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    swapped: list[tuple[Path, Path | None]] = []
    try:
        _write_files(files, staging)
        for top in tops:
            target, fresh = root / top, staging / top
            backup = None
            if target.exists():
                backup = staging / f"{top}.old"
                os.rename(target, backup)
            swapped.append((target, backup))  # before the next rename, so a failure rolls back
            os.rename(fresh, target)
    except BaseException:
        for target, backup in reversed(swapped):
            shutil.rmtree(target, ignore_errors=True)
            if backup is not None:
                os.rename(backup, target)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
