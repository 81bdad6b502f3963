#!/bin/bash
# yocto-check-layer on the three committed layers, offline, in a fresh build dir (the tool skips
# a layer already in BBLAYERS), with the pinned upstream layers as dependencies.
#
#   tools/scripts/yocto-check-layer.sh MIRRORS OUT [LAYER...]
#
# MIRRORS and OUT as for tools/scripts/bitbake-env.sh (run that first: it checks the upstream repos out
# under OUT/work). LAYER: names under meta-rocky-vulkan/ (default: all three), to recheck one
# layer after a change to it alone. Writes OUT/yocto-check-layer.log; exit status is
# yocto-check-layer's. The upstream layers are dependencies, not tested (--no-auto-dependency).
# ROCKY_YCL_MACHINES="m1 m2": the BSP's machines to build signatures and world for (default:
# every kas/*.yml machine; each adds a parse and more on 2 cores). About 30+ minutes per layer
# on 2 cores. Run as a normal user, kas 5.5 on PATH.
set -euo pipefail

if [ "${1:-}" = --inner ]; then
    # Inside `kas shell`: a fresh build dir from oe-core's template, offline.
    work=$2 out=$3 machines=$4
    shift 4
    rm -rf "$work/ycl-build"
    cd "$work/openembedded-core"
    set +u  # oe-init-build-env reads unset variables
    # shellcheck disable=SC1091
    . ./oe-init-build-env "$work/ycl-build" > /dev/null
    printf 'BB_NO_NETWORK = "1"\nCONNECTIVITY_CHECK_URIS = ""\n' >> conf/local.conf
    # shellcheck disable=SC2086
    exec yocto-check-layer -o "$out/yocto-check-layer.log" --no-auto-dependency \
        --dependency "$work/meta-arm/meta-arm" "$work/meta-arm/meta-arm-toolchain" \
                     "$work/meta-rockchip" "$work/openembedded-core/meta" "$work/meta-yocto/meta-poky" \
        --machines $machines -- "$@"
fi

if [ $# -lt 2 ]; then
    echo "usage: $0 MIRRORS OUT [LAYER...]" >&2
    exit 2
fi
mirrors=$(realpath "$1")
out=$(realpath "$2")
work="$out/work"
root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cd "$root"
mapfile -t machines < <(grep -l '^machine:' kas/*.yml | xargs -n1 basename | sed 's/\.yml$//')
if [ -n "${ROCKY_YCL_MACHINES:-}" ]; then
    read -r -a machines <<< "$ROCKY_YCL_MACHINES"
    for machine in "${machines[@]}"; do
        [ -f "kas/$machine.yml" ] || { echo "ROCKY_YCL_MACHINES: no kas/$machine.yml" >&2; exit 2; }
    done
fi
names=("${@:3}")
[ ${#names[@]} -gt 0 ] || names=(meta-rocky-vulkan-bsp meta-rocky-vulkan-distro meta-rocky-vulkan)
layers=()
for name in "${names[@]}"; do
    [ -f "$root/meta-rocky-vulkan/$name/conf/layer.conf" ] || {
        echo "$name: no such layer under meta-rocky-vulkan/ (see its conf/layer.conf)" >&2
        exit 2
    }
    layers+=("$root/meta-rocky-vulkan/$name")
done

export KAS_PREMIRRORS="https://git.openembedded.org/bitbake file://$mirrors/bitbake
https://git.openembedded.org/openembedded-core file://$mirrors/openembedded-core
https://git.yoctoproject.org/meta-yocto file://$mirrors/meta-yocto
https://git.yoctoproject.org/meta-arm file://$mirrors/meta-arm
https://git.yoctoproject.org/meta-rockchip file://$mirrors/meta-rockchip"
# Its own kas build dir: kas rewrites conf/ there, which must not disturb bitbake-env.sh.
export KAS_WORK_DIR="$work" KAS_BUILD_DIR="$work/ycl-kas" LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8

git rev-parse HEAD > "$out/yocto-check-layer.commit"
kas shell "kas/${machines[0]}.yml:kas/offline.yml" \
    -c "bash '$root/tools/scripts/yocto-check-layer.sh' --inner '$work' '$out' '${machines[*]}' ${layers[*]}"
