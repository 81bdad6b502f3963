#!/usr/bin/env bash
# CI stage: the simulated Mali-G610 from Debian's registry only.
#   1. `sim setup`: debootstrap a Debian sid root (cached), arm64 multiarch, pinned packages
#      (falls back to sid's current versions, loudly, when a pin has left the archive)
#   2. vulkaninfo under qemu + panthor drm-shim shows "Mali-G610 MC4" / panvk
#   3. one llama-bench run (ub 64, small model) succeeds on the simulated G610
#   4. the board's self-test (rocky_selftest) accepts the simulated G610: vulkan_device
#      and the ub 64 sweep PASS on real panvk / llama-bench output
#   5. rocky-vkcheck (the image's driver check) built for arm64 in the root records and submits
#      on both queues of the simulated G610 (recording only: nothing executes)
# via the slow tests in tests/sim/test_sim.py. Caches under ${ROCKY_CACHE:-/var/cache/rocky-vulkan}/sim.
# Needs root (debootstrap, chroot, mount namespaces). Cold: see docs/verification/sim.md.
set -euo pipefail

cd "$(dirname "$0")/.."
export ROCKY_CACHE=${ROCKY_CACHE:-/var/cache/rocky-vulkan}
SIM=$ROCKY_CACHE/sim
say() { printf '[ci/sim] %s\n' "$*" >&2; }
start=$(date +%s)

if ! command -v debootstrap >/dev/null || ! command -v unshare >/dev/null; then
	say "installing debootstrap"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap util-linux
fi

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
	say "creating .venv"
	python3 -m venv .venv
	.venv/bin/pip install -q -e '.[dev]'
fi

say "sim setup (root: $SIM/root)"
mkdir -p "$SIM"
rc=0
"$PY" -m rocky_vulkan.sim setup 2>&1 | tee "$SIM/setup.log" || rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
	if grep -q "no longer in" "$SIM/setup.log"; then
		say "WARNING: pinned versions left Debian sid; using the current ones (printed below)"
		"$PY" -m rocky_vulkan.sim setup --float
	else
		exit 1
	fi
fi

say "writing the CI test model"
mkdir -p "$SIM/models"
MODEL=$SIM/models/ci-tiny.gguf
"$PY" -c 'import sys; from rocky_vulkan.llama.testmodel import write_preset; write_preset("tiny", sys.argv[1])' "$MODEL"

# ROCKY_SIM_FULL=1 adds the private-VA exhaustion test: +3 GB of disk, about 70 s to write the
# model and a few minutes of cold shader compilation.
BIG=
if [ "${ROCKY_SIM_FULL:-0}" = 1 ]; then
	BIG=$SIM/models/q3b-shape-36l-q8_0.gguf
	[ -f "$BIG" ] || "$PY" -c 'import sys; from rocky_vulkan.llama.testmodel import write_preset; write_preset("qwen2.5-3b-shape", sys.argv[1], n_layer=36)' "$BIG"
fi

# rocky-vkcheck's shaders and Vulkan headers: trixie's glslc and headers, unpacked by .ci/llama.sh.
TX=$ROCKY_CACHE/trixie-tools
if [ -x "$TX/glslc" ] && [ -d "$TX/usr/include/vulkan" ]; then
	export ROCKY_VKCHECK_GLSLC=$TX/glslc ROCKY_VULKAN_INCLUDE=$TX/usr/include
fi

say "slow simulator tests"
ROCKY_SIM_ROOT=$SIM/root ROCKY_SIM_MODEL=$MODEL ROCKY_SIM_BIG_MODEL=$BIG \
	"$PY" -m pytest -q -m slow tests/sim/test_sim.py -rs
say "done in $(($(date +%s) - start)) s"
