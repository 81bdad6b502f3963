"""kas/vulkan-cts.yml: meta-oe and the vulkan-cts package, only in that fragment, pinned once in
rocky-vulkan.yaml (vulkan_cts.repo); valid for kas's own schema; and the names it and the
self-test rely on (recipe, package, install folder, mustpass lists, deqp-vk, meta-oe's layer
dependencies) checked against the real meta-oe recipe at the pinned commit when a clone is at
hand (ROCKY_META_OE_GIT)."""

from __future__ import annotations

import os
import re
import subprocess

import jsonschema
import pytest
import yaml
from rocky_selftest import cts, paths
from rocky_vulkan.config import ConfigError, load_config
from rocky_vulkan.layer import lint
from rocky_vulkan.layer.manifest import CTS_FRAGMENT, render_files

from tests.helpers.project import ROOT

CFG = load_config(ROOT / "rocky-vulkan.yaml")


def fragment(cfg=CFG) -> dict:
    return yaml.safe_load(render_files(cfg)[CTS_FRAGMENT])


def test_the_fragment_adds_meta_oe_pinned_by_the_config():
    data = fragment()
    repo = CFG.vulkan_cts.repo
    assert data["repos"] == {
        repo.name: {
            "url": repo.url,
            "branch": repo.branch,
            "commit": repo.commit,
            "layers": {"meta-oe": None},
        }
    }
    assert re.fullmatch(r"[0-9a-f]{40}", repo.commit)
    conf = data["local_conf_header"]["vulkan-cts"]
    assert conf.strip() == f'IMAGE_INSTALL:append:pn-rocky-vulkan-image = " {cts.CTS_PACKAGE}"'


def test_the_fragment_is_valid_for_kas_and_committed_as_rendered():
    jsonschema.Draft7Validator(lint.kas_schema()).validate(fragment())
    assert (ROOT / CTS_FRAGMENT).read_bytes() == render_files(CFG)[CTS_FRAGMENT]


def test_meta_oe_is_in_no_other_kas_file():
    for path, data in render_files(CFG).items():
        if path.startswith("kas/") and path != CTS_FRAGMENT:
            assert CFG.vulkan_cts.repo.name.encode() not in data, path
            assert b"meta-oe" not in data and cts.CTS_PACKAGE.encode() not in data, path


def test_a_commit_in_one_place(tmp_path):
    text = (ROOT / "rocky-vulkan.yaml").read_text()
    new = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "patches").symlink_to(ROOT / "patches")
    path = tmp_path / "rocky-vulkan.yaml"
    path.write_text(text.replace(CFG.vulkan_cts.repo.commit, new))
    assert fragment(load_config(path))["repos"]["meta-openembedded"]["commit"] == new


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("    name: meta-openembedded", "    name: meta-arm", "is also a repos[].name"),
        ("    layers: [meta-oe]", "    layers: []", "vulkan_cts.repo.layers"),
        ("    commit: 6bf0d8ad57b33950bab4c7f6c037e1ccb6f6e2eb", "    commit: wrynose",
         "vulkan_cts.repo.commit"),
        ("    url: https://git.openembedded.org/meta-openembedded",
         "    url: https://user:pw@git.openembedded.org/meta-openembedded", "credential"),
        ("    name: meta-openembedded", "    name: build", "vulkan_cts.repo.name"),
    ],
)  # fmt: skip
def test_bad_vulkan_cts_values_are_refused(tmp_path, old, new, field):
    text = (ROOT / "rocky-vulkan.yaml").read_text()
    assert old in text
    path = tmp_path / "rocky-vulkan.yaml"
    (tmp_path / "patches").symlink_to(ROOT / "patches")
    path.write_text(text.replace(old, new))
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(path)


def test_lint_allows_the_repo_only_in_its_fragment_and_at_the_configs_commit(project):
    cfg = load_config(project / "rocky-vulkan.yaml")
    assert lint.check_kas(cfg).findings == []
    frag = project / CTS_FRAGMENT
    good = frag.read_text()
    frag.write_text(good.replace(cfg.vulkan_cts.repo.commit, "1" * 40))
    assert any("belongs in kas/base.yml" in f for f in lint.check_kas(cfg).findings)
    frag.write_text(good)
    debug = project / "kas" / "debug.yml"
    data = yaml.safe_load(debug.read_text())
    data["repos"] = yaml.safe_load(good)["repos"]
    debug.write_text(yaml.safe_dump(data))
    assert any("debug.yml: repo meta-openembedded" in f for f in lint.check_kas(cfg).findings)


def test_the_self_test_looks_where_the_recipe_installs():
    assert cts.CTS_DIR == paths.CTS_DIR == "/usr/lib/vulkan-cts"
    distro = render_files(CFG)[
        "meta-rocky-vulkan/meta-rocky-vulkan-distro/conf/distro/rocky-vulkan.conf"
    ].decode()
    # vulkan-cts has REQUIRED_DISTRO_FEATURES = "vulkan"; its DEPENDS need virtual/libgles2
    # (Mesa's gles) and, with wayland in the distro, wayland-protocols.
    features = re.search(r'DISTRO_FEATURES = "([^"]*)"', distro, re.S).group(1).split()
    assert {"vulkan", "opengl", "wayland"} <= set(features)


# --- against meta-oe itself ----------------------------------------------------------------


def _show(path: str) -> str:
    git = os.environ["ROCKY_META_OE_GIT"]
    commit = CFG.vulkan_cts.repo.commit
    return subprocess.run(
        ["git", "-C", git, "show", f"{commit}:{path}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def _ls(path: str) -> list[str]:
    git = os.environ["ROCKY_META_OE_GIT"]
    out = subprocess.run(
        ["git", "-C", git, "ls-tree", "--name-only", f"{CFG.vulkan_cts.repo.commit}:{path}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


RECIPE_DIR = "meta-oe/recipes-graphics/vk-gl-cts"


@pytest.mark.needs_meta_oe
def test_the_pinned_meta_oe_has_the_recipe_and_package_we_name():
    recipes = [n for n in _ls(RECIPE_DIR) if n.startswith(f"{cts.CTS_RECIPE}_")]
    assert recipes == ["vulkan-cts_1.4.5.2.bb"]
    recipe = _show(f"{RECIPE_DIR}/{recipes[0]}")
    common = _show(f"{RECIPE_DIR}/khronos-cts.inc")
    assert 'REQUIRED_DISTRO_FEATURES = "vulkan"' in recipe
    assert "deqp-vk" in re.search(r"SELECTED_BUILD_TARGETS=([^\n]*)", recipe).group(1)
    # What the package holds: CTSDIR = /usr/lib/${BPN}, all of it in ${PN}.
    assert 'CTSDIR = "/usr/lib/${BPN}"' in common
    assert 'FILES:${PN} += "${CTSDIR}"' in common
    assert cts.CTS_DIR == f"/usr/lib/{cts.CTS_RECIPE}" and cts.CTS_PACKAGE == cts.CTS_RECIPE
    # The build dir's modules/vulkan (deqp-vk and its data) and the mustpass lists.
    assert "cp -r ${B}/external/vulkancts/modules/vulkan/* ${D}/${CTSDIR}/" in recipe
    assert "mustpass/main/ ${D}/${CTSDIR}/mustpass/" in recipe
    assert cts.MUSTPASS_INDEX == "mustpass/main/vk-default.txt"


@pytest.mark.needs_meta_oe
def test_meta_oe_needs_only_core_and_is_for_wrynose():
    conf = _show("meta-oe/conf/layer.conf")
    assert re.search(r'^LAYERDEPENDS_openembedded-layer = "core"$', conf, re.M)
    compat = re.search(r'^LAYERSERIES_COMPAT_openembedded-layer = "([^"]*)"', conf, re.M)
    assert CFG.release in compat.group(1).split()
