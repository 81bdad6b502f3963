#!/usr/bin/env bash
# Meson rehearsal of the Mesa recipes outside bitbake (issue 21, item 4): the Mesa 26.2 tree with
# the series patches/mesa-0*.patch applied in order by GNU patch --fuzz=0, then `meson setup` with
# exactly the arguments bitbake -e gives meson_do_configure, first for mesa-tools-native (build
# host, then its mesa_clc, vtn_bindgen2 and panfrost_compile are built, as the target needs them
# with -Dmesa-clc=system -Dprecomp-compiler=system), then for mesa (aarch64 cross file).
#
#   tools/scripts/cross-mesa.sh [root|tree|native|target|driver|all] [DUMP_DIR]
#
#   root    make the build root (below); tree: export the Mesa tree and apply the series (root
#   first if missing); native: mesa-tools-native setup and its three tools; target: mesa setup;
#   all (default): tree, native, target (setup, then the patched files compiled for aarch64: the
#   four CSF/device .c files for v10, and the two JM users of the changed prototype for v7);
#   driver (optional, not in all): libvulkan_panfrost.so for aarch64. Each stage but driver
#   starts its own outputs afresh.
# DUMP_DIR: holds mesa.env and mesa-tools-native.env from `bitbake -e` of the real layer set
# (tools/scripts/bitbake-env.sh), default /var/tmp/yocto-compat/env2/rock-5-itx.
#
# Where things come from:
#   meson arguments   the dumps' meson_do_configure `meson setup ...` line (oe_dump.py dump-meson):
#                     MESONOPTS, source, build dir, MESON_CROSS_FILE, EXTRA_OEMESON (which ends
#                     with PACKAGECONFIG_CONFARGS), unchanged but for paths (WORKDIR -> /work/...)
#   meson.cross/.native, meson-qemuwrapper
#                     the dumps' do_write_config / write_qemuwrapper, run with the paths mapped and
#                     aarch64-poky-linux- -> aarch64-linux-gnu- (Debian's cross tools)
#   recipe-sysroot    the root itself (Debian multiarch: arm64 -dev packages next to amd64 ones),
#                     so the dump's .../recipe-sysroot maps to /; target pkg-config reads only the
#                     arm64 .pc files (PKG_CONFIG_LIBDIR as OE sets it, in Debian's multiarch dirs)
#   recipe-sysroot-native/usr/bin
#                     llvm-config (LLVM 22, as wrynose), pkg-config-native, and for the target the
#                     three tools built from mesa-tools-native (what OE stages from its sysroot)
#   the tree          GitHub leegao/mesa-26.2 at 3c34d70 = Mesa 26.2.0-rc1 (fetched with the search
#                     tool's fetch into /work/.mirror; no 26.2.0 tarball is reachable here)
# Build root: a Debian sid root (debootstrap, like tools/rocky_vulkan/sim/mesa-panvk-build.sh;
# sid has LLVM 22 and meson 1.10 as wrynose does), $ROCKY_CACHE/cross/mesa-root; packages below.
# Env: ROCKY_CACHE (default /var/cache/rocky-vulkan), MESA_GIT (bare git dir of the tree),
# MESA_COMMIT, MESA_JOBS (default 2), DEBIAN_MIRROR, MESA_SETUP_ONLY (native: stop after setup).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
MODE=${1:-all}
DUMPS=${2:-/var/tmp/yocto-compat/env2/rock-5-itx}
ROOT=$CACHE/cross/mesa-root
MESA_GIT=${MESA_GIT:-/work/.mirror/leegao+mesa-26.2/repo}
MESA_COMMIT=${MESA_COMMIT:-3c34d70f234f43053eeda159dd16958190280310}
# The series in file-name order, which is the order of mesa.patches in rocky-vulkan.yaml.
PATCHES=("$REPO"/patches/mesa-0*.patch)
JOBS=${MESA_JOBS:-2}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LLVM=22
OE="python3 $REPO/tools/scripts/oe_dump.py"
t0=$(date +%s)
step() { echo "=== [cross-mesa $(($(date +%s) - t0))s] $*"; }
die() { echo "cross-mesa: error: $*" >&2; exit 1; }

# Build host (amd64): what mesa-tools-native's DEPENDS name (llvm, clang, libclc,
# SPIRV-LLVM-Translator, SPIRV-Tools, elfutils, libdrm, wayland, X11 for platforms=wayland,x11),
# meson/ninja/python3-mako/pyyaml/flex/bison/glslang (mesa's native DEPENDS), the cross toolchain
# and qemu-user (OE's meson-qemuwrapper).
NATIVE_PKGS="build-essential meson ninja-build pkgconf python3-mako python3-yaml python3-packaging
 bison flex glslang-tools libwayland-bin wayland-protocols libdrm-dev libelf-dev libwayland-dev
 llvm-$LLVM-dev libclang-$LLVM-dev libclang-cpp$LLVM-dev libclc-$LLVM libclc-$LLVM-dev
 libllvmspirvlib-$LLVM-dev llvm-spirv-$LLVM spirv-tools-dev x11proto-dev libx11-dev libx11-xcb-dev
 libxext-dev libxxf86vm-dev libxdamage-dev libxfixes-dev libxrandr-dev libxshmfence-dev
 libxcb-dri3-dev libxcb-present-dev libxcb-sync-dev libxcb-randr0-dev libxcb-shm0-dev
 libxcb-xfixes0-dev libxcb-glx0-dev libxcb1-dev
 crossbuild-essential-arm64 qemu-user patch file"
# Target (arm64, multiarch): mesa's DEPENDS for this PACKAGECONFIG: expat libdrm wayland
# wayland-protocols zlib vulkan-loader vulkan-headers (OE's wayland-dev has wayland-egl-backend.pc,
# Debian ships it in libwayland-egl-backend-dev).
TARGET_PKGS="libexpat1-dev:arm64 libdrm-dev:arm64 libwayland-dev:arm64 libwayland-egl-backend-dev:arm64
 zlib1g-dev:arm64
 libvulkan-dev:arm64"

in_root() {
	[ -x "$ROOT/usr/bin/env" ] || die "no Debian root at $ROOT: run '$0 root' first"
	cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
	unshare --mount --propagation private -- /bin/bash -c \
		'r=$1; shift; for d in proc sys dev; do mount --bind "/$d" "$r/$d" || exit 1; done
		exec chroot "$r" "$@"' in_root "$ROOT" \
		/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
}

cmd_root() {
	step "build root: Debian sid at $ROOT"
	if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
		command -v debootstrap >/dev/null || apt-get install -y debootstrap
		rm -rf "$ROOT.tmp" && mkdir -p "$(dirname "$ROOT")"
		debootstrap --variant=minbase --include=ca-certificates sid "$ROOT.tmp" "$MIRROR" \
			>"$CACHE/cross/debootstrap.log" 2>&1 || { tail -20 "$CACHE/cross/debootstrap.log"; die "debootstrap failed"; }
		mv "$ROOT.tmp" "$ROOT"
	fi
	echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99no-valid-until"
	echo 'APT::Install-Recommends "false";' >"$ROOT/etc/apt/apt.conf.d/99no-recommends"
	in_root dpkg --add-architecture arm64
	in_root apt-get update -q >"$CACHE/cross/apt.log" 2>&1 || { tail -20 "$CACHE/cross/apt.log"; die "apt-get update failed"; }
	# shellcheck disable=SC2086
	in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $NATIVE_PKGS $TARGET_PKGS \
		>>"$CACHE/cross/apt.log" 2>&1 || { tail -30 "$CACHE/cross/apt.log"; die "apt-get install failed"; }
	in_root dpkg-query -W -f '${Package}:${Architecture} ${Version}\n' meson ninja-build \
		llvm-$LLVM-dev libclc-$LLVM libllvmspirvlib-$LLVM-dev spirv-tools-dev glslang-tools \
		gcc-aarch64-linux-gnu qemu-user libdrm-dev:amd64 libdrm-dev:arm64 libwayland-dev:arm64 \
		libwayland-egl-backend-dev:arm64 libexpat1-dev:arm64 zlib1g-dev:arm64 libvulkan-dev:arm64 \
		wayland-protocols patch \
		| tee "$ROOT/.rocky-cross-versions"
}

# Write a git tree into DIR with `git archive`; blobs the fetched snapshot lacks are left out.
export_tree() {
	local gitdir=$1 commit=$2 dest=$3 missing=()
	mapfile -t missing < <(git --git-dir="$gitdir" ls-tree -r "$commit" \
		| awk '$2 == "blob" {print $3 "\t" $4}' \
		| while IFS=$'\t' read -r sha path; do
			git --git-dir="$gitdir" cat-file -e "$sha" 2>/dev/null || printf '%s\n' "$path"
		done)
	echo "snapshot lacks ${#missing[@]} blobs (none used by panvk or the tools):"
	printf '  %s\n' "${missing[@]}"
	rm -rf "$dest" && mkdir -p "$dest"
	# Even with the absent blobs excluded, git archive names them on stderr (exit 0): count what
	# came out.
	git --git-dir="$gitdir" archive "$commit" -- . "${missing[@]/#/:!}" 2>"$dest.archive-errors" | tar -x -C "$dest"
	local want got
	want=$(( $(git --git-dir="$gitdir" ls-tree -r "$commit" | awk '$2 == "blob"' | wc -l) - ${#missing[@]} ))
	got=$(find "$dest" -type f -o -type l | wc -l)
	echo "exported $got files and links (tree: $want present blobs); git archive: $(grep -c 'invalid object' "$dest.archive-errors") absent blobs named"
	[ "$got" -eq "$want" ] || die "export of $commit incomplete: $got of $want"
}

# The dump's function FUNC with paths mapped, run inside the root.
run_dump_func() {
	local dump=$1 func=$2 out=$3; shift 3
	$OE dump-func "$dump" "$func" "$@" >"$ROOT$out"
	in_root bash -e "$out"
}

SRC=/work/mesa-26.2.0
NW=/work/mesa-tools-native
TW=/work/mesa
TOOLS=(src/compiler/clc/mesa_clc src/compiler/spirv/vtn_bindgen2 src/panfrost/clc/panfrost_compile)

cmd_tree() {
	[ -x "$ROOT/usr/bin/meson" ] || cmd_root
	git --git-dir="$MESA_GIT" cat-file -e "$MESA_COMMIT^{commit}" 2>/dev/null \
		|| die "no Mesa commit $MESA_COMMIT in $MESA_GIT (fetch github:leegao/mesa-26.2)"
	step "versions"
	cat "$ROOT/.rocky-cross-versions"
	echo "Mesa tree: $MESA_GIT $MESA_COMMIT, VERSION $(git --git-dir="$MESA_GIT" show "$MESA_COMMIT:VERSION")"
	local p
	for p in "${PATCHES[@]}"; do echo "patch: $p (sha256 $(sha256sum "$p" | cut -c1-16)...)"; done
	echo "dumps: $DUMPS ($(grep -m1 -o 'PV="[^"]*"' "$DUMPS/mesa.env"))"

	mkdir -p "$ROOT/work"
	step "tree: export, then patch -p1 --fuzz=0 (GNU patch, as OE's do_patch)"
	local src=$SRC
	export_tree "$MESA_GIT" "$MESA_COMMIT" "$ROOT$src"
	in_root sh -c "cd $src && patch --version | sed -n 1p"
	for p in "${PATCHES[@]}"; do
		cp "$p" "$ROOT/work/"
		in_root sh -c "cd $src && patch -p1 --fuzz=0 < /work/$(basename "$p")"
	done
	echo "$MESA_COMMIT $(series_sum)" >"$ROOT$src/.rocky-tree"
}

series_sum() { cat "${PATCHES[@]}" | sha256sum | cut -d' ' -f1; }

check_tree() {
	[ "$(cat "$ROOT$SRC/.rocky-tree" 2>/dev/null)" = "$MESA_COMMIT $(series_sum)" ] \
		|| die "no patched tree of $MESA_COMMIT at $ROOT$SRC: run '$0 tree' first"
}

cmd_native() {
	check_tree
	local src=$SRC nd=$DUMPS/mesa-tools-native.env nw=$NW
	local nwd; nwd=$($OE dump-var "$nd" WORKDIR)
	local nmap=(--map "$nwd=$nw" --map "$($OE dump-var "$nd" S)=$src")
	step "mesa-tools-native: do_write_config (the dump's), native sysroot tools"
	rm -rf "$ROOT$nw" && mkdir -p "$ROOT$nw/recipe-sysroot-native/usr/bin"
	ln -s /usr/lib/llvm-$LLVM/bin/llvm-config "$ROOT$nw/recipe-sysroot-native/usr/bin/llvm-config"
	printf '#!/bin/sh\nunset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH\nexec /usr/bin/pkg-config "$@"\n' \
		>"$ROOT$nw/recipe-sysroot-native/usr/bin/pkg-config-native"
	chmod +x "$ROOT$nw/recipe-sysroot-native/usr/bin/pkg-config-native"
	run_dump_func "$nd" do_write_config /work/write-config-native.sh "${nmap[@]}"
	$OE dump-meson "$nd" "${nmap[@]}" >"$ROOT$nw/meson-args"
	step "mesa-tools-native: meson setup (args: $nw/meson-args)"
	paste -sd" " "$ROOT$nw/meson-args" | fold -s -w 100 | sed "s/^/  /"
	in_root env PATH=$nw/recipe-sysroot-native/usr/bin:/usr/bin:/bin \
		bash -c "cd /work && mapfile -t a < $nw/meson-args && meson setup \"\${a[@]}\"" \
		>"$ROOT$nw/setup.log" 2>&1 || { tail -40 "$ROOT$nw/setup.log"; die "mesa-tools-native meson setup failed"; }
	sed -n '/^mesa 26/,$p' "$ROOT$nw/setup.log"
	[ -z "${MESA_SETUP_ONLY:-}" ] || return 0
	step "mesa-tools-native: build mesa_clc, vtn_bindgen2, panfrost_compile (-j$JOBS)"
	echo "$(in_root ninja -C "$nw/build" -n "${TOOLS[@]}" | grep -c '^\[') build steps"
	local tools=("${TOOLS[@]}")
	in_root nice -n 10 ninja -C "$nw/build" -j "$JOBS" "${tools[@]}" >"$ROOT$nw/build.log" 2>&1 \
		|| { tail -40 "$ROOT$nw/build.log"; die "mesa-tools-native build failed"; }
	tail -1 "$ROOT$nw/build.log"
	for t in "${tools[@]}"; do file "$ROOT$nw/build/$t" | sed "s|$ROOT||"; done
}

cmd_target() {
	check_tree
	local src=$SRC nw=$NW td=$DUMPS/mesa.env tw=$TW tools=("${TOOLS[@]}")
	for t in "${tools[@]}"; do
		[ -x "$ROOT$nw/build/$t" ] || die "no $nw/build/$t: run '$0 native' first"
	done
	local twd; twd=$($OE dump-var "$td" WORKDIR)
	# recipe-sysroot -> / (multiarch root); recipe-sysroot-native named too, or the shorter
	# recipe-sysroot mapping would eat its prefix.
	local tmap=(--map "$twd/recipe-sysroot-native=$tw/recipe-sysroot-native" --map "$twd/recipe-sysroot=/" --map "$twd=$tw" --map "$($OE dump-var "$td" S)=$src"
		--map "aarch64-poky-linux-=aarch64-linux-gnu-")
	step "mesa: do_write_config + write_qemuwrapper (the dump's), tools staged in the native sysroot"
	rm -rf "$ROOT$tw" && mkdir -p "$ROOT$tw/recipe-sysroot-native/usr/bin"
	for t in "${tools[@]}"; do ln -s "$nw/build/$t" "$ROOT$tw/recipe-sysroot-native/usr/bin/"; done
	cp -a "$ROOT$nw/recipe-sysroot-native/usr/bin/pkg-config-native" "$ROOT$tw/recipe-sysroot-native/usr/bin/"
	ln -s /usr/lib/llvm-$LLVM/bin/llvm-config "$ROOT$tw/recipe-sysroot-native/usr/bin/llvm-config"
	{ $OE dump-func "$td" write_qemuwrapper "${tmap[@]}" | sed '1i write_qemuwrapper() {' ; echo '}'
	  $OE dump-func "$td" do_write_config "${tmap[@]}"; } >"$ROOT/work/write-config-target.sh"
	in_root bash -e /work/write-config-target.sh
	sed -n '/^\[binaries\]/,/^pkg-config/p;/^\[properties\]/,/^sys_root/p' "$ROOT$tw/meson.cross"
	$OE dump-meson "$td" "${tmap[@]}" >"$ROOT$tw/meson-args"
	step "mesa: meson setup --cross-file (args: $tw/meson-args)"
	paste -sd" " "$ROOT$tw/meson-args" | fold -s -w 100 | sed "s/^/  /"
	# OE's target pkg-config environment, with Debian's arm64 multiarch .pc directory.
	in_root env PATH=$tw/recipe-sysroot-native/usr/bin:/usr/bin:/bin PKG_CONFIG_PATH= \
		PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig PKG_CONFIG_DISABLE_UNINSTALLED=yes \
		bash -c "cd /work && mapfile -t a < $tw/meson-args && meson setup \"\${a[@]}\"" \
		>"$ROOT$tw/setup.log" 2>&1 || { tail -40 "$ROOT$tw/setup.log"; die "mesa meson setup failed"; }
	grep -E "^Host machine cpu|^Build machine cpu|Program (mesa_clc|vtn_bindgen2|panfrost_compile) found|Run-time dependency (libdrm|wayland-client|expat|zlib)" "$ROOT$tw/setup.log" || true
	sed -n '/^mesa 26/,$p' "$ROOT$tw/setup.log"
	step "mesa: compile the patched files for aarch64, panvk v10 (the G610's arch), and v7's JM users of the changed prototype (-j$JOBS)"
	local objs=() f
	for f in csf_panvk_vX_cmd_buffer csf_panvk_vX_cmd_dispatch csf_panvk_vX_cmd_precomp panvk_vX_device; do
		objs+=("src/panfrost/vulkan/libpanvk_v10.a.p/$f.c.o")
	done
	for f in jm_panvk_vX_cmd_dispatch jm_panvk_vX_cmd_precomp; do
		objs+=("src/panfrost/vulkan/libpanvk_v7.a.p/$f.c.o")
	done
	in_root nice -n 10 ninja -C "$tw/build" -j "$JOBS" "${objs[@]}" >"$ROOT$tw/build-patched.log" 2>&1 \
		|| { tail -40 "$ROOT$tw/build-patched.log"; die "compiling the patched files failed"; }
	tail -1 "$ROOT$tw/build-patched.log"
	echo "warnings: $(grep -c 'warning:' "$ROOT$tw/build-patched.log")"
	for f in "${objs[@]}"; do file "$ROOT$tw/build/$f" | sed "s|$ROOT$tw/build/||"; done
	step "done"
}

# Optional, ~1000 steps: the whole panvk driver for aarch64.
cmd_driver() {
	[ -f "$ROOT$TW/build/build.ninja" ] || die "no mesa build dir: run '$0 target' first"
	step "mesa: build src/panfrost/vulkan/libvulkan_panfrost.so for aarch64 (-j$JOBS)"
	in_root nice -n 10 ninja -C "$TW/build" -j "$JOBS" src/panfrost/vulkan/libvulkan_panfrost.so \
		>"$ROOT$TW/build-driver.log" 2>&1 || { tail -40 "$ROOT$TW/build-driver.log"; die "driver build failed"; }
	tail -1 "$ROOT$TW/build-driver.log"
	echo "warnings: $(grep -c 'warning:' "$ROOT$TW/build-driver.log")"
	file "$ROOT$TW/build/src/panfrost/vulkan/libvulkan_panfrost.so" | sed "s|$ROOT||"
	step "done"
}

if [ "$MODE" != root ]; then
	[ -f "$DUMPS/mesa.env" ] && [ -f "$DUMPS/mesa-tools-native.env" ] \
		|| die "no mesa.env / mesa-tools-native.env in $DUMPS (tools/scripts/bitbake-env.sh makes them)"
fi
case "$MODE" in
root) cmd_root ;;
tree) cmd_tree ;;
native) cmd_native ;;
target) cmd_target ;;
driver) cmd_driver ;;
all) cmd_tree && cmd_native && cmd_target ;;
*) die "usage: $0 [root|tree|native|target|driver|all] [DUMP_DIR]" ;;
esac
