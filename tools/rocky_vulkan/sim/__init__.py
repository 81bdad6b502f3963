"""`rocky-vulkan sim`: a simulated Mali-G610 (Debian arm64 panvk + panthor drm-shim under qemu).

sim setup                 create the cached Debian sid root and install the pinned packages
sim versions              print the installed versions next to the pins
sim run -- PROG ARGS      run one arm64 program on the simulated G610
sim sweep --model GGUF    llama-bench over ub 64..1024: ok or the exact error, peak private VA
sim stats --model GGUF    matmul pipelines' spills, fills, registers (GGML_VK_PIPELINE_STATS)
sim build-llama --src D   cross-build llama-bench for arm64 (with patches) in the root
sim prove --mesa-git D    from nothing: build stock and patched panvk (native amd64, drm-shim)
                          and llama.cpp b9101 with our patch, sweep, print the claims table
"""

from rocky_vulkan.sim.cli import register

__all__ = ["register"]
