"""Stack checks against a fake sysfs/dev/firmware tree (a real kernel tree cannot be staged)."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from rocky_selftest import stack
from rocky_selftest.settings import Settings

from tests.helpers.selftest import fake_root

pytestmark = pytest.mark.timeout(120)

FW_LINE = "panthor fb000000.gpu: [drm] CSF FW using interface v1.1.0, Features 0x0"


def _settings(root, **kw) -> Settings:
    return Settings(
        model_path=str(root / "model.gguf"),
        model_sha256=None,
        ubatch_sizes=(64,),
        sysroot=str(root),
        gpu_wait_s=0,
        **kw,
    )


def test_render_node_bound_to_panthor_passes_with_evidence(tmp_path):
    root = fake_root(tmp_path)
    check = stack.check_gpu_driver(_settings(root))
    assert check.status == "PASS"
    assert check.evidence == "renderD128 -> panthor (fb000000.gpu)"


@pytest.mark.parametrize("driver", ["panfrost", None])
def test_other_or_no_driver_fails(tmp_path, driver):
    root = fake_root(tmp_path, driver=driver)
    check = stack.check_gpu_driver(_settings(root))
    assert check.status == "FAIL"
    assert ("panfrost" if driver else "unbound") in check.evidence


def test_no_render_node_fails(tmp_path):
    (tmp_path / "empty/sys").mkdir(parents=True)
    check = stack.check_gpu_driver(_settings(tmp_path / "empty"))
    assert check.status == "FAIL" and "no DRM render node" in check.evidence


def test_firmware_line_in_kernel_log_passes(tmp_path):
    root = fake_root(tmp_path, kmsg=["Booting Linux", FW_LINE, "systemd[1]: started"])
    check = stack.check_firmware(_settings(root), driver_bound=True)
    assert check.status == "PASS"
    assert "CSF FW using interface" in check.evidence


def test_firmware_load_failure_in_log_fails(tmp_path):
    line = "panthor fb000000.gpu: Direct firmware load for arm/mali/arch10.8/mali_csffw.bin failed"
    root = fake_root(tmp_path, kmsg=[line + " with error -2"])
    check = stack.check_firmware(_settings(root), driver_bound=False)
    assert check.status == "FAIL" and "Direct firmware load" in check.evidence


def test_missing_firmware_file_fails_naming_the_package(tmp_path):
    root = fake_root(tmp_path, firmware=False, kmsg=[FW_LINE])
    check = stack.check_firmware(_settings(root), driver_bound=True)
    assert check.status == "FAIL" and "linux-firmware-mali-csffw-arch108" in check.evidence


def test_wrapped_log_falls_back_to_the_bound_driver(tmp_path):
    root = fake_root(tmp_path, kmsg=["unrelated"])
    assert stack.check_firmware(_settings(root), driver_bound=True).status == "PASS"
    assert stack.check_firmware(_settings(root), driver_bound=False).status == "FAIL"


def test_vendor_device_fails(tmp_path):
    root = fake_root(tmp_path, mali0=True)
    check = stack.check_no_vendor_driver(_settings(root))
    assert check.status == "FAIL" and "/dev/mali0" in check.evidence
    shutil.rmtree(root)
    assert stack.check_no_vendor_driver(_settings(fake_root(tmp_path))).status == "PASS"


def test_model_sha256(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    good = hashlib.sha256(model.read_bytes()).hexdigest()
    s = _settings(tmp_path)
    assert stack.check_model(s.__class__(**{**s.__dict__, "model_sha256": good})).status == "PASS"
    bad = stack.check_model(s.__class__(**{**s.__dict__, "model_sha256": "0" * 64}))
    assert bad.status == "FAIL" and good in bad.evidence
    model.unlink()
    assert "missing" in stack.check_model(s).evidence


# vulkaninfo --summary as printed by vulkan-tools 1.4 (device section of a captured run).
SUMMARY = """\
Devices:
========
GPU0:
\tapiVersion         = 1.4.318
\tdriverVersion      = 26.1.3
\tvendorID           = 0x13b5
\tdeviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU
\tdeviceName         = Mali-G610 MC4
\tdriverID           = DRIVER_ID_MESA_PANVK
\tdriverName         = panvk
GPU1:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 19.1.7, 128 bits)
\tdriverID           = DRIVER_ID_MESA_LLVMPIPE
\tdriverName         = llvmpipe
"""


def test_vulkan_summary_parser_finds_both_devices():
    devices = stack.parse_vulkan_summary(SUMMARY)
    assert [d["driverName"] for d in devices] == ["panvk", "llvmpipe"]
    assert devices[0]["deviceName"] == "Mali-G610 MC4"


@pytest.mark.needs_tool("vulkaninfo", "Debian: vulkan-tools")
def test_real_vulkaninfo_on_this_host_is_no_mali(tmp_path):
    # This host has no Mali GPU: the real tool must make the check fail, naming what it saw.
    s = _settings(tmp_path, vulkaninfo=shutil.which("vulkaninfo"))
    check = stack.check_vulkan_device(s)
    assert check.status == "FAIL"
    assert "Mali-G610" in check.evidence
