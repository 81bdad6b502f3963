"""The built llama.cpp binaries of ROCKY_LLAMA_BIN_DIR (.ci/llama.sh builds them), as the slow
tests run them. Tests that use them carry the `needs_llama_bin` marker (tests/conftest.py), which
skips them when the variable is unset."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

BIN_DIR = os.environ.get("ROCKY_LLAMA_BIN_DIR")
# .ci/llama.sh builds the recipe's shared-library layout (usr/bin, usr/lib) without RUNPATH, as
# the image has it: the tools find libllama/libggml* through LD_LIBRARY_PATH (the self-test's
# runner and these helpers pass the environment on).
if BIN_DIR and (Path(BIN_DIR).parent / "lib").is_dir():
    _lib = str((Path(BIN_DIR).parent / "lib").resolve())
    if _lib not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        os.environ["LD_LIBRARY_PATH"] = ":".join(
            p for p in (_lib, os.environ.get("LD_LIBRARY_PATH")) if p
        )
DEVICE = os.environ.get("ROCKY_VK_DEVICE", "0")
VK_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}  # ggml-vulkan skips CPU-type devices (lavapipe) else
# The int-dot L pipelines that ran, as the lavapipe hook of GGML_VK_PIPELINE_STATS names them.
SEEN = re.compile(r"ggml_vulkan: pipeline stats for (matmul_\w+_q8_1_l):")


def vulkan_device() -> str | None:
    """The description of Vulkan0 as llama-bench lists it, or None."""
    proc = subprocess.run(
        [str(Path(BIN_DIR) / "llama-bench"), "--list-devices"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **VK_ENV},
    )  # fmt: skip
    m = re.search(r"^\s*Vulkan0: (.+?) \(\d+ MiB", proc.stdout, re.M)
    return m.group(1) if m else None


def run_backend_ops(tmp_path: Path, env: dict[str, str | None], cases: list[str]) -> str:
    """Run test-backend-ops on the given --test-file cases; every case must run and pass.
    `env` values of None leave the variable unset (inherited tile settings are always cleared)."""
    path = tmp_path / "intdot.cases"
    path.write_text("\n".join(cases) + "\n")
    return run_tool_cases(env, ["--test-file", str(path)], "MUL_MAT", len(cases))


def run_tool_cases(env: dict[str, str | None], args: list[str], op: str, count: int | None) -> str:
    """test-backend-ops on Vulkan0 with `args` (a --test-file, or -o OP -p REGEX for its own
    cases); every `op` case must run and pass, `count` of them (None: at least one)."""
    tbo = Path(BIN_DIR) / "test-backend-ops"
    if not tbo.is_file():
        pytest.skip(f"{tbo} missing")
    # test-backend-ops b9101: test_generic_op (the --test-file cases) initializes only its sources,
    # not the sentinels around them, so a sentinel holds whatever the allocator left there and a
    # stale NaN pattern fails the case with "[NONE] NaN at index ..." on CPU and Vulkan alike.
    # MALLOC_PERTURB_=255 makes glibc hand out zeroed memory (lavapipe's device memory included),
    # which makes that rare, not impossible: tests that can use the tool's own cases do.
    full = dict(
        os.environ, GGML_NO_BACKTRACE="1", GGML_VK_VISIBLE_DEVICES=DEVICE, MALLOC_PERTURB_="255"
    )
    for key in ("GGML_VK_MALI_WARPTILE", "GGML_VK_DISABLE_INTEGER_DOT_PRODUCT"):
        full.pop(key, None)
    full.update({key: value for key, value in env.items() if value is not None})
    proc = subprocess.run([str(tbo), "-b", "Vulkan0", *args], env=full, capture_output=True,
                          timeout=3000)  # fmt: skip
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    # Without the Vulkan device, test-backend-ops skips it and still exits 0: count the cases.
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m, "no test count: the Vulkan device was skipped?\n" + out[-2000:]
    ran = int(m.group(2))
    assert ran == count if count is not None else ran > 0, out[-3000:]
    results = [ln for ln in out.splitlines() if f"{op}(" in ln and ("OK" in ln or "FAIL" in ln)]
    assert len(results) == ran, out[-3000:]
    bad = [ln for ln in results if "FAIL" in ln]
    assert not bad, "\n".join(bad)
    assert m.group(1) == m.group(2) and proc.returncode == 0, out[-3000:]
    return out


# What llama.cpp's loader prints per buffer, e.g. "load_tensors:      Vulkan0 model buffer size =
# 3.52 MiB" (the CPU's is "CPU_Mapped" or "CPU"; a worker's "RPC0[10.77.0.2:50052]").
BUFFER_RE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
