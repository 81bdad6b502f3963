"""Issue 22, area "config": rocky-vulkan.yaml and `rocky-vulkan render` against hostile numbers,
files, names, outputs and URLs (tests/helpers/adversary.py runs and counts the cases).

Every case runs the real code on real files in a fresh temporary project: the CLI's main() for
what the user types (`-c PATH`, `render`), or load_config and render_files (what the CLI calls)
where the case judges the rendered tree. Real FIFOs, sockets, symlinks and devices; an
unreadable file is read as another user (setpriv) when the tests run as root. Classes:
- numbers: every numeric field x {400, 5000 and 70 digits, -1, 2**63, a float, a bool, ...}
- files: `-c` at a symlink loop, a FIFO, /dev/zero, a directory, a dangling link, an unreadable
  file, a 2 MB file, ...; a patch file that is one of those
- reserved-names: every reserved name x {machine key, repo name, distro}
- outputs: where render writes and what it may remove (a symlinked config, files render never
  made, a hostile list of rendered files, two outputs on one path, render --check)
- secrets: every URL field x {user:password@, a token as user name, ?token=, signed URLs, ...}
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rocky_vulkan.cli import main
from rocky_vulkan.config import ConfigError, load_config, parse_yaml
from rocky_vulkan.errors import UserError
from rocky_vulkan.layer import manifest, reserved

from tests.helpers import hostile
from tests.helpers.adversary import Case, Outcome
from tests.helpers.project import ROOT

AREA = "config"
CONFIG = "rocky-vulkan.yaml"
SECRET = "s3cretXYZ"  # must never reach the tree or the terminal

Result = tuple[Outcome, str]


# --- running and judging --------------------------------------------------------------------


@contextlib.contextmanager
def _tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hostile-files-") as tmp:
        yield Path(tmp).resolve()


def _project(parent: Path, text: str | None = None, name: str = "proj") -> Path:
    """A project folder: the config (the committed one, or `text`) and our patches."""
    dest = parent / name
    dest.mkdir()
    (dest / CONFIG).write_text(text if text is not None else (ROOT / CONFIG).read_text())
    shutil.copytree(ROOT / "patches", dest / "patches")
    return dest


def _cli(*argv: str) -> tuple[int, str, str]:
    """`rocky-vulkan ARGV` in this process (an escaping exception is the case's TRACEBACK)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _plain(text: str) -> bool:
    """No control character but newlines (a message must not drive the terminal)."""
    return all(c.isprintable() or c == "\n" for c in text)


def _refusal(rc: int, err: str, *names: str) -> Result:
    """REFUSED when the CLI stopped with a clean message naming each of `names`."""
    if rc == 0:
        return Outcome.WRONG, "accepted"
    missing = [n for n in names if n not in err]
    if rc != 2 or not err.startswith("rocky-vulkan: error: ") or missing or not _plain(err):
        return Outcome.WRONG, f"rc {rc}, unclear refusal (lacks {missing}): {err[:300]!r}"
    return Outcome.REFUSED, ""


def _loaded(path: Path, *names: str) -> tuple[Result | None, Any]:
    """(None, config) when it loads; else (the refusal's judgement, None)."""
    try:
        return None, load_config(path)
    except ConfigError as err:
        return _refusal(2, f"rocky-vulkan: error: {err}", str(path), *names), None


def _snapshot(top: Path) -> dict[str, Any]:
    """Every entry under `top` (not following links): file bytes (size and mtime of a big
    one), link targets, kinds."""
    found: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(top).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = "dir"
            elif path.is_file():
                info = path.stat()
                big = info.st_size > 1 << 20
                found[rel] = (info.st_size, info.st_mtime_ns) if big else path.read_bytes()
            else:
                found[rel] = "special"
    return found


def _with_value(leaf: hostile.Leaf, literal: str) -> str:
    """The hostile run's full config with `literal` (YAML text) as the value of `leaf`."""
    text = hostile._dump(hostile.replaced(hostile.clean_data(), leaf, "HOSTILEVALUE"))
    assert text.count("HOSTILEVALUE") == 1
    return text.replace("HOSTILEVALUE", literal)


def _case(klass: str, name: str, run: Callable[[], Result], timeout_s: float = 20.0) -> Case:
    return Case(AREA, klass, name, run, timeout_s)


# --- numbers --------------------------------------------------------------------------------

NUMBERS = {
    "400-digits": "9" * 400,
    "5000-digits": "9" * 5000,
    "minus-5000-digits": "-" + "9" * 5000,
    "70-digits": "1" + "0" * 69,
    "minus-1": "-1",
    "2**63": str(2**63),
    "float": "64.5",  # (for a field of floats: out of every range)
    "bool": "true",
    "hex-5000-digits": "0x" + "f" * 5000,
    "underscores-400": "1_" * 200 + "1",
    "sexagesimal-300": "1" + ":59" * 300,
    "float-overflow": "1.0e+999",
    "float-5000-digits": "9" * 5000 + ".5",
}


def _number_case(leaf: hostile.Leaf, literal: str) -> Result:
    with _tmp() as tmp:
        project = _project(tmp, _with_value(leaf, literal))
        result, cfg = _loaded(project / CONFIG, leaf.field())
        if result:
            return result
        return Outcome.WRONG, f"accepted {literal[:40]!r} as {_value_of(cfg, leaf)!r:.60}"


def _value_of(cfg: Any, leaf: hostile.Leaf) -> Any:
    """The loaded value of `leaf` (for the message of a wrongly accepted number)."""
    value = cfg
    for part in leaf.path:
        if isinstance(part, int):
            value = value[part]
        elif dataclasses.is_dataclass(value) and hasattr(value, part):
            value = getattr(value, part)
        else:
            return "?"
    return value


def _numbers() -> Iterator[Case]:
    for leaf in hostile.leaves(hostile.clean_data()):
        value = leaf.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        for name, literal in NUMBERS.items():
            if name == "float" and isinstance(value, float):
                literal = "1.0e+300"
            yield _case(
                "numbers",
                f"{leaf.field()}={name}",
                lambda leaf=leaf, literal=literal: _number_case(leaf, literal),
            )


# --- files ----------------------------------------------------------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(path: Path, target: str | Path) -> Path:
    path.symlink_to(target)
    return path


def _socket(path: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays
    return path


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def _big_config(path: Path) -> Path:
    path.write_text((ROOT / CONFIG).read_text() + "# " + "x" * (2 << 20) + "\n")
    return path


def _not_a_dir(path: Path) -> Path:
    path.write_text("a file")
    return path / CONFIG


# -c targets: a maker (the project's folder -> the path to pass) and what the message must name.
CONFIG_TARGETS: dict[str, Callable[[Path], Path]] = {
    "symlink-loop": lambda p: (_link(p / "a", p / "b"), _link(p / "b", p / "a"))[0],
    "self-loop": lambda p: _link(p / "self", p / "self"),
    "fifo": lambda p: _fifo(p / "fifo.yaml"),
    "link-to-fifo": lambda p: _link(p / "l.yaml", _fifo(p / "fifo")),
    "dev-zero": lambda p: Path("/dev/zero"),
    "link-to-dev-zero": lambda p: _link(p / "z.yaml", "/dev/zero"),
    "dev-null": lambda p: Path("/dev/null"),
    "socket": lambda p: _socket(p / "sock.yaml"),
    "directory": lambda p: p,
    "root-directory": lambda p: Path("/"),
    "dangling-link": lambda p: _link(p / "gone.yaml", p / "nowhere.yaml"),
    "missing": lambda p: p / "missing.yaml",
    "2MB": lambda p: _big_config(p / "big.yaml"),
    "sparse-2GB": lambda p: _sparse(p / "sparse.yaml", 2 << 30),
    "empty": lambda p: _sparse(p / "empty.yaml", 0),
    "proc-status": lambda p: Path("/proc/self/status"),
    "under-a-file": lambda p: _not_a_dir(p / "plain"),
    "name-too-long": lambda p: p / ("x" * 5000),
    "escape-in-name": lambda p: p / "\x1b[2Jcfg.yaml",
}


def _config_file_case(make: Callable[[Path], Path]) -> Result:
    with _tmp() as tmp:
        project = _project(tmp)
        path = make(project)
        before = _snapshot(tmp)
        rc, _, err = _cli("-c", str(path), "render", "--check")
        if _snapshot(tmp) != before:
            return Outcome.WRONG, "the project changed"
        shown = str(path) if str(path).isprintable() else ascii(str(path))[1:-1]
        return _refusal(rc, err, shown[:60])


def _nul_in_path() -> Result:
    rc, _, err = _cli("-c", "rocky\x00vulkan.yaml", "render", "--check")
    return _refusal(rc, err, "NUL")


def _unreadable() -> Result:
    """A config its reader may not read: as root, read it as nobody (setpriv), a real EACCES."""
    with _tmp() as tmp:
        project = _project(tmp)
        path = project / CONFIG
        path.chmod(0)
        if os.geteuid() != 0:
            rc, _, err = _cli("-c", str(path), "render", "--check")
            return _refusal(rc, err, str(path), "permission")
        for folder in (tmp, project):  # (not /tmp itself)
            folder.chmod(0o755)
        code = "import sys; from rocky_vulkan.cli import main; sys.exit(main(sys.argv[1:]))"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(os.path.abspath, sys.path))}
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
            + ["-c", code, "-c", str(path), "render", "--check"],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            timeout=30,
        )
        if "Traceback" in proc.stderr:
            return Outcome.TRACEBACK, proc.stderr[-300:]
        return _refusal(proc.returncode, proc.stderr, str(path), "permission")


PATCH_TARGETS: dict[str, Callable[[Path], Any]] = {
    "fifo": _fifo,
    "link-to-dev-zero": lambda p: _link(p, "/dev/zero"),
    "directory": lambda p: p.mkdir(),
    "symlink-loop": lambda p: _link(p, p),
    "dangling-link": lambda p: _link(p, p.with_name("nowhere.patch")),
    "sparse-2GB": lambda p: _sparse(p, 2 << 30),
}


def _patch_case(make: Callable[[Path], Any]) -> Result:
    with _tmp() as tmp:
        project = _project(tmp)
        name = load_config(project / CONFIG).mesa.patches[0]  # a patch the config lists
        patch = project / "patches" / name
        patch.unlink()
        make(patch)
        rc, _, err = _cli("-c", str(project / CONFIG), "render")
        if (project / "kas").exists() or (project / manifest.LAYER_DIR).exists():
            return Outcome.WRONG, "render wrote a tree"
        return _refusal(rc, err, name)


def _files() -> Iterator[Case]:
    for name, make in CONFIG_TARGETS.items():
        yield _case("files", f"-c={name}", lambda make=make: _config_file_case(make), 5)
    yield _case("files", "-c=nul-in-path", _nul_in_path, 5)
    yield _case("files", "-c=unreadable", _unreadable, 30)
    for name, make in PATCH_TARGETS.items():
        yield _case("files", f"patch={name}", lambda make=make: _patch_case(make), 5)


# --- reserved names -------------------------------------------------------------------------


def _kas_names() -> list[str]:
    """kas/<name>.yml of every kas template but the machines' own, a placeholder filled in with
    the hostile run's licensed model (whose fragment it names): from the template tree."""
    names = []
    for template in manifest.template_tree():
        if template.startswith(f"{manifest.KAS_DIR}/") and "{machine}" not in template:
            stem = template.split("/", 1)[1].removesuffix(manifest.JINJA_SUFFIX)
            stem = re.sub(r"\{\w+\}", hostile.EXTRA_MODEL["name"], stem)
            names.append(stem.removesuffix(".yml"))
    return names


def _upstream(table: dict[str, str]) -> set[str]:
    return {name for names in table.values() for name in names.split()}


MACHINES_UP = _upstream(reserved.UPSTREAM_MACHINES)
DISTROS_UP = _upstream(reserved.UPSTREAM_DISTROS)
KAS_NAMES = set(_kas_names())
REPO_RESERVED = {manifest.PROJECT_REPO, *reserved.PROJECT_FOLDERS}
RESERVED = sorted(KAS_NAMES | MACHINES_UP | DISTROS_UP | REPO_RESERVED)
# Slot -> (field as the loader names it, how to put the name there, names it must refuse).
SLOTS: dict[str, tuple[Callable[[str], str], Callable[[dict, str], None], set[str]]] = {
    "machine": (
        lambda n: "machines",
        lambda d, n: d["machines"].__setitem__(n, d["machines"].pop("rock-5b-rocky")),
        MACHINES_UP | KAS_NAMES,
    ),
    "repo": (
        lambda n: "repos[2].name",
        lambda d, n: d["repos"][2].__setitem__("name", n),
        REPO_RESERVED,
    ),
    "distro": (
        lambda n: "yocto.distro",
        lambda d, n: d["yocto"].__setitem__("distro", n),
        DISTROS_UP,
    ),
}


def _tree_problems(files: dict[str, bytes], data: dict[str, Any], clean: int) -> list[str]:
    """What a render with an accepted name got wrong: a file lost to another on its path, our
    layers or a repo missing from kas/base.yml, a machine file that is not that machine's."""
    problems = []
    if len(files) != clean:
        problems.append(f"{len(files)} files, a clean render has {clean}")
    base = parse_yaml(files[f"{manifest.KAS_DIR}/base.yml"].decode())
    repos = list(base.get("repos") or {})
    want = [manifest.PROJECT_REPO, *(r["name"] for r in data["repos"])]
    if repos != want:
        problems.append(f"kas/base.yml repos {repos}, expected {want}")
    ours = (base.get("repos") or {}).get(manifest.PROJECT_REPO) or {}
    if len(ours.get("layers") or {}) != len(manifest.SUB_LAYERS):
        problems.append(f"kas/base.yml: our layers are {ours}")
    if base.get("distro") != data["yocto"]["distro"]:
        problems.append(f"kas/base.yml distro {base.get('distro')!r}")
    for name in data["machines"]:
        kas = parse_yaml(files[f"{manifest.KAS_DIR}/{name}.yml"].decode())
        if kas.get("machine") != name:
            problems.append(f"kas/{name}.yml: machine {kas.get('machine')!r}")
    return problems


def _reserved_case(slot: str, name: str) -> Result:
    field, put, must_refuse = SLOTS[slot]
    clean = len(manifest.render_files(load_config(_clean_config())))
    data = hostile.clean_data()
    put(data, name)
    with _tmp() as tmp:
        project = _project(tmp, hostile._dump(data))
        result, cfg = _loaded(project / CONFIG, field(name), name)
        if result:
            return result
        try:
            files = manifest.render_files(cfg)
        except UserError as err:
            return _refusal(2, f"rocky-vulkan: error: {err}", name)
        if name in must_refuse:
            return Outcome.WRONG, f"{slot} {name!r} accepted (reserved)"
        problems = _tree_problems(files, data, clean)
        if problems:
            return Outcome.WRONG, "; ".join(problems)[:300]
        return Outcome.HELD, ""


_CLEAN_CONFIG: dict[str, Path] = {}


def _clean_config() -> Path:
    """The hostile run's clean config, written once per process (removed at exit)."""
    if "path" not in _CLEAN_CONFIG:
        tmp = Path(tempfile.mkdtemp(prefix="hostile-files-clean-"))
        atexit.register(shutil.rmtree, tmp, True)
        _CLEAN_CONFIG["path"] = _project(tmp, hostile._dump(hostile.clean_data())) / CONFIG
    return _CLEAN_CONFIG["path"]


def _reserved_names() -> Iterator[Case]:
    for slot in SLOTS:
        for name in RESERVED:
            yield _case(
                "reserved-names",
                f"{slot}={name}",
                lambda slot=slot, name=name: _reserved_case(slot, name),
            )


# --- outputs --------------------------------------------------------------------------------


def _rendered(parent: Path, name: str = "proj") -> Path:
    project = _project(parent, name=name)
    rc, _, err = _cli("-c", str(project / CONFIG), "render")
    assert rc == 0, err
    return project


def _symlinked_config(with_patches: bool) -> Result:
    """The config is a link into another project: render writes beside the link (the project
    folder named on the command line), never into the link target's folder."""
    with _tmp() as tmp:
        target = _rendered(tmp, "target")
        (target / manifest.KAS_DIR / "mine.txt").write_text("not render's")
        here = tmp / "here"
        here.mkdir()
        (here / CONFIG).symlink_to(target / CONFIG)
        if with_patches:
            shutil.copytree(ROOT / "patches", here / "patches")
        before = _snapshot(target)
        rc, _, err = _cli("-c", str(here / CONFIG), "render")
        if _snapshot(target) != before:
            return Outcome.WRONG, "render changed the link target's folder"
        if not with_patches:
            return _refusal(rc, err, str(here / "patches"))
        if rc != 0:
            return Outcome.WRONG, f"rc {rc}: {err[:300]!r}"
        if not (here / manifest.KAS_DIR / "base.yml").is_file():
            return Outcome.WRONG, "nothing rendered beside the link"
        return Outcome.HELD, ""


FOREIGN_AT = (
    "kas/local.yml",
    "kas/sub/deep.yml",
    "meta-rocky-vulkan/notes.txt",
    "meta-rocky-vulkan/meta-rocky-vulkan/recipes-core/mine/mine_1.0.bb",
)
FOREIGN_KINDS: dict[str, Callable[[Path, Path], Any]] = {
    "file": lambda p, outside: p.write_text("mine"),
    "link-outside": lambda p, outside: p.symlink_to(outside),
    "fifo": lambda p, outside: os.mkfifo(p),
}


def _foreign_case(where: str, kind: str, check: bool) -> Result:
    """A file render never made inside its folders: render must not delete it (nor follow a
    link out, nor hang on a FIFO); render --check must not pass."""
    with _tmp() as tmp:
        project = _rendered(tmp)
        outside = tmp / "outside.txt"
        outside.write_text("outside")
        path = project / where
        path.parent.mkdir(parents=True, exist_ok=True)
        FOREIGN_KINDS[kind](path, outside)
        before = _snapshot(project)
        rc, out, err = _cli("-c", str(project / CONFIG), "render", *(["--check"] * check))
        if outside.read_text() != "outside":
            return Outcome.WRONG, "a file outside the project changed"
        if _snapshot(project) != before:
            return Outcome.WRONG, f"render changed the project (rc {rc}); {where} lost?"
        if check and rc == 2 and where in out:  # named in --check's diff on stdout
            return _refusal(rc, err)
        return _refusal(rc, err, where)


def _top_is_not_a_folder(top: str, kind: str) -> Result:
    with _tmp() as tmp:
        project = _project(tmp)
        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "keep.txt").write_text("keep")
        if kind == "link":
            (project / top).symlink_to(elsewhere)
        else:
            (project / top).write_text("a file named like render's folder")
        before, outside = _snapshot(project), _snapshot(elsewhere)
        rc, _, err = _cli("-c", str(project / CONFIG), "render")
        if _snapshot(elsewhere) != outside:
            return Outcome.WRONG, "render wrote through the link"
        if _snapshot(project) != before:
            return Outcome.WRONG, f"render replaced {top} (rc {rc})"
        return _refusal(rc, err, top)


def _stale_output() -> Result:
    """A machine dropped from the config: its files, render's own, go with the next render."""
    with _tmp() as tmp:
        project = _rendered(tmp)
        config = project / CONFIG
        data = parse_yaml(config.read_text())
        del data["machines"]["rock-5b-rocky"]
        config.write_text(hostile._dump(data))
        rc, _, err = _cli("-c", str(config), "render")
        if rc != 0:
            return Outcome.WRONG, f"rc {rc}: {err[:300]!r}"
        if (project / "kas/rock-5b-rocky.yml").exists():
            return Outcome.WRONG, "the dropped machine's kas file stayed"
        rc, _, err = _cli("-c", str(config), "render", "--check")
        return (Outcome.HELD, "") if rc == 0 else (Outcome.WRONG, f"--check after: {err[:200]}")


def _staging_lookalike(name: str) -> Result:
    """A folder of the user's named like render's staging folders must survive a render."""
    with _tmp() as tmp:
        project = _project(tmp)
        mine = project / name
        mine.mkdir()
        (mine / "notes.txt").write_text("mine")
        rc, _, err = _cli("-c", str(project / CONFIG), "render")
        if not (mine / "notes.txt").is_file():
            return Outcome.WRONG, f"render deleted {name}/ (rc {rc})"
        return (Outcome.HELD, "") if rc == 0 else _refusal(rc, err, name)


RECORD_KINDS: dict[str, Callable[[Path, Path], Any]] = {
    "fifo": lambda p, outside: os.mkfifo(p),
    "link-to-dev-zero": lambda p, outside: p.symlink_to("/dev/zero"),
    "sparse-2GB": lambda p, outside: _sparse(p, 2 << 30),
    "lists-outside": lambda p, outside: p.write_text(f"../{outside.name}\n{outside}\n"),
    "directory": lambda p, outside: p.mkdir(),
}


def _record_case(kind: str) -> Result:
    """The list of files render made, replaced by something hostile: no hang, nothing outside
    the project touched, and a clean refusal or a correct render."""
    with _tmp() as tmp:
        project = _rendered(tmp)
        outside = tmp / "outside.txt"
        outside.write_text("outside")
        record = project / manifest.RECORD
        if record.is_file():
            record.unlink()
        RECORD_KINDS[kind](record, outside)
        rc, _, err = _cli("-c", str(project / CONFIG), "render")
        if not outside.is_file():
            return Outcome.WRONG, "a file outside the project was deleted"
        if rc == 0:
            rc, _, err = _cli("-c", str(project / CONFIG), "render", "--check")
            return (Outcome.HELD, "") if rc == 0 else (Outcome.WRONG, err[:200])
        return _refusal(rc, err, record.relative_to(project).as_posix())


def _collision_case(change: Callable[[Any], Any], name: str) -> Result:
    """A Config built by hand (skipping the loader's name checks): render's own checks must
    refuse a machine `name` whose output lands on another's path."""
    cfg = change(load_config(_clean_config()))
    try:
        manifest.render_files(cfg)
    except UserError as err:
        return _refusal(2, f"rocky-vulkan: error: {err}", name)
    return Outcome.WRONG, f"rendered with two outputs on kas/{name}.yml"


def _renamed_machine(name: str) -> Callable[[Any], Any]:
    def change(cfg: Any) -> Any:
        first = dataclasses.replace(cfg.machines[0], name=name)
        return dataclasses.replace(cfg, machines=(first, *cfg.machines[1:]))

    return change


def _twin_machines(cfg: Any) -> Any:
    itx = next(m for m in cfg.machines if m.name == "rock-5-itx")
    return dataclasses.replace(cfg, machines=(itx, itx))


def _outputs() -> Iterator[Case]:
    yield _case("outputs", "symlinked-config", lambda: _symlinked_config(True))
    yield _case("outputs", "symlinked-config-no-patches", lambda: _symlinked_config(False))
    for where in FOREIGN_AT:
        for kind in FOREIGN_KINDS:
            for check in (False, True):
                yield _case(
                    "outputs",
                    f"foreign-{kind}:{where}{':check' if check else ''}",
                    lambda w=where, k=kind, c=check: _foreign_case(w, k, c),
                    10,
                )
    for top in manifest.OUTPUT_DIRS:
        for kind in ("link", "file"):
            yield _case(
                "outputs", f"{top}-is-a-{kind}", lambda t=top, k=kind: _top_is_not_a_folder(t, k)
            )
    yield _case("outputs", "stale-output-removed", _stale_output)
    for name in (".render-notes", ".render-abcd1234"):
        yield _case("outputs", f"user-folder:{name}", lambda n=name: _staging_lookalike(n))
    for kind in RECORD_KINDS:
        yield _case("outputs", f"record-{kind}", lambda k=kind: _record_case(k), 10)
    for name in sorted(KAS_NAMES):
        yield _case(
            "outputs",
            f"collision:machine={name}",
            lambda n=name: _collision_case(_renamed_machine(n), n),
        )
    yield _case(
        "outputs",
        "collision:two-machines-one-name",
        lambda: _collision_case(_twin_machines, "rock-5-itx"),
    )


# --- secrets --------------------------------------------------------------------------------

# How a credential gets into a URL: (name, function of (scheme://host, /path) -> URL).
SECRET_FORMS: dict[str, Callable[[str, str], str]] = {
    "user:password@": lambda h, p: h.replace("://", f"://me:{SECRET}@", 1) + p,
    "token-as-user@": lambda h, p: h.replace("://", f"://ghp_{SECRET}@", 1) + p,
    ":password@": lambda h, p: h.replace("://", f"://:{SECRET}@", 1) + p,
    "encoded-user:password@": lambda h, p: h.replace("://", f"://me%3A{SECRET}@", 1) + p,
    "?token=": lambda h, p: f"{h}{p}?token={SECRET}",
    "?access_token=": lambda h, p: f"{h}{p}?access_token={SECRET}",
    "?TOKEN=": lambda h, p: f"{h}{p}?TOKEN={SECRET}",
    "&private_token=": lambda h, p: f"{h}{p}?download=true&private_token={SECRET}",
    "?api_key=": lambda h, p: f"{h}{p}?api_key={SECRET}",
    "?apikey=": lambda h, p: f"{h}{p}?apikey={SECRET}",
    "?password=": lambda h, p: f"{h}{p}?password={SECRET}",
    "?X-Amz-Signature=": lambda h, p: f"{h}{p}?X-Amz-Credential=AKIA/x&X-Amz-Signature={SECRET}",
    "?X-Amz-Security-Token=": lambda h, p: f"{h}{p}?X-Amz-Security-Token={SECRET}",
    "?X-Goog-Signature=": lambda h, p: f"{h}{p}?X-Goog-Signature={SECRET}",
    "?sig= (Azure SAS)": lambda h, p: f"{h}{p}?sv=2022-11-02&sig={SECRET}",
    "#access_token=": lambda h, p: f"{h}{p}#access_token={SECRET}",
}
# Legitimate URLs that look a little like those: they must load.
BENIGN_FORMS: dict[str, Callable[[str, str], str]] = {
    "?download=true": lambda h, p: f"{h}{p}?download=true",
    "@-in-path": lambda h, p: f"{h}/@scope{p}",
    "?revision=main": lambda h, p: f"{h}{p}?revision=main",
}


def _url_leaves() -> list[hostile.Leaf]:
    return [
        leaf
        for leaf in hostile.leaves(hostile.clean_data())
        if isinstance(leaf.value, str) and re.match(r"[a-z]+://", leaf.value)
    ]


def _secret_case(leaf: hostile.Leaf, url: str, benign: bool) -> Result:
    data = hostile.replaced(hostile.clean_data(), leaf, url)
    with _tmp() as tmp:
        project = _project(tmp, hostile._dump(data))
        result, cfg = _loaded(project / CONFIG, leaf.field())
        if result:
            if benign and leaf.field() != "project.url":  # project.url takes no query or '@'
                return Outcome.WRONG, f"a plain URL refused: {url}"
            rc, out, err = _cli("-c", str(project / CONFIG), "render", "--check")
            if SECRET in out + err:
                return Outcome.WRONG, "refused, but the message shows the secret"
            return result
        files = manifest.render_files(cfg)
        leaked = [rel for rel, data in files.items() if SECRET.encode() in data]
        if leaked:
            return Outcome.WRONG, f"the secret is in {len(leaked)} files: {leaked[:2]}"
        return (Outcome.HELD, "") if benign else (Outcome.WRONG, "accepted a URL with a secret")


def _secrets() -> Iterator[Case]:
    for leaf in _url_leaves():
        scheme_host, _, rest = leaf.value.partition("://")
        host, slash, path = rest.partition("/")
        base, tail = f"{scheme_host}://{host}", f"{slash}{path}"
        for forms, benign in ((SECRET_FORMS, False), (BENIGN_FORMS, True)):
            for name, form in forms.items():
                url = form(base, tail)
                yield _case(
                    "secrets",
                    f"{leaf.field()}:{name}",
                    lambda leaf=leaf, url=url, benign=benign: _secret_case(leaf, url, benign),
                )


def cases() -> Iterator[Case]:
    yield from _numbers()
    yield from _files()
    yield from _reserved_names()
    yield from _outputs()
    yield from _secrets()
