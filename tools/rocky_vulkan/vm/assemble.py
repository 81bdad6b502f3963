"""The VM's disk: the Debian base, then what the image installs, each part from the rendered layer.

Every step reads the recipes (packaging.bbfile) instead of restating them, so a change to a
recipe's users, units, install or the image's post-processing reaches the VM unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from rocky_vulkan.config import Config
from rocky_vulkan.errors import UserError
from rocky_vulkan.layer import manifest
from rocky_vulkan.packaging import bbfile, oerules, trees
from rocky_vulkan.vm.base import say

# The recipes whose trees the image installs from this project, in install order.
RECIPES = ("rocky-board", "rocky-selftest", "rocky-llm")
IMAGE_RECIPE = Path("meta-rocky-vulkan/meta-rocky-vulkan/recipes-core/images/rocky-vulkan-image.bb")
# The image's ROOTFS_POSTPROCESS_COMMAND functions that shape the running system (the first,
# rocky_refuse_insecure, only stops a build).
POSTPROCESS = ("rocky_image_identity", "rocky_image_sshd", "rocky_image_network")
# Debian's own services the image has from oe-core (systemd-conf, openssh's socket or service).
SYSTEM_UNITS = ("systemd-networkd.service", "systemd-resolved.service", "ssh.service")
CONFIG = "/etc/rocky-selftest/config.json"
DISK_SIZE = "3G"  # mkfs.ext4 reads a bare number as blocks, not bytes


@dataclass(frozen=True)
class Inputs:
    """What one VM disk is made of besides the layer."""

    project: Path  # a folder holding the rendered meta-rocky-vulkan/ (render_layer)
    llama_tree: Path | None  # a DESTDIR of llama.cpp's install (root/usr/bin/llama-server ...)
    model: Path  # the GGUF put where config.json's model_path says
    hostname: str


def chroot(root: Path, *argv: str) -> None:
    proc = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"in the VM root: {shlex.join(argv)} failed:\n{proc.stdout}{proc.stderr}")


def _store(path: Path, overrides: dict[str, str]) -> tuple[bbfile.Recipe, bbfile.Store]:
    return trees.load_store(path, oerules.load(), overrides)


def render_layer(cfg: Config, ssh_keys: tuple[str, ...], dest: Path) -> Path:
    """The layers rendered as the user's build renders them, with these keys in
    image.ssh_authorized_keys (the image recipe's users, sshd and keys depend on them), into
    dest/meta-rocky-vulkan. Returns dest, a project folder for trees.recipe_file."""
    if ssh_keys:
        cfg = replace(cfg, image=replace(cfg.image, ssh_authorized_keys=ssh_keys))
    if dest.exists():
        shutil.rmtree(dest)
    for path, data in manifest.render_files(cfg).items():
        if path.startswith(f"{manifest.LAYER_DIR}/"):
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(data)
    return dest


def image_packages(project: Path) -> set[str]:
    """The packages the image recipe installs (IMAGE_INSTALL)."""
    _, store = _store(project / IMAGE_RECIPE, {})
    return set(store.words("IMAGE_INSTALL"))


def install_recipes(root: Path, project: Path, work: Path) -> list[str]:
    """Each recipe's do_install into the root; its users; returns the units to enable: those
    of the packages the image installs (rocky-llm-cluster only with a cluster: config)."""
    units: list[str] = []
    installed = image_packages(project)
    for name in RECIPES:
        path = trees.recipe_file(name, project)
        trees.install_from_files(path, oerules.load(), root, work / name)
        recipe, store = _store(path, {})
        for pkg in store.words("USERADD_PACKAGES"):
            params = store.get(f"USERADD_PARAM:{pkg}")
            for one in filter(None, (p.strip() for p in params.split(";"))):
                chroot(root, "useradd", *shlex.split(one))
        packages = store.words("SYSTEMD_PACKAGES") or [recipe.pn]
        for pkg in (p for p in packages if p in installed):
            if (store.get(f"SYSTEMD_AUTO_ENABLE:{pkg}") or "enable") == "enable":
                units += store.words(f"SYSTEMD_SERVICE:{pkg}")
    return units


def install_llama(root: Path, tree: Path) -> None:
    """CI's installed llama.cpp tree (DESTDIR root): its usr/ over the VM's."""
    if not (tree / "usr/bin/llama-server").is_file():
        raise UserError(f"{tree} has no usr/bin/llama-server: give the DESTDIR .ci/llama.sh made")
    shutil.copytree(tree / "usr", root / "usr", symlinks=True, dirs_exist_ok=True)
    chroot(root, "ldconfig")


def image_userspace(root: Path, inputs: Inputs) -> None:
    """The image's login user (EXTRA_USERS_PARAMS) and its rootfs post-process functions."""
    path = inputs.project / IMAGE_RECIPE
    overrides = {"IMAGE_ROOTFS": str(root), "ROCKY_HOSTNAME": inputs.hostname}
    _, store = _store(path, overrides)
    for command in filter(None, (c.strip() for c in store.get("EXTRA_USERS_PARAMS").split(";"))):
        argv = shlex.split(command)
        if argv[0] == "passwd-expire":  # extrausers.bbclass's own: expire the password now
            argv = ["passwd", "--expire", *argv[1:]]
        chroot(root, *argv)
    rules = oerules.load()
    for function in POSTPROCESS:
        script = trees.task_script(path, rules, function, overrides, parts=("",))
        trees.run_script(script, cwd=root)


# The self-test's measurement sizes, scaled for a CPU under TCG (the board's take hours there);
# the served settings (context, slots, port) stay the config's.
VM_WORKLOAD = {
    "ubatch_sizes": [64, 128],
    "prompt_tokens": 64,
    "repetitions": 1,
    "serve_request_prompt_tokens": 128,
    "serve_request_generated_tokens": 16,
}


def place_model(root: Path, model: Path) -> None:
    """The test model where config.json points, config.json's checksum made its, and the
    self-test's workload scaled (VM_WORKLOAD)."""
    config_path = root / CONFIG.lstrip("/")
    config = json.loads(config_path.read_text())
    target = root / config["model_path"].lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, target)
    target.chmod(0o644)
    config["model_sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    config.update(VM_WORKLOAD)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def enable_units(root: Path, units: list[str]) -> None:
    for unit in (*SYSTEM_UNITS, *units):
        if not re.fullmatch(r"[A-Za-z0-9@._-]+", unit):
            raise UserError(f"a unit name from the recipes is not a unit name: {unit!r}")
    proc = subprocess.run(
        ["systemctl", f"--root={root}", "enable", *SYSTEM_UNITS, *units],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise UserError(f"systemctl enable in the VM root failed:\n{proc.stderr}")


def make_disk(root: Path, disk: Path) -> None:
    tmp = disk.with_name(disk.name + ".tmp")
    tmp.unlink(missing_ok=True)
    proc = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "rocky-root", "-d", str(root), str(tmp), DISK_SIZE],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise UserError(f"mkfs.ext4 -d failed:\n{proc.stderr}")
    tmp.rename(disk)


def assemble(base: Path, out: Path, inputs: Inputs) -> Path:
    """A fresh copy of the base with the image's userspace, written as out/disk.img; the
    kernel and initrd beside it. Returns the disk."""
    out.mkdir(parents=True, exist_ok=True)
    root = out / "root"
    if root.exists():
        shutil.rmtree(root)
    say(f"copying the base into {root}")
    subprocess.run(["cp", "-a", str(base), str(root)], check=True)
    with tempfile.TemporaryDirectory(prefix="rocky-vm-") as work:
        units = install_recipes(root, inputs.project, Path(work))
    if inputs.llama_tree is not None:
        install_llama(root, inputs.llama_tree)
    image_userspace(root, inputs)
    place_model(root, inputs.model)
    enable_units(root, units)
    # Host keys and machine id of this disk, not the cached base's.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    chroot(root, "ssh-keygen", "-A")
    (root / "etc/machine-id").write_text("")
    say(f"enabled: {' '.join(units)}")
    for name in ("vmlinuz", "initrd.img"):
        (found,) = sorted((root / "boot").glob(f"{name}-*"))[-1:]
        shutil.copyfile(found, out / name)
    disk = out / "disk.img"
    make_disk(root, disk)
    shutil.rmtree(root)
    return disk
