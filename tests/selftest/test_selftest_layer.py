"""The layer side: the rendered recipes, unit and config, and that the copy of the self-test in
the layer runs with nothing but the standard library (python3 -S -I: no site-packages)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rocky_selftest import serving
from rocky_selftest.settings import load_settings
from rocky_vulkan.config import load_config
from rocky_vulkan.layer import manifest

from tests.helpers.project import ROOT
from tests.helpers.selftest import fake_root

pytestmark = pytest.mark.timeout(120)

LAYER_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-selftest/files"
BOARD_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board/files"
# The OE python3 packages the recipe RDEPENDS on hold exactly these modules (python3-manifest).
ALLOWED_IMPORTS = {
    "__future__", "argparse", "collections", "contextlib", "dataclasses", "errno", "glob",
    "hashlib", "json", "math", "os", "platform", "re", "shutil", "signal", "stat", "subprocess",
    "struct", "sys", "tempfile", "time", "traceback", "typing",
    # the run lock and the tool-output reader: lib-dynload/fcntl and selectors.py are python3-core
    # files in oe-core's python3-manifest.json
    "fcntl", "selectors",
    # the serving step: http.client is in python3-netclient, socket in python3-io
    "http", "socket",
    # the model store's fetch: urllib is in python3-netclient, ssl in python3-io; threading.py is
    # python3-core
    "urllib", "ssl", "threading",
    # the cluster's settings and keys: ipaddress.py and lib-dynload/binascii are python3-core
    "ipaddress", "binascii",
}  # fmt: skip
# Modules only `rocky-llm` runs (its recipe RDEPENDS on python3-io and python3-netclient too, and
# for the Ollama API on python3-netserver (http.server's socketserver), python3-datetime; hmac is
# python3-netclient).
SERVE_ONLY = {"serve_cli.py", "serve_keys.py", "ollama_api.py"}
SERVE_IMPORTS = ALLOWED_IMPORTS | {"base64", "grp", "secrets", "socket", "datetime", "hmac"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_selftest_imports_only_the_stdlib_modules_the_recipe_provides():
    sources = sorted((ROOT / "tools/rocky_selftest").glob("*.py"))
    assert sources
    for path in sources:
        extra = _imports(path) - (SERVE_IMPORTS if path.name in SERVE_ONLY else ALLOWED_IMPORTS)
        assert not extra, f"{path.name} imports {extra}: stdlib only, and add its OE package"


def _run_layer_copy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # Install the layer's files the way the recipe does, then run the entry script isolated.
    lib = tmp_path / "share/rocky-selftest"
    (lib / "rocky_selftest").mkdir(parents=True, exist_ok=True)
    for src in (BOARD_FILES / "rocky_selftest").glob("*.py"):
        (lib / "rocky_selftest" / src.name).write_bytes(src.read_bytes())
    script = (LAYER_FILES / "rocky-selftest").read_text()
    script = script.replace('"/usr/share/rocky-selftest"', repr(str(lib)))
    entry = tmp_path / "rocky-selftest"
    entry.write_text(script)
    return subprocess.run(
        [sys.executable, "-S", "-I", str(entry), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_layer_copy_runs_without_site_packages(tmp_path):
    root = fake_root(tmp_path, kmsg=["panthor fb000000.gpu: [drm] CSF FW using interface v1.1.0"])
    board = json.loads((BOARD_FILES / "config.json").read_text())
    board.update(
        model_path=str(tmp_path / "missing.gguf"),
        results_dir=str(tmp_path / "results"),
        motd_path=str(tmp_path / "motd"),
        sysroot=str(root),
        bin_dir=str(tmp_path / "nobin"),
        vulkaninfo=str(tmp_path / "nobin/vulkaninfo"),
        gpu_wait_s=0,
    )
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(board))
    proc = _run_layer_copy(tmp_path, "--config", str(cfg), "run")
    assert proc.returncode == 1, proc.stderr
    assert "PASS gpu_driver: renderD128 -> panthor (fb000000.gpu)" in proc.stdout
    assert "FAIL model_sha256" in proc.stdout
    doc = json.loads((tmp_path / "results/result.json").read_text())
    assert doc["verdict"] == "FAIL"
    status = _run_layer_copy(tmp_path, "--config", str(cfg), "status")
    assert status.returncode == 1 and "rocky-selftest FAIL" in status.stdout


def test_rendered_board_config_matches_the_yaml_and_skips_nothing():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    s = load_settings(str(BOARD_FILES / "config.json"))
    assert s.ubatch_sizes == cfg.selftest.ubatch_sizes
    assert s.tuned_vs_stock_ratio == cfg.selftest.tuned_vs_stock_ratio
    assert s.ratio_tolerance == cfg.selftest.ratio_tolerance
    assert s.match_tokens == cfg.selftest.match_tokens
    assert s.deadline_s == cfg.selftest.deadline_s
    assert s.model_sha256 == cfg.model.sha256
    assert s.model_path.endswith("/" + cfg.model.filename)
    assert s.skip_checks == () and s.env == {}


def test_unit_runs_once_after_boot_and_is_bounded():
    unit = (LAYER_FILES / "rocky-selftest.service").read_text()
    assert "ConditionPathExists=!/var/lib/rocky-selftest/first-boot.stamp" in unit
    assert "--stamp /var/lib/rocky-selftest/first-boot.stamp" in unit
    assert "Type=oneshot" in unit and "WantedBy=multi-user.target" in unit
    settings = [line for line in unit.splitlines() if not line.startswith("#")]
    assert not [line for line in settings if line.startswith("Before=")]  # login never waits
    assert not [line for line in settings if "ConditionFirstBoot" in line]
    timeout = int(unit.split("TimeoutStartSec=")[1].split()[0])
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    assert cfg.selftest.deadline_s < timeout < cfg.selftest.deadline_s + 2 * 3600
    # Nothing starts after the deadline and nothing runs past it (each tool, server start and
    # request gets min(run_timeout_s, time left)); stopping a server then takes its grace.
    assert timeout >= cfg.selftest.deadline_s + serving.STOP_GRACE_S + 60


def _recipe(name: str) -> str:
    return next(
        (ROOT / f"meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/{name}").glob("*.bb")
    ).read_text()


def _rdepends(recipe: str) -> set[str]:
    """Every word of every RDEPENDS:<pkg> = "..." in a rendered recipe."""
    found = re.findall(r'(?m)^RDEPENDS:[^=]+= "([^"]*)"', recipe)
    return {w for value in found for w in value.replace("\\", " ").split()}


def test_recipe_rdepends_on_what_the_serving_step_runs_and_imports():
    assert "python3-netclient" in _rdepends(_recipe("rocky-board"))  # http.client
    assert {"llama-cpp-server", "rocky-board"} <= _rdepends(_recipe("rocky-selftest"))


def test_nothing_but_the_image_needs_a_recipe_skipped_for_the_model_licence():
    """yocto-check-layer's test_world builds without the licence: a recipe skipped for it
    (LICENSE_FLAGS, or SKIP_RECIPE on LICENSE_FLAGS_ACCEPTED) that another recipe RDEPENDS on
    is "Nothing RPROVIDES" there (rocky-llm on rocky-selftest, found on main at 53b166b)."""
    recipes = {
        bb.name.split("_")[0]: bb.read_text()
        for bb in (ROOT / "meta-rocky-vulkan/meta-rocky-vulkan").glob("recipes-*/*/*.bb")
    }
    skipped = {
        name
        for name, text in recipes.items()
        if re.search(r"(?m)^LICENSE_FLAGS = ", text)
        or re.search(r"(?m)^SKIP_RECIPE\[.*LICENSE_FLAGS_ACCEPTED", text)
    }
    assert {"rocky-model", "rocky-selftest"} <= skipped  # the check sees what it guards
    for name, text in recipes.items():
        if name not in skipped and name != "rocky-vulkan-image":
            assert not _rdepends(text) & skipped, name


def _render_with_sha(project: Path, sha: str) -> dict[str, str]:
    path = project / "rocky-vulkan.yaml"
    head, model = path.read_text().split("\nmodel:\n", 1)
    model = re.sub(r"(?m)^(  sha256: )(null|[0-9a-f]{64})$", rf"\g<1>{sha}", model, count=1)
    path.write_text(head + "\nmodel:\n" + model)
    files = manifest.render_files(load_config(path))
    return {k: v.decode() for k, v in files.items()}


def test_model_recipe_refuses_to_build_while_sha256_is_null(project):
    files = _render_with_sha(project, "null")
    recipe = files["meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-model/rocky-model_1.0.bb"]
    assert 'SKIP_RECIPE[rocky-model] = "model.sha256 is null' in recipe
    assert "rocky-vulkan model fetch" in recipe
    assert "SRC_URI[sha256sum]" not in recipe
    pinned = _render_with_sha(project, "ab" * 32)
    recipe = pinned[
        "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-model/rocky-model_1.0.bb"
    ]
    assert f'SRC_URI[sha256sum] = "{"ab" * 32}"' in recipe and "SKIP_RECIPE" not in recipe
    board = json.loads(
        pinned["meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board/files/config.json"]
    )
    assert board["model_sha256"] == "ab" * 32


def test_recipe_ships_every_selftest_source_and_the_image_installs_both():
    recipe = _recipe("rocky-board")
    for src in (ROOT / "tools/rocky_selftest").glob("*.py"):
        assert f"file://rocky_selftest/{src.name}" in recipe
        assert (BOARD_FILES / "rocky_selftest" / src.name).read_bytes() == src.read_bytes()
    image = (
        ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-core/images/rocky-vulkan-image.bb"
    ).read_text()
    assert "rocky-selftest \\" in image and "rocky-model \\" in image
