#!/bin/bash
# Build-readiness check as far as offline allows, and the dumps tests/layer/test_bitbake_env.py reads:
# per machine, the parse and `bitbake -n rocky-vulkan-image` (every task of the image, with
# signatures, nothing run), `bitbake -e` of the recipes whose values we render; and, for the
# first machine, the image refused without the model licence.
#
#   tools/scripts/bitbake-env.sh MIRRORS OUT [MACHINE...]
#
# MIRRORS holds git mirrors named bitbake, openembedded-core, meta-yocto, meta-arm and
# meta-rockchip (e.g. `git clone --mirror`); kas maps the pinned URLs to them (KAS_PREMIRRORS)
# and checks out the commits of kas/base.lock.yml. Run as a normal user (bitbake refuses root),
# with kas 5.5 on PATH. OUT gets work/ (kas repos and build dir), one folder per machine, and
# layer-tree (the git tree of meta-rocky-vulkan/ the dumps belong to). Then:
#   ROCKY_BITBAKE_ENV_DIR=OUT pytest -m slow tests/layer/test_bitbake_env.py
#
# ROCKY_KAS_FRAGMENTS="vulkan-cts ..." adds kas/<name>.yml to every kas file chain (default:
# none, the layer set of kas/base.yml). A fragment's own repos (kas/vulkan-cts.yml: meta-openembedded)
# must be in MIRRORS under their kas name too; with vulkan-cts, its recipe's `bitbake -e` is
# dumped as well. Use another OUT than the plain run's: the dumps differ.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 MIRRORS OUT [MACHINE...]" >&2
    exit 2
fi
mirrors=$(realpath "$1")
out=$(realpath -m "$2")
shift 2
root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cd "$root"
if [ $# -gt 0 ]; then
    machines=("$@")
else
    mapfile -t machines < <(grep -l '^machine:' kas/*.yml | xargs -n1 basename | sed 's/\.yml$//')
fi
for repo in bitbake openembedded-core meta-yocto meta-arm meta-rockchip; do
    [ -d "$mirrors/$repo" ] || { echo "$mirrors/$repo missing: mirror the pinned repo there" >&2; exit 2; }
done
fragments="" extra_premirrors="" recipes="mesa mesa-tools-native llama-cpp rocky-vulkan-image rocky-model rocky-selftest linux-yocto"
for name in ${ROCKY_KAS_FRAGMENTS:-}; do
    if ! [[ "$name" =~ ^[a-z0-9][a-z0-9-]{0,62}$ ]] || [ ! -f "kas/$name.yml" ]; then
        echo "ROCKY_KAS_FRAGMENTS: no kas/$name.yml (names: $(cd kas && ls -- *.yml | tr '\n' ' '))" >&2
        exit 2
    fi
    fragments+=":kas/$name.yml"
    while read -r repo url; do
        [ -d "$mirrors/$repo" ] || { echo "$mirrors/$repo missing: kas/$name.yml needs $url mirrored there" >&2; exit 2; }
        extra_premirrors+=$'\n'"$url file://$mirrors/$repo"
    done < <(awk '/^repos:/ { r = 1; next } r && /^[^ #]/ { r = 0 }
                  r && /^  [^ #][^ ]*:$/ { n = $1; sub(/:$/, "", n) }
                  r && /^    url: / { print n, $2 }' "kas/$name.yml")
    if [ "$name" = vulkan-cts ]; then recipes+=" vulkan-cts"; fi
done
if [ -n "$(git status --porcelain -- meta-rocky-vulkan kas)" ]; then
    echo "meta-rocky-vulkan/ or kas/ has uncommitted changes: the dumps must match a commit" >&2
    exit 2
fi

export KAS_PREMIRRORS="https://git.openembedded.org/bitbake file://$mirrors/bitbake
https://git.openembedded.org/openembedded-core file://$mirrors/openembedded-core
https://git.yoctoproject.org/meta-yocto file://$mirrors/meta-yocto
https://git.yoctoproject.org/meta-arm file://$mirrors/meta-arm
https://git.yoctoproject.org/meta-rockchip file://$mirrors/meta-rockchip$extra_premirrors"
export KAS_WORK_DIR="$out/work" LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8
mkdir -p "$KAS_WORK_DIR"
rm -f "$out/layer-tree" "$out/no-licence.txt"

# Check the repos out once; the kas shells below run side by side and must not race on it.
kas checkout "kas/${machines[0]}.yml:kas/offline.yml:kas/model-licence.yml$fragments"

# Without the licence fragment the image must be skipped, with the reason. One board suffices;
# its own kas build dir (another local.conf means another full parse), alongside the boards.
KAS_BUILD_DIR="$KAS_WORK_DIR/no-licence" kas shell --skip repos_checkout \
    "kas/${machines[0]}.yml:kas/offline.yml$fragments" \
    -c "bitbake -n rocky-vulkan-image" > "$out/no-licence.txt" 2>&1 &
no_licence=$!

for machine in "${machines[@]}"; do
    dir="$out/$machine"
    rm -rf "$dir" && mkdir -p "$dir"
    # One bitbake server (-T keeps it while idle) parses once and answers every command.
    kas shell --skip repos_checkout "kas/$machine.yml:kas/offline.yml:kas/model-licence.yml$fragments" -c "
        set -e
        bitbake -T 600 -n rocky-vulkan-image > '$dir/dry-run.txt' 2>&1
        bitbake -T 600 -e > '$dir/global.env'
        for recipe in $recipes; do
            bitbake -T 600 -e \$recipe > '$dir/'\$recipe.env
        done
        bitbake -m
    "
    grep -E '^(Parsing of|NOTE: Tasks Summary|ERROR|WARNING)' "$dir/dry-run.txt" || true
done
wait "$no_licence" || true
git rev-parse HEAD:meta-rocky-vulkan > "$out/layer-tree"
echo "dumps in $out for: ${machines[*]}"
