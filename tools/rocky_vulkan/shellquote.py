"""Command hints and echoed command lines, quoted for a POSIX shell and safe to print: a path
holding `; rm -rf ~`, `$(...)` or a space is one word when pasted, and one holding a control
character is shown as bash's $'\\xNN' escape, so it cannot drive the terminal either."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable


def quote(arg: str | os.PathLike) -> str:
    """`arg` as one shell word; printable as it is."""
    text = os.fspath(arg)
    if text.isprintable():
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch.isprintable() and ch not in "\\'":
            out.append(ch)
        else:  # surrogateescape: the file name's own undecodable bytes
            out += [f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape")]
    return "$'" + "".join(out) + "'"


def join(args: Iterable[str | os.PathLike]) -> str:
    """The command line `args` as it would be typed."""
    return " ".join(quote(a) for a in args)
