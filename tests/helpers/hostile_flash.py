"""The adversarial flash run (issue 22, area "flash"): hostile device lists, block maps, images,
mount points and names through `rocky-vulkan flash`, the real code path end to end.

What is real: the CLI (`main`), the .bmap reader, the image checks, `bmaptool create` and
`bmaptool copy`, FIFOs, symlinks, directories, /dev/zero, and (as root) a loop device that a case
may write to; the device is read back after each case, so "nothing written" is checked, not
assumed. What is injected: lsblk's output. The real lsblk cannot report a model named `[red]card`,
a size of "16G" or a mount point with a newline on demand, so a small `lsblk` script put first on
PATH prints the case's JSON (and answers `--version` as util-linux 2.38.1 does); everything after
the pipe is the real code.

Outcomes: REFUSED needs exit 2, a message that names the cause (a keyword per case) with no control
character, and the device untouched; HELD needs exit 0, output with no control character (rich
markup and escapes shown as text, the value visible), and for a write the device holding the
image. Anything else is WRONG, with what was seen.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import hashlib
import importlib
import importlib.util
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

from rocky_vulkan.cli import main
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import flash

from tests.helpers.adversary import Case, Outcome

AREA = "flash"
MIB = 1 << 20
IMAGE_SIZE = 8 * MIB
LOOP_SIZE = 16 * MIB
VERSION = "lsblk from util-linux 2.38.1"

# ---------------------------------------------------------------- shared, real resources


@cache
def _work() -> Path:
    path = Path(tempfile.mkdtemp(prefix="rocky-hostile-flash-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _sparse_image(path: Path, size: int = IMAGE_SIZE) -> bytes:
    """A sparse .wic with data in three places; returns its bytes."""
    rng = random.Random(size)
    raw = bytearray(size)
    regions = ((0, 17 * 512), (MIB, 64 * 1024), (size - 300_000 - 4096, 300_000))
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, length in regions:
            raw[offset : offset + length] = rng.randbytes(length)
            f.seek(offset)
            f.write(raw[offset : offset + length])
    return bytes(raw)


@cache
def _made(size: int = IMAGE_SIZE) -> tuple[bytes, bytes]:
    """(raw image, its bmap text from the real `bmaptool create`)."""
    wic = _work() / f"made-{size}.wic"
    raw = _sparse_image(wic, size)
    bmap = wic.with_name(wic.name + ".bmap")
    subprocess.run(["bmaptool", "create", "-o", str(bmap), str(wic)], check=True)
    return raw, bmap.read_bytes()


def _gz(raw: bytes) -> bytes:
    return gzip.compress(raw, compresslevel=1, mtime=0)


def _image_dir(name: str) -> Path:
    """A fresh folder for one case's image and bmap."""
    del name  # the folder's name must not hold a case's keyword (it is in every message)
    return Path(tempfile.mkdtemp(prefix="c", dir=_work()))


def _write_image(
    folder: Path, name: str = "img.wic.gz", data: bytes | None = None, bmap: bytes | None = None
) -> Path:
    """`name` holding `data` (default: the gzipped test image) and its `.wic.bmap` beside it."""
    raw, text = _made()
    image = folder / name
    image.write_bytes(_gz(raw) if data is None else data)
    stem = name[: -len(".gz")] if name.endswith(".gz") else name
    (folder / (stem + ".bmap")).write_bytes(text if bmap is None else bmap)
    return image


def _loop_problem() -> str | None:
    if os.geteuid() != 0:
        return "loop devices need root"
    if not shutil.which("losetup"):
        return "no losetup"
    return None


@cache
def _loop() -> str | None:
    """One loop device (ours, detached at exit) on a zero-filled file, or None without root."""
    if _loop_problem():
        return None
    backing = _work() / "loop.img"
    with open(backing, "wb") as f:
        f.truncate(LOOP_SIZE)
    proc = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return None
    dev = proc.stdout.strip()
    atexit.register(subprocess.run, ["losetup", "-d", dev], check=False)
    return dev


def _device() -> str:
    """The loop device, or a path that is not there (the cases still run; the 'nothing written'
    check is then vacuous)."""
    return _loop() or "/dev/rockyhostile0"


def _device_bytes() -> bytes:
    dev = _loop()
    if not dev:
        return bytes(LOOP_SIZE)
    with open(dev, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f.read(LOOP_SIZE)


def _wipe() -> None:
    dev = _loop()
    if dev:
        with open(dev, "r+b") as f:
            f.write(bytes(LOOP_SIZE))
            f.flush()
            os.fsync(f.fileno())


# ---------------------------------------------------------------- the lsblk that lies


def _card(**over: object) -> dict:
    """The loop device as lsblk would show a USB card reader's card."""
    dev = _device()
    node = {
        "name": Path(dev).name,
        "path": dev,
        "size": LOOP_SIZE,
        "type": "disk",
        "rm": True,
        "hotplug": True,
        "ro": False,
        "mountpoints": [None],
        "model": "SD/MMC",
        "tran": "usb",
    }
    node.update(over)
    return node


def _root_disk() -> dict:
    return {
        "name": "vda",
        "path": "/dev/vda",
        "size": 274877906944,
        "type": "disk",
        "rm": False,
        "hotplug": False,
        "ro": False,
        "mountpoints": ["/"],
        "model": None,
        "tran": None,
    }


def _doc(card: dict | None = None) -> dict:
    return {"blockdevices": [_card() if card is None else card, _root_disk()]}


@contextlib.contextmanager
def _lsblk(out: bytes, rc: int = 0, err: bytes = b"", sleep_s: float = 0) -> Iterator[None]:
    """A `lsblk` first on PATH that prints `out` (and `err`, exit `rc`), or sleeps."""
    folder = Path(tempfile.mkdtemp(prefix="lsblk-", dir=_work()))
    (folder / "out").write_bytes(out)
    (folder / "err").write_bytes(err)
    body = f"exec sleep {sleep_s}\n" if sleep_s else f'cat "$d/out"; cat "$d/err" >&2; exit {rc}\n'
    script = folder / "lsblk"
    script.write_text(
        "#!/bin/sh\n"
        f"d='{folder}'\n"
        f'if [ "$1" = --version ]; then echo "{VERSION}"; exit 0; fi\n' + body
    )
    script.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ("PATH", "COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["COLUMNS"] = "200"
    os.environ.pop("FORCE_COLOR", None)
    os.environ.pop("TTY_COMPATIBLE", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _json(doc: object) -> bytes:
    return json.dumps(doc).encode()


# ---------------------------------------------------------------- running the real CLI


@contextlib.contextmanager
def _captured() -> Iterator[dict[str, str]]:
    """stdout and stderr of the code and of its children (bmaptool), as text."""
    got: dict[str, str] = {}
    sink = tempfile.TemporaryFile()
    saved = (os.dup(1), os.dup(2))
    out, err = io.StringIO(), io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield got
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sink.seek(0)
        got["out"] = out.getvalue()
        got["err"] = err.getvalue()
        got["child"] = sink.read().decode("utf-8", "replace")
        sink.close()


def _cli(argv: list[str]) -> tuple[int, str, str]:
    with _captured() as got:
        rc = main(argv)
    return rc, got["out"] + got["child"], got["err"]


def _flash(image: Path, device: str, **kw: object) -> tuple[int, str, str]:
    """flash.flash() as the CLI calls it; a UserError becomes exit 2 and its message."""
    with _captured() as got:
        try:
            rc = flash.flash(image, device, **kw)
            msg = ""
        except UserError as err:
            rc, msg = err.exit_code, str(err)
    return rc, got["out"] + got["child"], got["err"] + msg


def _unclean(text: str) -> str | None:
    """The first character a terminal would act on (anything not printable but a newline)."""
    for ch in text:
        if ch != "\n" and not ch.isprintable():
            return repr(ch)
    return None


def _refused(rc: int, out: str, err: str, keys: tuple[str, ...]) -> tuple[Outcome, str]:
    """REFUSED if the exit is 2, the message has one of `keys` and nothing raw; else WRONG."""
    if "Traceback" in out + err:
        return Outcome.TRACEBACK, (out + err)[-300:]
    bad = _unclean(out + err)
    if rc != 2:
        return Outcome.WRONG, f"exit {rc}, not refused: {(out + err)[-200:]!r}"
    if bad:
        return Outcome.WRONG, f"refused, but {bad} reached the terminal: {err[-200:]!r}"
    if not any(k.lower() in err.lower() for k in keys):
        return Outcome.WRONG, f"refused without naming the cause {keys}: {err[-300:]!r}"
    return Outcome.REFUSED, err[-120:]


def _untouched() -> str | None:
    """None if the device is still all zeros; else says so (and wipes it for the next case)."""
    if _device_bytes() == bytes(LOOP_SIZE):
        return None
    _wipe()
    return "the device was written"


def _with_device_check(run: Callable[[], tuple[Outcome, str]]) -> tuple[Outcome, str]:
    outcome, detail = run()
    written = _untouched()
    if written and outcome is Outcome.REFUSED:
        return Outcome.WRONG, f"{written} although refused: {detail}"
    return outcome, detail


# ---------------------------------------------------------------- class "lsblk"

LSBLK_KEYS = ("lsblk",)

# Whole outputs lsblk might give on another version, a broken system or a bad day.
WHOLE_OUTPUTS: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"lsblk: unknown column MOUNTPOINTS\n",
    "empty-object": b"{}",
    "list": b"[]",
    "null": b"null",
    "string": b'"blockdevices"',
    "blockdevices-object": b'{"blockdevices": {}}',
    "blockdevices-null": b'{"blockdevices": null}',
    "blockdevices-number": b'{"blockdevices": [1]}',
    "node-empty": b'{"blockdevices": [{}]}',
    "not-utf8": b'{"blockdevices": [{"name": "\xff\xfe"}]}',
    "digits-5000": b'{"blockdevices": [{"name": "sdb", "size": ' + b"9" * 5000 + b"}]}",
    "nested-100k": b"[" * 100_000 + b"]" * 100_000,
    "nan": b'{"blockdevices": [{"name": "sdb", "path": "/dev/sdb", "size": NaN}]}',
    "float-overflow": b'{"blockdevices": [{"name": "sdb", "path": "/dev/sdb", "size": 1e400}]}',
    "trailing-garbage": _json({"blockdevices": []}) + b"\x1b[2J",
    "twenty-mb": b'{"blockdevices": [], "x": "' + b"x" * (20 * MIB) + b'"}',
}

NOT_A_DISK = "/nonexistent/rocky-not-a-disk"
# Per field of a node: values lsblk >= 2.37 (JSON types) never gives.
BAD_FIELD_VALUES: dict[str, list[object]] = {
    "size": ["16G", "", -1, 2**64, 10**30, 1.5, True, None, [], {}],
    "rm": ["yes", "1", 2, None, [], 1.0],
    "hotplug": ["no", 0, None],
    "ro": ["0", 1, None],
    "name": [5, None, "", "sd b", "sd\nb", "x" * 300, "../etc", "[red]sdb"],
    # Not real files: a regression must fail on a missing path, never write over one (the first
    # run of these cases, on the old flash code, wrote its image over the machine's /etc/passwd).
    "path": [5, None, NOT_A_DISK, "/dev/.." + NOT_A_DISK, "sdb", "/dev/sd b", "/dev/sdb\n"],
    "type": [5, None, "", "Disk ", "[red]disk", "x" * 100, "disk\n"],
    "mountpoints": [None, "/", 5, [5], [["/"]], {"a": 1}],
    "model": [5, [], {}, True],
    "tran": [5, [], "usb\n", "[red]usb", "x" * 100],
    "children": [5, "x", [5], [{}], {"a": 1}],
}
# Legal below a whole disk: device-mapper names (crypt, LVM) may hold spaces and brackets.
CHILD_LEGAL = {("name", "sd b"), ("name", "[red]sdb"), ("path", "/dev/sd b")}
REQUIRED = ("name", "size", "type", "rm", "hotplug", "ro", "mountpoints")


def _list_case(out: bytes, keys: tuple[str, ...] = LSBLK_KEYS) -> Callable[[], tuple]:
    def run() -> tuple[Outcome, str]:
        with _lsblk(out):
            rc, so, se = _cli(["flash", "--list"])
        return _refused(rc, so, se, keys)

    return run


def _flash_case(
    out: bytes, keys: tuple[str, ...] = LSBLK_KEYS, device: str | None = None
) -> Callable[[], tuple]:
    """`flash IMAGE DEVICE --force --yes` with this lsblk: refused, and nothing written."""

    def run() -> tuple[Outcome, str]:
        image = _write_image(_image_dir("lsblk"))
        with _lsblk(out):
            rc, so, se = _cli(["flash", str(image), device or _device(), "--force", "--yes"])
        return _refused(rc, so, se, keys)

    return lambda: _with_device_check(run)


def _listed_case(out: bytes) -> Callable[[], tuple]:
    """A device list that is legal (a partition's dm-style name, a column flash does not ask
    for): listed, nothing raw on the screen."""

    def run() -> tuple[Outcome, str]:
        with _lsblk(out):
            rc, so, se = _cli(["flash", "--list"])
        if "Traceback" in so + se:
            return Outcome.TRACEBACK, (so + se)[-300:]
        bad = _unclean(so + se)
        if rc != 0 or bad:
            return Outcome.WRONG, f"exit {rc}, {bad or 'clean'}: {se[-200:]!r}"
        return Outcome.HELD, "listed"

    return run


def _mounts_case(mounts: list[str]) -> Callable[[], tuple]:
    """A card with many mounts: refused with a message of bounded length."""

    def run() -> tuple[Outcome, str]:
        image = _write_image(_image_dir("mounts"))
        with _lsblk(_json(_doc(_card(mountpoints=mounts)))):
            rc, out, err = _cli(["flash", str(image), _device(), "--force", "--yes"])
        outcome, detail = _refused(rc, out, err, ("more",))
        if outcome is Outcome.REFUSED and len(err) > 3000:
            return Outcome.WRONG, f"a {len(err)}-character message"
        return outcome, detail

    return lambda: _with_device_check(run)


def _lsblk_cases() -> Iterator[Case]:
    for name, out in WHOLE_OUTPUTS.items():
        yield Case(AREA, "lsblk", f"list-{name}", _list_case(out))
        yield Case(AREA, "lsblk", f"flash-{name}", _flash_case(out))
    for field, values in BAD_FIELD_VALUES.items():
        for i, value in enumerate(values):
            tag = f"{field}={_tag(value)}#{i}"
            doc = _doc(_card(**{field: value}))
            keys = (f"blockdevices[0].{field}",)  # the message names the field
            yield Case(AREA, "lsblk", f"list-{tag}", _list_case(_json(doc), keys))
            yield Case(AREA, "lsblk", f"flash-{tag}", _flash_case(_json(doc), keys))
            # The same value one level down, in a partition of the card.
            child = _card(name=_card()["name"] + "p1", path=_device() + "p1", type="part")
            child[field] = value
            out = _json(_doc(_card(children=[child])))
            legal = isinstance(value, str) and (field, value) in CHILD_LEGAL
            keys = (f"blockdevices[0].children[0].{field}",)
            run = _listed_case(out) if legal else _list_case(out, keys)
            yield Case(AREA, "lsblk", f"child-{tag}", run)
    for field in REQUIRED:
        node = _card()
        del node[field]
        keys = (f"blockdevices[0].{field}",)
        yield Case(AREA, "lsblk", f"missing-{field}", _list_case(_json(_doc(node)), keys))
    # Keys of columns flash does not ask for (VENDOR, SERIAL, lsblk < 2.37's MOUNTPOINT): ignored.
    for key in ("vendor", "serial", "mountpoint"):
        for i, value in enumerate(MARKUP_VALUES):
            out = _json(_doc(_card(**{key: value})))
            yield Case(AREA, "lsblk", f"unasked-{key}={_tag(value)}#{i}", _listed_case(out))
    mounts = [f"/media/u/m{i}" for i in range(1000)]
    yield Case(AREA, "lsblk", "mounts-1000", _mounts_case(mounts))
    deep: dict = _card()
    for level in range(200):
        deep = _card(children=[dict(deep, type="part", name=f"n{level}")])
    yield Case(AREA, "lsblk", "children-200-deep", _list_case(_json(_doc(deep))))
    many = _card(children=[_card(name=f"p{i}", type="part") for i in range(100_000)])
    yield Case(AREA, "lsblk", "children-100k", _list_case(_json(_doc(many))))
    yield Case(
        AREA,
        "lsblk",
        "exit-1-escapes",
        _exit_case(b"lsblk: \x1b[2J\x1b]0;pwned\x07failed", ("lsblk failed",)),
    )
    yield Case(AREA, "lsblk", "hang", _hang_case(), timeout_s=5)
    yield Case(AREA, "lsblk", "empty-list", _empty_list_case())
    yield Case(AREA, "lsblk", "vanished", _vanished_case("/dev/rockygone0"))
    yield Case(AREA, "lsblk", "char-device-as-disk", _vanished_case("/dev/null"))
    if os.access("/dev", os.W_OK):
        yield Case(AREA, "lsblk", "regular-file-as-disk", _vanished_case("/dev/rockyfile0", True))


def _tag(value: object) -> str:
    text = json.dumps(value)[:24] if not isinstance(value, str) else repr(value)[:24]
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", text)


def _exit_case(err: bytes, keys: tuple[str, ...]) -> Callable[[], tuple]:
    def run() -> tuple[Outcome, str]:
        with _lsblk(b"", rc=1, err=err):
            rc, so, se = _cli(["flash", "--list"])
        return _refused(rc, so, se, keys)

    return run


def _has_lsblk() -> bool:
    return importlib.util.find_spec("rocky_vulkan.host.lsblk") is not None


def _hang_case() -> Callable[[], tuple]:
    """lsblk stuck (a hung device): the run ends within the bound. The bound is lowered from its
    production value for the test (a module constant, not a mock)."""

    def run() -> tuple[Outcome, str]:
        # Imported here: the "before" run (docs/verification/hostile-flash.md) uses code without it.
        lsblk = importlib.import_module("rocky_vulkan.host.lsblk") if _has_lsblk() else None
        saved = getattr(lsblk, "LSBLK_TIMEOUT_S", None)
        if saved is not None:
            lsblk.LSBLK_TIMEOUT_S = 1
        try:
            with _lsblk(b"", sleep_s=30):
                rc, so, se = _cli(["flash", "--list"])
        finally:
            if saved is not None:
                lsblk.LSBLK_TIMEOUT_S = saved
        return _refused(rc, so, se, ("did not answer", "timed out", "seconds"))

    return run


def _empty_list_case() -> Callable[[], tuple]:
    """No disks at all is a valid answer: the table is empty and flash names the device."""

    def run() -> tuple[Outcome, str]:
        with _lsblk(_json({"blockdevices": []})):
            rc, so, se = _cli(["flash", "--list"])
            if rc != 0 or _unclean(so + se):
                return Outcome.WRONG, f"--list of no disks: exit {rc}: {se[-200:]!r}"
            image = _write_image(_image_dir("empty"))
            rc, so, se = _cli(["flash", str(image), _device(), "--yes"])
        return _refused(rc, so, se, ("not a block device lsblk knows",))

    return lambda: _with_device_check(run)


def _vanished_case(path: str, make_file: bool = False) -> Callable[[], tuple]:
    """lsblk lists `path` as a removable card, but there is no block device there (removed
    between list and write, or never one); with `make_file`, a regular file stands there."""

    def run() -> tuple[Outcome, str]:
        if make_file:
            Path(path).write_bytes(b"")
        try:
            doc = _doc(_card(name=Path(path).name, path=path))
            image = _write_image(_image_dir("vanished"))
            with _lsblk(_json(doc)):
                rc, so, se = _cli(["flash", str(image), path, "--yes"])
            if Path(path).is_file() and Path(path).stat().st_size:
                return Outcome.WRONG, f"{path} was written as a file"
            return _refused(rc, so, se, ("not a block device", "not there"))
        finally:
            if Path(path).is_file() and path.startswith("/dev/rocky"):
                Path(path).unlink()

    return run


# ---------------------------------------------------------------- class "markup"

MARKUP_VALUES = (
    "[/]",
    "[red]card",
    "[bold]x[/bold]",
    "[link=https://x.invalid]y[/link]",
    ":smile:",
    "\x1b[2J\x1b[31mred",
    "\x1b]0;title\x07",
    "a\nVERDICT: yes",
    "car\rd",
    "\u202eevil",
    "zero\u200bwidth",
    "x" * 1000,
    "x" * 10_000,
)
# Where a string from lsblk can reach the screen.
MARKUP_FIELDS = ("model", "mountpoint", "child-mountpoint", "name", "type", "tran")


def _squash(text: str) -> str:
    """`text` without whitespace and control characters (a table wraps, a newline may become a
    space): what is left of a value must show in order."""
    return "".join(ch for ch in text if ch.isprintable() and not ch.isspace())


def _visible(value: str) -> str:
    """What must show of `value` (its printable start) when it is held."""
    return _squash(value)[:12]


def _markup_doc(field: str, value: str) -> dict:
    if field == "mountpoint":
        return _doc(_card(mountpoints=[value]))
    if field == "child-mountpoint":
        child = _card(name=_card()["name"] + "p1", type="part", mountpoints=[value])
        child["path"] = _device() + "p1"
        return _doc(_card(children=[child]))
    return _doc(_card(**{field: value}))


def _held_list(rc: int, out: str, err: str, value: str) -> tuple[Outcome, str]:
    if "Traceback" in out + err:
        return Outcome.TRACEBACK, (out + err)[-300:]
    if rc == 2:
        return _refused(rc, out, err, LSBLK_KEYS)
    bad = _unclean(out + err)
    if rc != 0 or bad:
        return Outcome.WRONG, f"exit {rc}, {bad or 'clean'} in the listing: {out[-300:]!r}"
    shown = _visible(value)
    if shown and shown not in _squash(out):
        return Outcome.WRONG, f"{shown!r} not shown as text: {out[-400:]!r}"
    if len(out) > 6000:
        return Outcome.WRONG, f"{len(out)} characters listed for two disks: the value is not capped"
    return Outcome.HELD, "shown as text"


def _markup_list_case(field: str, value: str) -> Callable[[], tuple]:
    def run() -> tuple[Outcome, str]:
        with _lsblk(_json(_markup_doc(field, value))):
            rc, out, err = _cli(["flash", "--list"])
        return _held_list(rc, out, err, value)

    return run


def _markup_prompt_case(field: str, value: str) -> Callable[[], tuple]:
    """The typed confirmation shows the disk: the model in it is text too (answer: no)."""

    def run() -> tuple[Outcome, str]:
        prompts: list[str] = []
        image = _write_image(_image_dir("prompt"))
        with _lsblk(_json(_markup_doc(field, value))):
            rc, out, err = _flash(image, _device(), ask=lambda p: prompts.append(p) or "no")
        if rc == 2 and not prompts:
            return _refused(rc, out, err, LSBLK_KEYS + ("not a block device",))
        if not prompts:
            return Outcome.WRONG, f"exit {rc} without asking: {err[-200:]!r}"
        bad = _unclean(prompts[0].replace("\n", " ") + err)
        if bad:
            return Outcome.WRONG, f"{bad} in the confirmation prompt: {prompts[0][-200:]!r}"
        if _visible(value) not in _squash(prompts[0]):
            return Outcome.WRONG, f"model not shown as text: {prompts[0][-200:]!r}"
        return _refused(rc, out, err, ("not confirmed",))

    return lambda: _with_device_check(run)


def _markup_cases() -> Iterator[Case]:
    for field in MARKUP_FIELDS:
        for i, value in enumerate(MARKUP_VALUES):
            tag = f"{field}={_tag(value)}#{i}"
            yield Case(AREA, "markup", f"list-{tag}", _markup_list_case(field, value))
            if field == "model":
                yield Case(AREA, "markup", f"prompt-{tag}", _markup_prompt_case(field, value))


# ---------------------------------------------------------------- class "quoting"

MOUNTS = (
    "/media/u/card; echo X",
    "/media/u/$(id)",
    "/media/u/`id`",
    "/media/u/my card",
    "/media/u/it's",
    "/media/u/a\\b",
    "/media/u/*",
    "/media/u/a\nb",
    "/media/u/\x1b[2Jx",
    "/media/u/é",
    "-f",
)
IMAGE_NAMES = (
    "a b.wic.gz",
    "x;echo X.wic.gz",
    "$(id).wic.gz",
    "`id`.wic.gz",
    "it's.wic.gz",
    "-rf.wic.gz",
    "a\nb.wic.gz",
    "\x1b[2J.wic.gz",
)
DEVICES = ("/dev/sd b", "/dev/sdb\n", "/dev/\x1b[2Jsdb", "/dev/[red]sdb", "/dev/" + "x" * 5000)


def _shell_words(line: str) -> list[str] | None:
    """The words bash makes of `line` (a hint as printed), or None if bash cannot read it."""
    proc = subprocess.run(
        ["bash", "-c", f"shopt -s failglob\nset -- {line}\nprintf '%s\\0' \"$@\""],
        capture_output=True,
        timeout=5,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return [os.fsdecode(w) for w in proc.stdout.split(b"\0")[:-1]]


def _umount_case(mount: str) -> Callable[[], tuple]:
    def run() -> tuple[Outcome, str]:
        image = _write_image(_image_dir("umount"))
        with _lsblk(_json(_doc(_card(mountpoints=[mount])))):
            rc, out, err = _cli(["flash", str(image), _device(), "--force", "--yes"])
        outcome, detail = _refused(rc, out, err, ("mounted",))
        if outcome is not Outcome.REFUSED:
            return outcome, detail
        hint = re.search(r"sudo umount (.*)", err)
        if not hint:
            return Outcome.WRONG, f"no umount hint: {err[-200:]!r}"
        words = _shell_words(hint.group(1).split("; sudo umount ")[0])
        if words != ["--", mount] and (words != [mount] or mount.startswith("-")):
            return Outcome.WRONG, f"the hint {hint.group(0)!r} runs umount on {words!r}"
        return outcome, detail

    return lambda: _with_device_check(run)


def _image_name_case(name: str) -> Callable[[], tuple]:
    """A real write of an image with this name: the `running:` line is that exact command."""

    def run() -> tuple[Outcome, str]:
        raw, _ = _made()
        image = _write_image(_image_dir("name"), name)
        with _lsblk(_json(_doc())):
            rc, out, err = _cli(["flash", str(image), _device(), "--yes"])
        if "Traceback" in out + err:
            return Outcome.TRACEBACK, (out + err)[-300:]
        if rc != 0:
            return Outcome.WRONG, f"exit {rc}: {err[-300:]!r}"
        got = _device_bytes()
        _wipe()
        if got[: len(raw)] != raw:
            return Outcome.WRONG, "the device does not hold the image"
        bad = _unclean(out.split("running:")[-1].split("\n")[0] + err)
        if bad:
            return Outcome.WRONG, f"{bad} in the running line: {out[:300]!r}"
        line = re.search(r"running: (.*)", out)
        words = _shell_words(line.group(1)) if line else None
        if not words or str(image) not in words:
            return Outcome.WRONG, f"the running line is not the command: {words!r}"
        return Outcome.HELD, "written, the command shown quoted"

    return run


def _device_arg_case(device: str) -> Callable[[], tuple]:
    def run() -> tuple[Outcome, str]:
        image = _write_image(_image_dir("devarg"))
        with _lsblk(_json(_doc())):
            rc, out, err = _cli(["flash", str(image), device, "--yes"])
        outcome, detail = _refused(rc, out, err, ("not a block device lsblk knows",))
        if outcome is Outcome.REFUSED and len(err) > 1000:
            return Outcome.WRONG, f"a {len(err)}-character message: the name is not capped"
        if outcome is Outcome.REFUSED and err.strip().count("\n"):
            return Outcome.WRONG, f"the name breaks the message's line: {err!r}"
        return outcome, detail

    return lambda: _with_device_check(run)


def _quoting_cases() -> Iterator[Case]:
    for i, mount in enumerate(MOUNTS):
        yield Case(AREA, "quoting", f"umount-{_tag(mount)}#{i}", _umount_case(mount))
    if _loop():
        for i, name in enumerate(IMAGE_NAMES):
            yield Case(AREA, "quoting", f"image-{_tag(name)}#{i}", _image_name_case(name))
    for i, device in enumerate(DEVICES):
        yield Case(AREA, "quoting", f"device-{_tag(device)}#{i}", _device_arg_case(device))


# ---------------------------------------------------------------- class "bmap"

BMAP_KEYS = ("bmap",)
NUMBERS = (
    "8M",
    "",
    "-1",
    "0",
    "1.5",
    "0x10",
    "1_000",
    "\u0661\u0662",  # Arabic-Indic digits: int() takes them
    "+5",
    "9" * 5000,
    str(2**64),
    str(2**63),
)


def _bmap_checksum(text: bytes) -> bytes:
    """`text` with its BmapFileChecksum recomputed as bmaptool does (so the one change made is
    what the reader meets, not a checksum mismatch)."""
    match = re.search(rb"<BmapFileChecksum>\s*([0-9a-f]{64})\s*</BmapFileChecksum>", text)
    if not match:
        return text
    zeroed = text[: match.start(1)] + b"0" * 64 + text[match.end(1) :]
    digest = hashlib.sha256(zeroed).hexdigest().encode()
    return text[: match.start(1)] + digest + text[match.end(1) :]


def _set_element(text: bytes, tag: str, value: str) -> bytes:
    out = re.sub(
        rf"<{tag}>[^<]*</{tag}>".encode(), f"<{tag}> {value} </{tag}>".encode(), text, count=1
    )
    return _bmap_checksum(out)


def _set_ranges(text: bytes, ranges: list[str]) -> bytes:
    head, _, rest = text.partition(b"<BlockMap>")
    _, _, tail = rest.partition(b"</BlockMap>")
    return _bmap_checksum(
        head + b"<BlockMap>\n" + "\n".join(ranges).encode() + b"\n</BlockMap>" + tail
    )


def _range_lines(text: bytes) -> list[str]:
    return re.findall(r"<Range[^>]*>[^<]*</Range>", text.decode())


def _bmap_variants() -> Iterator[tuple[str, bytes]]:
    _, good = _made()
    for tag in ("ImageSize", "BlockSize", "BlocksCount", "MappedBlocksCount"):
        for i, value in enumerate(NUMBERS):
            yield f"{tag}={_tag(value)}#{i}", _set_element(good, tag, value)
    yield "BlockSize=4097", _set_element(good, "BlockSize", "4097")
    yield "ImageSize=bigger-than-blocks", _set_element(good, "ImageSize", str(IMAGE_SIZE + 4096))
    yield "MappedBlocksCount=off-by-one", _set_element(good, "MappedBlocksCount", "78")
    for value in ("md5", "sha1", "", "SHA256", "nonesuch", "sha256\x1b[2J"):
        yield f"ChecksumType={_tag(value)}", _set_element(good, "ChecksumType", value)
    for tag in ("ImageSize", "BlockSize", "BlocksCount", "MappedBlocksCount", "ChecksumType"):
        yield f"missing-{tag}", _bmap_checksum(re.sub(rf"<{tag}>[^<]*</{tag}>".encode(), b"", good))
        dup = re.search(rf"<{tag}>[^<]*</{tag}>".encode(), good).group(0)
        yield f"twice-{tag}", _bmap_checksum(good.replace(dup, dup + b"\n" + dup))
    yield "checksum-wrong", good.replace(b"<BlocksCount> 2048", b"<BlocksCount>  2048")
    yield (
        "checksum-not-hex",
        re.sub(rb"(<BmapFileChecksum>\s*)[0-9a-f]{64}", rb"\1" + b"z" * 64, good),
    )
    yield "checksum-missing", re.sub(rb"<BmapFileChecksum>[^<]*</BmapFileChecksum>", b"", good)
    ranges = _range_lines(good)
    first = ranges[0]
    sha = re.search(r'chksum="([0-9a-f]+)"', first).group(1)
    for i, text in enumerate(
        ("a-b", "5-3", "1-2-3", "-1", "", "2048", "2040-2050", "99999999999999999999", "0x1-0x2")
        + ("\u0661-\u0662", "1_0-2_0", "0 - ")
    ):
        bad = f'<Range chksum="{sha}"> {text} </Range>'
        yield f"Range={_tag(text)}#{i}", _set_ranges(good, [bad, *ranges[1:]])
    yield "Range-overlap", _set_ranges(good, [*ranges, first])
    yield "Range-unsorted", _set_ranges(good, list(reversed(ranges)))
    yield "Range-none", _set_ranges(good, [])
    for i, value in enumerate(("zz", "", sha[:-1], sha.upper(), sha + "0", "\x1b[2J")):
        line = re.sub(r'chksum="[0-9a-f]+"', f'chksum="{value}"', first)
        yield f"chksum={_tag(value)}#{i}", _set_ranges(good, [line, *ranges[1:]])
    yield "chksum-missing", _set_ranges(good, [re.sub(r' chksum="[0-9a-f]+"', "", first)])
    for value in ("3.0", "x.y", "", "1.0", "2"):
        yield (
            f"version={_tag(value)}",
            _bmap_checksum(
                good.replace(b'<bmap version="2.0">', f'<bmap version="{value}">'.encode())
            ),
        )
    yield (
        "root-not-bmap",
        _bmap_checksum(good.replace(b"<bmap ", b"<map ").replace(b"</bmap>", b"</map>")),
    )
    yield "empty", b""
    yield "not-xml", b"ImageSize: 8388608\n"
    yield "truncated", good[: len(good) // 2]
    yield "entity-expansion", _laughs()
    yield (
        "external-entity",
        (
            b'<?xml version="1.0"?><!DOCTYPE bmap [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b'<bmap version="2.0"><ImageSize>&x;</ImageSize></bmap>'
        ),
    )
    yield "doctype", b"<!DOCTYPE bmap>" + good.split(b"?>", 1)[1]
    yield (
        "utf-16",
        good.decode()
        .replace('version="1.0" ', 'version="1.0" encoding="utf-16" ')
        .encode("utf-16"),
    )
    yield "nested-100k", b"<bmap>" + b"<a>" * 100_000 + b"</a>" * 100_000 + b"</bmap>"


def _laughs() -> bytes:
    ents = ['<!ENTITY l0 "lol">'] + [
        f'<!ENTITY l{i} "{("&l" + str(i - 1) + ";") * 10}">' for i in range(1, 10)
    ]
    return (
        f'<?xml version="1.0"?><!DOCTYPE bmap [{"".join(ents)}]>'
        '<bmap version="2.0"><ImageSize>&l9;</ImageSize></bmap>'
    ).encode()


def _bmap_keys(name: str) -> tuple[str, ...]:
    """What the refusal of variant `name` must name: the element, else what is wrong."""
    if "x1b" in name:  # XML 1.0 has no ESC character: the parser stops at it
        return ("not well-formed",)
    tag = re.match(r"(?:missing-|twice-)?([A-Z][A-Za-z]+)\b", name)
    if tag:
        return (f"<{tag[1]}>",)
    for start, keys in (
        ("checksum-", ("checksum",)),
        ("chksum", ("chksum",)),
        ("version", ("version",)),
        ("root", ("root element",)),
        ("entity", ("DOCTYPE",)),
        ("external", ("DOCTYPE",)),
        ("doctype", ("DOCTYPE",)),
    ):
        if name.startswith(start):
            return keys
    return BMAP_KEYS


def _bmap_case(text: bytes, keys: tuple[str, ...]) -> Callable[[], tuple]:
    """`flash --list IMAGE` (reads the bmap for the size) and `flash IMAGE DEVICE`: refused."""

    def run() -> tuple[Outcome, str]:
        image = _write_image(_image_dir("bmap"), bmap=text)
        with _lsblk(_json(_doc())):
            rc, out, err = _cli(["flash", "--list", str(image)])
            outcome, detail = _refused(rc, out, err, keys)
            if outcome is not Outcome.REFUSED:
                return outcome, "--list: " + detail
            rc, out, err = _cli(["flash", str(image), _device(), "--yes"])
        return _refused(rc, out, err, keys)

    return lambda: _with_device_check(run)


def _bmap_file_case(kind: str) -> Callable[[], tuple]:
    """The .bmap is not a regular file of a sane size."""

    def run() -> tuple[Outcome, str]:
        folder = _image_dir("bmapfile")
        image = _write_image(folder)
        bmap = folder / "img.wic.bmap"
        bmap.unlink()
        if kind == "fifo":
            os.mkfifo(bmap)
        elif kind == "dev-zero":
            bmap.symlink_to("/dev/zero")
        elif kind == "directory":
            bmap.mkdir()
        elif kind == "huge":
            with open(bmap, "wb") as f:
                f.truncate(200 * MIB)
        elif kind == "loop":
            bmap.symlink_to(bmap)
        with _lsblk(_json(_doc())):
            rc, out, err = _cli(["flash", str(image), _device(), "--yes"])
        keys = {"huge": ("bytes",), "loop": ("symbolic links",)}.get(kind, ("not a regular file",))
        return _refused(rc, out, err, keys)

    return lambda: _with_device_check(run)


def _bmap_cases() -> Iterator[Case]:
    for name, text in _bmap_variants():
        yield Case(AREA, "bmap", name, _bmap_case(text, _bmap_keys(name)), timeout_s=10)
    for kind in ("fifo", "dev-zero", "directory", "huge", "loop"):
        yield Case(AREA, "bmap", f"file-{kind}", _bmap_file_case(kind), timeout_s=5)


# ---------------------------------------------------------------- class "image"


def _image_case(kind: str, keys: tuple[str, ...]) -> Callable[[], tuple]:
    """`flash IMAGE DEVICE --yes` where IMAGE is not a whole gzipped image: refused, unwritten."""

    def run() -> tuple[Outcome, str]:
        raw, bmap = _made()
        folder = _image_dir(f"image-{kind}")
        image = _write_image(folder)
        card = _card()
        if kind == "fifo":
            image.unlink()
            os.mkfifo(image)
        elif kind == "dev-zero":
            image.unlink()
            image.symlink_to("/dev/zero")
        elif kind == "device-link":
            image.unlink()
            image.symlink_to(_device())
        elif kind == "directory":
            image.unlink()
            image.mkdir()
        elif kind == "not-gzip":
            image.write_bytes(random.Random(1).randbytes(100_000))
        elif kind == "truncated-gzip":
            image.write_bytes(_gz(raw)[: len(_gz(raw)) // 2])
        elif kind == "gzip-of-less":
            image.write_bytes(_gz(raw[: IMAGE_SIZE // 2]))
        elif kind == "gzip-of-more":
            image.write_bytes(_gz(raw + bytes(MIB)))
        elif kind == "empty":
            image.write_bytes(b"")
        elif kind == "raw-short":
            image = _write_image(folder, "img.wic", raw[: IMAGE_SIZE - 4096], bmap)
        elif kind == "xz-not-xz":
            image = _write_image(folder, "img.wic.xz", _gz(raw), bmap)
        elif kind == "bigger-than-device":
            big, big_bmap = _made(2 * LOOP_SIZE)
            image = _write_image(folder, "big.wic.gz", _gz(big), big_bmap)
        elif kind == "read-only":
            card = _card(ro=True)
        with _lsblk(_json(_doc(card))):
            rc, out, err = _cli(["flash", str(image), _device(), "--yes"])
        return _refused(rc, out, err, keys)

    return lambda: _with_device_check(run)


def _image_held_case(kind: str) -> Callable[[], tuple]:
    """Images that must be written: a symlinked .wic.gz (Yocto's deploy link), a raw .wic, a
    gzip of two members (pigz -i, `cat a.gz b.gz`: the trailer check falls back to unpacking)."""

    def run() -> tuple[Outcome, str]:
        raw, bmap = _made()
        folder = _image_dir(f"held-{kind}")
        if kind == "symlink":
            real = _write_image(folder, "img-20250101.rootfs.wic.gz")
            (folder / "img.rootfs.wic.bmap").symlink_to(folder / "img-20250101.rootfs.wic.bmap")
            image = folder / "img.rootfs.wic.gz"
            image.symlink_to(real.name)
        elif kind == "multi-member":
            half = IMAGE_SIZE // 2
            image = _write_image(folder, data=_gz(raw[:half]) + _gz(raw[half:]))
        else:
            image = _write_image(folder, "img.wic", raw, bmap)
        with _lsblk(_json(_doc())):
            rc, out, err = _cli(["flash", str(image), _device(), "--yes"])
        got = _device_bytes()
        _wipe()
        if "Traceback" in out + err:
            return Outcome.TRACEBACK, (out + err)[-300:]
        if rc != 0 or got[: len(raw)] != raw:
            return Outcome.WRONG, f"exit {rc}, image written: {got[: len(raw)] == raw}: {err!r}"
        return Outcome.HELD, "written and verified"

    return run


IMAGE_KINDS = {
    "fifo": ("FIFO",),
    "dev-zero": ("character device",),
    "device-link": ("block device",),
    "directory": ("directory",),
    "not-gzip": ("gzip",),
    "truncated-gzip": ("truncated", "gzip"),
    "gzip-of-less": ("bmap", "size"),
    "gzip-of-more": ("bmap", "size"),
    "empty": ("gzip", "empty"),
    "raw-short": ("bmap", "size"),
    "xz-not-xz": ("xz",),
    "bigger-than-device": ("does not fit",),
    "read-only": ("read-only",),
}


def _image_cases() -> Iterator[Case]:
    for kind, keys in IMAGE_KINDS.items():
        yield Case(AREA, "image", kind, _image_case(kind, keys), timeout_s=20)
    if _loop():
        for kind in ("symlink", "raw", "multi-member"):
            yield Case(AREA, "image", f"held-{kind}", _image_held_case(kind), timeout_s=30)


def cases() -> Iterator[Case]:
    yield from _lsblk_cases()
    yield from _markup_cases()
    yield from _quoting_cases()
    yield from _bmap_cases()
    yield from _image_cases()
