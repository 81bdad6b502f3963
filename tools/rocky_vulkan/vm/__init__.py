"""The boot rehearsal: the image's userspace booted with systemd as PID 1 in a virtual machine.

`rocky-vulkan vm build` assembles a disk from what the image installs, `rocky-vulkan vm boot`
starts it with qemu-system-x86_64 (KVM where it works, else TCG), its SSH, OpenAI and Ollama
ports forwarded to loopback. tests/vm/ boot it and check the first boot from the host.

What is the image's own (run from the rendered layer, not copied by hand):
- the install trees of rocky-board, rocky-selftest and rocky-llm: each recipe's do_install
  (packaging.trees, as the packaging rehearsal runs it), and llama-cpp's tree as CI's build
  installs it (.ci/llama.sh's cmake --install into a DESTDIR, then the recipe's do_install:append);
- the system users of the recipes' USERADD_PARAM lines and the login user of the image's
  EXTRA_USERS_PARAMS;
- the units of SYSTEMD_SERVICE, enabled as systemd.bbclass enables them (SYSTEMD_AUTO_ENABLE);
- the image's rootfs post-process functions (hostname, sudo rule, authorized_keys, sshd policy,
  networkd and mDNS), run on the VM's root with the recipe's own values.

What differs from the Yocto image, and why (DIFFERENCES, printed by `vm build`):
"""

from __future__ import annotations

import argparse

# One place for every way the VM is not the board's image.
DIFFERENCES = (
    ("base system", "Debian trixie (debootstrap) for oe-core: kernel, systemd, python3, openssh, "
     "openssl, networkd/resolved; the same programs, other builds and versions"),
    ("architecture", "x86-64, not aarch64: llama.cpp is CI's x86-64 build of the pinned, patched "
     "tree, configured as the recipe configures it"),
    ("GPU", "virtio-gpu's render node (driver virtio_gpu, no Vulkan driver), not panthor + "
     "panvk: the self-test must say FAIL, and the server must fall back to the CPU"),
    ("model", "the test model (`rocky-vulkan testmodel`), not the config's; config.json's "
     "model_sha256 is set to its checksum"),
    ("workload", "the self-test's measurement sizes scaled for a CPU under TCG "
     "(assemble.VM_WORKLOAD: 2 micro-batch sizes, 64-token prompts, 1 repetition); the served "
     "settings are the config's"),
    ("kernel", "Debian's linux-image-amd64 with its initramfs, booted by qemu -kernel, not "
     "U-Boot + the BSP's kernel"),
    ("package manager", "files installed from the recipes' trees, no opkg/rpm database"),
)  # fmt: skip

__doc__ += "".join(f"- {what}: {why}.\n" for what, why in DIFFERENCES)


def register(sub: argparse._SubParsersAction) -> None:
    from rocky_vulkan.vm import cli

    cli.register(sub)
