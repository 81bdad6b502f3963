"""flash: every refusal, then a real `bmaptool copy` to a loop device, read back byte for byte.

Refusal logic is tested on lsblk JSON captured from the real lsblk (util-linux 2.38.1) on a host
with one free loop device, one loop device mounted as ext4, and the root disk
(tests/fixtures/lsblk/loops-and-root.json). The end-to-end tests need root and working loop
devices (`losetup`); elsewhere they skip."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import blockdev, flash, lsblk
from rocky_vulkan.host.bmap import bmap_for, parse_bmap, verify_device

from tests.helpers.project import FIXTURES

LSBLK = (FIXTURES / "lsblk/loops-and-root.json").read_text()
MIB = 1024 * 1024


def disks():
    return lsblk.parse_lsblk(LSBLK)


def reasons(device: str, image_size: int = MIB, force: bool = False) -> list[str]:
    disk = blockdev.find_target(disks(), device)
    return [r.reason for r in blockdev.refusals(disk, image_size, force=force)]


def test_root_disk_is_refused_even_with_force():
    (why,) = reasons("/dev/vda", force=True)
    assert "holds the running system (/)" in why


def test_mounted_disk_is_refused_even_with_force():
    (why,) = reasons("/dev/loop1", force=True)
    assert why == "/dev/loop1 is mounted at /tmp/up-mnt"
    disk = blockdev.find_target(disks(), "/dev/loop1")
    assert "sudo umount /tmp/up-mnt" in blockdev.refusals(disk, MIB)[0].fix


def test_non_removable_needs_force():
    assert reasons("/dev/loop0") == ["/dev/loop0 is not a removable disk (loop, no transport)"]
    assert reasons("/dev/loop0", force=True) == []


def test_image_must_fit():
    (why,) = reasons("/dev/loop0", image_size=65 * MIB, force=True)
    assert "does not fit on /dev/loop0" in why


def test_removable_card_is_accepted_without_force():
    # The captured JSON with loop0 edited to look like a USB card reader (rm/hotplug true).
    data = json.loads(LSBLK)
    data["blockdevices"][0].update(rm=True, hotplug=True, tran="usb", model="SD/MMC")
    card = blockdev.find_target(lsblk.parse_lsblk(json.dumps(data)), "/dev/loop0")
    assert card.removable
    assert blockdev.refusals(card, MIB) == []


def test_partition_and_unknown_device_are_refused():
    # A partition as lsblk nests it under its disk (captured tree, plus one child node).
    data = json.loads(LSBLK)
    data["blockdevices"][0]["children"] = [
        dict(data["blockdevices"][0], name="loop0p1", path="/dev/loop0p1", type="part")
    ]
    with pytest.raises(UserError, match="is a part, not a whole disk: flash the disk /dev/loop0"):
        blockdev.find_target(lsblk.parse_lsblk(json.dumps(data)), "/dev/loop0p1")
    with pytest.raises(UserError, match="flash --list"):
        blockdev.find_target(disks(), "/dev/sdz")


def test_a_mounted_partition_refuses_its_disk():
    data = json.loads(LSBLK)
    data["blockdevices"][0]["children"] = [
        dict(
            data["blockdevices"][0],
            name="loop0p2",
            path="/dev/loop0p2",
            type="part",
            mountpoints=["/media/u/root"],
        )
    ]
    disk = blockdev.find_target(lsblk.parse_lsblk(json.dumps(data)), "/dev/loop0")
    assert [r.overridable for r in blockdev.refusals(disk, MIB, force=True)] == [False]


def test_candidates_list_every_whole_disk_with_its_reasons():
    listed = {d.path: why for d, why in blockdev.candidates(disks())}
    assert set(listed) == {"/dev/loop0", "/dev/loop1", "/dev/vda"}  # zram0 has size 0
    assert any("running system" in r.reason for r in listed["/dev/vda"])


def make_image(tmp_path: Path, size: int = 8 * MIB) -> tuple[Path, bytes]:
    """A sparse .wic with data in a few places, its .wic.bmap (real bmaptool) and .wic.gz."""
    rng = random.Random(5)
    raw = bytearray(size)
    for offset, length in ((0, 17 * 512), (MIB, 64 * 1024), (5 * MIB + 4096, 300_000)):
        raw[offset : offset + length] = rng.randbytes(length)
    wic = tmp_path / "rocky-vulkan-image-rock-5-itx.rootfs.wic"
    with open(wic, "wb") as f:  # write only the data regions so the file stays sparse
        f.truncate(size)
        for offset, length in ((0, 17 * 512), (MIB, 64 * 1024), (5 * MIB + 4096, 300_000)):
            f.seek(offset)
            f.write(raw[offset : offset + length])
    bmap = wic.with_name(wic.name + ".bmap")  # x.wic.bmap, as Yocto names it
    subprocess.run(["bmaptool", "create", "-o", str(bmap), str(wic)], check=True)
    gz = wic.with_name(wic.name + ".gz")
    with open(wic, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return gz, bytes(raw)


need_bmaptool = pytest.mark.needs_tool("bmaptool", "apt-get install bmap-tools")


@need_bmaptool
def test_bmap_naming_and_parse(tmp_path):
    gz, raw = make_image(tmp_path)
    assert bmap_for(gz).name == "rocky-vulkan-image-rock-5-itx.rootfs.wic.bmap"
    bmap = parse_bmap(bmap_for(gz))
    assert bmap.image_size == len(raw) and bmap.block_size == 4096
    assert bmap.checksum_type == "sha256" and all(r.checksum for r in bmap.ranges)
    assert 0 < bmap.mapped_bytes < len(raw)
    (tmp_path / "other.wic.gz").write_bytes(b"")
    with pytest.raises(UserError, match="no block map"):
        bmap_for(tmp_path / "other.wic.gz")


def _loop_usable() -> str | None:
    if os.geteuid() != 0:
        return "loop devices need root"
    if not shutil.which("losetup"):
        return "no losetup"
    probe = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"losetup -f failed: {probe.stderr.strip()}"


need_loop = pytest.mark.skipif(_loop_usable() is not None, reason=str(_loop_usable()))


@pytest.fixture
def loopdev(tmp_path):
    """Attach zero-filled backing files as loop devices; detach them (only ours) afterwards."""
    attached: list[str] = []
    mounted: list[Path] = []

    def attach(size: int, name: str = "disk") -> str:
        backing = tmp_path / f"{name}.img"
        with open(backing, "wb") as f:
            f.truncate(size)
        dev = subprocess.run(
            ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=True
        ).stdout.strip()
        attached.append(dev)
        return dev

    attach.mounted = mounted  # type: ignore[attr-defined]
    yield attach
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=False)
    for dev in attached:
        subprocess.run(["losetup", "-d", dev], check=False)


def read_dev(dev: str, size: int) -> bytes:
    with open(dev, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f.read(size)


@need_loop
@need_bmaptool
def test_flash_to_loop_device_byte_for_byte(tmp_path, loopdev, capsys):
    gz, raw = make_image(tmp_path)
    dev = loopdev(16 * MIB)
    name = Path(dev).name
    prompts = []
    rc = flash.flash(gz, dev, force=True, ask=lambda p: prompts.append(p) or name)
    assert rc == 0
    assert f"Type the device name '{name}'" in prompts[0]
    assert read_dev(dev, len(raw)) == raw
    assert read_dev(dev, 16 * MIB)[len(raw) :] == bytes(16 * MIB - len(raw))
    assert "verified:" in capsys.readouterr().out
    # The read-back really reads the medium: corrupt one mapped byte and it is caught.
    with open(dev, "r+b") as f:
        f.seek(MIB + 10)
        f.write(b"\xff" if raw[MIB + 10] != 0xFF else b"\x00")
        f.flush()
        os.fsync(f.fileno())
    bad = verify_device(Path(dev), parse_bmap(bmap_for(gz)))
    assert len(bad) == 1 and bad[0].startswith("blocks 256-")


@need_loop
@need_bmaptool
def test_real_refusals_write_nothing(tmp_path, loopdev):
    gz, raw = make_image(tmp_path)
    dev = loopdev(16 * MIB)
    with pytest.raises(UserError, match="not a removable disk.*add --force"):
        flash.flash(gz, dev, ask=lambda p: Path(dev).name)
    with pytest.raises(UserError, match="not confirmed; nothing was written"):
        flash.flash(gz, dev, force=True, ask=lambda p: "yes")
    small = loopdev(4 * MIB, "small")
    with pytest.raises(UserError, match="does not fit"):
        flash.flash(gz, small, force=True, yes=True)
    assert read_dev(dev, 16 * MIB) == bytes(16 * MIB)
    assert read_dev(small, 4 * MIB) == bytes(4 * MIB)
    # The command line: refusals exit 2 without writing; with --force --yes it writes.
    assert main(["flash", str(gz), dev]) == UserError.exit_code
    assert read_dev(dev, 16 * MIB) == bytes(16 * MIB)
    assert main(["flash", str(gz), dev, "--force", "--yes"]) == 0
    assert read_dev(dev, len(raw)) == raw


@need_loop
@need_bmaptool
@pytest.mark.needs_tool("mkfs.ext4", "Debian: e2fsprogs")
def test_real_mounted_device_is_refused(tmp_path, loopdev):
    gz, _ = make_image(tmp_path)
    dev = loopdev(32 * MIB, "mounted")
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", dev, str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("mount not permitted here")
    loopdev.mounted.append(mnt)
    before = read_dev(dev, 64 * 1024)
    with pytest.raises(UserError, match=f"mounted at {mnt}"):
        flash.flash(gz, dev, force=True, yes=True)
    assert read_dev(dev, 64 * 1024) == before


@need_bmaptool
def test_real_system_disk_is_refused(tmp_path):
    gz, _ = make_image(tmp_path)
    system = [
        d
        for d in lsblk.parse_lsblk(lsblk.run_lsblk())
        if set(d.all_mountpoints()) & set(blockdev.SYSTEM_MOUNTS)
    ]
    if not system:
        pytest.skip("lsblk shows no disk holding / (container root)")
    with pytest.raises(UserError, match="holds the running system"):
        flash.flash(gz, system[0].path, force=True, yes=True)


def test_cli_list_shows_real_disks(capsys):
    assert main(["flash", "--list"]) == 0
    assert "disks (lsblk)" in capsys.readouterr().out
