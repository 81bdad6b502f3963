#!/usr/bin/env bash
# Cross rehearsal of the llama-cpp recipe outside bitbake (issue 21, item 3): configure the pinned,
# patched llama.cpp b9101 for aarch64 with Debian bookworm's cross toolchain the way OE's
# cmake.bbclass does, with EXACTLY the recipe's EXTRA_OECMAKE, then build the host tool
# vulkan-shaders-gen (an ExternalProject given GGML_VULKAN_SHADERS_GEN_TOOLCHAIN) and one shader.
#
#   tools/scripts/cross-llama.sh [DUMP]
#   tools/scripts/cross-llama.sh --extract DUMP OUT
#
# DUMP: `bitbake -e llama-cpp` of the real layer set (tools/scripts/bitbake-env.sh), or the
# extract of one that --extract writes (only the variables and the function used here, verbatim;
# default: the committed .ci/llama-cpp-bitbake-e.txt, so CI needs no bitbake). What comes from where:
#   EXTRA_OECMAKE, do_configure:prepend   the rendered recipe in this checkout (expanded by
#                                         tools/scripts/oe_dump.py; ${WORKDIR} -> $W)
#   host-toolchain.cmake.in               the recipe's files/, rendered by its do_configure:prepend
#   BUILD_CC/CXX/CFLAGS/CXXFLAGS/LDFLAGS  the dump (OE's values), the dump's WORKDIR mapped to $W
#   toolchain.cmake                       the dump's cmake_do_generate_toolchain_file, run with
#                                         the dump's WORKDIR -> $W, aarch64-poky-linux- ->
#                                         aarch64-linux-gnu- (Debian's cross tools)
#   cmake command line                    cmake_do_configure: OECMAKE_GENERATOR_ARGS, the source,
#                                         the dump's OECMAKE_ARGS, the recipe's EXTRA_OECMAKE, -Wno-dev
#   task environment                      the dump's exported CC, CXX, CFLAGS, CXXFLAGS, CPPFLAGS,
#                                         LDFLAGS, BUILD_* (mapped), so a leak of the target's
#                                         flags into the host tool would show
#   recipe-sysroot                        bookworm arm64 debs (libvulkan-dev, libvulkan1, libssl-dev,
#                                         libssl3: apt-get download + dpkg -x, nothing installed)
#                                         plus trixie's Vulkan 1.4 and SPIR-V headers (bookworm's
#                                         1.3.239 are too old for ggml-vulkan; the recipe gets
#                                         wrynose's 1.4.341); libc and libstdc++ come with
#                                         crossbuild-essential-arm64 (installed if missing)
#   recipe-sysroot-native/usr/bin         the cross tools, cmake, ninja, pkg-config and trixie's
#                                         glslc 2025.2 (OE: shaderc-native), as symlinks/wrappers
#   source tree                           `rocky_vulkan.llama.sources prepare` with the recipe's
#                                         patches (rocky-vulkan.yaml), from the PyPI cache
# Needs $ROCKY_CACHE/trixie-tools (made by .ci/llama.sh) and the PyPI sdists in $ROCKY_CACHE/pypi.
# Work area: $ROCKY_CACHE/cross/llama (the "WORKDIR"); rerunning redoes configure and build.
# Env: ROCKY_CACHE (default /var/cache/rocky-vulkan), CROSS_SHADER (default relu.comp),
# CROSS_JOBS (default 2).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
OE="python3 $REPO/tools/scripts/oe_dump.py"
# What this script reads from the dump (and all that --extract keeps).
ENV_VARS=(CC CXX CPP CFLAGS CXXFLAGS CPPFLAGS LDFLAGS BUILD_CC BUILD_CXX BUILD_CPP BUILD_CFLAGS
          BUILD_CXXFLAGS BUILD_CPPFLAGS BUILD_LDFLAGS PKG_CONFIG_SYSROOT_DIR)
DUMP_VARS=(WORKDIR HOSTTOOLS HOSTTOOLS_NONFATAL HOSTTOOLS_DIR OECMAKE_ARGS "${ENV_VARS[@]}")
if [ "${1:-}" = --extract ]; then
    [ $# -eq 3 ] && [ -f "$2" ] || { echo "usage: $0 --extract DUMP OUT" >&2; exit 2; }
    {
        echo "# Extract of \`bitbake -e llama-cpp\` for tools/scripts/cross-llama.sh, written by"
        echo "# \`tools/scripts/cross-llama.sh --extract DUMP OUT\`; lines verbatim from the dump."
        echo "# dump: $2 ($(sha256sum "$2" | cut -c1-16)...), $(date -u +%Y-%m-%d)"
        $OE extract "$2" "${DUMP_VARS[@]/#/--var=}" --func cmake_do_generate_toolchain_file
    } >"$3.tmp"
    mv "$3.tmp" "$3"
    echo "wrote $3"
    exit 0
fi
DUMP=${1:-$REPO/.ci/llama-cpp-bitbake-e.txt}
SHADER=${CROSS_SHADER:-relu.comp}
JOBS=${CROSS_JOBS:-2}
RECIPE_DIR=$REPO/meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp
RECIPE=$RECIPE_DIR/llama-cpp_git.bb
W=$CACHE/cross/llama
TX=$CACHE/trixie-tools
export PYTHONPATH=$REPO/tools${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
step() { echo "=== [cross-llama $(($(date +%s) - t0))s] $*"; }
die() { echo "cross-llama: error: $*" >&2; exit 1; }

[ -f "$DUMP" ] || die "no bitbake -e dump at $DUMP (tools/scripts/bitbake-env.sh MIRRORS OUT makes one)"
echo "dump: $DUMP"
grep -m3 '^# ' "$DUMP" || true
[ -f "$RECIPE" ] || die "no recipe at $RECIPE"
[ -x "$TX/glslc" ] && [ -f "$TX/usr/include/vulkan/vulkan.hpp" ] \
    || die "no trixie glslc / Vulkan headers in $TX: run .ci/llama.sh once (its trixie step)"

step "versions"
DUMP_WD=$($OE dump-var "$DUMP" WORKDIR)
echo "WORKDIR in the dump: $DUMP_WD"
echo "recipe: $RECIPE ($(git -C "$REPO" log -1 --format=%h -- "$RECIPE" 2>/dev/null || echo '?'))"
export DEBIAN_FRONTEND=noninteractive
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v file >/dev/null; then
    apt-get update -q && apt-get install -y -q --no-install-recommends crossbuild-essential-arm64 file
fi
aarch64-linux-gnu-g++ --version | sed -n 1p
dpkg-query -W -f '${Package} ${Version}\n' g++-aarch64-linux-gnu libc6-dev-arm64-cross \
    libstdc++-12-dev-arm64-cross cmake ninja-build
"$TX/glslc" --version | sed -n 1p
file --version | sed -n 1p

step "recipe-sysroot: bookworm arm64 debs (apt-get download, dpkg -x), trixie Vulkan headers"
SYSROOT_DEBS=(libvulkan-dev libvulkan1 libssl-dev libssl3)
A=$CACHE/cross/apt-arm64
if [ ! -f "$W/recipe-sysroot/.debs" ]; then
    mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/etc"
    grep -h '^deb ' /etc/apt/sources.list 2>/dev/null >"$A/etc/sources.list" || true
    [ -s "$A/etc/sources.list" ] \
        || echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" >"$A/etc/sources.list"
    O=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64
       -o Dir::Etc::sourcelist="$A/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
       -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A" -o Dir::State::status=/dev/null)
    apt-get "${O[@]}" update -q
    rm -rf "$W/recipe-sysroot" "$W/debs" && mkdir -p "$W/debs" "$W/recipe-sysroot"
    (cd "$W/debs" && apt-get "${O[@]}" -o APT::Sandbox::User=root download "${SYSROOT_DEBS[@]/%/:arm64}")
    for d in "$W"/debs/*.deb; do dpkg -x "$d" "$W/recipe-sysroot"; done
    # The recipe builds against vulkan-headers 1.4.341 (wrynose): bookworm's 1.3.239 lack what
    # ggml-vulkan uses. Headers only: the arm64 loader stays bookworm's.
    for h in vulkan vk_video spirv; do
        rm -rf "$W/recipe-sysroot/usr/include/$h"
        cp -a "$TX/usr/include/$h" "$W/recipe-sysroot/usr/include/"
    done
    (cd "$W/debs" && ls) >"$W/recipe-sysroot/.debs"
fi
cat "$W/recipe-sysroot/.debs"
grep -m1 -h '#define VK_HEADER_VERSION ' "$W/recipe-sysroot/usr/include/vulkan/vulkan_core.h"
file -L "$W/recipe-sysroot/usr/lib/aarch64-linux-gnu/libvulkan.so" | sed "s|$W/||"

step "recipe-sysroot-native/usr/bin and hosttools (the PATH OE gives a task: no /usr/bin)"
NB=$W/recipe-sysroot-native/usr/bin
HT=$W/hosttools
rm -rf "$NB" "$HT" && mkdir -p "$NB" "$HT"
for t in gcc g++ cpp gcc-ar gcc-nm gcc-ranlib ar as ld ld.bfd nm objcopy objdump ranlib readelf strip; do
    ln -s "$(command -v aarch64-linux-gnu-$t)" "$NB/aarch64-linux-gnu-$t"
done
for t in cmake ninja pkg-config; do
    p=$(command -v $t) || die "$t not found on the host (apt-get install cmake ninja-build pkgconf)"
    ln -s "$p" "$NB/$t"
done
ln -s "$TX/glslc" "$NB/glslc"
# OE's HOSTTOOLS (from the dump): every one found on this host, as symlinks; the rest skipped.
for t in $($OE dump-var "$DUMP" HOSTTOOLS) $($OE dump-var "$DUMP" HOSTTOOLS_NONFATAL); do
    p=$(command -v "$t" 2>/dev/null) && [ -x "$p" ] && ln -sf "$p" "$HT/$t" || true
done
# Only what OE would run gets this PATH (the script itself keeps the host's).
OEPATH=$NB:$HT

step "source tree: b9101 from PyPI, blob-verified, the recipe's patches"
mapfile -t PATCHES < <(python3 -c 'import sys
from rocky_vulkan.config import load_config
cfg = load_config(sys.argv[1])
print("\n".join(map(str, cfg.patch_paths(cfg.llama_cpp.patches))))' "$REPO/rocky-vulkan.yaml")
PARGS=()
for p in "${PATCHES[@]}"; do
    cmp -s "$p" "$RECIPE_DIR/files/$(basename "$p")" || die "$p differs from the recipe's copy: render first"
    PARGS+=(--patch "$p")
done
S=$W/sources/llama-cpp-0.0.9101+git
KEY=$(python3 -m rocky_vulkan.llama.sources key "${PARGS[@]}")
if [ "$(cat "$S/.rocky-key" 2>/dev/null)" != "$KEY" ]; then
    python3 -m rocky_vulkan.llama.sources prepare "$S" "${PARGS[@]}" --cache "$CACHE/pypi" --force \
        >"$W/prepare.log" 2>&1 || { tail -30 "$W/prepare.log"; die "prepare failed"; }
    echo "$KEY" >"$S/.rocky-key"
fi
grep -E "^(verified|applied|patch)|blobs" "$W/prepare.log" | head -8 || true
echo "tree key $KEY, $(ls "$S"/ggml/src/ggml-vulkan/vulkan-shaders/*.comp | wc -l) .comp files"

step "do_configure:prepend (the recipe's): host-toolchain.cmake"
M=(--map "$DUMP_WD=$W")
cp "$RECIPE_DIR/files/host-toolchain.cmake.in" "$W/sources/"
SETS=(--set "UNPACKDIR=$W/sources" --set "WORKDIR=$W")
for v in BUILD_CC BUILD_CXX BUILD_CFLAGS BUILD_CXXFLAGS BUILD_LDFLAGS; do
    SETS+=(--set "$v=$($OE dump-var "$DUMP" $v "${M[@]}")")
done
$OE recipe-func "$RECIPE" do_configure:prepend "${SETS[@]}" >"$W/do_configure_prepend.sh"
PATH=$OEPATH sh -e "$W/do_configure_prepend.sh"
grep -v '^#' "$W/host-toolchain.cmake"

step "cmake_do_generate_toolchain_file (the dump's): toolchain.cmake"
# Debian's cross tools are aarch64-linux-gnu-*, OE's hosttools are $W/hosttools, and bookworm's
# GCC 12 does not know -fcanon-prefix-map (GCC 13+; wrynose builds with GCC 15): dropped. The
# rest of the function is run as OE has it.
TM=("${M[@]}" --map "aarch64-poky-linux-=aarch64-linux-gnu-" --map "$($OE dump-var "$DUMP" HOSTTOOLS_DIR)=$HT"
    --map=-fcanon-prefix-map=)
$OE dump-func "$DUMP" cmake_do_generate_toolchain_file "${TM[@]}" >"$W/generate_toolchain.sh"
PATH=$OEPATH bash -e "$W/generate_toolchain.sh"
grep -E "CMAKE_(C|CXX)_COMPILER |CMAKE_SYSROOT|CMAKE_FIND_ROOT_PATH " "$W/toolchain.cmake"

step "task environment (the dump's exports, mapped)"
for v in "${ENV_VARS[@]}"; do
    export "$v=$($OE dump-var "$DUMP" $v "${TM[@]}")"
done
# Debian's multiarch .pc files sit in usr/lib/aarch64-linux-gnu/pkgconfig (OE: usr/lib/pkgconfig).
export PKG_CONFIG_LIBDIR=$W/recipe-sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$W/recipe-sysroot/usr/share/pkgconfig
echo "CC=$CC"
echo "CFLAGS=$CFLAGS"

step "cmake_do_configure: OECMAKE_ARGS + the recipe's EXTRA_OECMAKE"
mapfile -t EXTRA < <($OE recipe-var "$RECIPE" EXTRA_OECMAKE --set "WORKDIR=$W")
[ "${#EXTRA[@]}" -gt 0 ] || die "EXTRA_OECMAKE came out empty"
read -r -a OEARGS <<<"$($OE dump-var "$DUMP" OECMAKE_ARGS "${TM[@]}")"
printf 'EXTRA_OECMAKE: %s\n' "${EXTRA[@]}"
# A full dump also has bitbake's own EXTRA_OECMAKE: say whether the recipe still matches it.
if $OE dump-var "$DUMP" EXTRA_OECMAKE >"$W/extra.dump" 2>/dev/null; then
    $OE recipe-var "$RECIPE" EXTRA_OECMAKE --set "WORKDIR=$DUMP_WD" >"$W/extra.recipe"
    echo "recipe vs the dump's EXTRA_OECMAKE: $($OE same-words "$W/extra.recipe" "$W/extra.dump" | sed "s|$W/||" | paste -sd';')"
fi
B=$W/build
rm -rf "$B" && mkdir -p "$B"
(cd "$B" && PATH=$OEPATH cmake -G 'Ninja' -DCMAKE_MAKE_PROGRAM=ninja "$S" "${OEARGS[@]}" "${EXTRA[@]}" -Wno-dev) \
    >"$W/configure.log" 2>&1 || { tail -40 "$W/configure.log"; die "cmake configure failed (log: $W/configure.log)"; }
grep -E "CMAKE_SYSTEM_PROCESSOR|compiler identification|Found Vulkan|Found OpenSSL|glslc|vulkan-shaders-gen toolchain|Vulkan found|Including .* backend|Build files" "$W/configure.log" || true
grep -h "set(CMAKE_CXX_COMPILER " "$B"/CMakeFiles/*/CMakeCXXCompiler.cmake
grep -E "^Vulkan_GLSLC_EXECUTABLE|^Vulkan_LIBRARY:|^Vulkan_INCLUDE_DIR:|^OPENSSL_SSL_LIBRARY:|^GGML_VULKAN_SHADERS_GEN_TOOLCHAIN" "$B/CMakeCache.txt"

# OE's buildpaths QA (an error at wrynose) fails a package whose files name the build folders:
# list what configure wrote into files that `cmake --install` copies into the package.
echo "build paths in files that get installed (ggml-config.cmake, llama-config.cmake, *.pc):"
grep -n "$W" "$B/ggml/ggml-config.cmake" "$B/llama-config.cmake" "$B"/*.pc 2>/dev/null \
    | sed "s|$W|\$W|g; s|^$B/||" || echo "  none"

step "build the host tool: vulkan-shaders-gen (ExternalProject, -j$JOBS)"
nice -n 10 env PATH=$OEPATH ninja -C "$B" -j "$JOBS" vulkan-shaders-gen >"$W/build-gen.log" 2>&1 \
    || { tail -40 "$W/build-gen.log"; die "vulkan-shaders-gen failed (log: $W/build-gen.log)"; }
GEN=$B/Release/vulkan-shaders-gen
[ -x "$GEN" ] || die "no $GEN after the build"
EP=$(dirname "$(find "$B" -path '*vulkan-shaders-gen-build/CMakeCache.txt' | sed -n 1p)")
grep -E "^CMAKE_CXX_FLAGS:|^CMAKE_EXE_LINKER_FLAGS:|^CMAKE_TOOLCHAIN_FILE" "$EP/CMakeCache.txt"
grep -h "set(CMAKE_CXX_COMPILER " "$EP"/CMakeFiles/*/CMakeCXXCompiler.cmake
# The cache keeps the task's CFLAGS/LDFLAGS (CMake seeds them from the environment); the
# toolchain file's normal variables shadow them, so the lines ninja runs are what matter.
cmds=$(ninja -C "$EP" -t commands vulkan-shaders-gen)
echo "compile and link lines of vulkan-shaders-gen:"
grep -E "vulkan-shaders-gen.cpp.o -c|-o vulkan-shaders-gen " <<<"$cmds" | sed "s|$W|\$W|g"
file "$GEN" | sed "s|$W|\$W|"
file "$GEN" | grep -q "x86-64" || die "vulkan-shaders-gen is not an x86-64 binary"

step "one shader: $SHADER (vulkan-shaders-gen + glslc)"
OUTCPP=ggml/src/ggml-vulkan/$SHADER.cpp
nice -n 10 env PATH=$OEPATH ninja -C "$B" -j "$JOBS" "$OUTCPP" >"$W/build-shader.log" 2>&1 \
    || { tail -40 "$W/build-shader.log"; die "shader $SHADER failed (log: $W/build-shader.log)"; }
SPV_DIR=$B/ggml/src/ggml-vulkan/vulkan-shaders.spv
ls "$SPV_DIR"
SPVS=("$SPV_DIR"/*.spv)
SPV=${SPVS[0]}
file "$SPV" | sed "s|$W|\$W|"
magic=$(od -An -tx4 -N4 "$SPV" | tr -d ' ')
[ "$magic" = 07230203 ] || die "$SPV does not start with the SPIR-V magic (got $magic)"
echo "SPIR-V magic $magic, $(stat -c %s "$SPV") bytes"
ls -l "$B/$OUTCPP" | sed "s|$W|\$W|"
grep -c "unsigned char" "$B/$OUTCPP" | sed 's/^/arrays in the generated .cpp: /'

step "one target object for contrast: ggml-base ggml.c (aarch64)"
OBJ=ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
nice -n 10 env PATH=$OEPATH ninja -C "$B" "$OBJ" >"$W/build-obj.log" 2>&1 || { tail -20 "$W/build-obj.log"; die "target object failed"; }
file "$B/$OBJ" | sed "s|$W|\$W|"
file "$B/$OBJ" | grep -q "ARM aarch64" || die "the target object is not aarch64"
step "done: host tool x86-64, shader SPIR-V, target aarch64"
