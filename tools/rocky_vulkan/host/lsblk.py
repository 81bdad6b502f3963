"""The block devices as `lsblk --json` (util-linux >= 2.37) reports them, read by exact shape.

Every value is checked for type and range before a Disk is made of it: an output this module does
not understand is refused as a whole (nothing is flashed on a guess), with lsblk's version and the
field that did not fit. Strings that only name or describe (model, mount points) are kept as given
and shown through blockdev.shown(); names and types, which decide what is written, must match the
kernel's patterns."""

from __future__ import annotations

import json
import re

from rocky_vulkan.boundedrun import run_bounded
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.blockdev import WHOLE_DISK_TYPES, Disk
from rocky_vulkan.host.result_doc import clean_text

COLUMNS = "NAME,PATH,SIZE,TYPE,RM,HOTPLUG,RO,MOUNTPOINTS,MODEL,TRAN"
COMMAND = ["lsblk", "--json", "--bytes", "-o", COLUMNS]
LSBLK_TIMEOUT_S = 20.0  # lsblk reads sysfs; a hung device must not hang flash
MAX_OUTPUT_BYTES = 16 << 20  # some 50,000 devices; more is not lsblk
MAX_NODES = 10_000
MAX_DEPTH = 16  # disk > partition > crypt > LVM > ... is a handful of levels
MAX_SIZE = 2**64  # a device size is a u64 of bytes
MAX_PATH = 4096  # PATH_MAX: mount points and device paths
MAX_LABEL = 256  # model strings from sysfs are a few dozen characters
MAX_NAME = 127  # device-mapper names: DM_NAME_LEN - 1
# Kernel names of whole disks (sda, mmcblk0, nvme0n1, loop7, vda): what `flash` writes to.
WHOLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}")
WORD = re.compile(r"[a-z][a-z0-9_-]{0,15}")  # TYPE (disk, part, crypt, raid1) and TRAN (usb, mmc)
FIX = (
    "update util-linux to 2.37 or newer, or report it with the output of "
    f"`lsblk --json --bytes -o {COLUMNS}`"
)


class LsblkError(UserError):
    """lsblk's output is not the shape this module reads."""


def _bad(where: str, value: object, problem: str) -> LsblkError:
    return LsblkError(f"{where}: {_repr(value)} {problem}")


def _repr(value: object) -> str:
    if isinstance(value, str):
        return repr(clean_text(value, 40))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, (list, dict)):
        return clean_text(json.dumps(value)[:60], 40)
    return repr(value)


def _text(node: dict, key: str, where: str, limit: int, *, null: bool = False) -> str | None:
    value = node.get(key)
    if value is None and null:
        return None
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", value, "is not a string" + (" or null" if null else ""))
    if len(value) > limit or "\x00" in value:
        raise _bad(f"{where}.{key}", value, f"is not a {key} (over {limit} characters or a NUL)")
    return value


def _flag(node: dict, key: str, where: str) -> bool:
    value = node.get(key)
    if not isinstance(value, bool):
        raise _bad(f"{where}.{key}", value, "is not true or false")
    return value


def _size(node: dict, where: str) -> int:
    value = node.get("size")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_SIZE:
        raise _bad(f"{where}.size", value, "is not a whole number of bytes (0 to 2**64 - 1)")
    return value


def _path(node: dict, name: str, whole: bool, where: str) -> str:
    path = _text(node, "path", where, MAX_PATH)
    parts = path.split("/")
    if (
        not path.startswith("/dev/")
        or not path.isprintable()
        or any(p in ("", ".", "..") for p in parts[1:])
        or (whole and path != f"/dev/{name}")
    ):
        want = f"/dev/{name}" if whole else "a device path under /dev"
        raise _bad(f"{where}.path", path, f"is not {want}")
    return path


def _mountpoints(node: dict, where: str) -> tuple[str, ...]:
    mounts = node.get("mountpoints")
    if not isinstance(mounts, list) or len(mounts) > MAX_NODES:
        raise _bad(f"{where}.mountpoints", mounts, "is not a list of mount points")
    out = []
    for i, mount in enumerate(mounts):
        if mount is None:  # lsblk's [null]: not mounted
            continue
        if not isinstance(mount, str) or not 0 < len(mount) <= MAX_PATH or "\x00" in mount:
            raise _bad(f"{where}.mountpoints[{i}]", mount, "is not a mount point")
        out.append(mount)
    return tuple(out)


def _node(node: object, where: str, depth: int, count: list[int]) -> Disk:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise LsblkError(f"over {MAX_NODES} devices listed")
    if depth > MAX_DEPTH:
        raise LsblkError(f"{where}: devices nested over {MAX_DEPTH} deep")
    if not isinstance(node, dict):
        raise _bad(where, node, "is not a device (a JSON object)")
    type_ = _text(node, "type", where, 16)
    if not WORD.fullmatch(type_):
        raise _bad(f"{where}.type", type_, "is not a device type such as disk or part")
    whole = type_ in WHOLE_DISK_TYPES
    name = _text(node, "name", where, MAX_NAME)
    child_name = name.isprintable() and "/" not in name and name.strip() == name != ""
    if not (WHOLE_NAME.fullmatch(name) if whole else child_name):
        raise _bad(f"{where}.name", name, "is not a kernel device name")
    tran = _text(node, "tran", where, 16, null=True) or ""
    if tran and not WORD.fullmatch(tran):
        raise _bad(f"{where}.tran", tran, "is not a transport such as usb or mmc")
    rm, hotplug, ro = (_flag(node, key, where) for key in ("rm", "hotplug", "ro"))
    children = node.get("children")
    if children is not None and not isinstance(children, list):
        raise _bad(f"{where}.children", children, "is not a list of devices")
    return Disk(
        name=name,
        path=_path(node, name, whole, where),
        size=_size(node, where),
        type=type_,
        removable=rm or hotplug or tran == "usb",
        read_only=ro,
        model=(_text(node, "model", where, MAX_LABEL, null=True) or "").strip(),
        tran=tran,
        mountpoints=_mountpoints(node, where),
        children=tuple(
            _node(c, f"{where}.children[{i}]", depth + 1, count)
            for i, c in enumerate(children or ())
        ),
    )


def _no_constant(word: str) -> object:
    raise ValueError(f"{word} is not a JSON number")


def _int(text: str) -> int:
    if len(text) > 400:  # spares int() a 5000-digit string; shorter ones get the field's check
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def parse_lsblk(text: str | bytes) -> list[Disk]:
    """Top-level devices from `lsblk --json --bytes -o COLUMNS` output (LsblkError if its shape
    is not the one util-linux >= 2.37 gives)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        doc = json.loads(text, parse_constant=_no_constant, parse_int=_int)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError too
        raise LsblkError(f"not JSON: {clean_text(str(err), 120)}") from None
    devices = doc.get("blockdevices") if isinstance(doc, dict) else None
    if not isinstance(devices, list):
        raise LsblkError(f"not a JSON object with a list 'blockdevices': {_repr(doc)}")
    count = [0]
    return [_node(d, f"blockdevices[{i}]", 0, count) for i, d in enumerate(devices)]


def version() -> str:
    """`lsblk --version`'s words, for a message; never raises."""
    try:
        res = run_bounded(["lsblk", "--version"], 4096, 5)
    except OSError:
        return "lsblk's version unknown"
    return clean_text(res.out.decode("utf-8", "replace").strip(), 80) or "lsblk's version unknown"


def run_lsblk() -> bytes:
    """lsblk's JSON, bounded in size and time."""
    try:
        res = run_bounded(COMMAND, MAX_OUTPUT_BYTES, LSBLK_TIMEOUT_S)
    except FileNotFoundError:
        raise UserError("lsblk not found: sudo apt-get install util-linux") from None
    if res.timed_out:
        raise UserError(
            f"lsblk did not answer within {LSBLK_TIMEOUT_S:g} seconds: a device may hang; "
            "unplug the card reader, plug it in again, and retry"
        )
    if res.overflow:
        raise UserError(f"lsblk gave over {MAX_OUTPUT_BYTES} bytes: not a device list; {FIX}")
    if res.rc != 0:
        why = clean_text(res.err.decode("utf-8", "replace").strip(), 300) or "no message"
        raise UserError(f"lsblk failed (exit {res.rc}): {why}")
    return res.out


def read_disks(output: str | bytes | None = None) -> list[Disk]:
    """The disks lsblk reports now (or in `output`, as it printed it)."""
    try:
        return parse_lsblk(run_lsblk() if output is None else output)
    except LsblkError as err:
        raise LsblkError(
            f"lsblk's output is not what this tool reads ({version()}): {err}; {FIX}"
        ) from None
