"""OE's packaging rules, from a `bitbake -e` dump into a small committed data file and back.

`extract(dump_text, oe_core)` reads, from the dump of one of our recipes at the pinned layers:
- the default of PACKAGES and of every FILES:${PN}-* as OE sets them (the history's operations
  from openembedded-core/bitbake only, before our recipe's own += / =+), unexpanded;
- the final values of the directory variables, SOLIBS, SOLIBSDEV, FILES_SOLIBSDEV, ERROR_QA,
  WARN_QA, DISTRO_FEATURES, and the -DCMAKE_INSTALL_* part of OECMAKE_ARGS (cmake.bbclass's layout);
and, when an openembedded-core checkout is given, two things that are code rather than variables:
the file dependencies insane.bbclass's file-rdeps test ignores, and which python3 package provides
which ${bindir} file (python3-manifest.json). tools/scripts/oe-rules-from-dump.py writes the result
to oe-rules.json beside this module; `load()` reads it (CI has no bitbake).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rocky_vulkan.errors import UserError

DATA = "oe-rules.json"
DIR_VARS = (
    "prefix exec_prefix base_prefix bindir sbindir libexecdir libdir base_libdir base_bindir "
    "base_sbindir nonarch_libdir nonarch_base_libdir datadir sysconfdir sharedstatedir "
    "localstatedir includedir docdir mandir infodir localedir systemd_unitdir "
    "systemd_system_unitdir systemd_user_unitdir baselib"
).split()
FINAL_VARS = (
    "SOLIBS",
    "SOLIBSDEV",
    "FILES_SOLIBSDEV",
    "PACKAGE_BEFORE_PN",
    "PACKAGE_DEBUG_SPLIT_STYLE",
)
_HISTORY = re.compile(r"^# \$(\S+)")
_OP = re.compile(r"^#   (\S+(?: from \S+)?) (\S+?)(?::(\d+))?(?: \[\w+\])?$")
_VALUE = re.compile(r'^#     (?:\[(\w+)\] )?"(.*)"$')
_FINAL = re.compile(r'^(?:export )?([^\s=#]+)="(.*)"$')


@dataclass(frozen=True)
class HistoryOp:
    op: str  # set, set?, append, prepend, :append, override[x]:append, rename from VAR, ...
    where: str  # file (or python module) and line
    value: str
    kind: str  # "" or doc, _defaultval, vardepvalue, ...


def parse_dump(text: str) -> tuple[dict[str, str], dict[str, list[HistoryOp]]]:
    """Final values and per-variable histories of a `bitbake -e` dump."""
    final: dict[str, str] = {}
    history: dict[str, list[HistoryOp]] = {}
    current: list[HistoryOp] | None = None
    pending: tuple[str, str] | None = None
    for line in text.splitlines():
        if m := _HISTORY.match(line):
            current = history.setdefault(m.group(1), [])
            pending = None
        elif current is not None and (m := _OP.match(line)):
            where = m.group(2) + (f":{m.group(3)}" if m.group(3) else "")
            pending = (m.group(1), where)
        elif current is not None and pending and (m := _VALUE.match(line)):
            current.append(HistoryOp(pending[0], pending[1], m.group(2), m.group(1) or ""))
            pending = None
        elif m := _FINAL.match(line):
            final[m.group(1)] = m.group(2).replace('\\"', '"')
            current = None
    return final, history


def _from_oe(op: HistoryOp) -> bool:
    return "/openembedded-core/" in op.where or "/bitbake/" in op.where


def oe_default(ops: list[HistoryOp]) -> tuple[str, str] | None:
    """The value OE itself gives a variable (its set, then its appends), and where; None if OE
    does not set it."""
    value: str | None = None
    where = ""
    for op in ops:
        if op.kind == "doc" or not _from_oe(op):
            continue
        if op.op in ("set", "set?") and value is None or op.op == "set":
            value, where = op.value, op.where
        elif value is not None and op.op in ("append", ":append"):
            value = value + (" " if op.op == "append" else "") + op.value
    return None if value is None else (value, where)


def _generic_name(ops: list[HistoryOp], var: str) -> str | None:
    """`FILES:${PN}-dev` for the history of `FILES:llama-cpp-dev` (bitbake's expandKeys rename)."""
    for op in ops:
        if op.op.startswith(f"rename from {var}:"):
            return op.op.removeprefix(f"rename from {var}:")
    return None


def extract(dump_text: str, oe_core: Path | None = None) -> dict:
    final, history = parse_dump(dump_text)
    pn = final.get("PN")
    if not pn:
        raise UserError("no PN in the dump: give a `bitbake -e RECIPE` dump, not the global one")
    per_pkg: dict[str, dict[str, dict[str, str]]] = {"FILES": {}, "RDEPENDS": {}}
    for name, ops in history.items():
        var = name.split(":", 1)[0]
        if var in per_pkg and name.startswith(f"{var}:{pn}"):
            generic = _generic_name(ops, var)
            if generic and (found := oe_default(ops)):
                per_pkg[var][generic] = {"value": found[0], "from": _short(found[1])}
    files = per_pkg["FILES"]
    packages = oe_default(history.get("PACKAGES", []))
    if not packages or not files:
        raise UserError("the dump has no OE default for PACKAGES or FILES: is it a recipe dump?")
    cmake_install = [
        arg for arg in final.get("OECMAKE_ARGS", "").split() if arg.startswith("-DCMAKE_INSTALL_")
    ]
    data: dict = {
        "generated_by": "tools/scripts/oe-rules-from-dump.py",
        "oe_core_revision": final.get("METADATA_REVISION", ""),
        "dump_recipe": pn,
        "packages": {"value": packages[0], "from": _short(packages[1])},
        "files": dict(sorted(files.items())),
        "rdepends": dict(sorted(per_pkg["RDEPENDS"].items())),
        "vars": {name: final[name] for name in (*DIR_VARS, *FINAL_VARS) if name in final},
        "error_qa": sorted(set(final.get("ERROR_QA", "").split())),
        "warn_qa": sorted(set(final.get("WARN_QA", "").split())),
        "distro_features": sorted(set(final.get("DISTRO_FEATURES", "").split())),
        "cmake_install_args": cmake_install,
    }
    if oe_core is not None:
        data["file_rdeps_ignored"] = _ignored_file_rdeps(oe_core, data["distro_features"])
        data["file_providers"] = _python3_providers(oe_core, final)
    return data


def _short(where: str) -> str:
    """`.../openembedded-core/meta/conf/bitbake.conf:347` -> `meta/conf/bitbake.conf:347`."""
    for root in ("/openembedded-core/", "/bitbake/"):
        if root in where:
            return where.split(root, 1)[1]
    return where


def _ignored_file_rdeps(oe_core: Path, distro_features: list[str]) -> dict[str, str]:
    """insane.bbclass's package_qa_check_rdepends: file deps it never reports."""
    path = Path(oe_core) / "meta/classes-global/insane.bbclass"
    text = path.read_text()
    base = re.search(r"ignored_file_rdeps = set\(\[([^\]]*)\]\)", text)
    usrmerge = re.search(
        r"'DISTRO_FEATURES', 'usrmerge'.*\n\s*ignored_file_rdeps \|= set\(\[([^\]]*)\]\)", text
    )
    if not base or not usrmerge:
        raise UserError(f"{path}: ignored_file_rdeps not found where expected; read the class")
    names = re.findall(r"'([^']+)'", base.group(1))
    if "usrmerge" in distro_features:
        names += re.findall(r"'([^']+)'", usrmerge.group(1))
    where = "meta/classes-global/insane.bbclass (package_qa_check_rdepends)"
    return {name: where for name in names}


def _python3_providers(oe_core: Path, final: dict[str, str]) -> dict[str, list[str]]:
    """${bindir} files of python3's packages, from python3-manifest.json (its packages are
    python3-<key>)."""
    path = Path(oe_core) / "meta/recipes-devtools/python/python3/python3-manifest.json"
    text = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    manifest = json.loads(text)
    out: dict[str, list[str]] = {}
    for key, pkg in manifest.items():
        for f in pkg.get("files", []):
            if f.startswith("${bindir}/") and "*" not in f and "${PYTHON_MAJMIN}" not in f:
                out.setdefault(f.replace("${bindir}", final["bindir"]), []).append(f"python3-{key}")
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class OeRules:
    data: dict

    def defaults(self) -> dict[str, str]:
        """OE's values as a datastore base for bbfile.finalize (names may hold ${PN})."""
        base = dict(self.data["vars"])
        base["PACKAGES"] = self.data["packages"]["value"]
        for var in ("files", "rdepends"):
            for pkg, entry in self.data.get(var, {}).items():
                base[f"{var.upper()}:{pkg}"] = entry["value"]
        return base

    @property
    def error_qa(self) -> list[str]:
        return self.data["error_qa"]

    def severity(self, check: str) -> str:
        """ "error" (ERROR_QA: bitbake stops), "warning" (WARN_QA) or "off", for a QA test's name;
        our stricter variants ("file-rdeps (env)") take their base test's."""
        base = check.split(" (", 1)[0]
        if base in self.data["error_qa"]:
            return "error"
        return "warning" if base in self.data["warn_qa"] else "off"

    @property
    def ignored_file_rdeps(self) -> set[str]:
        return set(self.data.get("file_rdeps_ignored", {}))

    @property
    def file_providers(self) -> dict[str, list[str]]:
        return self.data.get("file_providers", {})

    @property
    def cmake_install_args(self) -> list[str]:
        return self.data["cmake_install_args"]


def load(path: Path | None = None) -> OeRules:
    if path is not None:
        return OeRules(json.loads(Path(path).read_text()))
    text = resources.files("rocky_vulkan.packaging").joinpath(DATA).read_text()
    return OeRules(json.loads(text))
