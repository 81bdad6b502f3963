"""Shared builders for the self-test tests: a fake sysfs/dev/firmware root and configs."""

from __future__ import annotations

import json
import os
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
