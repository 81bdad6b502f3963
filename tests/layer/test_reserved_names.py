"""The upstream machine and distro names the config refuses (layer/reserved.py), checked against
something other than that table: a few names written here by hand, and, with the upstream git
mirrors, every conf/machine and conf/distro file of the pinned commits.

The hostile config cases (tests/helpers/hostile_files.py) take their names from the table, so on
their own they would stay green with a name dropped from it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.config import ConfigError, load_config
from rocky_vulkan.layer import reserved

from tests.helpers.project import ROOT

# Written here, not derived: the boards ours are built on, and the names a user tries first.
MUST_REFUSE_MACHINES = ("rock-5a", "rock-5b", "orangepi-5-plus", "nanopc-t6", "qemuarm64",
                        "qemux86-64", "genericarm64")  # fmt: skip
MUST_REFUSE_DISTROS = ("poky", "nodistro", "poky-tiny")

# Where each table entry lives: (the repo's name under ROCKY_UPSTREAM_MIRRORS, folder, suffix).
PLACES = {
    ("machine", "meta-rockchip"): ("meta-rockchip", "conf/machine"),
    ("machine", "openembedded-core (meta)"): ("openembedded-core", "meta/conf/machine"),
    ("machine", "meta-arm"): ("meta-arm", "meta-arm/conf/machine"),
    ("machine", "meta-arm-bsp"): ("meta-arm", "meta-arm-bsp/conf/machine"),
    ("machine", "meta-yocto-bsp"): ("meta-yocto", "meta-yocto-bsp/conf/machine"),
    ("distro", "meta-poky"): ("meta-yocto", "meta-poky/conf/distro"),
    ("distro", "openembedded-core (meta)"): ("openembedded-core", "meta/conf/distro"),
}


def _table(kind: str) -> dict[str, set[str]]:
    table = reserved.UPSTREAM_MACHINES if kind == "machine" else reserved.UPSTREAM_DISTROS
    return {layer: set(names.split()) for layer, names in table.items()}


def _all(kind: str) -> set[str]:
    return set().union(*_table(kind).values())


def test_the_boards_ours_are_built_on_are_reserved():
    assert set(MUST_REFUSE_MACHINES) <= _all("machine")
    assert set(MUST_REFUSE_DISTROS) <= _all("distro")


@pytest.mark.parametrize("name", MUST_REFUSE_MACHINES)
def test_config_refuses_an_upstream_machine_name(project, name):
    path = project / "rocky-vulkan.yaml"
    text = path.read_text()
    cfg = load_config(path)
    old = cfg.default_machine
    path.write_text(re.sub(rf"(?m)^(\s*){re.escape(old)}:$", rf"\g<1>{name}:", text, count=1)
                    .replace(f"default_machine: {old}", f"default_machine: {name}"))  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(f"{name!r} is a machine of")):
        load_config(path)


def _pins() -> dict[str, str]:
    lock = (ROOT / "kas/base.lock.yml").read_text()
    return dict(re.findall(r"(?m)^    ([\w-]+):\n      commit: ([0-9a-f]{40})$", lock))


@pytest.mark.skipif(
    not os.environ.get("ROCKY_UPSTREAM_MIRRORS"),
    reason="set ROCKY_UPSTREAM_MIRRORS: git mirrors named as tools/scripts/bitbake-env.sh wants",
)
@pytest.mark.parametrize("place", sorted(PLACES), ids=lambda p: f"{p[0]}-{p[1]}")
def test_table_matches_the_pinned_upstream_layers(place):
    kind, layer = place
    repo, folder = PLACES[place]
    git = Path(os.environ["ROCKY_UPSTREAM_MIRRORS"]) / repo
    commit = _pins()[repo]
    listing = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(git), "ls-tree", "--name-only",
         f"{commit}:{folder}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found = {n.removesuffix(".conf") for n in listing if n.endswith(".conf")}
    expected = _table(kind)[layer]
    if (kind, layer) == ("distro", "openembedded-core (meta)"):
        found.add("nodistro")  # bitbake.conf's DISTRO when none is set: no file of its own
    assert expected == found
