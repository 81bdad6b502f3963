"""`rocky-vulkan build --ssh-key FILE`: read a public key file, check it with the config's own rules
for image.ssh_authorized_keys, and add it to rocky-vulkan.yaml by a small textual edit that keeps
every comment and the layout, checked by reading the result back and written atomically.

Nothing of a refused file is echoed (it may be a private key), and a refused file or an edit that
would not read back as exactly "the same config plus these keys" leaves the config untouched.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path

import yaml

from rocky_vulkan.config import ConfigError, load_config, parse_yaml, ssh_authorized_key_problem
from rocky_vulkan.errors import UserError
from rocky_vulkan.regularfile import NotReadable, read_bounded

# A .pub line is under 5 kB (a 16384-bit RSA key); more is some other file.
MAX_KEY_FILE_BYTES = 16 * 1024
KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
FIELD = "image.ssh_authorized_keys"
NEW_KEY_HINT = (
    "make a key pair with `ssh-keygen -t ed25519` (it writes ~/.ssh/id_ed25519.pub) "
    "and pass that .pub file"
)


KEY_FILE = "a public key file: " + NEW_KEY_HINT


class SshKeyError(UserError):
    """A --ssh-key file that cannot go into the image; the config was not changed."""


def _read_bounded(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_KEY_FILE_BYTES; never blocks on a FIFO or a
    device (regularfile.read_bounded), in this command's words."""
    try:
        return read_bounded(path, MAX_KEY_FILE_BYTES)
    except NotReadable as err:
        fix = {
            "missing": f"no such file; {NEW_KEY_HINT}",
            "denied": "permission denied; pass a public key file you can read",
            "open": f"cannot open it ({err.detail}); {NEW_KEY_HINT}",
            "type": f"is {err.detail}, not a regular file; pass your public key file, "
            "e.g. ~/.ssh/id_ed25519.pub",
            "size": f"{err.detail} bytes; a public key file is one line of under 5 kB "
            f"(at most {MAX_KEY_FILE_BYTES} bytes here): is it the right file?",
            "read": f"cannot read it ({err.detail})",
        }[err.why]
        raise SshKeyError(f"{path}: {fix}") from None


def check_key_text(data: bytes) -> str:
    """The one key line in a .pub file's bytes, or SshKeyError's reason (without the path).

    The line must pass the config's own check for image.ssh_authorized_keys; the file may end
    with one newline. No part of the file is quoted back."""
    if b"PRIVATE KEY" in data or b"PuTTY-User-Key-File" in data:
        raise SshKeyError(
            "is a PRIVATE key; never put it into an image. Pass the public key beside it "
            "(the same name with .pub), or " + NEW_KEY_HINT
        )
    if b"BEGIN SSH2 PUBLIC KEY" in data:
        raise SshKeyError(
            "is an SSH2 (RFC 4716) public key; convert it to one OpenSSH line with "
            "`ssh-keygen -i -f FILE > FILE.pub` and pass that"
        )
    if not data.strip():
        raise SshKeyError(f"is empty; {NEW_KEY_HINT}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise SshKeyError(
            "holds bytes that are not ASCII text, so it is not an OpenSSH .pub file; "
            + NEW_KEY_HINT
        ) from None
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            text = text[: -len(ending)]
            break
    lines = text.split("\n")
    if len(lines) > 1:
        keys = sum(1 for line in lines if line.strip())
        raise SshKeyError(
            f"holds {len(lines)} lines ({keys} not blank); a public key file is one key line: "
            "put each key in a file of its own and give each its own --ssh-key FILE"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise SshKeyError(
            "holds control characters (a tab, a carriage return or an escape sequence); "
            "an OpenSSH key line has none: pass the .pub file ssh-keygen wrote"
        )
    words = text.split(" ")
    if words[0] not in KEY_TYPES:
        later = next((w for w in words[1:] if w in KEY_TYPES), None)
        if later:
            raise SshKeyError(
                f"starts with key options (like from= or command=) before {later!r}; the config "
                f"takes the key alone: pass a file with the line from {later!r} on"
            )
        raise SshKeyError(
            "does not start with a key type the image takes ("
            + ", ".join(KEY_TYPES)
            + "); "
            + NEW_KEY_HINT
        )
    problem = ssh_authorized_key_problem(text)
    if problem:
        raise SshKeyError(f"is not a key line {FIELD} takes: {problem}")
    return text


def read_public_key(path: Path) -> str:
    """The validated key line of the public key file at `path`."""
    data = _read_bounded(path)
    try:
        return check_key_text(data)
    except SshKeyError as err:
        beside = path.with_name(path.name + ".pub")
        hint = f" ({beside} is there)" if "PRIVATE" in str(err) and beside.is_file() else ""
        raise SshKeyError(f"{path}: {err}{hint}") from None


def _same_key(a: str, b: str) -> bool:
    """Type and key data equal (the comment does not make a different key)."""
    return a.split(" ")[:2] == b.split(" ")[:2]


class _Unsafe(Exception):
    """The YAML is written in a shape the textual edit does not handle."""


_TOP = re.compile(r"[^\s#]")  # a line that starts a top-level entry (or a document marker)
_BLANK = re.compile(r"[ ]*(#.*)?(\r?\n)?")
_KEY_LINE = re.compile(
    r"(?P<indent>[ ]+)ssh_authorized_keys:(?P<flow>[ ]*\[[ ]*\])?"
    r"[ ]*(?P<comment>#.*?)?(?P<nl>\r?\n)?"
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _item(indent: str, key: str, nl: str) -> str:
    # Single quotes: a key line holds no quote, and a comment ending in ':' stays a string.
    return f"{indent}- '{key}'{nl}"


def insert_keys(text: str, keys: list[str]) -> str:
    """`text` with `keys` appended to image.ssh_authorized_keys as block-list items; every other
    line unchanged. Raises _Unsafe for a shape it does not handle (the caller then refuses)."""
    lines = text.splitlines(keepends=True)
    image = [i for i, line in enumerate(lines) if re.fullmatch(r"image:[ ]*(#.*)?\r?\n?", line)]
    if len(image) != 1:
        raise _Unsafe("no top-level `image:` line followed by its settings on their own lines")
    start = image[0] + 1
    end = next((i for i in range(start, len(lines)) if _TOP.match(lines[i])), len(lines))
    body = [i for i in range(start, end) if not _BLANK.fullmatch(lines[i])]
    if not body:
        raise _Unsafe("`image:` has no settings under it")
    child = _indent(lines[body[0]])
    found = [i for i in body if re.match(r"[ ]+ssh_authorized_keys[ ]*:", lines[i])]
    if len(found) != 1 or _indent(lines[found[0]]) != child:
        raise _Unsafe("no `ssh_authorized_keys:` line directly under `image:`")
    at = found[0]
    match = _KEY_LINE.fullmatch(lines[at])
    if not match:
        raise _Unsafe("`ssh_authorized_keys:` is neither `[]` nor a list of `- key` lines")
    nl = match["nl"] or "\n"
    if match["flow"]:  # `ssh_authorized_keys: []` -> a block list
        comment = f"  {match['comment']}" if match["comment"] else ""
        head = f"{match['indent']}ssh_authorized_keys:{comment}{nl}"
        items = "".join(_item(match["indent"] + "  ", k, nl) for k in keys)
        return "".join(lines[:at]) + head + items + "".join(lines[at + 1 :])
    # A block list: items at one indent (>= the key's), possibly with comments between them.
    last, item_indent = None, None
    for i in range(at + 1, end):
        line = lines[i]
        if _BLANK.fullmatch(line):
            continue
        ind = _indent(line)
        if item_indent is None:
            if ind < child or not line[ind:].startswith("- "):
                break
            item_indent = ind
        if ind == item_indent and line[ind:].startswith("- "):
            last = i
        elif ind > item_indent and last is not None:
            last = i  # a continuation of the item above
        else:
            break
    if last is None:
        raise _Unsafe("`ssh_authorized_keys:` has no `- key` lines under it")
    before = lines[: last + 1]
    if not before[-1].endswith("\n"):
        before[-1] += nl
    items = "".join(_item(" " * item_indent, k, nl) for k in keys)
    return "".join(before) + items + "".join(lines[last + 1 :])


def add_authorized_keys(config_path: Path, keys: list[str]) -> list[str]:
    """Append the keys not yet in image.ssh_authorized_keys to the config at `config_path`
    (resolved: a symlinked config is edited in place); return the keys added."""
    config_path = config_path.resolve()
    cfg = load_config(config_path)
    have = list(cfg.image.ssh_authorized_keys)
    new: list[str] = []
    for key in keys:
        if not any(_same_key(key, k) for k in have + new):
            new.append(key)
    if not new:
        return []
    text = config_path.read_text(encoding="utf-8")
    how = (
        f"add each key by hand as a `- 'ssh-ed25519 AAAA... you@host'` line under "
        f"`ssh_authorized_keys:` in {config_path.name}"
    )
    try:
        edited = insert_keys(text, new)
    except _Unsafe as why:
        raise UserError(
            f"{config_path}: cannot add the key safely: {why}; {how}. Nothing was changed."
        ) from None
    want = parse_yaml(text)
    assert isinstance(want, dict)
    want["image"]["ssh_authorized_keys"] = have + new
    try:
        got = parse_yaml(edited)
    except (ConfigError, yaml.YAMLError):
        got = None
    if got != want:
        raise UserError(
            f"{config_path}: adding the key to {FIELD} would change more than that list "
            f"(an unusual layout of the file); {how}. Nothing was changed."
        )
    _write_checked(config_path, text, edited, cfg, have + new)
    return new


def _write_checked(path: Path, old: str, new: str, cfg, keys: list[str]) -> None:
    """Write `new` beside `path`, load it as a config, then swap it in; `path` must still hold
    `old` (nobody edited it meanwhile)."""
    fd, tmp_name = tempfile.mkstemp(prefix=".rocky-vulkan.", suffix=".yaml", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(new)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        loaded = load_config(tmp)
        expected = dataclasses.replace(
            cfg,
            path=loaded.path,
            image=dataclasses.replace(cfg.image, ssh_authorized_keys=tuple(keys)),
        )
        if loaded != expected:
            raise UserError(
                f"{path}: the edited config did not read back as expected; nothing was changed"
            )
        if path.read_text(encoding="utf-8") != old:
            raise UserError(f"{path}: the file changed while the key was being added; run it again")
        os.replace(tmp, path)
    except OSError as err:
        raise UserError(
            f"{path}: cannot write the edited config ({err.strerror}); nothing was changed. "
            "Check that the folder is writable and the disk not full."
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
