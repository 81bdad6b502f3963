#!/usr/bin/env bash
# Build Mesa's panvk + the panfrost drm-shim (amd64, native) in a cached Debian sid root, with our
# patches applied, and run llama.cpp on a simulated Mali-G610 with that driver. No board, no qemu.
#
#   mesa-panvk-build.sh root
#       Create (once) the sid root and install the build and simulation packages into it.
#   mesa-panvk-build.sh build --tag NAME (--git-dir DIR --commit SHA | --src DIR) [--patch FILE]...
#       Export the Mesa tree into the root (once per source), commit it as `base`, check out branch
#       NAME from `base`, apply each patch with `git am` (no fuzz: `git am` refuses it), build
#       panvk + drm-shim with ninja (incremental: every tag of one source shares one build dir),
#       and copy the driver bundle to $ROOT/work/drivers/NAME (libvulkan_panfrost.so, ICD json,
#       libpanfrost_noop_drm_shim.so).
#   mesa-panvk-build.sh run --driver NAME -- COMMAND...
#       Run COMMAND in the root on the simulated G610 (PAN_GPU_ID=a867) with driver bundle NAME.
#   mesa-panvk-build.sh exec -- COMMAND...
#       Run COMMAND in the root, no driver (e.g. llama-quantize).
#   mesa-panvk-build.sh llama --src DIR --name NAME [--targets "llama-bench llama-quantize"]
#       Build llama.cpp with the Vulkan backend from the tree DIR (a path inside the root, e.g.
#       one written by `rocky-vulkan llama-src prepare`) with sid's cmake, glslc (it has
#       GL_EXT_integer_dot_product) and Vulkan headers; the binaries go to /work/llama-NAME/bin.
#       Incremental: the build folder /work/llama-NAME/build is kept.
#   mesa-panvk-build.sh sweep --driver NAME --model GGUF [--ubs "64 128 256 512 1024"] [--out DIR]
#                             [--bench PATH] [--env K=V]...
#       One llama-bench process per micro-batch (-p 512 -n 0 -ngl 99 -r 1 -o json), so that a
#       crash at one ub does not hide the others; keeps JSON, stderr, exit code and the
#       `panvk-privva:` lines (printed by the instrumentation patch) per ub, and a summary.tsv.
#       --bench: the llama-bench to run, a path inside the root (default: the root's
#       `llama-bench`, Debian's); --env: an extra variable for it (repeatable), e.g.
#       GGML_VK_MALI_WARPTILE=0. The bench and variables are written to the sweep's `command` file.
#
# Environment: ROCKY_CACHE (default /var/cache/rocky-vulkan), MESA_ROOT (default
# $ROCKY_CACHE/mesa/root-sid), MESA_JOBS (default 2), DEBIAN_MIRROR. Paths given to `run` and
# `sweep` (models) are paths inside the root; $ROOT/work is the shared work area.
# /proc, /sys and /dev are bound into the root in a private mount namespace (unshare) for the
# duration of one command, so invocations can run side by side and nothing stays mounted.
# The drm-shim does not execute GPU work: recording, vkEndCommandBuffer, memory allocation and
# submission are real, so the run shows allocation failures and VA use, not speed.
set -euo pipefail

CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
ROOT=${MESA_ROOT:-$CACHE/mesa/root-sid}
JOBS=${MESA_JOBS:-2}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LLVM=22

BUILD_PKGS="build-essential meson ninja-build ccache pkgconf git python3-mako python3-yaml
 python3-packaging python3-setuptools bison flex glslang-tools libdrm-dev libexpat1-dev
 libzstd-dev zlib1g-dev libelf-dev libudev-dev libdisplay-info-dev libvulkan-dev spirv-tools-dev
 llvm-$LLVM-dev libclang-$LLVM-dev libclang-cpp$LLVM-dev libclc-$LLVM libclc-$LLVM-dev
 libllvmspirvlib-$LLVM-dev llvm-spirv-$LLVM cmake glslc spirv-headers"
SIM_PKGS="llama.cpp-tools libggml0-backend-vulkan vulkan-tools python3-gguf python3-numpy"

say() { printf '[mesa-panvk] %s\n' "$*" >&2; }
die() { printf '[mesa-panvk] error: %s\n' "$*" >&2; exit 1; }

# /proc, /sys and /dev are bind-mounted in a private mount namespace: they vanish with the command,
# so a root is never left with /dev bound into it (dangerous to delete), and two invocations
# (a Mesa and a llama.cpp build) cannot unmount each other's binds.
in_root() {
	[ -x "$ROOT/usr/bin/env" ] || die "no Debian root at $ROOT: run '$0 root' first"
	cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
	unshare --mount --propagation private -- /bin/bash -c \
		'r=$1; shift; for d in proc sys dev; do mount --bind "/$d" "$r/$d" || exit 1; done
		exec chroot "$r" "$@"' in_root "$ROOT" \
		/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
}

cmd_root() {
	if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
		command -v debootstrap >/dev/null || apt-get install -y debootstrap
		say "debootstrap sid into $ROOT"
		mkdir -p "$(dirname "$ROOT")"
		debootstrap --variant=minbase --include=ca-certificates sid "$ROOT" "$MIRROR"
	fi
	# sid's Release files can be older than their Valid-Until on a mirror snapshot.
	echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99no-valid-until"
	echo 'APT::Install-Recommends "false";' >"$ROOT/etc/apt/apt.conf.d/99no-recommends"
	in_root apt-get update
	# shellcheck disable=SC2086
	in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y $BUILD_PKGS $SIM_PKGS
	in_root dpkg-query -W -f '${Package} ${Version}\n' meson llvm-$LLVM-dev libdrm-dev \
		libclc-$LLVM llama.cpp-tools libggml0-backend-vulkan vulkan-tools cmake glslc spirv-headers
}

# Write a git tree into a directory. A snapshot brought by the search tool's `fetch` may lack a
# few large blobs (test models, perf XML); they are not needed for panvk and are skipped.
export_tree() {
	python3 - "$1" "$2" "$3" <<'EOF'
import os, subprocess, sys
gitdir, commit, dest = sys.argv[1:4]
ls = subprocess.run(["git", f"--git-dir={gitdir}", "ls-tree", "-r", "-z", commit],
                    check=True, capture_output=True).stdout
cat = subprocess.Popen(["git", f"--git-dir={gitdir}", "cat-file", "--batch"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
done = skipped = 0
for rec in filter(None, ls.split(b"\0")):
    meta, path = rec.split(b"\t", 1)
    mode, kind, sha = meta.split()
    if kind != b"blob":
        continue
    cat.stdin.write(sha + b"\n")
    cat.stdin.flush()
    header = cat.stdout.readline().split()
    if header[1] == b"missing":
        skipped += 1
        print("skipped (absent from snapshot):", path.decode(), file=sys.stderr)
        continue
    data = cat.stdout.read(int(header[2]))
    cat.stdout.read(1)
    out = os.path.join(dest, path.decode())
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if mode == b"120000":
        os.symlink(data.decode(), out)
        continue
    with open(out, "wb") as f:
        f.write(data)
    if mode == b"100755":
        os.chmod(out, 0o755)
    done += 1
print(f"exported {done} files, skipped {skipped}", file=sys.stderr)
EOF
}

cmd_build() {
	local tag="" gitdir="" commit="" src="" patches=()
	while [ $# -gt 0 ]; do
		case "$1" in
		--tag) tag=$2; shift 2 ;;
		--git-dir) gitdir=$2; shift 2 ;;
		--commit) commit=$2; shift 2 ;;
		--src) src=$2; shift 2 ;;
		--patch) patches+=("$(realpath "$2")"); shift 2 ;;
		*) die "build: unknown argument $1" ;;
		esac
	done
	[ -n "$tag" ] || die "build: --tag NAME is required"
	[ -x "$ROOT/usr/bin/meson" ] || die "no build root at $ROOT: run '$0 root' first"
	local name
	if [ -n "$gitdir" ]; then
		[ -n "$commit" ] || die "build: --git-dir needs --commit"
		name=mesa-${commit:0:12}
	elif [ -n "$src" ]; then
		name=mesa-$(basename "$(realpath "$src")")
	else
		die "build: give --git-dir DIR --commit SHA or --src DIR"
	fi
	local tree=$ROOT/work/$name/src build=/work/$name/build
	if [ ! -d "$tree/.git" ]; then
		say "exporting Mesa source into $tree"
		rm -rf "$tree"
		mkdir -p "$tree"
		if [ -n "$gitdir" ]; then export_tree "$gitdir" "$commit" "$tree"; else cp -a "$src/." "$tree/"; fi
		git -C "$tree" init -q
		git -C "$tree" -c core.autocrlf=false add -A
		git -C "$tree" -c user.name=base -c user.email=base@localhost commit -qm "base: $name"
		git -C "$tree" branch -f base
	fi
	say "branch $tag = base + ${#patches[@]} patch(es)"
	git -C "$tree" checkout -q -f -B "$tag" base
	local p
	for p in "${patches[@]}"; do
		say "git am $(basename "$p")"
		git -C "$tree" -c user.name=sim -c user.email=sim@localhost am -q --whitespace=nowarn "$p" ||
			{ git -C "$tree" am --abort || true; die "$(basename "$p") does not apply"; }
	done
	git -C "$tree" log --oneline -n $((${#patches[@]} + 1)) >&2
	if [ ! -f "$ROOT$build/build.ninja" ]; then
		in_root meson setup "$build" "/work/$name/src" -Dbuildtype=debugoptimized \
			-Dvulkan-drivers=panfrost -Dgallium-drivers= -Dtools=drm-shim -Dplatforms= \
			-Dglx=disabled -Degl=disabled -Dgbm=disabled -Dopengl=false -Dgles1=disabled \
			-Dgles2=disabled -Dvideo-codecs= -Dllvm=enabled -Dshared-llvm=enabled \
			-Dvalgrind=disabled -Dlibunwind=disabled -Dlmsensors=disabled -Dzstd=enabled \
			-Dexpat=enabled -Dvulkan-layers= -Dbuild-tests=false
	fi
	say "ninja -j$JOBS (log: $ROOT$build/ninja-$tag.log)"
	in_root nice -n 10 ninja -C "$build" -j"$JOBS" >"$ROOT$build/ninja-$tag.log" 2>&1 ||
		{ tail -40 "$ROOT$build/ninja-$tag.log" >&2; die "build of $tag failed"; }
	tail -1 "$ROOT$build/ninja-$tag.log" >&2
	local out=$ROOT/work/drivers/$tag
	mkdir -p "$out"
	cp "$ROOT$build/src/panfrost/vulkan/libvulkan_panfrost.so" "$out/"
	cp "$ROOT$build/src/panfrost/drm-shim/libpanfrost_noop_drm_shim.so" "$out/"
	sed "s|\"library_path\": *\"[^\"]*\"|\"library_path\": \"/work/drivers/$tag/libvulkan_panfrost.so\"|" \
		"$ROOT$build/src/panfrost/vulkan/panfrost_devenv_icd.x86_64.json" >"$out/panfrost_icd.json"
	git -C "$tree" rev-parse HEAD >"$out/mesa-commit"
	say "driver bundle: $out"
}

cmd_llama() {
	local src="" name="" targets="llama-bench llama-quantize"
	while [ $# -gt 0 ]; do
		case "$1" in
		--src) src=$2; shift 2 ;;
		--name) name=$2; shift 2 ;;
		--targets) targets=$2; shift 2 ;;
		*) die "llama: unknown argument $1" ;;
		esac
	done
	[ -n "$src" ] && [ -n "$name" ] || die "llama: --src DIR (inside the root) --name NAME"
	[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "llama: --name '$name' may hold only A-Z a-z 0-9 . _ -"
	[ -x "$ROOT/usr/bin/cmake" ] && [ -x "$ROOT/usr/bin/glslc" ] ||
		die "the root at $ROOT has no cmake/glslc: run '$0 root' again (it installs them)"
	[ -f "$ROOT$src/CMakeLists.txt" ] || die "llama: no llama.cpp tree at $src inside the root ($ROOT$src)"
	local build=/work/llama-$name/build out=/work/llama-$name/bin
	mkdir -p "$ROOT$build" "$ROOT$out"
	if [ ! -f "$ROOT$build/build.ninja" ]; then
		in_root env CCACHE_DIR=/work/ccache cmake -S "$src" -B "$build" -G Ninja \
			-DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER_LAUNCHER=ccache \
			-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DBUILD_SHARED_LIBS=OFF -DGGML_VULKAN=ON \
			-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
			-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_NUMBER=9101 \
			-DLLAMA_BUILD_COMMIT=389ff61 >"$ROOT$build/../configure.log" 2>&1 ||
			{ tail -40 "$ROOT$build/../configure.log" >&2; rm -f "$ROOT$build/build.ninja"; die "cmake configure failed"; }
		grep -i 'integer_dot\|glslc' "$ROOT$build/../configure.log" >&2 || true
	fi
	say "building $targets with -j$JOBS (log: $ROOT/work/llama-$name/build.log)"
	# shellcheck disable=SC2086
	in_root env CCACHE_DIR=/work/ccache nice -n 10 cmake --build "$build" -j"$JOBS" \
		--target $targets >"$ROOT/work/llama-$name/build.log" 2>&1 ||
		{ tail -40 "$ROOT/work/llama-$name/build.log" >&2; die "llama.cpp build failed"; }
	local t
	for t in $targets; do cp "$ROOT$build/bin/$t" "$ROOT$out/"; done
	say "llama.cpp binaries: $ROOT$out"
}

driver_env() {
	local d=/work/drivers/$1
	[ -f "$ROOT$d/panfrost_icd.json" ] || die "no driver bundle $1 (run '$0 build --tag $1 ...')"
	echo "VK_ICD_FILENAMES=$d/panfrost_icd.json LD_PRELOAD=$d/libpanfrost_noop_drm_shim.so" \
		"PAN_GPU_ID=a867 GGML_NO_BACKTRACE=1 MESA_SHADER_CACHE_DIR=/work/shader-cache/$1"
}

cmd_run() {
	local driver=""
	while [ $# -gt 0 ]; do
		case "$1" in
		--driver) driver=$2; shift 2 ;;
		--) shift; break ;;
		*) die "run: unknown argument $1" ;;
		esac
	done
	[ -n "$driver" ] && [ $# -gt 0 ] || die "run: --driver NAME -- COMMAND..."
	local envs
	envs=$(driver_env "$driver") || exit 1
	# shellcheck disable=SC2086
	in_root env $envs "$@"
}

cmd_sweep() {
	local driver="" model="" ubs="64 128 256 512 1024" out="" bench=llama-bench extra=()
	while [ $# -gt 0 ]; do
		case "$1" in
		--driver) driver=$2; shift 2 ;;
		--model) model=$2; shift 2 ;;
		--ubs) ubs=$2; shift 2 ;;
		--out) out=$2; shift 2 ;;
		--bench) bench=$2; shift 2 ;;
		--env)
			[[ $2 == [A-Za-z_]*=* ]] || die "sweep: --env takes K=V, not '$2'"
			extra+=("$2"); shift 2 ;;
		*) die "sweep: unknown argument $1" ;;
		esac
	done
	[ -n "$driver" ] && [ -n "$model" ] || die "sweep: --driver NAME --model GGUF"
	[ -f "$ROOT$model" ] || die "model $model not found inside the root ($ROOT$model)"
	if [[ $bench == */* ]]; then
		[ -x "$ROOT$bench" ] || die "llama-bench $bench not found inside the root ($ROOT$bench)"
	fi
	local envs
	envs=$(driver_env "$driver") || exit 1
	out=${out:-$ROOT/work/sweeps/$driver}
	mkdir -p "$out"
	printf 'driver=%s\nbench=%s\nmodel=%s\nenv=%s\n' "$driver" "$bench" "$model" \
		"${extra[*]:-}" >"$out/command"
	printf 'ub\texit\tpeak_priv_va_mib\terror\n' >"$out/summary.tsv"
	local ub rc peak err
	for ub in $ubs; do
		say "$bench ub=$ub driver=$driver${extra[*]:+ ${extra[*]}}"
		rc=0
		# shellcheck disable=SC2086
		in_root env $envs "${extra[@]}" timeout 1200 "$bench" -m "$model" -p 512 -n 0 \
			-ngl 99 -r 1 -ub "$ub" -o json >"$out/ub$ub.json" 2>"$out/ub$ub.stderr" || rc=$?
		peak=$(grep -o 'panvk-privva: peak [0-9.]*' "$out/ub$ub.stderr" | awk '{print $3}' |
			sort -n | tail -1)
		err=$(grep -o -m1 'what(): .*' "$out/ub$ub.stderr" ||
			grep -o -m1 'Error[A-Za-z]*\|priv heap exhausted.*' "$out/ub$ub.stderr" || true)
		printf '%s\t%s\t%s\t%s\n' "$ub" "$rc" "${peak:-?}" "${err:-}" | tee -a "$out/summary.tsv" >&2
	done
	say "results: $out"
}

case "${1:-}" in
root) shift; cmd_root "$@" ;;
build) shift; cmd_build "$@" ;;
run) shift; cmd_run "$@" ;;
exec) shift; [ "${1:-}" = -- ] && shift; [ $# -gt 0 ] || die "exec: -- COMMAND..."; in_root "$@" ;;
llama) shift; cmd_llama "$@" ;;
sweep) shift; cmd_sweep "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
