#!/bin/bash
# Device run (H200, NVIDIA Vulkan): the patched b9101 tree (exact pin, from PyPI, no test hooks)
# built with trixie's glslc so the integer-dot shaders exist; then, coopmat off so the scalar tiles
# are used: the auto switch (must stay off on NVIDIA), a bad GGML_VK_MALI_WARPTILE value (must
# warn), and the int-dot L cases (tests.helpers.intdot_cases) plus MUL_MAT / MUL_MAT_ID with the
# Mali tiles forced and stock, GGML_VK_PIPELINE_STATS naming the pipelines and their statistics.
# Needs beside the repo: .h200/llama-src.tar.gz (`llama-src prepare DIR` packed as full/) and
# .h200/debs (trixie glslc, libshaderc1, libc6, libgcc-s1, libstdc++6, libvulkan-dev,
# spirv-headers; bookworm libvulkan1).
. "$(dirname "${BASH_SOURCE[0]}")/h200-common.sh"   # R, O, ts, left (560 s), glslc, loader, ICD
ts "glslc: $($X/glslc --version | head -1); loader $LOADER; nproc $(nproc); $(command -v cmake ninja g++ | tr '\n' ' ')"
h200_unpack
h200_configure "$O"
cmake --build /tmp/b -j "$(nproc)" --target test-backend-ops > "$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
ts built; B=/tmp/b/bin
PYTHONPATH=$R/tools python3 -m tests.helpers.intdot_cases /tmp/intdot.cases
export GGML_NO_BACKTRACE=1 GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1
F='type_a=f16,type_b=f32,m=16,n=1,k=256,bs=.1,1.,nr=.1,1.'
$B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" > "$O/auto.log" 2>&1; ts "auto rc=$?"
GGML_VK_MALI_WARPTILE=1 $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" > "$O/bad-value.log" 2>&1; ts "MALI_WARPTILE=1 rc=$?"
grep -hE "ggml_vulkan: 0 =|Mali|stock matmul|ignoring GGML_VK" "$O/auto.log" "$O/bad-value.log" | tee -a "$O/steps.log"
for mode in force 0; do
  GGML_VK_MALI_WARPTILE=$mode GGML_VK_PIPELINE_STATS=matmul_ timeout "$(left 150)" $B/test-backend-ops -b Vulkan0 \
    --test-file /tmp/intdot.cases > "$O/intdot-$mode.log" 2>&1; ts "intdot $mode rc=$?"
  GGML_VK_MALI_WARPTILE=$mode timeout "$(left 150)" $B/test-backend-ops -b Vulkan0 -o MUL_MAT > "$O/mul_mat-$mode.log" 2>&1; ts "MUL_MAT $mode rc=$?"
done
GGML_VK_MALI_WARPTILE=force timeout "$(left 120)" $B/test-backend-ops -b Vulkan0 -o MUL_MAT_ID > "$O/mul_mat_id-force.log" 2>&1; ts "MUL_MAT_ID force rc=$?"
for f in "$O"/intdot-*.log "$O"/mul_mat*.log; do
  echo "${f##*/}: $(grep -E '[0-9]+/[0-9]+ tests passed' "$f" | head -1) FAIL=$(grep -c FAIL "$f") q8_1_l=$(grep -c 'pipeline stats for matmul_.*_q8_1_l:' "$f") mali_line=$(grep -c 'using Mali matmul' "$f")"
done | tee -a "$O/steps.log"
