# Shared setup of the H200 device runs, sourced (not run) by llama-intdot-h200.sh and
# llama-tilespec-h200.sh from the repo root. It defines R (the repo), O ($OUT, what comes back),
# T0, ts (a timed line in $O/steps.log), left N (N seconds, or what is left of H200_BUDGET_S,
# at least 5), X (trixie's glslc from .h200/debs, run through trixie's loader), LOADER (libvulkan.so.1,
# from .h200/debs if the machine has none), VK_DRIVER_FILES (the NVIDIA ICD where present), and
# h200_unpack (the prepared tree into S=/tmp/full) and h200_configure LOGDIR (cmake, int-dot glslc).
R=$(pwd); O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$O/steps.log"; }
left() { local l=$(( ${H200_BUDGET_S:-560} - ($(date +%s) - T0) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
X=/tmp/x; mkdir -p $X; for f in "$R"/.h200/debs/*.deb; do dpkg -x "$f" $X; done
cat > $X/glslc <<EOF
#!/bin/sh
exec $X/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path $X/usr/lib/x86_64-linux-gnu $X/usr/bin/glslc "\$@"
EOF
chmod +x $X/glslc
LOADER=$(ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}')
[ -n "$LOADER" ] || { dpkg -x "$R"/.h200/debs/libvulkan1_*.deb /; ldconfig; LOADER=$(ldconfig -p | awk '/libvulkan.so.1 /{print $NF; exit}'); }
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

h200_unpack() { tar xzf "$R/.h200/llama-src.tar.gz" -C /tmp && S=/tmp/full; }

h200_configure() {  # LOGDIR: where configure.log goes; stops the run if cmake fails
  cmake -S $S -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON \
    -DVulkan_INCLUDE_DIR=$X/usr/include -DVulkan_LIBRARY="$LOADER" -DVulkan_GLSLC_EXECUTABLE=$X/glslc \
    -DLLAMA_BUILD_NUMBER=9101 -DLLAMA_BUILD_COMMIT=389ff61 > "$1/configure.log" 2>&1 || { tail -30 "$1/configure.log"; exit 1; }
  grep "supported by glslc" "$1/configure.log" | tee -a "$O/steps.log"
}
