"""ELF facts the QA checks need, from the file's magic and binutils' readelf (as insane.bbclass
reads them with objdump -p)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from rocky_vulkan.errors import UserError

_RPATH = re.compile(r"\((RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]")


def is_elf(path: Path) -> bool:
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def rpaths(path: Path) -> list[tuple[str, str]]:
    """(RPATH or RUNPATH, value) entries of an ELF file's dynamic section."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise UserError("readelf not found: install binutils")
    proc = subprocess.run(
        [readelf, "-d", "-W", str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise UserError(f"readelf -d {path} failed: {proc.stderr.strip()}")
    return [(m.group(1), m.group(2)) for m in _RPATH.finditer(proc.stdout)]
