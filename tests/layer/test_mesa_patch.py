"""Checks of the Mesa patch series (patches/mesa-000N-*.patch), the panvk priv-heap fix.

The series, applied in this order: 0001 backports upstream 81db71cfba0 (compute jobs take the TLS
size of the shared allocation; in Mesa 26.2.4), 0002 shares one TLS buffer per device, 0003 reuses
one WLS buffer per command buffer. It replaced the single mesa-panvk-shared-tls-wls.patch
(docs/verification/mesa-patch.md, "The series").

No Mesa source is reachable from CI, so the fast tests check what the patch files themselves can
show: each is `git format-patch` output with the project's author line and the OE headers, git
parses it, the series touches only the panvk CSF allocation code, the first patch touching a file
starts from the blob of the tree it was verified against (Mesa 26.2.0-rc1 as imported in
leegao/mesa-26.2 commit 3c34d70, whose touched files 26.2.0 keeps; see
docs/verification/mesa-patch.md) and each later one from the previous patch's result, and the
layer applies the series, in order, to the checked release.

The slow test needs a Mesa tree: set ROCKY_MESA_SRC to its directory (for instance one made by
`tools/rocky_vulkan/sim/mesa-panvk-build.sh build`, under
$ROCKY_CACHE/mesa/root-sid/work/mesa-*/src). It checks that the files there are the verified ones
and that `git apply --check` accepts each patch in turn (git apply never applies with fuzz).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.project import ROOT as REPO

PATCH_DIR = REPO / "patches"
SERIES = (
    PATCH_DIR / "mesa-0001-panvk-csf-compute-jobs-tls-size.patch",
    PATCH_DIR / "mesa-0002-panvk-csf-device-shared-tls.patch",
    PATCH_DIR / "mesa-0003-panvk-csf-reuse-wls-buffer.patch",
)
INSTRUMENTATION = REPO / "tools/rocky_vulkan/sim/patches/mesa-panvk-privva-instrumentation.patch"
AUTHOR = "rocky-vulkan-llama maintainers <rocky-vulkan@users.noreply.github.com>"

CSF = "src/panfrost/vulkan/csf/"
VK = "src/panfrost/vulkan/"
# Blob ids of the touched files in the verified tree (git ls-tree of leegao/mesa-26.2 3c34d70).
VERIFIED_BLOBS = {
    CSF + "panvk_cmd_buffer.h": "eeed84936d9377d24f0845d078db71e871f8a5dc",
    CSF + "panvk_vX_cmd_buffer.c": "2d3973d61d111a70c548e78d0038378d42a76047",
    CSF + "panvk_vX_cmd_dispatch.c": "ef489ff88d9839e9568600d8543f03348b2a844b",
    CSF + "panvk_vX_cmd_precomp.c": "b697f82142f629523f1a93dad15e078f0cc00ea6",
    VK + "panvk_cmd_dispatch.h": "e0905e2c566caa20cf8c483625c22aa0df71c7f1",
    VK + "panvk_device.h": "c81d537609ab3d07d3c33de0d976b293f50628e5",
    VK + "panvk_vX_device.c": "5e54c6888c5c5760f5c9cd369866cc6141e3dd33",
}
# What each patch touches: 0001 only the two TLS-size hunks of 81db71cfba0.
TOUCHED = (
    {CSF + "panvk_vX_cmd_dispatch.c", CSF + "panvk_vX_cmd_precomp.c"},
    {
        CSF + "panvk_cmd_buffer.h",
        CSF + "panvk_vX_cmd_buffer.c",
        VK + "panvk_device.h",
        VK + "panvk_vX_device.c",
    },
    {
        CSF + "panvk_cmd_buffer.h",
        CSF + "panvk_vX_cmd_buffer.c",
        CSF + "panvk_vX_cmd_dispatch.c",
        CSF + "panvk_vX_cmd_precomp.c",
        VK + "panvk_cmd_dispatch.h",
    },
)
STATUS = (
    r"Backport \[mesa 81db71cfba0, reconstructed: .+\]",
    "Pending",
    "Pending",
)

DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
INDEX_LINE = re.compile(r"^index ([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})(?: \d+)?$", re.M)


def _message(path: Path) -> str:
    return path.read_text().split("\n---\n", 1)[0]


def _words(text: str) -> str:
    """The text with its line breaks (format-patch folds the Subject:) as single spaces."""
    return " ".join(text.split())


@pytest.mark.parametrize("n", range(len(SERIES)))
def test_patch_is_format_patch_with_oe_headers(n: int) -> None:
    text = SERIES[n].read_text()
    assert re.match(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\n", text)
    assert f"\nFrom: {AUTHOR}\n" in text
    assert re.search(rf"^Subject: \[PATCH {n + 1}/{len(SERIES)}\] panvk/csf: ", text, re.M)
    message = _message(SERIES[n])
    assert re.search(rf"^Upstream-Status: {STATUS[n]}$", message, re.M)
    assert message.rstrip().endswith(f"Signed-off-by: {AUTHOR}")
    assert "@@NUMBERS@@" not in message


def test_series_messages_carry_what_a_reviewer_asks_for() -> None:
    backport, tls, wls = (_words(_message(p)) for p in SERIES)
    assert "give compute jobs the TLS size of the shared allocation" in backport
    # The numbers the TLS buffer costs, computed and measured on stock panvk.
    assert "304 MiB" in tls and "3.8 to 3.9 GiB" in tls
    # D3: no SIMULTANEOUS_USE wait, and the message says what simultaneous use still shares.
    assert "SIMULTANEOUS_USE" in wls and "none is added" in wls


@pytest.mark.needs_tool("git")
def test_git_parses_each_patch_and_the_series_touches_only_panvk_csf_allocation() -> None:
    for path, touched in zip(SERIES, TOUCHED, strict=True):
        out = subprocess.run(
            ["git", "apply", "--numstat", str(path)], capture_output=True, text=True, cwd=REPO
        )
        assert out.returncode == 0, out.stderr
        assert {line.split("\t")[2] for line in out.stdout.splitlines()} == touched, path.name
    assert set().union(*TOUCHED) == set(VERIFIED_BLOBS)


def test_preimage_blobs_chain_from_the_verified_tree() -> None:
    """The first patch touching a file starts from the verified blob, a later one from the
    blob the previous patch left: the series was made as one branch on the verified tree."""
    current = dict(VERIFIED_BLOBS)
    for path in SERIES:
        text = path.read_text()
        files = [a for a, _ in DIFF_HEADER.findall(text)]
        blobs = INDEX_LINE.findall(text)
        assert len(files) == len(blobs)
        for name, (pre, post) in zip(files, blobs, strict=True):
            assert len(pre) == len(post) == 40, f"{path.name}: make it with --full-index"
            assert current[name] == pre, f"{path.name}: {name} made against another version"
            current[name] = post


def test_instrumentation_and_upstream_patches_are_not_shipped() -> None:
    from rocky_vulkan.config import load_config

    for path in SERIES:
        assert "panvk-privva" not in path.read_text()
    assert "Upstream-Status: Inappropriate" in INSTRUMENTATION.read_text()
    assert not (PATCH_DIR / INSTRUMENTATION.name).exists()
    cfg = load_config(REPO / "rocky-vulkan.yaml")
    upstream = sorted((PATCH_DIR / "upstream").glob("*.patch"))
    assert upstream, "patches/upstream/ holds the Valhall statistics fixes for sending upstream"
    listed = (PATCH_DIR / "upstream" / "README.md").read_text()
    for path in upstream:
        assert path.name not in cfg.mesa.patches
        assert f"`{path.name}`: for sending upstream, not built" in listed


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
def test_series_applies_without_fuzz_to_mesa_tree(tmp_path: Path) -> None:
    src = os.environ["ROCKY_MESA_SRC"]
    tree = tmp_path / "mesa"
    for rel, blob in VERIFIED_BLOBS.items():
        original = Path(src) / rel
        assert _git_blob(original) == blob, f"{rel} in {src} is not the verified version"
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(original, tree / rel)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    for path, touched in zip(SERIES, TOUCHED, strict=True):
        out = subprocess.run(
            ["git", "apply", "--check", "-v", str(path)], capture_output=True, text=True, cwd=tree
        )
        assert out.returncode == 0, out.stderr
        checked = re.findall(r"^Checking patch (\S+)\.\.\.$", out.stderr, re.M)
        assert set(checked) == touched
        subprocess.run(["git", "apply", str(path)], check=True, cwd=tree)


# The Mesa releases whose touched files are known to be the verified ones
# (docs/verification/mesa-patch.md, "The pin"); 26.2.4 and later already carry 81db71cfba0.
CHECKED_RELEASES = {"26.2.0"}


def test_layer_applies_the_series_in_order_to_a_checked_release() -> None:
    from rocky_vulkan.config import load_config

    cfg = load_config(REPO / "rocky-vulkan.yaml")
    assert cfg.mesa.patches == tuple(p.name for p in SERIES)
    assert cfg.mesa.version in CHECKED_RELEASES, (
        f"Mesa {cfg.mesa.version} is pinned, but the panvk series was checked for "
        f"{sorted(CHECKED_RELEASES)} only: re-check it (docs/verification/mesa-patch.md); "
        "from 26.2.4 on, drop mesa-0001 (upstream 81db71cfba0)"
    )
    mesa = REPO / "meta-rocky-vulkan" / "meta-rocky-vulkan-distro" / "recipes-graphics" / "mesa"
    for path in SERIES:
        assert (mesa / "files" / path.name).read_bytes() == path.read_bytes()
    assert sorted(p.name for p in (mesa / "files").glob("*.patch")) == [p.name for p in SERIES]
    bbappend = (mesa / "mesa.bbappend").read_text()
    assert " ".join(f"file://{p.name}" for p in SERIES) in bbappend
    assert (
        f'PV:{cfg.distro} = "{cfg.mesa.version}"' in (mesa / "rocky-mesa-version.inc").read_text()
    )
