"""The rendered layers' shape: three layers of one yocto-check-layer type each, board settings
that are ours, a product distro chosen on purpose, a trimmed Mesa, hard GPU dependencies and a
gated model licence. (tests/layer/test_bitbake_env.py checks the same through real bitbake.)"""

from __future__ import annotations

import re

import pytest
import yaml
from rocky_vulkan.config import load_config
from rocky_vulkan.layer import manifest

from tests.helpers.project import ROOT

BSP, DISTRO, SOFTWARE = manifest.SUB_LAYERS
IMAGE = f"{SOFTWARE}/recipes-core/images/rocky-vulkan-image.bb"
MODEL = f"{SOFTWARE}/recipes-llm/rocky-model/rocky-model_1.0.bb"
MESA = f"{DISTRO}/recipes-graphics/mesa/mesa.bbappend"


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "rocky-vulkan.yaml")


@pytest.fixture(scope="module")
def files(cfg) -> dict[str, str]:
    return {k: v.decode() for k, v in manifest.render_files(cfg).items()}


def value(text: str, name: str, op: str = r"[?]*=") -> str:
    match = re.search("^" + re.escape(name) + " " + op + r' "((?:[^"\\]|\\.|\\\n)*)"', text, re.M)
    assert match, f"{name} not set"
    return match.group(1)


def test_each_layer_has_exactly_one_type(files):
    # yocto-check-layer: conf/machine -> BSP, conf/distro -> DISTRO, both -> refused.
    def dirs(layer: str) -> set[str]:
        return {
            p.split("/")[len(layer.split("/")) + 1] for p in files if p.startswith(layer + "/conf/")
        }

    assert dirs(BSP) == {"layer.conf", "machine"}
    assert dirs(DISTRO) == {"layer.conf", "distro"}
    assert dirs(SOFTWARE) == {"layer.conf"}
    collections = set()
    for layer in manifest.SUB_LAYERS:
        for name in ("README.md", "SECURITY.md"):
            assert f"{layer}/{name}" in files, (layer, name)
        conf = files[f"{layer}/conf/layer.conf"]
        collection = value(conf, "BBFILE_COLLECTIONS", r"\+=").strip()
        assert value(conf, f"LAYERSERIES_COMPAT_{collection}") == "wrynose"
        collections.add(collection)
    assert len(collections) == 3
    assert "maintainers" in files[f"{BSP}/README.md"] and "[PATCH]" in files[f"{BSP}/README.md"]


def test_kas_lists_every_rendered_layer(files):
    layers = yaml.safe_load(files["kas/base.yml"])["repos"]["rocky-vulkan-llama"]["layers"]
    assert set(layers) == set(manifest.SUB_LAYERS)


def test_machine_files_carry_our_board_settings_and_no_redundant_overrides(cfg, files):
    for machine in cfg.machines:
        conf = files[f"{BSP}/conf/machine/{machine.name}.conf"]
        assert value(conf, "KERNEL_DEVICETREE") == machine.devicetree
        assert value(conf, "UBOOT_MACHINE") == machine.uboot_defconfig
        assert value(conf, "MACHINE_EXTRA_RDEPENDS", r"\+=") == " ".join(machine.firmware)
        # rk3588.inc already puts rk3588 into MACHINEOVERRIDES; twice doubled Mesa's appends.
        assert "MACHINEOVERRIDES" not in conf and "SOC_FAMILY" not in conf
    # meta-rockchip has conf/machine/rock-5b.conf: a machine of that name would not be ours.
    assert "rock-5b" not in {m.name for m in cfg.machines}


def test_each_board_has_its_own_hostname(cfg, files):
    image = files[IMAGE]
    names = {value(image, f"ROCKY_HOSTNAME:{m.name}") for m in cfg.machines}
    assert names == {m.hostname for m in cfg.machines} and len(names) == len(cfg.machines)


def test_product_distro_features_are_chosen_not_inherited(cfg, files):
    conf = files[f"{DISTRO}/conf/distro/{cfg.distro}.conf"]
    assert value(conf, "DISTRO_FEATURES_OPTED_OUT") == "*"
    features = value(conf, "DISTRO_FEATURES").replace("\\\n", " ").split()
    assert {"vulkan", "wayland", "opengl"} <= set(features)
    assert not {"x11", "pulseaudio", "ptest", "bluetooth", "wifi"} & set(features)
    assert "ptest" not in files["kas/debug.yml"]


def test_mesa_builds_only_what_the_image_uses(cfg, files):
    mesa = files[MESA]
    config = value(mesa, f"PACKAGECONFIG:class-target:{cfg.distro}").split()
    assert "vulkan" in config and len(config) == len(set(config))
    assert not {"x11", "zink", "virtio", "gallium-llvm", "video-codecs", "opencl"} & set(config)
    # panfrost + libclc come once, from meta-rockchip's bbappend for Rockchip machines.
    assert "panfrost" not in mesa.replace("# ", "#").split("PACKAGECONFIG:class-target")[1]
    assert value(mesa, f"GALLIUMDRIVERS_SOFTPIPE:class-target:{cfg.distro}") == ""


def test_gpu_stack_is_a_hard_dependency_of_the_image(files):
    installed = value(files[IMAGE], "IMAGE_INSTALL", r"\+=").replace("\\\n", " ").split()
    for package in ("mesa-vulkan-drivers", "vulkan-loader", "kernel-module-panthor"):
        assert package in installed


def test_model_licence_is_gated_by_license_flags(files):
    flag = value(files[MODEL], "LICENSE_FLAGS")
    assert flag == manifest.MODEL_LICENSE_FLAG
    assert f"LICENSE_FLAGS_ACCEPTED += '{flag}'" in value(
        files[MODEL], f"LICENSE_FLAGS_DETAILS[{flag}]"
    )
    accept = yaml.safe_load(files["kas/model-licence.yml"])["local_conf_header"]["model-licence"]
    assert accept.strip() == f'LICENSE_FLAGS_ACCEPTED:append = " {flag}"'
    image = files[IMAGE]
    assert value(image, "ROCKY_MODEL_LICENSE_FLAG") == flag
    assert "SKIP_RECIPE[rocky-vulkan-image]" in image
    # Nothing accepts it for the user: only the opt-in fragment.
    for path, text in files.items():
        if path.startswith("kas/") and path != "kas/model-licence.yml":
            assert "LICENSE_FLAGS_ACCEPTED" not in text, path
