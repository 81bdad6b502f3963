#!/usr/bin/env bash
# CI stage: cross rehearsal of the llama-cpp recipe (issue 21, item 3). Debian bookworm's aarch64
# cross toolchain configures the pinned, patched llama.cpp b9101 with OE's toolchain file and task
# environment (from .ci/llama-cpp-bitbake-e.txt, an extract of bitbake -e llama-cpp) and exactly
# the recipe's EXTRA_OECMAKE; it builds vulkan-shaders-gen (must be x86-64), one shader (SPIR-V)
# and one target object (must be aarch64). Needs the trixie glslc and Vulkan headers that
# .ci/llama.sh leaves in $ROCKY_CACHE/trixie-tools. About 2 minutes warm, 3-4 cold.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/scripts/cross-llama.sh .ci/llama-cpp-bitbake-e.txt
