"""What real bitbake makes of the committed layers, per board: `bitbake -e` values and their
variable history (which file set them), `bitbake -n` of the image, and the licence gate.

Needs the dumps of tools/scripts/bitbake-env.sh (bitbake 2.18 and the five pinned layers, offline
from
local mirrors; ~10 min per board on 2 cores): set ROCKY_BITBAKE_ENV_DIR to its OUT folder.
Without it every test here skips."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.config import Machine, load_config
from rocky_vulkan.layer import manifest

from tests.helpers.project import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.needs_bitbake_dumps]
CFG = load_config(ROOT / "rocky-vulkan.yaml")
BSP = manifest.BSP_LAYER


@pytest.fixture(scope="module")
def dumps() -> Path:
    out = Path(os.environ["ROCKY_BITBAKE_ENV_DIR"])
    tree = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD:meta-rocky-vulkan"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    recorded = (out / "layer-tree").read_text().strip() if (out / "layer-tree").exists() else ""
    assert recorded == tree, (
        f"{out} holds dumps of meta-rocky-vulkan tree {recorded or '(none)'}, not of HEAD's "
        f"{tree}: rerun tools/scripts/bitbake-env.sh"
    )
    return out


def variable(env: str, name: str) -> tuple[str, list[str]]:
    """(final value, history lines '<op> <file>:<line>') of NAME in a `bitbake -e` dump."""
    match = re.search(r"^(?:export )?" + re.escape(name) + r'="(.*)"$', env, re.M)
    assert match, f"{name} not in the dump"
    heads = [env.rfind(f"\n# ${name}{end}", 0, match.start()) for end in ("\n", " [")]
    history = []
    if max(heads) >= 0:
        block = env[max(heads) : match.start()]
        history = re.findall(r"^#   (\S+ \S+:\d+)$", block, re.M)
    # Weak defaults (set?) and documentation.conf's [doc] are not settings.
    return match.group(1), [
        h for h in history if not h.startswith("set? ") and "/documentation.conf:" not in h
    ]


def read(dumps: Path, machine: Machine, name: str) -> str:
    return (dumps / machine.name / name).read_text(errors="replace")


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_board_settings_come_from_our_machine_file(dumps, machine):
    env = read(dumps, machine, "global.env")
    ours = f"{BSP}/conf/machine/{machine.name}.conf"
    for name, expected in (
        ("KERNEL_DEVICETREE", machine.devicetree),
        ("UBOOT_MACHINE", machine.uboot_defconfig),
    ):
        value, history = variable(env, name)
        assert value == expected
        # Only our machine file sets it: no other layer's file of the same name was read.
        assert history and all(ours in h for h in history), (name, history)
    value, history = variable(env, "MACHINE_EXTRA_RDEPENDS")
    assert set(machine.firmware) <= set(value.split())
    assert any(ours in line for line in history), history


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_product_distro_features(dumps, machine):
    features = variable(read(dumps, machine, "global.env"), "DISTRO_FEATURES")[0].split()
    assert {"vulkan", "wayland", "opengl", "systemd"} <= set(features)
    assert not {"x11", "pulseaudio", "ptest"} & set(features)


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_mesa_is_the_pin_with_the_patch_and_only_panvk(dumps, machine):
    env = read(dumps, machine, "mesa.env")
    assert variable(env, "PV")[0] == CFG.mesa.version
    src = variable(env, "SRC_URI")[0].split()
    assert src[0] == (
        f"https://archive.mesa3d.org/mesa-{CFG.mesa.version}.tar.xz;sha256sum={CFG.mesa.sha256}"
    )
    assert [f"file://{p}" for p in CFG.mesa.patches] == src[1:]
    config = variable(env, "PACKAGECONFIG")[0].split()
    for needed in ("panfrost", "libclc", "vulkan"):
        assert config.count(needed) == 1, config
    assert not {"x11", "zink", "virtio", "gallium-llvm"} & set(config)
    native = read(dumps, machine, "mesa-tools-native.env")
    assert variable(native, "PV")[0] == CFG.mesa.version


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_llama_cpp_is_the_pin(dumps, machine):
    env = read(dumps, machine, "llama-cpp.env")
    src = variable(env, "SRC_URI")[0].split()
    assert src[0].startswith("git://" + CFG.llama_cpp.url.split("://", 1)[1] + ";")
    assert [f"file://{p}" for p in CFG.llama_cpp.patches] == [
        s for s in src if s.endswith(".patch")
    ]
    assert variable(env, "SRCREV")[0] == CFG.llama_cpp.srcrev
    cmake = variable(env, "EXTRA_OECMAKE")[0].split()
    for option in (
        "-DGGML_VULKAN=ON",
        f"-DLLAMA_BUILD_NUMBER={CFG.llama_cpp.build_number}",
        f"-DLLAMA_BUILD_COMMIT={CFG.llama_cpp.srcrev[:7]}",
    ):
        assert option in cmake


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_image_hostname_and_dry_run(dumps, machine):
    env = read(dumps, machine, "rocky-vulkan-image.env")
    assert variable(env, "ROCKY_HOSTNAME")[0] == machine.hostname
    assert variable(env, "IMAGE_FSTYPES")[0].split() == ["wic.gz", "wic.bmap"]
    dry = read(dumps, machine, "dry-run.txt")
    assert not re.search(r"^ERROR:", dry, re.M), dry[-2000:]
    assert re.search(r"^NOTE: Tasks Summary: Attempted \d+ tasks", dry, re.M), dry[-2000:]


def test_image_is_refused_until_the_model_licence_is_accepted(dumps):
    # tools/scripts/bitbake-env.sh checks this on the first machine only (another full parse).
    text = (dumps / "no-licence.txt").read_text(errors="replace")
    assert f'MACHINE              = "{CFG.machines[0].name}"' not in text  # skipped before
    assert "the model's licence is not accepted" in text
    assert f"LICENSE_FLAGS_ACCEPTED += '{manifest.MODEL_LICENSE_FLAG}'" in text


@pytest.mark.parametrize("machine", CFG.machines, ids=lambda m: m.name)
def test_model_is_fetched_at_a_pinned_revision_by_sha256(dumps, machine):
    env = read(dumps, machine, "rocky-model.env")
    src = variable(env, "SRC_URI")[0].split()
    assert src[0] == f"{CFG.model.url};downloadfilename={CFG.model.filename}"
    # resolve/<40-hex revision>/, not a branch: the sha256 below cannot drift with the repo.
    assert re.search(r"/resolve/[0-9a-f]{40}/", src[0]), src[0]
    assert "file://MODEL-LICENSE" in src
    # `bitbake -e` prints flags only in the history: "#   set <file>:<line>" followed by
    # '#     [sha256sum] "<value>"'.
    flag = re.search(r'^#   set (\S+):\d+\n#     \[sha256sum\] "([0-9a-f]+)"$', env, re.M)
    assert flag, "no SRC_URI[sha256sum] in the history"
    assert flag.group(1).endswith("/rocky-model_1.0.bb") and flag.group(2) == CFG.model.sha256
    assert variable(env, "LICENSE_FLAGS")[0] == manifest.MODEL_LICENSE_FLAG
