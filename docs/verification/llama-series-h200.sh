#!/bin/bash
# Device run (H200, NVIDIA Vulkan) of the ggml-vulkan series (issue 23), one tree per call:
#   bash llama-series-h200.sh pin      llama.cpp 389ff61 (b9101) + patches/llama.cpp-0001..0004
#   bash llama-series-h200.sh b11312   llama.cpp b11312 (llama-cpp-python 0.3.36) + patches/upstream/llama.cpp-b11312/0001..0004
# Both trees also carry the three test-only LAVAPIPE_HOOKS of tools/rocky_vulkan/llama/sources.py
# (GGML_VK_TEST_LOG_TILES=1 logs each compiled pipeline's denominators and spec constants).
# Built with trixie's glslc (int-dot shaders) and WITHOUT -DNDEBUG, so 0001's warp-tile check
# (ggml_vk_check_warptile, debug builds only) runs on every device init: built-in tiles, Mali tiles.
# Then, coopmat off (GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1) so the scalar tiles run:
#   29 bad GGML_VK_MALI_WARPTILE specs (tests/llama/test_llama_tilespec.py), one rejection line each;
#   test-backend-ops -o MUL_MAT and -o MUL_MAT_ID with GGML_VK_MALI_WARPTILE unset, =force and =$SPEC;
#   the L-tile --test-file cases (every int-dot *_q8_1 large pipeline + float/dequant L) forced and spec;
# and with coopmat on (the H200's coopmat2 tiles, 0002 changed their denominators' source): MUL_MAT, MUL_MAT_ID.
# Every matmul pipeline logged must have denominators = its BM, BN and (scalar tiles) obey
# (BM/WM)*(BN/WN) == BLOCK_SIZE/WARP (tile-check.py). Needs .port-h200/ in the repo root (carried):
# gl/*.deb (bookworm glvnd + libvulkan1), debs/*.deb (trixie glslc, libshaderc1, libc6, libgcc-s1,
# libstdc++6, libvulkan-dev, spirv-headers), <tree>-src.tar.xz (unpacks to src/), l-cases-<tree>.txt,
# tile-check.py. See docs/verification/llama-series-h200.md for how they were made.
TREE=$1; P=$(pwd)/.port-h200; O=${OUT:-/tmp/out}; L=/tmp/logs-$TREE; mkdir -p "$O" "$L"
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$O/steps-$TREE.log"; }
left() { local l=$(( ${BUDGET_S:-570} - ($(date +%s) - T0) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
pack() { tar czf "$O/logs-$TREE.tgz" -C "$L" . 2>/dev/null; }
for f in "$P"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
X=/tmp/x; mkdir -p $X; for f in "$P"/debs/*.deb; do dpkg -x "$f" $X; done
cat > $X/glslc <<EOF
#!/bin/sh
exec $X/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path $X/usr/lib/x86_64-linux-gnu $X/usr/bin/glslc "\$@"
EOF
chmod +x $X/glslc
LOADER=$(ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}')
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
case $TREE in
  pin)    BNUM=9101;  BCOMMIT=389ff61 ;;
  b11312) BNUM=11312; BCOMMIT=0c1e570 ;;
  *) echo "usage: $0 pin|b11312"; exit 2 ;;
esac
ts "tree $TREE; glslc: $($X/glslc --version | head -1); loader $LOADER; nproc $(nproc); $(cmake --version | head -1)"
rm -rf /tmp/src /tmp/b; tar xJf "$P/$TREE-src.tar.xz" -C /tmp; S=/tmp/src
cmake -S $S -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O2 -DCMAKE_CXX_FLAGS_RELEASE=-O2 \
  -DGGML_VULKAN=ON -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=ON \
  -DVulkan_INCLUDE_DIR=$X/usr/include -DVulkan_LIBRARY="$LOADER" -DVulkan_GLSLC_EXECUTABLE=$X/glslc -DSPIRV-Headers_DIR=$X/usr/share/cmake/SPIRV-Headers \
  -DLLAMA_BUILD_NUMBER=$BNUM -DLLAMA_BUILD_COMMIT=$BCOMMIT > "$L/configure.log" 2>&1 || { tail -30 "$L/configure.log"; pack; exit 1; }
grep -h "supported by glslc" "$L/configure.log" | tr '\n' ' ' | sed 's/^/glslc features: /' | tee -a "$O/steps-$TREE.log"; echo
cmake --build /tmp/b -j "$(nproc)" --target test-backend-ops > "$L/build.log" 2>&1 || { grep -B2 -A12 "error" "$L/build.log" | head -80; pack; exit 1; }
ts built; B=/tmp/b/bin
export GGML_NO_BACKTRACE=1 GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1 MALLOC_PERTURB_=255
F='type_a=f16,type_b=f32,m=16,n=1,k=256,bs=.1,1.,nr=.1,1.'
SPEC='mm=128,64,64,32,16,32,2,2,2,1,16;mmq=256,128,64,32,32,16,2,2,2,1,16;int=128,64,64,32,16,32,2,2,2,1,16,2;int_k=256,128,128,32,32,64,2,4,4,1,32,2'
$B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" > "$L/device.log" 2>&1
grep -hE "ggml_vulkan: 0 =|tests passed" "$L/device.log" | tee -a "$O/steps-$TREE.log"
# one rejection line per rule and grammar error: tests/llama/test_llama_tilespec.py's BAD list as
# spec|expected text, written to .port-h200/bad-specs.txt
n=0; while IFS='|' read -r spec want; do n=$((n+1))
  ( GGML_VK_MALI_WARPTILE="$spec" timeout 90 $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" > "$L/bad-$n.log" 2>&1
    r=$(grep -cF "GGML_VK_MALI_WARPTILE spec rejected: $want" "$L/bad-$n.log"); l=$(grep -c "spec rejected" "$L/bad-$n.log")
    p=$(grep -oE "[0-9]+/[0-9]+ tests passed" "$L/bad-$n.log")
    echo "bad $n: expected-line=$r rejection-lines=$l $p | $(grep -h 'spec rejected' "$L/bad-$n.log")" > "$L/bad-$n.sum" ) &
done < "$P/bad-specs.txt"; wait
for i in $(seq 1 $n); do cat "$L/bad-$i.sum"; done > "$L/rejections.txt"
echo "rejections: $(grep -c 'expected-line=1 rejection-lines=1 ' "$L/rejections.txt")/$n with exactly the expected line" | tee -a "$O/steps-$TREE.log"
grep -v 'expected-line=1 rejection-lines=1 ' "$L/rejections.txt" | tee -a "$O/steps-$TREE.log"
GGML_VK_MALI_WARPTILE=1 $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p "$F" 2>&1 | grep -hE "ignoring GGML_VK|matmul warptiles" | tee -a "$O/steps-$TREE.log"
ts "rejections done"
run() { local name=$1; shift; ( env "$@" GGML_VK_TEST_LOG_TILES=1 timeout "$(left 400)" $B/test-backend-ops -b Vulkan0 ${TBO_ARGS} > "$L/$name.log" 2>&1; echo "rc=$?" >> "$L/$name.log" ); }
TBO_ARGS="-o MUL_MAT"    run mm-unset -u GGML_VK_MALI_WARPTILE &
TBO_ARGS="-o MUL_MAT"    run mm-force GGML_VK_MALI_WARPTILE=force &
TBO_ARGS="-o MUL_MAT"    run mm-spec  GGML_VK_MALI_WARPTILE="$SPEC" &
TBO_ARGS="-o MUL_MAT_ID" run id-unset -u GGML_VK_MALI_WARPTILE &
TBO_ARGS="-o MUL_MAT_ID" run id-force GGML_VK_MALI_WARPTILE=force &
TBO_ARGS="-o MUL_MAT_ID" run id-spec  GGML_VK_MALI_WARPTILE="$SPEC" &
TBO_ARGS="--test-file $P/l-cases-$TREE.txt" run l-force GGML_VK_MALI_WARPTILE=force GGML_VK_PIPELINE_STATS=matmul_ &
TBO_ARGS="--test-file $P/l-cases-$TREE.txt" run l-spec  GGML_VK_MALI_WARPTILE="$SPEC" GGML_VK_PIPELINE_STATS=matmul_ &
TBO_ARGS="-o MUL_MAT"    run mm-coopmat -u GGML_VK_DISABLE_COOPMAT -u GGML_VK_DISABLE_COOPMAT2 -u GGML_VK_MALI_WARPTILE &
TBO_ARGS="-o MUL_MAT_ID" run id-coopmat -u GGML_VK_DISABLE_COOPMAT -u GGML_VK_DISABLE_COOPMAT2 -u GGML_VK_MALI_WARPTILE &
wait; ts "parallel runs done"
for f in "$L"/mm-*.log "$L"/id-*.log "$L"/l-*.log; do
  echo "${f##*/}: $(grep -oE '[0-9]+/[0-9]+ tests passed' "$f" | head -1) FAIL=$(grep -c FAIL "$f") $(tail -1 "$f") | $(grep -hE 'ggml_vulkan: 0 =' "$f" | grep -oE 'matrix cores: [a-zA-Z_0-9]+' | head -1) | $(grep -h 'matmul warptiles' "$f" | head -1) | $(python3 "$P/tile-check.py" "$f")"
done | tee -a "$O/steps-$TREE.log"
grep -h FAIL "$L"/*.log | head -20 | tee -a "$O/steps-$TREE.log"
pack; ts end
