"""The series ported to llama.cpp b11312 (patches/upstream/llama.cpp-b11312, issue 23 part 3).

Fast checks without a tree: each patch's `index` pre-image is b11312's blob (llama-cpp-python
0.3.36's vendored tree, blob ids below read with `git rev-parse` from its pristine commit) or the
post-image of the patch before it; the same diffs' messages follow the layer's patch rules; the
pinned series and the port carry the same Upstream-Status lines and author. The apply, build and
test runs are recorded in docs/verification/llama-series-h200.md (they need the 76 MB sdist).
"""

from __future__ import annotations

import re

from rocky_vulkan.layer.lint import patch_problems
from rocky_vulkan.llama import sources as ls

from tests.helpers.project import ROOT as REPO

PORT_DIR = REPO / "patches" / "upstream" / "llama.cpp-b11312"
PORT = sorted(PORT_DIR.glob("000*.patch"))
PINNED = [
    REPO / "patches" / name
    for name in (
        "llama.cpp-0001-vulkan-small-warptile-rule.patch",
        "llama.cpp-0002-vulkan-tile-denoms-bk-step.patch",
        "llama.cpp-0003-vulkan-mali-panvk-warptiles.patch",
        "llama.cpp-0004-vulkan-mali-warptile-env.patch",
        "llama.cpp-perplexity-flush-log.patch",
        "llama.cpp-server-router-proxy-read-timeout.patch",
        "llama.cpp-ggml-rpc-tcp-keepalive.patch",
    )
]
# git blob ids at b11312 (0c1e57098) of every file the port touches
B11312_BLOBS = {
    "ggml/src/ggml-vulkan/ggml-vulkan.cpp": "cbd3697ef9b6fd273191c72c50f6d2e30114dd04",
    "ggml/src/ggml-vulkan/vulkan-shaders/mul_mmq.comp": "67908e7048791496c2f89766f38406c0677b328c",
    "ggml/src/ggml-vulkan/ggml-vulkan-types.h": "ee50f51a383618b327716e73f6cdb34fbdbcab25",
    "tools/perplexity/perplexity.cpp": "601361acdce0b27cc7c586798636d7ab41515dc8",
    "tools/server/server-models.cpp": "a8996b00c9501ac9d0776d0de41f9ddff1ce56a4",
    "ggml/src/ggml-rpc/transport.cpp": "b28d16605cb1c8396e465503609cd608926287bb",
}


def _status(text: str) -> str:
    return re.search(r"^Upstream-Status: .*$", text, re.M).group(0)


def _author(text: str) -> str:
    return re.search(r"^From: .*(?:\n .*)*", text, re.M).group(0)


def test_port_index_lines_chain_from_b11312_blobs():
    assert [p.name[:4] for p in PORT] == ["0001", "0002", "0003", "0004", "0005", "0006", "0007"]
    current = dict(B11312_BLOBS)
    for patch in PORT:
        for f in ls.parse_patch(patch):
            assert current[f.path].startswith(f.pre), (patch.name, f.path)
            current[f.path] = f.post


def test_port_follows_the_patch_rules_with_the_pinned_status_and_author():
    readme = (PORT_DIR / "README.md").read_text()
    for port, pinned in zip(PORT, PINNED, strict=True):
        text = port.read_text()
        assert patch_problems(text) == [], port.name
        assert _status(text) == _status(pinned.read_text()), port.name
        assert _author(text) == _author(pinned.read_text()), port.name
        assert f"`{port.name}`" in readme
    # the port handles upstream's BK_STEP hard-coding and the separate int flags (issue 23)
    denoms = PORT[1].read_text()
    assert "warptile.size() > 11 ? warptile[11] : 4u" in denoms
    assert "-    const uint32_t BK_STEP = mul_mat_id ? 1u : 4u;" in denoms
    assert not re.search(r"^\+.*mul_mat_id_l(_int)?\[", "".join(p.read_text() for p in PORT), re.M)
