"""Read a rendered recipe (.bb) the way bitbake would, for the subset of syntax our layer uses.

Assignments (`=`, `?=`, `??=`, `:=`, `+=`, `=+`, `.=`, `=.`, `VAR:append`, `VAR:prepend`,
`VAR:remove`, `VAR[flag] =`), backslash-continued values, `inherit`, and shell functions
(`name() {`, `name:append() {`, `name:prepend() {`). The recipe's operations are applied over a
base of OE's defaults (oerules.OeRules.defaults), in order, with :append/:prepend/:remove last, as
bitbake finalises a datastore; variable names holding `${PN}` are expanded first (expandKeys).
Values expand `${VAR}` and `${@python}` (inline python sees a `d` with getVar); an unknown
`${VAR}` stays as it is, as in bitbake (shell functions rely on that for their own variables).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocky_vulkan.errors import UserError

_ASSIGN = re.compile(
    r"^(?:export\s+)?(?P<name>[A-Za-z0-9_${}.+/:-]+?)(?:\[(?P<flag>[A-Za-z0-9_-]+)\])?\s*"
    r"(?P<op>\?\?=|\?=|:=|\+=|=\+|\.=|=\.|=)\s*(?P<q>[\"'])(?P<value>.*)(?P=q)\s*$",
    re.S,
)
_FUNC = re.compile(
    r"^(?P<python>python\s+)?(?:fakeroot\s+)?(?P<name>[A-Za-z0-9_${}:-]*)\s*\(\)\s*\{\s*$"
)
# Statements that change no variable the checks read (a recipe's tasks and handlers).
_IGNORED = ("addtask ", "deltask ", "addhandler ", "EXPORT_FUNCTIONS ")
_VAR_REF = re.compile(r"\$\{([A-Za-z0-9_:+.-]+)\}")
_PY_REF = re.compile(r"\$\{@(.+?)\}(?=[^}]|$)")
_LATE_OPS = ("append", "prepend", "remove")


@dataclass(frozen=True)
class Op:
    name: str  # as written (may hold ${PN})
    op: str  # =, ?=, ??=, :=, +=, =+, .=, =., append, prepend, remove
    value: str


@dataclass
class Recipe:
    """A recipe's operations and functions, as parsed (nothing applied yet)."""

    path: Path
    pn: str
    ops: list[Op] = field(default_factory=list)
    flags: dict[tuple[str, str], str] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)  # name (with :append...) -> body
    python_functions: dict[str, str] = field(default_factory=dict)  # not run here
    inherits: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    """Join backslash-continued lines (bitbake drops the backslash and the newline)."""
    out: list[str] = []
    buf = ""
    for line in text.splitlines():
        if buf or not line.lstrip().startswith("#"):
            if line.endswith("\\"):
                buf += line[:-1]
                continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def parse(path: Path) -> Recipe:
    """Parse `path`; PN from the file name (`name_version.bb`)."""
    path = Path(path)
    pn = path.name.rsplit(".bb", 1)[0].split("_")[0]
    recipe = Recipe(path=path, pn=pn)
    lines = _logical_lines(path.read_text())
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if m := _FUNC.match(line):
            body: list[str] = []
            while i < len(lines) and lines[i].rstrip() != "}":
                body.append(lines[i])
                i += 1
            i += 1
            table = recipe.python_functions if m.group("python") else recipe.functions
            table[m.group("name") or "__anonymous"] = "\n".join(body) + "\n"
            continue
        if stripped.startswith("inherit "):
            recipe.inherits += stripped.split()[1:]
            continue
        if stripped.startswith(_IGNORED):
            continue
        if stripped.startswith(("require ", "include ")):
            raise UserError(
                f"{path}: {stripped.split()[0]} is not followed here: the packaging checks read "
                "a recipe's own file only (put the values in the recipe, or extend bbfile.py)"
            )
        m = _ASSIGN.match(stripped)
        if not m:
            raise UserError(f"{path}: cannot read this line as bitbake syntax: {line!r}")
        name, op, value = m.group("name"), m.group("op"), m.group("value")
        if m.group("flag"):
            recipe.flags[(name, m.group("flag"))] = value
            continue
        base, _, suffix = name.rpartition(":")
        if base and suffix in _LATE_OPS:
            name, op = base, suffix
        recipe.ops.append(Op(name, op, value))
    return recipe


class _D:
    """The `d` inline python sees: getVar only."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def getVar(self, name: str, expand: bool = True) -> str | None:  # noqa: N802 - bitbake's API
        value = self._store.raw.get(name)
        if value is None:
            return None
        return self._store.expand(value) if expand else value


class Store:
    """Final (unexpanded) values of a recipe over a base, and their expansion."""

    def __init__(self, raw: dict[str, str]) -> None:
        self.raw = raw

    def expand(self, value: str, _depth: int = 0) -> str:
        if _depth > 30:
            raise UserError(f"recursive variable reference while expanding {value[:80]!r}")
        prev = None
        while prev != value:
            prev = value
            value = _VAR_REF.sub(lambda m: self._ref(m.group(1), m.group(0), _depth), value)
            value = _PY_REF.sub(lambda m: self._python(m.group(1)), value)
        return value

    def _ref(self, name: str, literal: str, depth: int) -> str:
        value = self.raw.get(name)
        return literal if value is None else self.expand(value, depth + 1)

    def _python(self, code: str) -> str:
        try:
            result = eval(code, {"__builtins__": {}}, {"d": _D(self)})  # noqa: S307 - our recipe
        except Exception as err:
            raise UserError(f"cannot evaluate ${{@{code}}}: {err}") from err
        return "" if result is None else str(result)

    def get(self, name: str) -> str:
        return self.expand(self.raw.get(name, ""))

    def words(self, name: str) -> list[str]:
        return self.get(name).split()


def finalize(recipe: Recipe, base: Mapping[str, str], overrides: Mapping[str, str] = {}) -> Store:
    """The recipe's final values: `base` (OE's defaults, names may hold ${PN}), then the recipe's
    operations in order, then its :append/:prepend/:remove, then `overrides` (what a bitbake build
    would set from the outside: WORKDIR, D, ...)."""
    naming = Store({"PN": recipe.pn, "BPN": recipe.pn})
    raw: dict[str, str] = {"PN": recipe.pn, "BPN": recipe.pn}
    weak: dict[str, str] = {}
    for name, value in base.items():
        raw[naming.expand(name)] = value
    late: list[Op] = []
    for op in recipe.ops:
        name = naming.expand(op.name)
        if op.op in _LATE_OPS:
            late.append(Op(name, op.op, op.value))
        elif op.op == "=":
            raw[name] = op.value
        elif op.op == ":=":
            raw[name] = Store(raw).expand(op.value)
        elif op.op == "?=":
            raw.setdefault(name, op.value)
        elif op.op == "??=":
            weak[name] = op.value
        elif op.op == "+=":
            raw[name] = f"{raw.get(name, '')} {op.value}"
        elif op.op == "=+":
            raw[name] = f"{op.value} {raw.get(name, '')}"
        elif op.op == ".=":
            raw[name] = raw.get(name, "") + op.value
        elif op.op == "=.":
            raw[name] = op.value + raw.get(name, "")
    for name, value in weak.items():
        raw.setdefault(name, value)
    for op in late:
        if op.op == "append":
            raw[op.name] = raw.get(op.name, "") + op.value
        elif op.op == "prepend":
            raw[op.name] = op.value + raw.get(op.name, "")
    for op in late:
        if op.op == "remove":
            drop = set(Store(raw).expand(op.value).split())
            kept = [w for w in Store(raw).expand(raw.get(op.name, "")).split() if w not in drop]
            raw[op.name] = " ".join(kept)
    raw.update(overrides)
    return Store(raw)


def task_body(recipe: Recipe, task: str, store: Store) -> str:
    """The shell of `task` as bitbake runs it: prepends, the task, appends, expanded."""
    parts = [
        recipe.functions.get(f"{task}:prepend", ""),
        recipe.functions.get(task, ""),
        recipe.functions.get(f"{task}:append", ""),
    ]
    return store.expand("".join(parts))
