"""Render: deterministic, atomic, and `--check` catches a drifted tree."""

from __future__ import annotations

import os

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.layer import manifest
from rocky_vulkan.layer import render as render_mod
from rocky_vulkan.layer.errors import RenderError

from tests.helpers.project import ROOT


def test_committed_tree_matches_fresh_render():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    assert render_mod.diff_against_disk(cfg) == ""


def test_render_is_deterministic(project):
    cfg = load_config(project / "rocky-vulkan.yaml")
    assert manifest.render_files(cfg) == manifest.render_files(cfg)


def test_render_writes_layer_and_kas_for_every_machine(project, tmp_path):
    cfg = load_config(project / "rocky-vulkan.yaml")
    files = manifest.render_files(cfg)
    for machine in cfg.machines:
        conf = files[
            f"meta-rocky-vulkan/meta-rocky-vulkan-bsp/conf/machine/{machine.name}.conf"
        ].decode()
        assert f'KERNEL_DEVICETREE = "{machine.devicetree}"' in conf
        assert f'UBOOT_MACHINE = "{machine.uboot_defconfig}"' in conf
        assert f"require conf/machine/include/{machine.soc}.inc" in conf
        assert f"machine: {machine.name}" in files[f"kas/{machine.name}.yml"].decode()
    lock = files["kas/base.lock.yml"].decode()
    for repo in cfg.repos:
        assert f"commit: {repo.commit}" in lock
    layer_conf = files["meta-rocky-vulkan/meta-rocky-vulkan/conf/layer.conf"].decode()
    assert 'LAYERSERIES_COMPAT_rocky-vulkan = "wrynose"' in layer_conf


def test_config_change_flows_into_the_layer(project):
    path = project / "rocky-vulkan.yaml"
    path.write_text(path.read_text().replace("build_number: 9101", "build_number: 9200"))
    files = manifest.render_files(load_config(path))
    recipe = files[
        "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp/llama-cpp_git.bb"
    ].decode()
    assert 'LLAMA_BUILD_NUMBER = "9200"' in recipe


def test_patches_listed_in_config_are_copied_and_wired(project):
    patch = project / "patches" / "0001-test.patch"
    patch.parent.mkdir(exist_ok=True)
    patch.write_bytes(b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    path = project / "rocky-vulkan.yaml"
    text = path.read_text()
    product = "  patches:\n    - llama.cpp-0001-vulkan-small-warptile-rule.patch\n"
    assert product in text
    path.write_text(text.replace(product, "  patches:\n    - 0001-test.patch\n", 1))
    files = manifest.render_files(load_config(path))
    assert files[
        "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp/files/0001-test.patch"
    ] == (patch.read_bytes())
    recipe = files[
        "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp/llama-cpp_git.bb"
    ].decode()
    assert "file://0001-test.patch" in recipe


def test_check_fails_with_diff_on_drift_and_render_keeps_files_it_never_made(project, capsys):
    cfg_path = str(project / "rocky-vulkan.yaml")
    machine_conf = project / "meta-rocky-vulkan/meta-rocky-vulkan-bsp/conf/machine/rock-5-itx.conf"
    machine_conf.write_text(machine_conf.read_text() + "# hand edit\n")
    stray = project / "kas" / "stray.yml"
    stray.write_text("header:\n  version: 23\n")
    assert main(["--config", cfg_path, "render", "--check"]) != 0
    out = capsys.readouterr().out
    assert "-# hand edit" in out
    assert "--- a/kas/stray.yml" in out
    # A file no render made is the user's: render refuses to delete it, naming it.
    assert main(["--config", cfg_path, "render"]) == 2
    assert "kas/stray.yml" in capsys.readouterr().err
    assert stray.is_file() and "# hand edit" in machine_conf.read_text()
    stray.unlink()
    assert main(["--config", cfg_path, "render"]) == 0  # render's own edited file: replaced
    assert "# hand edit" not in machine_conf.read_text()
    assert main(["--config", cfg_path, "render", "--check"]) == 0


OUTPUTS = ("meta-rocky-vulkan", "kas")


def test_failed_render_leaves_old_tree_untouched(project, monkeypatch):
    cfg = load_config(project / "rocky-vulkan.yaml")

    def tree() -> dict:
        return {
            p: p.read_bytes() for top in OUTPUTS for p in (project / top).rglob("*") if p.is_file()
        }

    before = tree()
    real_rename = os.rename
    calls = []

    def rename_then_fail(src, dst):
        # Fault injection: the second swap (kas/) fails after the layer was swapped in.
        calls.append(dst)
        if str(dst).endswith("/kas") and str(src).endswith("/kas") and "render-" in str(src):
            raise OSError("disk full (injected)")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_then_fail)
    (project / "meta-rocky-vulkan/meta-rocky-vulkan/conf/layer.conf").write_text("old\n")
    before[project / "meta-rocky-vulkan/meta-rocky-vulkan/conf/layer.conf"] = b"old\n"
    with pytest.raises(RenderError, match=r"disk full \(injected\).*Nothing was changed"):
        render_mod.write_rendered(cfg)
    assert tree() == before  # the layer swapped back, and kas/ (moved aside) put back too
    assert not list(project.glob(".render-*"))


def test_changes_to_upstream_recipes_leave_other_distros_signatures_alone():
    # Every SRC_URI[...] flag is a dependency of SRC_URI in bitbake's task signatures, so an
    # unconditional flag in a bbappend (or the .inc it requires) changes the upstream recipe's
    # signatures for every distro and machine: yocto-check-layer's test_signatures fails.
    mesa = ROOT / "meta-rocky-vulkan" / "meta-rocky-vulkan-distro" / "recipes-graphics" / "mesa"
    files = [*mesa.glob("*.bbappend"), *mesa.glob("*.inc")]
    assert files
    for path in [*files, *(ROOT / "meta-rocky-vulkan").glob("recipes-*/*/*.bbappend")]:
        for line in path.read_text().splitlines():
            assert not line.startswith("SRC_URI["), f"{path.name}: unconditional flag: {line}"


def test_plain_templates_carry_the_generated_header():
    # Files under templates/ without .j2 are copied as they are, so the header is written out in
    # them: it must stay the render's own (the licence text is the one file without it).
    from rocky_vulkan.layer import manifest

    plain = [t for t in manifest.template_tree() if not t.endswith(manifest.JINJA_SUFFIX)]
    assert manifest.LICENCE in plain
    for name in plain:
        if name != manifest.LICENCE:
            first = (manifest.TEMPLATES / name).read_text().splitlines()[0]
            assert first == "# " + manifest.HEADER_TEXT, name
