"""The config loader: the committed config loads; each bad input names file, field and fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.config import ConfigError, load_config

from tests.helpers.project import ROOT


def _edit(project: Path, old: str, new: str) -> Path:
    path = project / "rocky-vulkan.yaml"
    text = path.read_text()
    assert old in text, f"test setup: {old!r} not in config"
    path.write_text(text.replace(old, new, 1))
    return path


def test_committed_config_loads_frozen():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    assert cfg.default_machine == "rock-5-itx"
    assert cfg.machine("rock-5-itx").devicetree == "rockchip/rk3588-rock-5-itx.dtb"
    assert cfg.llama_cpp.srcrev == "389ff61d77b5c71cec0cf92fe4e5d01ace80b797"
    assert all(re.fullmatch(r"[0-9a-f]{40}", r.commit) for r in cfg.repos)
    with pytest.raises(AttributeError):
        cfg.mesa.version = "1.0.0"  # type: ignore[misc]


BAD_CASES = [
    # (old text, new text, field path in the message, what the message must say)
    (
        "commit: fae9db3168dbff1b8c76fe9c6726a9687ff97514",
        "commit: fae9db3",
        "repos[0].commit",
        "40-hex-digit",
    ),
    (
        "commit: ef022bf82d79015802309d14c28b13373ebe53f5",
        "commit: XYZ022bf82d79015802309d14c28b13373ebe53f5",
        "repos[1].commit",
        "40-hex-digit",
    ),
    (
        "sha256: efd4bb08cdb7c365a812cd4e6c9202ab55b2f22cdcd13c7d6c4f9647b799a4ef",
        "sha256: efd4bb08",
        "mesa.sha256",
        "64 lower-case hex",
    ),
    (
        "default_machine: rock-5-itx",
        "default_machine: rock-9",
        "default_machine",
        "unknown machine 'rock-9'",
    ),
    (
        "  user: rocky",
        "  user: rocky\n  colour: blue",
        "image",
        "'colour' was unexpected",
    ),
    (
        "    hostname: rock-5b\n",
        "    hostname: Rock_5B\n",
        "machines.rock-5b-rocky.hostname",
        "host name",
    ),
    ("  repetitions: 3", "  repetitions: three", "selftest.repetitions", "integer"),
    ("  build_number: 9101", "  build_number: '9101'", "llama_cpp.build_number", "release number"),
    (
        "    - mesa-0001-panvk-csf-compute-jobs-tls-size.patch\n",
        "    - missing.patch\n",
        "mesa.patches[0]",
        "'missing.patch' is not in",
    ),
    (
        "  - name: meta-rockchip",
        "  - name: meta-rockchip-typo",
        "repos",
        "'meta-rockchip' is missing",
    ),
    ("schema_version: 1", "schema_version: 1\nschema_version: 2", "line", "duplicate key"),
    ("release: wrynose", "release: scarthgap", "yocto.release", "wrynose"),
]


@pytest.mark.parametrize(("old", "new", "field", "says"), BAD_CASES)
def test_bad_config_names_file_field_and_expectation(project, old, new, field, says):
    path = _edit(project, old, new)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert field in message
    assert says in message


def test_missing_config_says_how_to_point_at_one(tmp_path):
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_syntax_error_is_reported_with_file(project):
    path = project / "rocky-vulkan.yaml"
    path.write_text("machines: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("case", BAD_CASES[:4], ids=lambda c: c[2])
def test_cli_bad_config_exits_nonzero_and_writes_nothing(project, capsys, case):
    old, new, field, _ = case
    path = _edit(project, old, new)
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    rc = main(["--config", str(path), "render"])
    assert rc != 0
    assert field in capsys.readouterr().err
    after = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    assert after == before
