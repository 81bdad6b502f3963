"""A hostile rocky-vulkan.yaml: no value may rewrite the image, and nothing ends in a traceback.

Every field gets generated hostile values (tests/hostile.py: newlines, quotes, backslashes,
`${@...}`, shell syntax, Unicode line separators, NUL, 5000 characters, wrong types); each must be
refused naming file and field, or render a tree of exactly a clean render's shape. Then YAML
bombs, integers that are not ints, system accounts, the escaping filters on their own (values
that skipped the loader), and render errors from the file system."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rocky_vulkan.cli import main
from rocky_vulkan.config import ConfigError, load_config
from rocky_vulkan.layer import manifest
from rocky_vulkan.layer.errors import RenderError

from tests.helpers import hostile
from tests.helpers.project import ROOT

FIELDS = sorted({leaf.field() for leaf in hostile.leaves(hostile.clean_data())})


@pytest.mark.parametrize("field", FIELDS)
def test_every_field_refuses_hostile_values_or_keeps_the_tree_shape(project, field):
    tally = hostile.run_all(project, only=field, full=False)
    assert tally.tried > 0
    assert tally.findings == []
    assert tally.tracebacks == 0 and tally.injections == 0


def test_the_run_covers_every_string_field_of_the_config():
    strings = [leaf for leaf in hostile.leaves(hostile.clean_data()) if isinstance(leaf.value, str)]
    fields = {leaf.field() for leaf in strings}
    for must in (
        "machines.rock-5-itx.description",
        "model.name",
        "model.url",
        "image.ssh_authorized_keys[0]",
        "machines.rock-5-itx.hostname",
        "image.user",
        "image.password_hash",
        "repos[0].branch",
        "repos[1].layers[0]",
        "machines",  # the machine names (mapping keys)
        "models[0].name",
        "models[0].url",
        "models[0].filename",
        "models[0].sha256",
        "models[0].license",
        "models[0].license_flags",
        "models[0].homepage",
        "serve.model",
    ):
        assert must in fields


def _cli(
    project: Path, *args: str, prefix: tuple[str, ...] = (), **run
) -> subprocess.CompletedProcess:
    """`rocky-vulkan --config PROJECT/rocky-vulkan.yaml ARGS` in a fresh interpreter."""
    code = "import sys; from rocky_vulkan.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [*prefix, sys.executable, "-c", code, "--config", str(project / "rocky-vulkan.yaml")]
    run.setdefault("timeout", 120)
    return subprocess.run([*argv, *args], capture_output=True, text=True, **run)


def _write(project: Path, text: str) -> Path:
    path = project / "rocky-vulkan.yaml"
    path.write_text(text)
    return path


def _committed() -> str:
    return (ROOT / "rocky-vulkan.yaml").read_text()


BOMBS = {
    # Billion laughs inside a field the schema checks (its error message repr()s the value).
    "alias-bomb": _committed().replace(
        "  ubatch_sizes: [64, 128, 256, 512, 1024]",
        "  ubatch_sizes: ["
        + ", ".join(
            f"&l{i} [{', '.join([f'*l{i - 1}'] * 9 if i else ['64'] * 9)}]" for i in range(10)
        )
        + "]",
    ),
    "single-alias": _committed().replace("  extra_packages: []", "  extra_packages: &p []")
    + "x: *p\n",
    "merge-key": _committed() + "m: &m {a: 1}\nn:\n  <<: *m\n",
    "deep-lists": _committed().replace(
        "  extra_packages: []", "  extra_packages: " + "[" * 5000 + "]" * 5000
    ),
    "deep-maps": _committed().replace(
        "  extra_packages: []", "  extra_packages: " + "{a: " * 5000 + "1" + "}" * 5000
    ),
    "deep-block": _committed()
    + "".join(f"{'  ' * i}k{i}:\n" for i in range(60))
    + "  " * 60
    + "v: 1\n",
    "many-values": _committed() + "z: [" + ", ".join(["1"] * 50_000) + "]\n",
    "huge-file": _committed() + "# " + "x" * (2 << 20) + "\n",
    "list-key": _committed() + "? [a, b]\n: 1\n",
    "python-tag": _committed() + "z: !!python/object/apply:os.system ['true']\n",
    "nul-byte": _committed() + "z: \x00\n",
    "not-utf8": None,
    "top-level-list": "- 1\n- 2\n",
    "int-key": _committed().replace("  rock-5b-rocky:", "  5:"),
}


def _limits() -> None:
    # A loader that builds an alias bomb would take the machine's memory: cap it at 1 GiB.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@contextlib.contextmanager
def _memory_cap(extra: int = 1 << 30):
    """This process may grow by `extra` bytes of address space, no more (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("name", BOMBS)
def test_yaml_bombs_and_odd_documents_are_refused_fast_and_cleanly(project, name):
    path = project / "rocky-vulkan.yaml"
    if BOMBS[name] is None:
        path.write_bytes(_committed().encode() + b"\xff\xfe\n")
    else:
        _write(project, BOMBS[name])
    start = time.monotonic()
    with _memory_cap(), pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.monotonic() - start < 5
    assert str(err.value).startswith(f"{path}: ")


@pytest.mark.parametrize("name", ["alias-bomb", "deep-lists", "huge-file"])
def test_the_cli_reports_bombs_without_a_traceback(project, name):
    _write(project, BOMBS[name])
    proc = _cli(project, "render", "--check", preexec_fn=_limits, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"rocky-vulkan: error: {project / 'rocky-vulkan.yaml'}: ")
    assert "Traceback" not in proc.stderr


def test_aliases_are_refused_before_any_object_is_built(project, monkeypatch):
    # The loader must stop at the event stream: constructing even one object is too late.
    import rocky_vulkan.config as config_mod

    def no_construct(*args, **kwargs):
        raise AssertionError("an object was constructed")

    monkeypatch.setattr(config_mod._UniqueKeyLoader, "construct_document", no_construct)
    path = _write(project, BOMBS["alias-bomb"])
    with pytest.raises(ConfigError, match="aliases"):
        load_config(path)


def _edit(project: Path, old: str, new: str) -> Path:
    text = _committed()
    assert old in text
    return _write(project, text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("ubatch_sizes: [64,", "ubatch_sizes: [64.0,", "selftest.ubatch_sizes[0]"),
        ("repetitions: 3", "repetitions: true", "selftest.repetitions"),
        ("serial_baud: 1500000", "serial_baud: 1500000.0", "machines.rock-5-itx.serial_baud"),
        ("schema_version: 1", "schema_version: 1.0", "schema_version"),
        ("build_number: 9101", "build_number: 9101.0", "llama_cpp.build_number"),
        (
            "tuned_vs_stock_ratio: 4.8",
            "tuned_vs_stock_ratio: .inf",
            "selftest.tuned_vs_stock_ratio",
        ),
        ("cpu_tps: 22.0", "cpu_tps: .nan", "selftest.reference.cpu_tps"),
        ("stock_tps: 5.8", "stock_tps: false", "selftest.reference.stock_tps"),
    ],
)
def test_numbers_must_be_real_ints_and_finite(project, old, new, field):
    with pytest.raises(ConfigError) as err:
        load_config(_edit(project, old, new))
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (
            "    hostname: rock-5-itx",
            '    hostname: "rock-5-itx\\n"',
            "machines.rock-5-itx.hostname",
        ),
        (
            "commit: fae9db3168dbff1b8c76fe9c6726a9687ff97514",
            'commit: "fae9db3168dbff1b8c76fe9c6726a9687ff97514\\n"',
            "repos[0].commit",
        ),
        (
            "sha256: efd4bb08cdb7c365a812cd4e6c9202ab55b2f22cdcd13c7d6c4f9647b799a4ef",
            'sha256: "efd4bb08cdb7c365a812cd4e6c9202ab55b2f22cdcd13c7d6c4f9647b799a4ef\\n"',
            "mesa.sha256",
        ),
    ],
)
def test_a_trailing_newline_is_refused(project, old, new, field):
    with pytest.raises(ConfigError) as err:
        load_config(_edit(project, old, new))
    assert field in str(err.value)


def test_every_schema_pattern_is_anchored_for_other_json_schema_tools():
    # The loader matches whole strings; other tools (editors) search, so anchor anyway.
    schema = json.loads((ROOT / "tools/rocky_vulkan/schema/config.schema.json").read_text())
    patterns = re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', json.dumps(schema))
    assert len(patterns) > 15
    for pattern in patterns:
        assert pattern.startswith("^") and pattern.endswith("$"), pattern


@pytest.mark.parametrize(
    "user",
    [
        "root",
        "daemon",
        "nobody",
        "video",
        "render",
        "sshd",
        "messagebus",
        "systemd-network",
        "rocky-selftest",
    ],
)
def test_image_user_is_no_system_account(project, user):
    with pytest.raises(ConfigError) as err:
        load_config(_edit(project, "  user: rocky", f"  user: {user}"))
    assert "image.user" in str(err.value) and "system account" in str(err.value)


def test_a_truncated_ssh_key_is_refused(project):
    key = hostile._ssh_key("me@host")
    kind, blob, comment = key.split()
    cut = f"{kind} {blob[:40]} {comment}"
    with pytest.raises(ConfigError) as err:
        load_config(
            _edit(project, "  ssh_authorized_keys: []", f"  ssh_authorized_keys: ['{cut}']")
        )
    assert "image.ssh_authorized_keys[0]" in str(err.value)
    swapped = key.replace("ssh-ed25519", "ssh-rsa", 1)
    with pytest.raises(ConfigError, match="not a ssh-rsa key"):
        load_config(
            _edit(project, "  ssh_authorized_keys: []", f"  ssh_authorized_keys: ['{swapped}']")
        )


# Values that skipped the loader (a Config built by hand): the filters alone must stop them.
INJECTIONS = [
    'x\nROCKY_DEBUG_IMAGE = "1"',
    'x" ROCKY_DEBUG_IMAGE = "1',
    "${@os.system('touch /tmp/rocky-pwned')}",
    "x\\",
    "x\u2028y",
    "x\x00y",
]


PLAIN = {
    "description": "Plain board",
    "name": "Plain model",
    "url": "https://example.org/m.gguf",
    "filename": "plain.gguf",
    "ssh_authorized_keys": hostile._ssh_key("plain@host"),
    "hostname": "plainhost",
    "user": "plainuser",
    "password_hash": hostile.PASSWORD_HASH,
    "branch": "plainbranch",
}


def _hand_built(cfg, where: str, value: str):
    if where in ("description", "hostname"):
        machines = tuple(dataclasses.replace(m, **{where: value}) for m in cfg.machines)
        return dataclasses.replace(cfg, machines=machines)
    if where in ("name", "url", "filename"):
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **{where: value}))
    if where == "ssh_authorized_keys":
        image = dataclasses.replace(cfg.image, ssh_authorized_keys=(value,))
        return dataclasses.replace(cfg, image=image)
    if where == "branch":
        repos = (dataclasses.replace(cfg.repos[0], branch=value), *cfg.repos[1:])
        return dataclasses.replace(cfg, repos=repos)
    return dataclasses.replace(cfg, image=dataclasses.replace(cfg.image, **{where: value}))


@pytest.mark.parametrize("value", INJECTIONS, ids=range(len(INJECTIONS)))
@pytest.mark.parametrize(
    "where",
    [
        "description",
        "name",
        "url",
        "filename",
        "ssh_authorized_keys",
        "hostname",
        "user",
        "password_hash",
        "branch",
    ],
)
def test_escaping_filters_stop_values_that_skipped_the_loader(tmp_path, where, value):
    # Refused by a filter, or harmless where it lands (a '"' in a comment): then the tree has
    # the shape it has with a plain value in that field.
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    try:
        files = manifest.render_files(_hand_built(cfg, where, value))
    except RenderError as err:
        assert "refusing to write" in str(err)
        return
    plain = PLAIN[where]
    baseline = manifest.render_files(_hand_built(cfg, where, plain))
    got = hostile.shape(files, tmp_path / "got")
    assert got == hostile.shape(baseline, tmp_path / "baseline")


QUOTED = [*hostile.HOSTILE, "it's", "a b", "", "-n", "$HOME"]


@pytest.mark.parametrize("value", QUOTED, ids=range(len(QUOTED)))
def test_quoting_filters_round_trip_through_their_parsers(value):
    from rocky_vulkan.layer import escape  # here, so the rest of the file runs where it is missing

    try:
        quoted = escape.sh_quote(value)
    except escape.UnsafeValue:
        assert "\x00" in value  # a shell argument cannot hold a NUL
    else:
        out = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True)
        assert out.stdout == value.encode()
    assert yaml.safe_load(f"k: {escape.yaml_scalar(value)}\n") == {"k": value}
    for name in ("bb_value", "comment", "line", "unit_value"):
        try:
            text = getattr(escape, name)(value)
        except escape.UnsafeValue:
            continue
        assert not re.search("[\x00-\x1f\u2028\u2029\x85]", text), name  # stays one line
        if name == "bb_value":
            assert not re.search(r'["\\$`]', text)


def _tree(project: Path) -> dict[str, bytes]:
    return {
        p.relative_to(project).as_posix(): p.read_bytes()
        for top in ("meta-rocky-vulkan", "kas")
        for p in (project / top).rglob("*")
        if p.is_file()
    }


def test_render_into_a_read_only_checkout_is_a_clean_error(project):
    # A real read-only tree: without root, no write permission; as root (which ignores
    # permissions), a read-only bind mount in a private mount namespace.
    before = _tree(project)
    project.joinpath("rocky-vulkan.yaml").write_text(
        _committed().replace("hostname: rock-5-itx", "hostname: changed")
    )
    if os.geteuid() != 0:
        for path in [project, *project.rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
        try:
            proc = _cli(project, "render")
        finally:
            for path in [project, *project.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)
        assert "make the checkout writable" in proc.stderr
    else:
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "true"], capture_output=True
        )
        if probe.returncode != 0 or not shutil.which("mount"):
            pytest.skip("root without mount namespaces: cannot make a read-only tree")
        wrapper = (
            f"mount --bind {project} {project} && mount -o remount,bind,ro {project} {project}"
            ' && exec "$@"'
        )
        proc = _cli(
            project,
            "render",
            prefix=("unshare", "-m", "--propagation", "private", "sh", "-c", wrapper, "sh"),
        )
        assert "read-only" in proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("rocky-vulkan: error: cannot ")
    assert "Traceback" not in proc.stderr
    assert _tree(project) == before
    assert not list(project.glob(".render-*"))


def test_disk_full_while_writing_is_a_clean_error_and_changes_nothing(project, monkeypatch, capsys):
    # Fault injection: a full disk cannot be had on demand; fail the 5th file write with ENOSPC.
    before = _tree(project)
    real = Path.write_bytes
    calls = []

    def write_bytes(self, data):
        calls.append(self)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    _edit(project, "  hostname: rock-5-itx", "  hostname: changed")
    assert main(["--config", str(project / "rocky-vulkan.yaml"), "render"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "the disk is full" in err
    assert "Nothing was changed" in err
    monkeypatch.undo()
    assert _tree(project) == before
    assert not list(project.glob(".render-*"))


KILL_DURING_SWAP = """
import os, signal, sys
from rocky_vulkan.layer import render
real = os.rename
def rename(src, dst):
    real(src, dst)
    if str(dst).endswith("meta-rocky-vulkan.old"):
        os.kill(os.getpid(), signal.SIGKILL)  # after the old layer moved aside, before the new
os.rename = rename
from rocky_vulkan.cli import main
sys.exit(main(["--config", sys.argv[1], "render"]))
"""


def test_a_killed_render_leaves_nothing_git_would_commit_and_the_next_render_recovers(project):
    # Fault injection: SIGKILL at the worst moment of the swap (a real kill -9, placed there).
    shutil.copy(ROOT / ".gitignore", project / ".gitignore")
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    config = str(project / "rocky-vulkan.yaml")
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_SWAP, config], capture_output=True)
    assert proc.returncode == -9
    assert list(project.glob(".render-*/meta-rocky-vulkan.old"))  # the kill hit mid-swap
    added = subprocess.run(
        [*git, "add", "-A", "--dry-run"], capture_output=True, text=True, check=True
    ).stdout
    assert ".render-" not in added
    assert main(["--config", config, "render"]) == 0
    assert not list(project.glob(".render-*"))
    assert main(["--config", config, "render", "--check"]) == 0
    status = subprocess.run(
        [*git, "status", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout
    assert status == ""
