"""flash against hostile device lists, block maps, images, mount points and names (issue 22):
every case of tests/helpers/hostile_flash.py is refused with a message naming the cause, or held
(shown as text, written and verified), and never writes to a device it refused.

lsblk's output is injected by a small `lsblk` script first on PATH: the real lsblk cannot report a
model named `[red]card`, a size of "16G" or a mount point holding `; echo X` on demand. Everything
else is real: the CLI, `bmaptool create` and `bmaptool copy`, FIFOs, symlinks, /dev/zero and (as
root) a loop device that is read back after each case."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan import shellquote
from rocky_vulkan.host import blockdev, build, lsblk

from tests.helpers import adversary

CASES = adversary.area_cases("flash")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_flash_input(case):
    adversary.assert_good(case)


# Quoted hints, checked by the shell that will read them.
WORDS = ["a b", "x;echo X", "$(id)", "`id`", "it's", "a\\b", "*", "-rf", "a\nb", "\x1b[2J", "é"]
WORDS += ["\udcff", "\u202e", ""]


def bash_words(line: str) -> list[bytes]:
    proc = subprocess.run(
        ["bash", "-c", f"shopt -s failglob\nset -- {line}\nprintf '%s\\0' \"$@\""],
        capture_output=True,
        check=True,
        timeout=5,
    )
    return proc.stdout.split(b"\0")[:-1]


@pytest.mark.parametrize("word", WORDS, ids=repr)
def test_shellquote_is_one_word_and_printable(word):
    quoted = shellquote.quote(word)
    assert quoted.isprintable()
    assert bash_words(quoted) == [word.encode("utf-8", "surrogateescape")]


def test_build_hints_are_quoted():
    wic = Path("/srv/my builds/x;rm -rf ~/$(id).wic.gz")
    hint = build.flash_hint(wic)
    assert bash_words(hint) == [b"rocky-vulkan", b"flash", os.fsencode(wic), b"/dev/sdX"]


def test_umount_hint_never_takes_a_path_for_an_option():
    assert bash_words(blockdev.umount_hint("-f")) == [b"sudo", b"umount", b"--", b"-f"]
    assert bash_words(blockdev.umount_hint("/media/u/a b")) == [
        b"sudo",
        b"umount",
        b"/media/u/a b",
    ]


def test_real_lsblk_output_reads_by_exact_shape():
    """The host's own lsblk (util-linux 2.37+) passes the exact-shape reader unchanged."""
    for disk in lsblk.read_disks():
        assert disk.path.startswith("/dev/") and 0 <= disk.size < 2**64
