"""The report's PNG files: where they may go (never onto the result being read, a directory, a
device or through a link), each written whole or not at all, and board text in them plain
(matplotlib reads "$...$" as mathtext: a name like "$\\frac{$" would crash it)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.regularfile import file_kind, shown

# The PNGs one --plot name stands for: NAME.png, NAME-serving.png, NAME-tune.png.
SIBLINGS = ("", "-serving", "-tune")


class PlotPathError(UserError):
    """A --plot name the report must not write; nothing was written."""


def sibling(out: Path, suffix: str) -> Path:
    return out.with_name(out.stem + suffix + ".png")


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # a hard link
    except OSError:
        return False


def check_plot_out(out: Path, inputs: Sequence[Path] = ()) -> None:
    """Refuse a --plot name before anything is written: not .png, or it (or a -serving/-tune
    sibling) is a link, not a regular file, one of `inputs`, or in a folder we cannot write."""
    p = shown(out)
    if out.suffix.lower() != ".png" or not out.stem:
        raise PlotPathError(f"{p}: the plot is a PNG: name a .png file, e.g. --plot result.png")
    for target in (sibling(out, s) for s in SIBLINGS):
        t = shown(target)
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            info = None
        except OSError as err:
            raise PlotPathError(f"{t}: cannot use it for the plot ({err.strerror})") from None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise PlotPathError(f"{t}: is a symbolic link: name a new file for --plot")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise PlotPathError(f"{t}: is {file_kind(info.st_mode)}: name a new file for --plot")
        if any(_same(target, src) for src in inputs):
            raise PlotPathError(
                f"{t}: is the result file this report reads; the plot would overwrite it: "
                "name another file with --plot"
            )
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".rocky-plot-", suffix=".png", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise PlotPathError(
            f"{shown(folder)}: cannot write the plot there ({err.strerror}): name a .png "
            "file in a folder you can write"
        ) from None


def save_png(fig, out: Path) -> Path:
    """Write `fig` to `out` through a temp file in the same folder (a failure leaves no partial
    PNG) and close it."""
    import matplotlib.pyplot as plt

    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".rocky-plot-", suffix=".png", dir=out.parent)
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
        tmp = None
    except OSError as err:
        raise PlotPathError(f"{shown(out)}: cannot write the plot ({err.strerror})") from None
    finally:
        plt.close(fig)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return out


def plain(text: str) -> str:
    """`text` for a label matplotlib reads as mathtext (tick labels): every "$" escaped, so
    board data shows as written. Titles and texts we place pass parse_math=False instead."""
    return text.replace("$", r"\$")
