"""What the self-test prints: every line from data goes through `printable`, so escape sequences
and control characters from a tool, a file or a config are shown as text, never run by the
terminal; and a reader that goes away (`run | head -1`, a closed terminal) does not change the
verdict: printing stops quietly, the run goes on and saves its result."""

from __future__ import annotations

import os
import sys

MAX_LINES = 80
MAX_LINE_CHARS = 400  # the console and motd summary
LOG_LINE_CHARS = 2000  # a step line in the journal; the whole text is in result.json


def clean_line(text: object, limit: int = MAX_LINE_CHARS) -> str:
    """One line: every character that is not printable (ESC, CR, BEL, C1, bidi controls, a
    newline) becomes '?', and at most `limit` characters are kept."""
    clean = "".join(c if c.isprintable() else "?" for c in str(text)[: limit + 1])
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def printable(lines: list[str]) -> list[str]:
    """No escape sequences or control characters from the data reach a terminal or the motd."""
    out = [clean_line(line) for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        out.append(f"  ... {len(lines) - MAX_LINES} more lines in result.json")
    return out


def _silence(stream) -> None:
    """The reader is gone (EPIPE) or the terminal broke (EIO): stop writing to it. The stream's
    descriptor now points at /dev/null, so later writes and the flush at exit go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real descriptor (a test's StringIO)
        pass


def write(text: str, stream=None) -> None:
    """`text` and a newline to `stream` (stdout) and flushed; nothing once the reader is gone."""
    stream = stream or sys.stdout
    if stream is None:  # started with the descriptor closed
        return
    try:
        stream.write(text + "\n")
        stream.flush()
    except OSError:
        _silence(stream)


def say(text: object, stream=None) -> None:
    """A log line for the journal or the terminal (stdout, or `stream`): each line cleaned and
    capped."""
    lines = str(text).split("\n")
    write("\n".join(clean_line(line, LOG_LINE_CHARS) for line in lines), stream)
