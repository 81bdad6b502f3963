#!/bin/bash
# Device run (H200, NVIDIA Vulkan) for the runtime tile spec, GGML_VK_MALI_WARPTILE=<spec>: the patched
# b9101 tree (exact pin from PyPI, no test hooks) built with trixie's glslc (int-dot shaders), then with
# coopmat off so the scalar tiles run:
#  (d) every rule's rejection line, one tiny case each, and an unknown value's old warning;
#  (a) unset, (b) force, (c) a valid non-default spec: test-backend-ops -o MUL_MAT in full, in parallel;
#  (c) the L-tile cases (all 11 int-dot *_q8_1_l pipelines; float and dequant L pipelines with int dot
#      off) with the spec and with force, GGML_VK_PIPELINE_STATS naming the pipelines that ran.
# Needs beside the repo: .h200/llama-src.tar.gz (`llama-src prepare DIR` packed as full/) and .h200/debs
# (trixie glslc, libshaderc1, libc6, libgcc-s1, libstdc++6, libvulkan-dev, spirv-headers; bookworm
# libvulkan1). Usage (device tool): bash docs/verification/llama-tilespec-h200.sh, carry .h200.
# Status: written 2026-12-03 but NOT run yet: the session's device time was spent (215 s left, under
# the 4 min a start needs). Its spec checks were run against the same C++ functions on this machine.
L=/tmp/o; mkdir -p $L  # $O: steps.log + logs.tgz come back
H200_BUDGET_S=570; . "$(dirname "${BASH_SOURCE[0]}")/h200-common.sh"   # R, O, ts, left, glslc, loader, ICD
ts "glslc: $($X/glslc --version | head -1); loader $LOADER; nproc $(nproc)"
h200_unpack
grep -c "ggml_vk_parse_mali_warptile_spec" $S/ggml/src/ggml-vulkan/ggml-vulkan.cpp | sed 's/^/spec parser in source: /' | tee -a "$O/steps.log"
h200_configure "$L"
cmake --build /tmp/b -j "$(nproc)" --target test-backend-ops > "$L/build.log" 2>&1 || { grep -B2 -A12 "error" "$L/build.log" | head -80; exit 1; }
ts built; B=/tmp/b/bin
# L-tile cases: the 11 int-dot types (tests.helpers.intdot_cases) plus f32, f16, bf16 and iq4_nl
# (mul_mm.comp: float and dequant), m and n > 64; k 224 is not a multiple of 128 (unaligned pipelines).
PYTHONPATH=$R/tools python3 -m tests.helpers.intdot_cases /tmp/l.cases >/dev/null
python3 - >> /tmp/l.cases <<'EOF'
for t, blk, size in ((0, 1, 4), (1, 1, 2), (30, 1, 2), (20, 32, 18)):
    for m, n, k in ((128, 128, 256), (136, 72, 512), (136, 72, 224)):
        row = k // blk * size
        a = [t, k, m, 1, 1, size, row, row * m, row * m]
        b = [0, k, n, 1, 1, 4, 4 * k, 4 * k * n, 4 * k * n]
        print(" ".join(map(str, [29, 0, m, n, 1, 1, 0, 2, *a, *b, "-"])))
EOF
ts "$(wc -l < /tmp/l.cases) L-tile cases"
export GGML_NO_BACKTRACE=1 GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1 MALLOC_PERTURB_=255
F='type_a=f16,type_b=f32,m=16,n=1,k=256,bs=.1,1.,nr=.1,1.'
SPEC='mm=128,64,64,32,16,32,2,2,2,1,16;mmq=256,128,64,32,32,16,2,2,2,1,16;int=128,64,64,32,16,32,2,2,2,1,16,2;int_k=256,128,128,32,32,64,2,4,4,1,32,2'
# (d) one rejection line per rule (spec | the rule text expected in the line)
cat > /tmp/bad.txt <<'EOF'
int=2048,64,64,32,16,16,2,2,2,1,16,2|int: BLOCK_SIZE <= maxComputeWorkGroupInvocations broken
int=256,64,64,32,16,16,2,2,2,1,24,2|int: BLOCK_SIZE % WARP == 0 broken
int=256,64,64,32,12,16,2,2,2,1,16,2|int: BM % WM == 0 && BN % WN == 0 broken
int=256,64,64,32,16,16,2,2,2,1,32,2|int: (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP broken
int_k=256,64,64,32,16,16,1,3,2,1,16,2|int_k: WM % WMITER == 0 && (WM/WMITER) % TM == 0 broken
int=256,64,64,32,16,16,4,4,2,1,16,2|int: (WM*WN) % (WARP*TM*TN*WMITER) == 0 broken
int=16,48,16,32,48,16,1,1,1,1,16,1|int: WN % WNITER == 0 && (WN/WNITER) % TN == 0 broken
int=256,64,64,32,16,16,2,2,2,2,16,2|int: TK == 1 broken
mmq=256,64,64,32,16,16,2,1,2,1,16|mmq: TM % 2 == 0 broken
mm=256,64,64,12,16,16,2,2,2,1,16|mm: BK % 4 == 0 && 128 % BK == 0 broken
int=256,64,64,16,16,16,2,2,2,1,16,2|int: BK == 32 broken
mmq=512,64,128,32,16,16,2,2,2,1,16|mmq: BLOCK_SIZE % 16 == 0 && BM % (BLOCK_SIZE/4) == 0 && BN % (BLOCK_SIZE/4) == 0 broken
mm=256,64,64,4,16,16,2,2,2,1,16|mm: BLOCK_SIZE % r == 0 && BM % (BLOCK_SIZE/r) == 0 && BN % (BLOCK_SIZE/r) == 0 for r = BK/2, BK/4 broken
int=12,48,16,32,16,16,1,4,1,1,4,2|int: BLOCK_SIZE % 8 == 0 broken
int=256,64,64,32,16,16,2,2,2,1,16,16|int: shared memory <= maxComputeSharedMemorySize broken
int=256,64|int: 2 values, expected 12
foo=1,2|entry 1: unknown family
int=256,64,64,32,16,16,2,2,2,1,16,2;|entry 2: expected <family>=<values>
int=x,64,64,32,16,16,2,2,2,1,16,2|int: value 1 is not a number from 1 to 65535
int=256,64,64,32,16,16,2,2,2,1,16,2;int=256,64,64,32,16,16,2,2,2,1,16,2|int: named twice
EOF
n=0; while IFS='|' read -r spec want; do n=$((n+1))
  ( GGML_VK_MALI_WARPTILE="$spec" timeout 60 $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" > "/tmp/bad-$n.log" 2>&1
    r=$(grep -c "GGML_VK_MALI_WARPTILE spec rejected: $want" "/tmp/bad-$n.log"); l=$(grep -c "spec rejected" "/tmp/bad-$n.log")
    m=$(grep -c "using Mali matmul warptiles (GGML_VK_MALI_WARPTILE=0 to disable)" "/tmp/bad-$n.log")
    p=$(grep -oE "[0-9]+/[0-9]+ tests passed" "/tmp/bad-$n.log")
    echo "bad $n: expected-line=$r rejection-lines=$l builtin-mali-line=$m $p | $(grep -h 'spec rejected' "/tmp/bad-$n.log")" > "/tmp/bad-$n.sum" ) &
done < /tmp/bad.txt; wait
for i in $(seq 1 $n); do cat /tmp/bad-$i.sum; done | tee -a "$O/steps.log" > "$L/rejections.txt"
GGML_VK_MALI_WARPTILE=1 $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" 2>&1 | grep -hE "ggml_vulkan: 0 =|ignoring GGML_VK|matmul warptiles" | tee -a "$O/steps.log"
ts "rejections done"
# (a) (b) (c) in parallel: full MUL_MAT per mode, and the L-tile cases with the spec / force
run() { local name=$1; shift; ( env "$@" timeout "$(left 420)" $B/test-backend-ops -b Vulkan0 ${TBO_ARGS} > "$L/$name.log" 2>&1; echo "rc=$?" >> "$L/$name.log" ) ; }
TBO_ARGS="-o MUL_MAT" run mul_mat-unset -u GGML_VK_MALI_WARPTILE &
TBO_ARGS="-o MUL_MAT" run mul_mat-force GGML_VK_MALI_WARPTILE=force &
TBO_ARGS="-o MUL_MAT" run mul_mat-spec GGML_VK_MALI_WARPTILE="$SPEC" &
TBO_ARGS="--test-file /tmp/l.cases" run l-spec GGML_VK_MALI_WARPTILE="$SPEC" GGML_VK_PIPELINE_STATS=matmul_ &
TBO_ARGS="--test-file /tmp/l.cases" run l-spec-noint GGML_VK_MALI_WARPTILE="$SPEC" GGML_VK_PIPELINE_STATS=matmul_ GGML_VK_DISABLE_INTEGER_DOT_PRODUCT=1 &
TBO_ARGS="--test-file /tmp/l.cases" run l-force GGML_VK_MALI_WARPTILE=force GGML_VK_PIPELINE_STATS=matmul_ &
wait; ts "parallel runs done"
for f in "$L"/mul_mat-*.log "$L"/l-*.log; do
  echo "${f##*/}: $(grep -oE '[0-9]+/[0-9]+ tests passed' "$f" | head -1) FAIL=$(grep -c FAIL "$f") $(tail -1 "$f") L-pipelines=$(grep -oE 'pipeline stats for matmul_[a-z0-9_]+_l:' "$f" | sort -u | wc -l) | $(grep -h 'matmul warptiles' "$f" | head -1)"
done | tee -a "$O/steps.log"
grep -hoE 'pipeline stats for matmul_[a-z0-9_]+_l:' "$L"/l-spec*.log | sort -u | tr '\n' ' ' | tee -a "$O/steps.log"; echo
# shared memory the driver reports for a few L pipelines (spec vs force)
for f in "$L"/l-spec.log "$L"/l-force.log; do
  for p in matmul_q8_0_q8_1_l matmul_q4_k_q8_1_l matmul_q6_k_q8_1_l; do
    echo "${f##*/} $p: $(grep -A12 "pipeline stats for $p:" "$f" | grep -iE 'shared|register' | tr -s ' ' | tr '\n' ' ' | head -c 300)"
  done
done | tee -a "$O/steps.log"
grep -h FAIL "$L"/*.log | head -20 | tee -a "$O/steps.log"
cp /tmp/bad-*.log $L/ 2>/dev/null; tar czf "$O/logs.tgz" -C "$L" . 2>/dev/null
ts end
