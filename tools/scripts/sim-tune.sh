#!/usr/bin/env bash
# The board's tile tuner on the simulated Mali-G610 of `rocky-vulkan sim prove`: the image's own
# rocky_selftest package and tile_candidates.json, `rocky-selftest tune` unchanged, in the prove
# root (amd64 panvk + the panfrost drm-shim) with the spec-capable llama.cpp that prove built.
#
#   sim-tune.sh OUT [--driver patched] [--model /work/model/q3b-4l-q4_k_m.gguf] [--budget 7200]
#
# Needs root and a finished `rocky-vulkan sim prove` (ROCKY_CACHE as for it). Adds
# llama-perplexity to prove's llama.cpp build (incremental), runs the tune, and copies
# result.json, the progress file and the log to OUT.
# The drm-shim executes no GPU work: llama-bench's t/s time only the CPU side of a run, so the
# ranking means nothing, and the GPU's logits are never computed, so the KLD check of a
# non-built-in winner is expected to fail and the tuner to keep the built-in tiles. What a run
# shows: every candidate is accepted by the patch, compiles on panvk and completes a pp512 run,
# and the tuner's phases (sweep, repeats, validation, the choice) run to the end on panvk.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
out=$1; shift
driver=patched model=/work/model/q3b-4l-q4_k_m.gguf budget=7200
while [ $# -gt 0 ]; do
	case "$1" in
	--driver) driver=$2; shift 2 ;;
	--model) model=$2; shift 2 ;;
	--budget) budget=$2; shift 2 ;;
	*) echo "sim-tune.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "sim-tune.sh: --budget takes seconds, not '$budget'" >&2; exit 2; }

export ROCKY_CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
root=${MESA_ROOT:-$ROCKY_CACHE/mesa/root-sid}
build="$repo/tools/rocky_vulkan/sim/mesa-panvk-build.sh"
llm="$repo/meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm"
pkg="$llm/rocky-selftest/files"
lib="$llm/rocky-board/files"  # the Python library and config.json
for need in "$root/work/llama-src-b9101" "$root$model" "$root/work/drivers/$driver/panfrost_icd.json"; do
	[ -e "$need" ] || { echo "sim-tune.sh: no $need: run \`rocky-vulkan sim prove\` first" >&2; exit 1; }
done

echo "== llama-perplexity for the KLD check (incremental build of prove's tree)"
bash "$build" llama --src /work/llama-src-b9101 --name b9101-mali \
	--targets "llama-bench llama-quantize llama-perplexity"

echo "== the image's rocky_selftest and tile_candidates.json in $root/work/tune"
rm -rf "$root/work/tune" && mkdir -p "$root/work/tune/results"
cp -r "$lib/rocky_selftest" "$pkg/tile_candidates.json" "$root/work/tune/"
python3 - "$lib/config.json" "$root/work/tune/config.json" "$root$model" "$model" "$budget" <<'EOF'
import hashlib, json, sys
src, dst, host_model, model, budget = sys.argv[1:]
cfg = json.load(open(src))
digest = hashlib.sha256()
with open(host_model, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
cfg.update(
    model_path=model, model_sha256=digest.hexdigest(), bin_dir="/work/llama-b9101-mali/bin",
    results_dir="/work/tune/results", tune_candidates="/work/tune/tile_candidates.json",
    tune_budget_s=int(budget), motd_path="",
)
json.dump(cfg, open(dst, "w"), indent=2)
EOF

echo "== rocky-selftest tune on the simulated G610 (driver $driver)"
mkdir -p "$out"
rc=0
bash "$build" run --driver "$driver" -- env PYTHONPATH=/work/tune \
	python3 -m rocky_selftest --config /work/tune/config.json tune 2>&1 | tee "$out/tune.log" || rc=$?
cp "$root"/work/tune/results/* "$out/" 2>/dev/null || true
cp "$root/work/tune/config.json" "$out/config.json"
echo "sim-tune.sh: rocky-selftest tune exit $rc; result.json and the log in $out"
exit "$rc"
