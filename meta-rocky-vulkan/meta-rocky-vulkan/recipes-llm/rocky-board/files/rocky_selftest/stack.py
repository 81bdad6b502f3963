"""Stack checks against a root directory (`/` on the board, a fake sysfs tree in tests):
the GPU's driver, the CSF firmware, no vendor driver, the Vulkan device, the model file."""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import time

from .checks import Check, failed, passed
from .runner import clip, run_tool
from .settings import Settings

FW_LOADED = re.compile(r"\bpanthor\b.*\bCSF FW\b")
FW_FAILED = re.compile(
    r"(Direct firmware load for \S*mali_csffw\S* failed|Failed to load firmware)"
)
HASH_CHUNK = 4 << 20
VULKANINFO_TIMEOUT_S = 120
MAX_LISTING = 2000  # characters of vulkaninfo's device list kept in the result


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def render_nodes(root: str) -> list[tuple[str, str, str]]:
    """(node, device, driver) for every DRM render node; driver '' when unbound."""
    nodes = []
    for node in sorted(glob.glob(_under(root, "/sys/class/drm/renderD*"))):
        device = os.path.realpath(os.path.join(node, "device"))
        driver_link = os.path.join(node, "device", "driver")
        driver = ""
        if os.path.exists(driver_link):
            driver = os.path.basename(os.path.realpath(driver_link))
        nodes.append((os.path.basename(node), os.path.basename(device), driver))
    return nodes


def check_gpu_driver(s: Settings, wait_s: float | None = None) -> Check:
    name = "gpu_driver"
    deadline = time.monotonic() + (s.gpu_wait_s if wait_s is None else wait_s)
    while True:
        nodes = render_nodes(s.sysroot)
        bound = [n for n in nodes if n[2] == s.gpu_driver]
        if bound or time.monotonic() >= deadline:
            break
        time.sleep(1)  # at boot the module can still be probing
    listing = ", ".join(f"{n} -> {drv or 'unbound'} ({dev})" for n, dev, drv in nodes)
    if bound:
        node, dev, drv = bound[0]
        return passed(name, f"{node} -> {drv} ({dev})", nodes=listing)
    if not nodes:
        return failed(name, "no DRM render node under /sys/class/drm (GPU driver not loaded?)")
    return failed(name, f"no render node bound to {s.gpu_driver}: {listing}", nodes=listing)


def read_kernel_log(root: str) -> list[str] | None:
    """Kernel log messages from /dev/kmsg (a plain file in tests), or None if unreadable."""
    path = _under(root, "/dev/kmsg")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines = []
    try:
        for _ in range(200000):
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # end of the ring buffer
            except OSError as err:
                if err.errno == errno.EPIPE:
                    continue  # a record was overwritten while reading: skip it
                break
            if not chunk:
                break
            for record in chunk.decode("utf-8", "replace").splitlines():
                # kmsg records are "prio,seq,usec,flags;message"; continuation lines start with ' '
                if ";" in record and not record.startswith(" "):
                    lines.append(record.split(";", 1)[1])
    finally:
        os.close(fd)
    return lines


def check_firmware(s: Settings, driver_bound: bool) -> Check:
    name = "csf_firmware"
    base = _under(s.sysroot, "/lib/firmware/" + s.firmware)
    present = [p for p in (base, base + ".xz", base + ".zst") if os.path.isfile(p)]
    rel = "/lib/firmware/" + s.firmware
    if not present:
        return failed(name, f"{rel} is missing (install linux-firmware-mali-csffw-arch108)")
    log = read_kernel_log(s.sysroot)
    loaded = [line for line in log or [] if FW_LOADED.search(line)]
    failures = [line for line in log or [] if FW_FAILED.search(line)]
    if loaded:
        return passed(name, loaded[-1].strip(), file=rel)
    if failures:
        return failed(name, failures[-1].strip(), file=rel)
    if driver_bound:
        # panthor's probe fails without the firmware, so a bound device means it loaded.
        why = "kernel log unreadable" if log is None else "no CSF FW line in the kernel log"
        return passed(name, f"{rel} present, panthor bound ({why}; probe needs the firmware)")
    return failed(name, f"{rel} present but panthor is not bound and the log shows no CSF FW line")


def check_no_vendor_driver(s: Settings) -> Check:
    name = "no_vendor_driver"
    found = [
        p
        for p in (s.vendor_device, "/sys/module/mali_kbase")
        if os.path.exists(_under(s.sysroot, p))
    ]
    if found:
        return failed(name, "vendor Mali driver present: " + ", ".join(found))
    return passed(name, f"no {s.vendor_device}, no mali_kbase module")


def parse_vulkan_summary(text: str) -> list[dict[str, str]]:
    """The devices in `vulkaninfo --summary` output: deviceName, driverName, deviceType..."""
    devices: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if re.match(r"^GPU\d+:\s*$", line.strip()):
            current = {}
            devices.append(current)
            continue
        m = re.match(r"^\s*(\w+)\s*=\s*(.*?)\s*$", line)
        if m and current is not None:
            current.setdefault(m.group(1), m.group(2))
    return devices


def check_vulkan_device(s: Settings) -> Check:
    name = "vulkan_device"
    res = run_tool([s.vulkaninfo, "--summary"], {}, min(VULKANINFO_TIMEOUT_S, s.run_timeout_s))
    why = res.failure()
    if why:
        return failed(name, f"vulkaninfo --summary failed: {why}", stderr_tail=res.stderr_tail())
    devices = parse_vulkan_summary(res.stdout)
    listing = clip(
        "; ".join(
            f"{d.get('deviceName', '?')} / {d.get('driverName', d.get('driverID', '?'))}"
            for d in devices
        ),
        MAX_LISTING,
    )
    for d in devices:
        driver = (d.get("driverName", "") + " " + d.get("driverID", "")).lower()
        if s.gpu_name in d.get("deviceName", "") and s.vulkan_driver.lower() in driver:
            return passed(name, f"{d['deviceName']} / {d.get('driverName', '?')}", devices=listing)
    return failed(
        name,
        f"no {s.vulkan_driver} {s.gpu_name} device; vulkaninfo lists: {listing or 'none'}",
        devices=listing,
    )


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_model(s: Settings) -> Check:
    name = "model_sha256"
    if not os.path.isfile(s.model_path):
        return failed(name, f"{s.model_path} is missing")
    actual = sha256_file(s.model_path)
    if not s.model_sha256:
        return failed(name, f"no sha256 pinned in the config; file has {actual}", sha256=actual)
    if actual != s.model_sha256:
        return failed(
            name, f"{s.model_path}: sha256 {actual}, expected {s.model_sha256}", sha256=actual
        )
    return passed(name, f"{os.path.basename(s.model_path)} sha256 {actual}", sha256=actual)
