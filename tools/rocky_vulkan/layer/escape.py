"""Jinja filters that make a config value safe for the syntax it is written into.

The config loader already refuses anything outside each field's exact pattern; these filters are
the second line: a value that could start a new bitbake assignment, an inline-Python expansion
(`${@...}`), a shell command, a new systemd setting or a new YAML key is refused (UnsafeValue)
or quoted, never written as is."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

# Line breaks of every kind (Python's splitlines() and bitbake's reader split on more than \n)
# and other control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Inside a bitbake "..." value: the quote ends it, a backslash escapes or continues the line,
# '$' starts ${VAR} / ${@python} expansion, and '`' matters where the value lands in shell.
_BB_UNSAFE = re.compile(r'["\\$`]')
# A token that means the same in bitbake, shell, YAML and systemd syntax.
_WORD = re.compile(r"[A-Za-z0-9._+/-]+")
# An override name (MACHINE, DISTRO, SoC): ':' would start another override.
_OVERRIDE = re.compile(r"[a-z0-9][a-z0-9-]*")
_CRYPT = re.compile(r"\$(6|y)\$[./0-9A-Za-z$=]+")
# A YAML plain scalar we may leave unquoted (and only if it reads back as the same string).
_YAML_PLAIN = re.compile(r"[A-Za-z0-9.][A-Za-z0-9._/:@+%?&=~,-]*")


class UnsafeValue(ValueError):
    """A value that cannot be written safely into its target syntax."""


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:55]) + f"... ({len(text)} chars)"


def line(value: Any) -> str:
    """One line of plain text (comments, README, licence text): no line break of any kind, and
    no quote, backslash, '$' or '`' (inert there, but no config text needs them, and a
    comment or README may later become a value)."""
    text = str(value)
    if _CONTROL.search(text):
        raise UnsafeValue(f"{_short(text)} holds a line break or control character")
    if re.search(r"[\"'\\$`]", text):
        raise UnsafeValue(f"{_short(text)} holds a quote, '\\', '$' or '`'")
    return text


def comment(value: Any) -> str:
    """Text after '#' in a bitbake/kas file: a line() (no '\\' either: bitbake continues a
    comment ending in a backslash onto the next line)."""
    return line(value)


def bb_value(value: Any) -> str:
    """Text inside a bitbake double-quoted value: no quote, backslash, '$' or '`'."""
    text = str(value)
    if _CONTROL.search(text):
        raise UnsafeValue(f"{_short(text)} holds a line break or control character")
    if _BB_UNSAFE.search(text):
        raise UnsafeValue(f"{_short(text)} holds '\"', '\\\\', '$' or '`'")
    return text


def bb_word(value: Any) -> str:
    """A name, path, checksum or number used as a token in bitbake or shell syntax."""
    text = str(value)
    if not _WORD.fullmatch(text):
        raise UnsafeValue(f"{_short(text)} is not a plain name (letters, digits, ._+/-)")
    return text


def bb_override(value: Any) -> str:
    """A machine, distro or SoC name used as a bitbake override (after ':')."""
    text = str(value)
    if not _OVERRIDE.fullmatch(text):
        raise UnsafeValue(f"{_short(text)} is not an override name (a-z, 0-9, '-')")
    return text


def bb_uri(value: Any) -> str:
    """A URL inside SRC_URI: a bitbake value with no space (a new URI) and no ';' (parameters)."""
    text = bb_value(value)
    if re.search(r"[\s;]", text):
        raise UnsafeValue(f"{_short(text)} holds a space or ';'")
    return text


def bb_crypt(value: Any) -> str:
    """A crypt(3) hash for extrausers' `useradd -p '...'`: extrausers expands the value in
    shell double quotes, so each '$' becomes '\\$'."""
    text = str(value)
    if not _CRYPT.fullmatch(text):
        raise UnsafeValue(f"{_short(text)} is not a $6$ or $y$ crypt hash")
    return text.replace("$", "\\$")


def sh_quote(value: Any) -> str:
    """A single shell word, single-quoted (no NUL: a shell argument cannot hold one)."""
    text = str(value)
    if "\x00" in text:
        raise UnsafeValue(f"{_short(text)} holds a NUL byte")
    return "'" + text.replace("'", "'\\''") + "'"


def unit_value(value: Any) -> str:
    """A systemd unit setting's value: one line, '%' and '\\' escaped (specifier/C escapes)."""
    text = line(value)
    return text.replace("\\", "\\\\").replace("%", "%%")


def yaml_scalar(value: Any) -> str:
    """A YAML scalar for kas files: plain when it reads back as the same string, else a
    double-quoted JSON string (JSON strings are valid YAML)."""
    text = str(value)
    if _YAML_PLAIN.fullmatch(text) and yaml.safe_load(text) == text:
        return text
    return json.dumps(text, ensure_ascii=True)


def yaml_quoted(value: Any) -> str:
    """A YAML double-quoted scalar (a JSON string), for values that must stay strings."""
    return json.dumps(str(value), ensure_ascii=True)


FILTERS = {
    "line": line,
    "comment": comment,
    "bb_value": bb_value,
    "bb_word": bb_word,
    "bb_override": bb_override,
    "bb_uri": bb_uri,
    "bb_crypt": bb_crypt,
    "sh_quote": sh_quote,
    "unit_value": unit_value,
    "yaml_scalar": yaml_scalar,
    "yaml_quoted": yaml_quoted,
}
