"""Names the config must not give a machine, a distro or a repo, and why.

Render's own outputs come from the template tree (manifest.collisions): a machine called `base`
would be kas/base.yml, which render writes for itself. The upstream names are those of the layers
at the config's pins, so a name of ours never shadows theirs (or theirs ours: bitbake reads the
first conf/machine/<name>.conf or conf/distro/<name>.conf on BBPATH).
"""

from __future__ import annotations

from typing import Any

from rocky_vulkan.config import PATCH_DIR_NAME
from rocky_vulkan.layer import manifest

# `ls conf/machine conf/distro` of each layer at the pins of rocky-vulkan.yaml (meta-rockchip
# 9d02575b, openembedded-core ef022bf8, meta-arm caa36c53, meta-yocto 904846ae), including the
# BSP layers of those repos the config does not enable (a user may add them to repos[].layers).
UPSTREAM_MACHINES = {
    "meta-rockchip": """firefly-rk3288 marsboard-rk3066 nanopc-t6 nanopi-m4-2gb nanopi-m4
        nanopi-m4b nanopi-r2s nanopi-r4s orangepi-3b orangepi-5-plus radxa-zero-3e radxa-zero-3w
        radxarock roc-rk3308-cc roc-rk3328-cc rock-3a rock-4c-plus rock-5a rock-5b rock-pi-4a
        rock-pi-4b-plus rock-pi-4b rock-pi-4c rock-pi-e rock-pi-s rock2-square rock64
        soquartz-model-a tinker-board-s tinker-board vyasa-rk3288""",
    "openembedded-core (meta)": """qemuarm qemuarm64 qemuarmv5 qemuloongarch64 qemumips
        qemumips64 qemuppc qemuppc64 qemuriscv32 qemuriscv64 qemux86-64 qemux86""",
    "meta-arm": "qemuarm-secureboot qemuarm64-secureboot",
    "meta-arm-bsp": """corstone1000-a320-fvp corstone1000-fvp corstone1000-mps3 fvp-base juno
        musca-b1 musca-s1 rdn2 rdv2 sbsa-ref""",
    "meta-yocto-bsp": "beaglebone-yocto genericarm64 genericx86-64 genericx86",
}
UPSTREAM_DISTROS = {
    "meta-poky": "poky poky-altcfg poky-bleeding poky-tiny",
    # nodistro: bitbake.conf's DISTRO when none is set; defaultsetup.conf sits in conf/distro/.
    "openembedded-core (meta)": "nodistro defaultsetup",
}

# This repository's key under repos: in kas/base.yml (manifest.PROJECT_REPO), and the folders of
# the project kas would clone a repo into (kas clones repos[].name into KAS_WORK_DIR/<name>, the
# project folder): the render's outputs, our patches and kas's build folder.
PROJECT_FOLDERS = (*manifest.OUTPUT_DIRS, PATCH_DIR_NAME, manifest.KAS_BUILD_DIR)


def _upstream(table: dict[str, str]) -> dict[str, str]:
    return {name: layer for layer, names in table.items() for name in names.split()}


def _name_reason(kind: str, name: str, upstream: dict[str, str], fix: str) -> str | None:
    """Why `name` cannot be our `kind` ("machine", "distro"): an upstream one of that name, or a
    file render writes for something else; None when it is free."""
    layer = _upstream(upstream).get(name)
    if layer:
        return (
            f"{name!r} is a {kind} of {layer}: bitbake would read one of the two "
            f"conf/{kind}/{name}.conf files for both; {fix}"
        )
    clashes = manifest.collisions(kind, name)
    if clashes:
        path, template = clashes[0]
        return (
            f"{name!r} is reserved: its file would be {path}, which render writes from "
            f"templates/{template}; pick another name, e.g. my-{name}"
        )
    return None


def machine_reason(name: str) -> str | None:
    """Why `name` cannot be a machine of the config, or None."""
    return _name_reason(
        "machine", name, UPSTREAM_MACHINES, f"give yours its own name, e.g. {name}-rocky"
    )


def distro_reason(name: str) -> str | None:
    """Why `name` cannot be the config's distro, or None."""
    return _name_reason(
        "distro", name, UPSTREAM_DISTROS, "keep rocky-vulkan or pick a name of your own"
    )


def repo_reason(name: str) -> str | None:
    """Why `name` cannot be a repos[].name, or None."""
    if name == manifest.PROJECT_REPO:
        return (
            f"{name!r} is this repository's own key under repos: in kas/base.yml (a second "
            "entry would replace it, and our layers would drop out of the build); "
            "name the repo after its upstream project"
        )
    if name in PROJECT_FOLDERS:
        return (
            f"{name!r} is reserved: kas clones a repo into the project's {name}/ folder, "
            "which render or the build uses; name the repo after its upstream project"
        )
    return None


def problems(data: dict[str, Any]) -> list[str]:
    """The reserved names in a config's (schema-valid) data, as 'field: reason' lines."""
    found = []
    for name in sorted(data["machines"]):
        reason = machine_reason(name)
        if reason:
            found.append(f"machines.{name}: {reason}")
    reason = distro_reason(data["yocto"]["distro"])
    if reason:
        found.append(f"yocto.distro: {reason}")
    for i, repo in enumerate(data["repos"]):
        reason = repo_reason(repo["name"])
        if reason:
            found.append(f"repos[{i}].name: {reason}")
    reason = repo_reason(data["vulkan_cts"]["repo"]["name"])
    if reason:
        found.append(f"vulkan_cts.repo.name: {reason}")
    return found
