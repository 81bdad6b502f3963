"""Debian package versions the simulated G610 was built and measured with.

Debian sid moves: when a pinned version has left the archive, `sim setup` says so and
`sim setup --float` installs the current versions (and prints them) instead.
"""

from __future__ import annotations

SUITE = "sid"
MIRROR = "http://deb.debian.org/debian"

# Host-side tools, amd64: the emulator and the cross compiler for the VA counter.
HOST_PACKAGES: dict[str, str] = {
    "qemu-user": "1:11.1.3+ds-1",
    "gcc-aarch64-linux-gnu": "4:16.1.0-3",
    "libc6-dev-arm64-cross": "2.43-3cross8",
    "linux-libc-dev-arm64-cross": "7.2.13-1",
}

# The simulated board's software, arm64 (Debian amd64 ships neither panvk nor the panfrost shim).
GUEST_PACKAGES: dict[str, str] = {
    "mesa-vulkan-drivers": "26.2.6-1",
    "mesa-drm-shim": "26.2.6-1",
    "llama.cpp-tools": "1:0.7.0+dfsg-2",
    "libggml0-backend-vulkan": "0.27.0-1",
    "vulkan-tools": "1.4.341.0+dfsg1-1",
}
GUEST_ARCH = "arm64"

# `sim setup --cross`: what cross-building llama.cpp for arm64 needs (`sim build-llama`). The
# shader generator is a host tool, hence the native g++ next to the cross one.
CROSS_PACKAGES: dict[str, str] = {
    "g++": "4:16.1.0-3",
    "g++-aarch64-linux-gnu": "4:16.1.0-3",
    "cmake": "4.3.4-1",
    "ninja-build": "1.13.2-1",
    "glslc": "2026.4-1",
    "spirv-headers": "1.6.1+1.4.363.0-1",
    "pkgconf": "2.5.1-4",
    "ccache": "4.14.2-1",
    "libvulkan-dev:arm64": "1.4.363.0-1",
}

# Printed by `sim versions` next to the pins: the libraries the pins pull in.
REPORTED_PACKAGES = (
    "libllama0:arm64",
    "libggml0:arm64",
    "libvulkan1:arm64",
    "libc6:arm64",
    "libdrm2:arm64",
)

# An older panvk for comparison: Mesa 26.1.x is closer to the reference's 26.1.3 and lacks the
# 26.2.4 TLS-size change. Unpacked next to the stock driver (not installed), selected with
# `--driver NAME`; `libs` are runtime libraries it needs that sid no longer ships.
EXTRA_DRIVERS: dict[str, dict] = {
    "debian-26.1": {
        "suites": ("trixie", "trixie-backports"),
        "version": "26.1.6-1~bpo13+1",
        "libs": ("libdisplay-info2=0.2.0-2",),
    },
}
EXTRA_SUITE_MIRROR = MIRROR


def install_specs(pinned: bool, cross: bool = False) -> list[str]:
    """apt-get install arguments: `name=version` when pinned, bare names when floating."""
    host_pkgs = {**HOST_PACKAGES, **(CROSS_PACKAGES if cross else {})}
    host = [f"{n}={v}" if pinned else n for n, v in host_pkgs.items()]
    guest = [f"{n}:{GUEST_ARCH}" + (f"={v}" if pinned else "") for n, v in GUEST_PACKAGES.items()]
    return host + guest


def query_names() -> list[str]:
    """Package names (with arch where needed) whose installed versions `sim versions` prints."""
    return (
        list(HOST_PACKAGES)
        + [f"{n}:{GUEST_ARCH}" for n in GUEST_PACKAGES]
        + list(CROSS_PACKAGES)
        + list(REPORTED_PACKAGES)
    )
