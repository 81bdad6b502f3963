"""Checks of patches/mesa-panvk-shared-tls-wls.patch, the panvk priv-heap fix.

No Mesa source is reachable from CI, so the fast tests check what the patch file itself can show:
it is `git format-patch` output with the OE headers, git parses it, it touches only the panvk CSF
allocation code, its pre-image blob ids are those of the tree it was verified against (Mesa
26.2.0-rc1 as imported in leegao/mesa-26.2 commit 3c34d70, whose six touched files 26.2.0 keeps;
see docs/verification/mesa-patch.md), and the layer applies it to the checked release.

The slow test needs a Mesa tree: set ROCKY_MESA_SRC to its directory (for instance one made by
`tools/rocky_vulkan/sim/mesa-panvk-build.sh build`, under
$ROCKY_CACHE/mesa/root-sid/work/mesa-*/src). It
checks that the files there are the verified ones and that `git apply --check` accepts the patch
(git apply never applies with fuzz).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.project import ROOT as REPO

PATCH = REPO / "patches" / "mesa-panvk-shared-tls-wls.patch"
INSTRUMENTATION = REPO / "tools/rocky_vulkan/sim/patches/mesa-panvk-privva-instrumentation.patch"

# Blob ids of the touched files in the verified tree (git ls-tree of leegao/mesa-26.2 3c34d70).
VERIFIED_BLOBS = {
    "src/panfrost/vulkan/csf/panvk_cmd_buffer.h": "eeed84936d9377d24f0845d078db71e871f8a5dc",
    "src/panfrost/vulkan/csf/panvk_vX_cmd_buffer.c": "2d3973d61d111a70c548e78d0038378d42a76047",
    "src/panfrost/vulkan/csf/panvk_vX_cmd_dispatch.c": "ef489ff88d9839e9568600d8543f03348b2a844b",
    "src/panfrost/vulkan/csf/panvk_vX_cmd_precomp.c": "b697f82142f629523f1a93dad15e078f0cc00ea6",
    "src/panfrost/vulkan/panvk_device.h": "c81d537609ab3d07d3c33de0d976b293f50628e5",
    "src/panfrost/vulkan/panvk_vX_device.c": "5e54c6888c5c5760f5c9cd369866cc6141e3dd33",
}

DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
INDEX_LINE = re.compile(r"^index ([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})(?: \d+)?$", re.M)


def _text() -> str:
    return PATCH.read_text()


def test_patch_is_format_patch_with_oe_headers() -> None:
    text = _text()
    assert re.match(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\n", text)
    assert re.search(r"^Subject: \[PATCH\] panvk/csf: ", text, re.M)
    message = text.split("\n---\n", 1)[0]
    assert re.search(r"^Upstream-Status: (Pending|Submitted)", message, re.M)
    assert re.search(r"^Signed-off-by: .+ <.+@.+>$", message, re.M)
    # The commit message carries the measured numbers, not a placeholder.
    assert "@@NUMBERS@@" not in message
    assert re.search(r"MiB", message)


@pytest.mark.needs_tool("git")
def test_git_parses_patch_and_it_touches_only_panvk_csf_allocation() -> None:
    out = subprocess.run(
        ["git", "apply", "--numstat", str(PATCH)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    touched = sorted(line.split("\t")[2] for line in out.stdout.splitlines())
    assert touched == sorted(VERIFIED_BLOBS)


def test_preimage_blobs_are_the_verified_tree() -> None:
    text = _text()
    files = [a for a, _ in DIFF_HEADER.findall(text)]
    pre = [p for p, _ in INDEX_LINE.findall(text)]
    assert len(files) == len(pre) == len(VERIFIED_BLOBS)
    for path, blob in zip(files, pre, strict=True):
        assert VERIFIED_BLOBS[path] == blob, f"{path}: patch made against another version"


def test_instrumentation_is_not_shipped() -> None:
    shipped = _text()
    assert "panvk-privva" not in shipped
    assert "Upstream-Status: Inappropriate" in INSTRUMENTATION.read_text()
    assert not (REPO / "patches" / INSTRUMENTATION.name).exists()


def _git_blob(path: Path) -> str:
    out = subprocess.run(
        ["git", "hash-object", "--no-filters", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.slow
@pytest.mark.needs_mesa_src
def test_patch_applies_without_fuzz_to_mesa_tree(tmp_path: Path) -> None:
    src = os.environ["ROCKY_MESA_SRC"]
    tree = tmp_path / "mesa"
    for rel, blob in VERIFIED_BLOBS.items():
        original = Path(src) / rel
        assert _git_blob(original) == blob, f"{rel} in {src} is not the verified version"
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(original, tree / rel)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    out = subprocess.run(
        ["git", "apply", "--check", "-v", str(PATCH)], capture_output=True, text=True, cwd=tree
    )
    assert out.returncode == 0, out.stderr
    checked = re.findall(r"^Checking patch (\S+)\.\.\.$", out.stderr, re.M)
    assert sorted(checked) == sorted(VERIFIED_BLOBS)


# The Mesa releases whose six touched files are known to be the verified ones
# (docs/verification/mesa-patch.md, "The pin"); 26.2.4 and later already carry 81db71cfba0.
CHECKED_RELEASES = {"26.2.0"}


def test_layer_applies_the_patch_to_a_checked_release() -> None:
    from rocky_vulkan.config import load_config

    cfg = load_config(REPO / "rocky-vulkan.yaml")
    assert PATCH.name in cfg.mesa.patches
    assert cfg.mesa.version in CHECKED_RELEASES, (
        f"Mesa {cfg.mesa.version} is pinned, but the panvk patch was checked for "
        f"{sorted(CHECKED_RELEASES)} only: re-check it (docs/verification/mesa-patch.md)"
    )
    mesa = REPO / "meta-rocky-vulkan" / "meta-rocky-vulkan-distro" / "recipes-graphics" / "mesa"
    assert (mesa / "files" / PATCH.name).read_bytes() == PATCH.read_bytes()
    bbappend = (mesa / "mesa.bbappend").read_text()
    assert f"file://{PATCH.name}" in bbappend
    assert (
        f'PV:{cfg.distro} = "{cfg.mesa.version}"' in (mesa / "rocky-mesa-version.inc").read_text()
    )
