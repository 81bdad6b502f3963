#!/bin/bash
# Device run (H200, NVIDIA Vulkan): build the patched b9101 tree, run MUL_MAT / MUL_MAT_ID with the
# Mali tiles forced (coopmat off so the scalar tile path is used), stock, and GPU-vs-CPU generation.
D=$(cd "$(dirname "$0")" && pwd); O=/tmp/o; R=${OUT:-/tmp/out}; mkdir -p $O $R
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/steps.log; }
left() { local l=$(( 570 - ($(date +%s) - T0) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
pack() { tar czf $R/logs.tgz -C $O . 2>/dev/null; }
for f in $D/gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p /tmp/x; for f in $D/debs/*.deb; do dpkg -x $f /tmp/x; done
export PATH=/tmp/x/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/x/usr/lib/x86_64-linux-gnu
LOADER=$(ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}')
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>/dev/null | tee $O/icd.txt
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
ts "glslc: $(glslc --version | head -1); loader $LOADER; nproc $(nproc)"
tar xzf $D/llama-src.tar.gz -C /tmp && S=/tmp/full
cmake -S $S -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON \
  -DVulkan_INCLUDE_DIR=/tmp/x/usr/include -DVulkan_LIBRARY=$LOADER -DVulkan_GLSLC_EXECUTABLE=/tmp/x/usr/bin/glslc \
  -DLLAMA_BUILD_NUMBER=9101 -DLLAMA_BUILD_COMMIT=389ff61 > $O/configure.log 2>&1 || { tail -30 $O/configure.log; exit 1; }
ts configured
cmake --build /tmp/b -j 16 --target test-backend-ops llama-simple llama-quantize > $O/build.log 2>&1 || { tail -40 $O/build.log; exit 1; }
ts built; B=/tmp/b/bin
VK_LOADER_DEBUG=error,warn,driver $B/test-backend-ops -b Vulkan0 -o MUL_MAT -p 'type_a=f16,type_b=f32,m=16,n=1,k=256,bs=.1,1.,nr=.1,1.' > $O/diag.log 2>&1
grep -iE "ggml_vulkan|Backend|ERROR|passed|driver" $O/diag.log | head -20 | tee -a $R/steps.log
export GGML_NO_BACKTRACE=1 GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1
GGML_VK_MALI_WARPTILE=force timeout $(left 180) $B/test-backend-ops -b Vulkan0 -o MUL_MAT > $O/tbo_mul_mat_force.log 2>&1; ts "MUL_MAT force rc=$?"; pack
grep -E "passed|Vulkan0|Mali|FAIL" $O/tbo_mul_mat_force.log | grep -v "^  MUL_MAT.*OK" | head -20
# generation: CPU (no Vulkan device) vs GPU with the Mali tiles forced, greedy
P="The quick brown fox jumps over the lazy dog while the small cat sleeps in the warm sun near the old red barn, and the farmer counts his sheep again before the long night comes to the quiet valley."
export PYTHONPATH=$D/pkg:/tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/whl/*.whl
python3 -c "from rocky_vulkan.llama.testmodel import write_preset as w; w('qwen2.5-3b-shape','/tmp/q3b.gguf',n_layer=2,seed=3)" && $B/llama-quantize /tmp/q3b.gguf /tmp/q3b-q4k.gguf Q4_K_M > $O/quantize.log 2>&1
ts "models ready"
for m in $D/models/tiny-f16.gguf $D/models/tiny-q8_0.gguf /tmp/q3b.gguf /tmp/q3b-q4k.gguf; do
  n=$(basename $m .gguf)
  timeout 120 env GGML_VK_VISIBLE_DEVICES=99 $B/llama-simple -m $m -n 32 -ngl 0 "$P" > $O/gen_${n}_cpu.txt 2> $O/gen_${n}_cpu.err
  timeout 60 env GGML_VK_MALI_WARPTILE=force $B/llama-simple -m $m -n 32 -ngl 99 "$P" > $O/gen_${n}_gpu.txt 2> $O/gen_${n}_gpu.err
  timeout 60 env GGML_VK_MALI_WARPTILE=0 $B/llama-simple -m $m -n 32 -ngl 99 "$P" > $O/gen_${n}_stock.txt 2>/dev/null
  c=$(md5sum < $O/gen_${n}_cpu.txt); g=$(md5sum < $O/gen_${n}_gpu.txt); s=$(md5sum < $O/gen_${n}_stock.txt)
  ts "gen $n cpu==mali:$([ "$c" = "$g" ] && echo yes || echo NO) cpu==stock:$([ "$c" = "$s" ] && echo yes || echo NO) prompt_tokens=$(grep -o 'n_prompt[^,]*\|prompt eval[^,]*' $O/gen_${n}_gpu.err | head -1) mali=$(grep -c 'Mali matmul' $O/gen_${n}_gpu.err)"
done
GGML_VK_MALI_WARPTILE=force timeout $(left 60) $B/test-backend-ops -b Vulkan0 -o MUL_MAT_ID > $O/tbo_mul_mat_id_force.log 2>&1; ts "MUL_MAT_ID force rc=$?"
GGML_VK_MALI_WARPTILE=0 timeout $(left 120) $B/test-backend-ops -b Vulkan0 -o MUL_MAT > $O/tbo_mul_mat_stock.log 2>&1; ts "MUL_MAT stock rc=$?"
for f in $O/tbo_*.log; do echo "${f##*/}: $(grep -E '[0-9]+/[0-9]+ tests passed' $f | head -1) FAIL=$(grep -c FAIL $f)"; done | tee -a $O/steps.log
pack; ls -la $R
