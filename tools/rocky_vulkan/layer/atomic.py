"""Write the rendered tree atomically: stage it beside the outputs, then swap each top folder in
by rename; on any error the old tree is put back. One render at a time (a lock on the root), and
a render that was killed leaves nothing behind once the next one ran. Render only ever removes
what a render made: a file in the output folders that the last render's list (manifest.RECORD)
does not name is the user's, and the render is refused, changing nothing."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rocky_vulkan.layer.errors import RenderError, os_hint
from rocky_vulkan.layer.manifest import RECORD, recorded_paths
from rocky_vulkan.regularfile import file_kind, read_regular, shown

# Staging dirs of a render, beside the outputs (same file system, so the swap is a rename);
# .gitignore lists them and the next render removes any a killed one left behind: only those
# named as tempfile.mkdtemp names them and holding STAGING_MARKER (a folder of the user's
# called .render-notes stays).
STAGING_PREFIX = ".render-"
STAGING_MARKER = ".rocky-vulkan-staging"
_STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + r"[a-z0-9_]{8}")
MAX_RECORD_BYTES = 1 << 20
_MAX_LISTED = 10  # foreign files named in the refusal


def write_tree(files: dict[str, bytes], root: Path, tops: Iterable[str]) -> None:
    """Replace the folders `tops` under `root` with `files` (paths relative to root, each under
    one of `tops`), all or nothing. File system errors are a RenderError, and so are files in
    `tops` that no render made."""
    tops = tuple(tops)
    try:
        lock = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise RenderError(
            f"cannot open {shown(root)}: {err.strerror or err}; {os_hint(err)}"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one render at a time in this checkout
        _remove_leftovers(root, tops)
        _refuse_foreign(files, root, tops)
        _swap_in(files, root, tops)
    except OSError as err:
        where = shown(err.filename or root)
        raise RenderError(
            f"cannot write the rendered tree into {shown(root)} ({where}: "
            f"{err.strerror or err}); {os_hint(err)}. Nothing was changed."
        ) from None
    finally:
        os.close(lock)


def _owned(files: dict[str, bytes], root: Path) -> set[str]:
    """The paths under the output folders a render made: those the last render's RECORD lists,
    or, for a tree from before RECORD (or none yet), those this render writes."""
    record = root / RECORD
    try:
        regular = stat.S_ISREG(os.lstat(record).st_mode)
    except OSError:
        regular = False
    if not regular:  # (a RECORD that is there but no regular file is refused as foreign)
        return set(files)
    text = read_regular(record, MAX_RECORD_BYTES, "render list").decode("utf-8", "replace")
    return recorded_paths(text)


def _kind(mode: int) -> str:
    """What an lstat mode is, in words (links included: render never follows one)."""
    return "a symbolic link" if stat.S_ISLNK(mode) else file_kind(mode) or "a file"


def _raise(err: OSError) -> None:
    raise err


def _foreign(files: dict[str, bytes], root: Path, tops: tuple[str, ...]) -> list[str]:
    """Entries under the folders `tops` render may not remove: each file (or link, FIFO, ...)
    that no render made. A regular file at a path this render writes is replaced, not removed:
    after a merge of two branches the committed RECORD may not list a generated file yet."""
    owned = _owned(files, root)
    found = []
    for top in tops:
        base = root / top
        if not os.path.lexists(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base, onerror=_raise):
            for name in sorted(dirnames + filenames):
                path = Path(dirpath, name)
                mode = os.lstat(path).st_mode
                rel = path.relative_to(root).as_posix()
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    found.append(f"{rel} ({_kind(mode)})")
                elif rel not in owned and rel not in files:
                    found.append(rel)
    return found


def _refuse_foreign(files: dict[str, bytes], root: Path, tops: tuple[str, ...]) -> None:
    for top in tops:
        base = root / top
        if os.path.lexists(base) and not stat.S_ISDIR(os.lstat(base).st_mode):
            raise RenderError(
                f"not rendering into {shown(root)}: {top} is {_kind(os.lstat(base).st_mode)}, "
                f"not a folder; render makes {top}/ itself, so move that away and run render "
                "again. Nothing was changed."
            )
    found = _foreign(files, root, tops)
    if not found:
        return
    listed = ", ".join(shown(f) for f in found[:_MAX_LISTED])
    more = f" and {len(found) - _MAX_LISTED} more" if len(found) > _MAX_LISTED else ""
    folders = " and ".join(f"{top}/" for top in tops)
    raise RenderError(
        f"not rendering into {shown(root)}: {listed}{more} under {folders} did not come from "
        f"a render ({RECORD} does not list them). Render replaces {folders} whole, so move your "
        "own files out of them (kas files of your own can sit beside kas/); if a render did "
        "make them, delete them. Nothing was changed."
    )


def _write_files(files: dict[str, bytes], root: Path) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _remove_leftovers(root: Path, tops: tuple[str, ...]) -> None:
    """Staging dirs of a render that was killed: put back an output it had moved aside and
    not yet replaced, then delete them (the caller holds the render lock, so none is live)."""
    for staging in sorted(root.glob(STAGING_PREFIX + "*")):
        if (
            not _STAGING_NAME.fullmatch(staging.name)
            or staging.is_symlink()
            or not (staging / STAGING_MARKER).is_file()
        ):
            continue  # not a staging dir of ours
        for top in tops:
            backup = staging / f"{top}.old"
            if backup.is_dir() and not os.path.lexists(root / top):
                os.rename(backup, root / top)
        shutil.rmtree(staging)


def _swap_in(files: dict[str, bytes], root: Path, tops: tuple[str, ...]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    swapped: list[tuple[Path, Path | None]] = []
    try:
        (staging / STAGING_MARKER).touch()
        _write_files(files, staging)
        for top in tops:
            target, fresh = root / top, staging / top
            backup = None
            if os.path.lexists(target):
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
