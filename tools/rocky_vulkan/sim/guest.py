"""Run one arm64 program on the simulated Mali-G610: qemu-user, the panthor drm-shim, panvk.

The shim (`PAN_GPU_ID=a867`) presents a G610 in panthor mode: shaders are compiled, command
buffers recorded and submitted for real, GPU work is not executed. The VA counter sits in front of
the shim in LD_PRELOAD and writes the private-VA peak to a file (see data/sim-vacount.c).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.sim.root import DRIVERS_DIR, SHADER_CACHE, VACOUNT_LIB, SimRoot, write_icd

G610_GPU_ID = "a867"
# ggml's CPU backend dies with Illegal instruction on qemu's default CPU model.
QEMU_CPU = "cortex-a76"
STOCK_ICD = "/usr/share/vulkan/icd.d/panfrost_icd.json"
STOCK_SHIM = "/usr/lib/aarch64-linux-gnu/libpanfrost_noop_drm_shim.so"
_EM_AARCH64 = 183


@dataclass(frozen=True)
class Driver:
    """A panvk build as seen from inside the root."""

    name: str
    icd: str
    shim: str
    # Extra library folder (LD_LIBRARY_PATH) for a driver unpacked with its own old libraries.
    libpath: str = ""


def _elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def _import_local(root: SimRoot, spec: Path) -> Driver:
    """Copy a locally built panvk (ICD json or folder) into the root as its own driver."""
    if spec.is_dir():
        lib = spec / "libvulkan_panfrost.so"
        shim = spec / "libpanfrost_noop_drm_shim.so"
    else:
        try:
            icd = json.loads(spec.read_text())
            lib = Path(icd["ICD"]["library_path"])
        except (ValueError, KeyError) as err:
            raise UserError(
                f"{spec} is not a Vulkan ICD json ({err}); pass the ICD json "
                "or the folder holding libvulkan_panfrost.so"
            ) from err
        if not lib.is_absolute():
            lib = spec.parent / lib
        shim = lib.parent / "libpanfrost_noop_drm_shim.so"
    if not lib.is_file():
        raise UserError(f"driver library {lib} not found; build panvk first or fix --driver")
    machine = _elf_machine(lib)
    if machine != _EM_AARCH64:
        raise UserError(
            f"{lib} is not an arm64 library (ELF machine {machine}); the simulated G610 runs "
            "arm64 llama.cpp under qemu, so cross-build panvk for arm64 (meson --cross-file "
            "with aarch64-linux-gnu-gcc) or use the Mesa helper's native amd64 route"
        )
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()[:12]
    dest = f"{DRIVERS_DIR}/local-{digest}"
    host_dest = root.host_path(dest)
    if not (host_dest / "icd.json").exists():
        host_dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, host_dest / "libvulkan_panfrost.so")
        write_icd(root, dest, f"{dest}/libvulkan_panfrost.so")
        if shim.is_file():
            shutil.copy2(shim, host_dest / "libpanfrost_noop_drm_shim.so")
            (host_dest / "shim").write_text(f"{dest}/libpanfrost_noop_drm_shim.so\n")
        (host_dest / "version").write_text(f"local build {lib} sha256:{digest}\n")
    return _bundle(root, f"local-{digest}")


def _bundle(root: SimRoot, name: str) -> Driver:
    dest = f"{DRIVERS_DIR}/{name}"
    shim_file = root.host_path(dest) / "shim"
    shim = shim_file.read_text().strip() if shim_file.exists() else STOCK_SHIM
    libpath_file = root.host_path(dest) / "libpath"
    libpath = libpath_file.read_text().strip() if libpath_file.exists() else ""
    return Driver(name=name, icd=f"{dest}/icd.json", shim=shim, libpath=libpath)


def resolve_driver(root: SimRoot, spec: str) -> Driver:
    """`stock`, a driver folder name under /opt/rocky/drivers, or a host path to a local build."""
    if spec == "stock":
        return Driver(name="stock", icd=STOCK_ICD, shim=STOCK_SHIM)
    if "/" not in spec and (root.host_path(f"{DRIVERS_DIR}/{spec}") / "icd.json").exists():
        return _bundle(root, spec)
    path = Path(spec)
    if path.exists():
        return _import_local(root, path.resolve())
    known = sorted(p.name for p in root.host_path(DRIVERS_DIR).glob("*") if p.is_dir())
    raise UserError(
        f"unknown driver {spec!r}: use 'stock', one of {known or 'none installed'}, "
        "or a path to a locally built libvulkan_panfrost.so folder or ICD json"
    )


def driver_version(root: SimRoot, driver: Driver) -> str:
    if driver.name == "stock":
        from rocky_vulkan.sim.pins import GUEST_ARCH

        name = f"mesa-vulkan-drivers:{GUEST_ARCH}"
        return "Debian " + root.installed_versions([name])[name]
    version = root.host_path(f"{DRIVERS_DIR}/{driver.name}") / "version"
    return version.read_text().strip() if version.exists() else driver.name


def guest_env(driver: Driver, vacount_file: str | None, extra: dict[str, str]) -> dict[str, str]:
    """The environment the arm64 program sees (set through qemu -E, not the host env)."""
    preload = [VACOUNT_LIB, driver.shim] if vacount_file else [driver.shim]
    env = {
        "LD_PRELOAD": ":".join(preload),
        "PAN_GPU_ID": G610_GPU_ID,
        "VK_ICD_FILENAMES": driver.icd,
        "MESA_SHADER_CACHE_DIR": f"{SHADER_CACHE}/{driver.name}",
        # A crash must not attach a debugger and hang the run.
        "GGML_NO_BACKTRACE": "1",
    }
    if vacount_file:
        env["ROCKY_VACOUNT_FILE"] = vacount_file
    if driver.libpath:
        env["LD_LIBRARY_PATH"] = driver.libpath
    env.update(extra)
    return env


def guest_argv(program: str, args: list[str], env: dict[str, str]) -> list[str]:
    """qemu-aarch64 command line for `program` (a path inside the root)."""
    argv = ["nice", "-n", "10", "qemu-aarch64", "-cpu", QEMU_CPU]
    for key, value in env.items():
        argv += ["-E", f"{key}={value}"]
    return argv + [program, *args]


def resolve_program(root: SimRoot, name: str) -> str:
    """Absolute path inside the root of an arm64 program given by name or path."""
    if name.startswith("/"):
        candidates = [name]
    else:
        candidates = [f"{d}/{name}" for d in ("/usr/bin", "/usr/local/bin", "/opt/rocky/bin")]
    for cand in candidates:
        host = root.host_path(cand)
        if host.is_file():
            if _elf_machine(host) != _EM_AARCH64:
                raise UserError(
                    f"{cand} is not an arm64 program; `sim run` runs arm64 programs "
                    "under qemu (for shell use `chroot` on the root directly)"
                )
            return cand
    raise UserError(f"{name} not found in the simulator root (looked in {candidates})")


def parse_vacount(text: str) -> dict[str, int]:
    """The counter file's `key=value` fields as integers."""
    out = {}
    for field in text.split():
        key, _, value = field.partition("=")
        if value.isdigit():
            out[key] = int(value)
    return out
