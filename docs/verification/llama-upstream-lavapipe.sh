#!/usr/bin/env bash
# Issue 23 part 3: the series ported to llama.cpp b11312 (patches/upstream/llama.cpp-b11312/),
# built here and run through the same lavapipe cases at the Mali's subgroup size as the pin
# (tests/llama/test_llama_warp16.py), with bookworm-backports' lavapipe. Run from the repo root
# after `bash .ci/llama.sh` has fetched trixie's tools and the lavapipe (ROCKY_CACHE):
#
#   bash docs/verification/llama-upstream-lavapipe.sh [WORKDIR]      # default /var/tmp/b11312-lvp
#
# Steps: llama-cpp-python 0.3.36's sdist from PyPI (sha256 checked), vendor/llama.cpp unpacked,
# 0001..0005 applied in order with `patch -F0` (no fuzz), the test-only lavapipe hooks of
# tools/rocky_vulkan/llama/sources.py applied, test-backend-ops built (Release, Vulkan, trixie's
# glslc and headers), then the warp-16 tests against it.
set -euo pipefail
REPO=$(pwd)
W=${1:-/var/tmp/b11312-lvp}
CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
TX=$CACHE/trixie-tools
LVP=$CACHE/lavapipe-bpo
PY=$REPO/.venv/bin/python
SDIST=llama_cpp_python-0.3.36.tar.gz
SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$W"
[ -x "$TX/glslc" ] && [ -f "$LVP/lvp_icd.json" ] || { echo "run bash .ci/llama.sh first (trixie tools, lavapipe)" >&2; exit 1; }

if [ ! -f "$W/$SDIST" ]; then
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$W"
fi
echo "$SHA  $W/$SDIST" | sha256sum -c -

S=$W/src
if [ ! -f "$W/src.done" ]; then
    rm -rf "$S" "$W/unpack" && mkdir -p "$W/unpack"
    tar xzf "$W/$SDIST" -C "$W/unpack" llama_cpp_python-0.3.36/vendor/llama.cpp
    mv "$W/unpack/llama_cpp_python-0.3.36/vendor/llama.cpp" "$S"
    for p in "$REPO"/patches/upstream/llama.cpp-b11312/0*.patch; do
        echo "applying $(basename "$p")"
        patch -d "$S" -p1 -F0 -N --no-backup-if-mismatch <"$p"
    done
    PYTHONPATH=$REPO/tools "$PY" -c 'import sys; from pathlib import Path
from rocky_vulkan.llama.sources import apply_lavapipe_hooks
print("\n".join(apply_lavapipe_hooks(Path(sys.argv[1]))))' "$S"
    touch "$W/src.done"
fi

B=$W/build
cmake -S "$S" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_WEBUI=OFF \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_PREFIX_PATH="$TX/usr" -DVulkan_INCLUDE_DIR="$TX/usr/include" \
    -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1 -DVulkan_GLSLC_EXECUTABLE="$TX/glslc" \
    >"$W/configure.log" 2>&1 || { tail -40 "$W/configure.log"; exit 1; }
grep -E "GL_EXT_integer_dot_product" "$W/configure.log"
export CCACHE_DIR=$CACHE/ccache
time nice -n 10 cmake --build "$B" -j "$(nproc)" --target test-backend-ops >"$W/build.log" 2>&1 \
    || { tail -40 "$W/build.log"; exit 1; }

ROCKY_LAVAPIPE_ICD=$LVP/lvp_icd.json ROCKY_LAVAPIPE_LIB=$LVP/usr/lib/x86_64-linux-gnu \
ROCKY_LLAMA_BIN_DIR=$B/bin \
    "$PY" -m pytest -q -m slow tests/llama/test_llama_warp16.py -rs -vv
