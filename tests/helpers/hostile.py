"""The adversarial config run: every field of rocky-vulkan.yaml given hostile values.

Each case either is refused with a ConfigError that names the file and the field, or renders a
tree with exactly the shape of a clean render: the same files, the same bitbake assignments and
functions (read with oelint-parser, the parser oelint-adv uses), the same inline-Python blocks,
the same YAML/JSON keys, the same systemd settings, the same number of lines and of quote,
backslash, backtick, '$', ';' and brace characters per file.
Anything else (a traceback, a refusal that does not name the field, a changed shape) is a finding.

`python -m tests.helpers.hostile` (from the repo root, in the venv) prints the counts; the test
suite runs the same cases in tests/config/test_config_hostile.py."""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from oelint_parser.cls_item import Function, Variable
from oelint_parser.cls_stash import Stash
from rocky_vulkan.config import ConfigError, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.layer.manifest import render_files

from tests.helpers.project import ROOT

# Appended to, put in front of, or replacing each string value.
HOSTILE = (
    "\n",
    '\nIMAGE_FEATURES += "empty-root-password allow-root-login"\nROCKY_DEBUG_IMAGE = "1"',
    '"',
    "'",
    "\\",
    "${@os.system('touch /tmp/rocky-pwned')}",
    "${HOME}",
    "$(id)",
    "`id`",
    "; touch /tmp/rocky-pwned",
    " #",
    ": x",
    "\r",
    "\t",
    "\u2028",
    "\u0085",
    "\x00",
    "%n",
    "é",
    "x" * 5000,
)
# Legal in some fields: they exercise the "accepted, same shape" path.
BENIGN = ("-x", "+1", "%2F")
# Wrong types and out-of-range numbers for the non-string fields.
TYPED = (64.0, True, None, "64", -1, 10**30, float("inf"), float("nan"), [], {})

PASSWORD_HASH = (
    "$6$saltsaltsalt$"
    "Eq7AXoCiNaawmn73OzHS/Onu63TphN5OQr60M2oXjFa5F.pQts/b39gupmlqDTIdMumDdbS9OVbuNRng/NNQ61"
)


# A model besides the reference one, served: its recipe, kas fragment and the image's licence
# check are rendered, so every one of its fields is attacked too.
EXTRA_MODEL = {
    "name": "tiny",
    "url": "https://huggingface.co/example/tiny-GGUF/resolve/0123456789abcdef0123456789abcdef01234567/tiny.gguf",
    "filename": "tiny-q8_0.gguf",
    "sha256": "ab" * 32,
    "license": "Llama-3.2-Community",
    "license_flags": "llama-community",
    "homepage": "https://huggingface.co/example/tiny-GGUF",
}


def _ssh_key(comment: str) -> str:
    blob = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-ed25519", b"\x07" * 32))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


def clean_data() -> dict[str, Any]:
    """The committed config with every optional list and field filled in, so each has a value
    to attack."""
    data = yaml.safe_load((ROOT / "rocky-vulkan.yaml").read_text())
    data["image"]["ssh_authorized_keys"] = [_ssh_key("me@host")]
    data["image"]["extra_packages"] = ["htop"]
    if "password_hash" in data["image"]:  # (a config from before the field has none)
        data["image"]["password_hash"] = PASSWORD_HASH
    if "models" in data:  # (a config from before the section has none)
        data["models"] = [EXTRA_MODEL]
        data["serve"]["model"] = EXTRA_MODEL["name"]
    return data


@dataclass(frozen=True)
class Leaf:
    path: tuple[Any, ...]  # keys and indices; a trailing ("<key>",) marks a mapping key
    value: Any

    @property
    def is_key(self) -> bool:
        return bool(self.path) and self.path[-1] == "<key>"

    def field(self) -> str:
        """The field as the loader's messages spell it: a.b[0].c (for a key: its mapping)."""
        out = ""
        for part in self.path[:-2] if self.is_key else self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out


def leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[Leaf]:
    if isinstance(data, dict):
        for key, value in data.items():
            if path == ("machines",):
                yield Leaf((*path, key, "<key>"), key)
            yield from leaves(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from leaves(value, (*path, i))
    else:
        yield Leaf(path, data)


def replaced(data: dict[str, Any], leaf: Leaf, new: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    if leaf.is_key:
        parent = out
        for part in leaf.path[:-2]:
            parent = parent[part]
        old = leaf.path[-2]
        parent[new] = parent.pop(old)
        if out["default_machine"] == old:
            out["default_machine"] = new
        return out
    parent = out
    for part in leaf.path[:-1]:
        parent = parent[part]
    parent[leaf.path[-1]] = new
    return out


def variants(leaf: Leaf, full: bool = True) -> Iterator[Any]:
    """Hostile values for one field: appended to the clean value (what slips past a pattern
    that is not anchored at the end), and with `full` also in front of it and on their own."""
    if isinstance(leaf.value, str):
        for bad in HOSTILE:
            yield leaf.value + bad
            if full:
                yield bad + leaf.value
                yield bad
        for ok in BENIGN:
            yield leaf.value + ok
    else:
        yield from (v for v in TYPED if not (type(v) is type(leaf.value) and v == leaf.value))


def _dump(data: dict[str, Any]) -> str:
    """The config as YAML (libyaml's emitter when there is one: the dump is not under test)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=False)


def _kas_keys(data: Any, prefix: str = "") -> set[str]:
    keys = set()
    if isinstance(data, dict):
        for k, v in data.items():
            keys.add(f"{prefix}/{k}")
            keys |= _kas_keys(v, f"{prefix}/{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            keys |= _kas_keys(v, f"{prefix}[{i}]")
    return keys


def _bitbake_shape(files: dict[str, bytes], workdir: Path) -> Counter:
    """(file, variable, flag, operator) and (file, function) as oelint-parser reads them."""
    for old in workdir.rglob("*"):
        if old.is_file():
            old.unlink()
    stash = Stash(quiet=True)
    for rel, data in files.items():
        if rel.endswith((".bb", ".bbappend", ".conf", ".inc")):
            target = workdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            stash.AddFile(str(target))
    stash.Finalize()
    shape: Counter = Counter()
    for item in stash.GetItemsFor(classifier=Variable.CLASSIFIER):
        rel = Path(item.Origin).relative_to(workdir).as_posix()
        shape[(rel, item.VarName, item.SubItem, item.VarOp.strip())] += 1
    for item in stash.GetItemsFor(classifier=Function.CLASSIFIER):
        shape[(Path(item.Origin).relative_to(workdir).as_posix(), "()", item.FuncName)] += 1
    return shape


def shape(files: dict[str, bytes], workdir: Path) -> dict[str, Any]:
    """What a value must never change: files, assignments, functions, inline Python, keys,
    lines, and the characters that end a string or start an expansion."""
    out: dict[str, Any] = {"files": sorted(files), "bitbake": _bitbake_shape(files, workdir)}
    for rel, data in files.items():
        text = data.decode("utf-8")
        out[f"{rel}:lines"] = len(text.splitlines())
        out[f"{rel}:inline-python"] = text.count("${@")
        # Quotes, escapes and expansions: a value adding one can end a string or start code.
        out[f"{rel}:syntax"] = {c: text.count(c) for c in "\"'\\`$;{}"}
        if rel.endswith(".yml"):
            out[f"{rel}:keys"] = _kas_keys(yaml.safe_load(text))
        elif rel.endswith(".json"):
            out[f"{rel}:keys"] = sorted(json.loads(text))
        elif rel.endswith(".service"):
            out[f"{rel}:keys"] = [
                line.split("=", 1)[0] for line in text.splitlines() if re.match(r"\w+=", line)
            ]
    return out


def _normalised(files: dict[str, bytes], new: str, old: str) -> dict[str, bytes]:
    """An accepted value put back to the clean one, in paths and text, so a legitimate rename
    (a machine called rock-5b-x) compares equal; an injected line would still differ."""
    if not isinstance(new, str) or not isinstance(old, str) or new == old:
        return files
    if not re.fullmatch(r"[A-Za-z0-9._+/-]+", new):
        return files  # only a plain token can be put back without also undoing an injection
    return {
        rel.replace(new, old): data.replace(new.encode(), old.encode())
        for rel, data in files.items()
    }


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0
    accepted_same_shape: int = 0
    findings: list[str] = field(default_factory=list)
    tracebacks: int = 0
    injections: int = 0


def run_case(
    project: Path, data: dict[str, Any], leaf: Leaf, value: Any, clean: dict, tally: Tally
) -> None:
    tally.tried += 1
    path = project / "rocky-vulkan.yaml"
    case = f"{leaf.field()}{' (key)' if leaf.is_key else ''} = {value!r:.70}"
    path.write_text(_dump(replaced(data, leaf, value)))
    try:
        cfg = load_config(path)
        files = render_files(cfg)
    except ConfigError as err:
        message = str(err)
        generic = re.sub(r"\[\d+\]", "[]", leaf.field())  # repos[].name: no such entry
        if str(path) in message and (leaf.field() in message or generic in message):
            tally.refused += 1
        else:
            tally.findings.append(f"{case}: refused without naming the field: {message[:200]}")
        return
    except UserError as err:  # e.g. an escaping filter refused what the loader let through
        tally.findings.append(f"{case}: accepted by the loader, refused by render: {err}")
        return
    except Exception:  # noqa: BLE001 - counting tracebacks is the point
        tally.tracebacks += 1
        tally.findings.append(f"{case}: traceback\n{traceback.format_exc(limit=3)}")
        return
    try:
        got = shape(_normalised(files, value, leaf.value), project / ".shape")
    except Exception as err:  # noqa: BLE001 - a tree its parsers choke on is an injection too
        tally.injections += 1
        tally.findings.append(f"{case}: accepted; the rendered tree does not parse: {err!r:.100}")
        return
    if got == clean:
        tally.accepted_same_shape += 1
    else:
        tally.injections += 1
        diff = [k for k in clean if clean[k] != got.get(k)]
        tally.findings.append(f"{case}: accepted and changed the tree's shape: {diff[:5]}")


_CLEAN: dict[str, Any] = {}


def run_all(project: Path, only: str | None = None, full: bool = True) -> Tally:
    """Every case; `only` restricts to one field (as Leaf.field() spells it), `full=False` to
    the appended hostile values."""
    data = clean_data()
    path = project / "rocky-vulkan.yaml"
    path.write_text(_dump(data))
    text = path.read_text()
    if _CLEAN.get("text") != text:  # one clean render per process, not per field
        _CLEAN.update(text=text, shape=shape(render_files(load_config(path)), project / ".shape"))
    clean = _CLEAN["shape"]
    tally = Tally()
    for leaf in leaves(data):
        if only is not None and leaf.field() != only:
            continue
        for value in variants(leaf, full):
            run_case(project, data, leaf, value, clean, tally)
    return tally


def main() -> int:
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        shutil.copytree(ROOT / "patches", project / "patches")
        tally = run_all(project)
    fields = len(list(leaves(clean_data())))
    print(f"fields attacked:      {fields}")
    print(f"cases tried:          {tally.tried}")
    print(f"refused (field named): {tally.refused}")
    print(f"accepted, same shape: {tally.accepted_same_shape}")
    print(f"tracebacks:           {tally.tracebacks}")
    print(f"injections:           {tally.injections}")
    print(f"other findings:       {len(tally.findings) - tally.tracebacks - tally.injections}")
    for finding in tally.findings[:20]:
        print("  " + finding)
    return 1 if tally.findings else 0


if __name__ == "__main__":
    sys.exit(main())
