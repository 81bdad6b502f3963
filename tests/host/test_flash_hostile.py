"""flash against hostile device lists, block maps, images, mount points and names (issue 22):
every case of tests/helpers/hostile_flash.py is refused with a message naming the cause, or held
(shown as text, written and verified), and never writes to a device it refused.

lsblk's output is injected by a small `lsblk` script first on PATH: the real lsblk cannot report a
model named `[red]card`, a size of "16G" or a mount point holding `; echo X` on demand. Everything
else is real: the CLI, `bmaptool create` and `bmaptool copy`, FIFOs, symlinks, /dev/zero and (as
root) a loop device that is read back after each case."""

from __future__ import annotations

import pytest

from tests.helpers import adversary

CASES = adversary.area_cases("flash")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_flash_input(case):
    adversary.assert_good(case)
