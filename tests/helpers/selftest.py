"""Shared builders for the self-test tests: a fake sysfs/dev/firmware root and configs."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FW = "arm/mali/arch10.8/mali_csffw.bin"


def fake_root(
    tmp: Path,
    *,
    driver: str | None = "panthor",
    firmware: bool = True,
    kmsg: list[str] | None = None,
    mali0: bool = False,
) -> Path:
    """A root with /sys/class/drm/renderD128 -> a platform GPU bound to `driver`."""
    root = tmp / "root"
    gpu = root / "sys/devices/platform/fb000000.gpu"
    (gpu / "drm/renderD128").mkdir(parents=True)
    (gpu / "drm/renderD128/device").symlink_to("../..")
    drm = root / "sys/class/drm"
    drm.mkdir(parents=True)
    (drm / "renderD128").symlink_to(os.path.relpath(gpu / "drm/renderD128", drm))
    if driver:
        drivers = root / "sys/bus/platform/drivers" / driver
        drivers.mkdir(parents=True)
        (gpu / "driver").symlink_to(os.path.relpath(drivers, gpu))
    if firmware:
        fw = root / "lib/firmware" / FW
        fw.parent.mkdir(parents=True)
        fw.write_bytes(b"\0" * 64)
    (root / "dev").mkdir(exist_ok=True)
    if kmsg is not None:
        records = [f"6,{i},{i * 1000},-;{line}" for i, line in enumerate(kmsg)]
        (root / "dev/kmsg").write_text("\n".join(records) + "\n")
    if mali0:
        (root / "dev/mali0").write_text("")
    return root


def write_config(path: Path, **values) -> Path:
    data = {"schema_version": 1, "model_sha256": None, "ubatch_sizes": [64], **values}
    path.write_text(json.dumps(data))
    return path


def make_tiny_model(tmp_path_factory) -> Path:
    """The 'tiny' random-weight llama GGUF from rocky_vulkan.llama.testmodel (f16, 2 layers)."""
    pytest.importorskip("gguf")
    from rocky_vulkan.llama.testmodel import write_preset

    return write_preset("tiny", tmp_path_factory.mktemp("model") / "tiny.gguf", seed=1)


# The 'tiny' model's vocab (testmodel.py): ids 0-2 are <unk> <s> </s>, 3-258 the byte tokens.
# A lone byte token in the random model's output makes b9101's output parser (common/chat.cpp)
# fail a /v1/completions request with 500 "Failed to parse input at pos 0" (seen); a real model
# emits whole characters. The serving step's requests in tests ban them (serving_logit_bias).
TINY_TEXT_ONLY = {str(i): -100 for i in range(3 + 256)}


# ---- a self-test run with a fake llama-bench (fault injection only) --------------------------

STACK = ["gpu_driver", "csf_firmware", "no_vendor_driver", "vulkan_device"]
# The server steps start llama-server and run llama-bench in three modes: tests of their own
# (test_selftest_serving*.py).
SERVER_STEPS = ["placement", "serving", "speculative", "cluster"]
GOOD_ENTRY = {
    "avg_ts": 123.5,
    "samples_ts": [123.5],
    "n_gpu_layers": 99,
    "n_ubatch": 64,
    "n_threads": 4,
    "gpu_info": "Mali-G610 MC4",
    "devices": "Vulkan0",
    "build_commit": "389ff61",
    "build_number": 9101,
}
OLD_PASS = {
    "schema": "rocky-selftest-result",
    "schema_version": 1,
    "verdict": "PASS",
    "started_at": "2026-01-01T00:00:00Z",
    "finished_at": "2026-01-01T01:00:00Z",
    "duration_s": 3600.0,
    "checks": [{"name": "sweep", "status": "PASS", "evidence": "an old run"}],
}


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, as every other JSON reader does."""

    def refuse(name):
        raise ValueError(f"{name} in JSON")

    return json.loads(text, parse_constant=refuse)


def fake_tool(tmp: Path, name: str, body: str) -> Path:
    """A bin dir whose `name` is `body` (sh). Fault injection, not a measurement."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return bin_dir


def fake_bench(tmp: Path, body: str) -> Path:
    return fake_tool(tmp, "llama-bench", body)


def printing(tmp: Path, json_text: str) -> Path:
    payload = tmp / "bench.json"
    payload.write_text(json_text)
    return fake_bench(tmp, f"cat {payload}")


def bench_config(tmp: Path, bin_dir: Path, results: Path, **kw) -> Path:
    """A config that runs only the sweep (one tuned run at ub 64) with the llama-bench in
    bin_dir; kw replaces any value."""
    model = tmp / "model.gguf"
    model.write_bytes(b"GGUF fake model: the fake llama-bench never reads it")
    values = dict(
        model_path=str(model),
        ubatch_sizes=[64],
        bin_dir=str(bin_dir),
        run_timeout_s=60,
        results_dir=str(results),
        motd_path=str(tmp / "motd"),
        sysroot=str(tmp / "noroot"),
        gpu_wait_s=0,
        sweep_modes=["tuned"],
        skip_checks=[*STACK, "model_sha256", "ratio", "output_match", *SERVER_STEPS],
    )
    values.update(kw)
    return write_config(tmp / "config.json", **values)


def old_pass(results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "result.json").write_text(json.dumps(OLD_PASS))


@contextmanager
def read_only(path: Path) -> Iterator[str]:
    """`path` made read-only: a read-only bind mount (EROFS) as root where mounting works, else
    mode 0555 (EACCES; root ignores modes, so then nothing is read-only). Yields how."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "mode 0555"
        finally:
            path.chmod(0o755)
        return
    bind = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if bind.returncode:
        yield ""
        return
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
        yield "" if ro.returncode else "read-only bind mount"
    finally:
        subprocess.run(["umount", str(path)], check=True)
