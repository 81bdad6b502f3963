"""The patched llama.cpp on a real Vulkan driver (lavapipe): kernels and greedy generation.

Needs ROCKY_LLAMA_BIN_DIR: a bin/ with test-backend-ops and llama-simple built with the Vulkan
backend from the patched sources (.ci/llama.sh builds it). The Vulkan device is lavapipe unless
ROCKY_VK_DEVICE names another index for GGML_VK_VISIBLE_DEVICES (ggml-vulkan skips CPU-type devices
unless they are listed, and then runs everything on the CPU backend while reporting success).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from rocky_vulkan.llama.testmodel import write_preset

from tests.helpers.llama_bin import BIN_DIR, DEVICE

pytestmark = [pytest.mark.slow, pytest.mark.needs_llama_bin]

MALI_LINE = "using Mali matmul warptiles"
# n=1 (mat-vec), n=16 (small tile), and q4_0 576x512x576 (large tile)
SUBSET = (
    r"type_a=(f16|q8_0|q4_0|q4_K),type_b=f32,m=(16|576),n=(1|16|512),k=(256|576),"
    r"bs=\[1,1\],nr=\[1,1\]"
)
PROMPT = (
    "The quick brown fox jumps over the lazy dog while the small cat sleeps in the warm sun near "
    "the old red barn, and the farmer counts his sheep again before the long night comes to the "
    "quiet valley."
)


def _bin(name: str) -> Path:
    path = Path(BIN_DIR) / name
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return path


def _run(cmd: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    full = dict(os.environ, GGML_NO_BACKTRACE="1", **env)
    # Bytes: a random-weight model emits byte tokens that are not valid UTF-8.
    proc = subprocess.run(cmd, env=full, capture_output=True, timeout=timeout)
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


@pytest.mark.parametrize("mode", ["force", "0"])
def test_mul_mat_subset_passes_with_cases_run(mode):
    tbo = _bin("test-backend-ops")
    env = {"GGML_VK_VISIBLE_DEVICES": DEVICE, "GGML_VK_MALI_WARPTILE": mode}
    proc = _run([str(tbo), "-b", "Vulkan0", "-o", "MUL_MAT", "-p", SUBSET], env)
    out = proc.stdout.decode(errors="replace") + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m, "no test count: the Vulkan device was skipped?\n" + out[-2000:]
    passed, total = int(m.group(1)), int(m.group(2))
    assert passed == total and total >= 10
    assert "FAIL" not in out
    assert (MALI_LINE in out) == (mode == "force")


def _generate(model: Path, *, gpu: bool, mode: str = "force") -> tuple[bytes, str]:
    simple = _bin("llama-simple")
    if gpu:
        env = {"GGML_VK_VISIBLE_DEVICES": DEVICE, "GGML_VK_MALI_WARPTILE": mode}
        ngl = "99"
    else:  # no Vulkan device at all: pure CPU backend
        env = {"GGML_VK_VISIBLE_DEVICES": "99"}
        ngl = "0"
    proc = _run([str(simple), "-m", str(model), "-n", "24", "-ngl", ngl, PROMPT], env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_preset("tiny", tmp_path_factory.mktemp("m") / "tiny-f16.gguf", seed=1)


def test_greedy_generation_gpu_mali_tiles_matches_cpu(tiny_model):
    cpu_text, cpu_err = _generate(tiny_model, gpu=False)
    gpu_text, gpu_err = _generate(tiny_model, gpu=True, mode="force")
    assert "Vulkan0" not in cpu_err and MALI_LINE not in cpu_err
    assert MALI_LINE in gpu_err and "offloaded 3/3 layers to GPU" in gpu_err, gpu_err[-2000:]
    n_prompt = int(re.search(r"prompt eval time\s*=.*?/\s*(\d+) tokens", gpu_err).group(1))
    assert n_prompt > 64  # the prompt batch reaches the large tile (m > 64 and n > 64)
    assert len(gpu_text) > len(PROMPT.encode())
    assert gpu_text == cpu_text


def test_greedy_generation_stock_tiles_matches_cpu(tiny_model):
    cpu_text, _ = _generate(tiny_model, gpu=False)
    gpu_text, gpu_err = _generate(tiny_model, gpu=True, mode="0")
    assert MALI_LINE not in gpu_err
    assert gpu_text == cpu_text
