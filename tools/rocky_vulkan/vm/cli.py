"""`rocky-vulkan vm build` and `rocky-vulkan vm boot`: the boot rehearsal's two commands."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.regularfile import NotReadable, read_regular
from rocky_vulkan.vm import DIFFERENCES, assemble, base, qemu

# One OpenSSH public key line: type, base64 body, optional comment without control characters.
SSH_KEY = re.compile(
    r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,3}( [ -~]{0,200})?"
)


def default_out() -> Path:
    return base.cache_dir() / "disk"


def read_key(path: str) -> str:
    try:
        text = read_regular(Path(path), 16 << 10, "SSH public key").decode("ascii").strip()
    except (NotReadable, UnicodeDecodeError) as err:
        fix = "give a .pub file (ssh-keygen -t ed25519)"
        raise UserError(f"--ssh-key {path}: {err}; {fix}") from None
    if not SSH_KEY.fullmatch(text):
        raise UserError(f"--ssh-key {path}: not one OpenSSH public key line; give the .pub file")
    return text


def _build(args: argparse.Namespace) -> int:
    from rocky_vulkan.llama.testmodel import write_preset

    cfg = load_config(args.config)
    out = Path(args.out)
    for what, why in DIFFERENCES:
        base.say(f"differs from the image: {what}: {why}")
    root = base.ensure_base()
    out.mkdir(parents=True, exist_ok=True)
    model = write_preset("tiny", out / "tiny.gguf", seed=1)
    llama = Path(args.llama_tree) if args.llama_tree else None
    if llama is None:
        base.say("no --llama-tree: the guest has no llama.cpp (the self-test and server fail)")
    keys = tuple(read_key(k) for k in args.ssh_key)
    inputs = assemble.Inputs(
        project=assemble.render_layer(cfg, keys, out / "layer"),
        llama_tree=llama,
        model=model,
        hostname=cfg.machine(cfg.default_machine).hostname,
    )
    disk = assemble.assemble(root, out, inputs)
    print(disk)
    return 0


def _boot(args: argparse.Namespace) -> int:
    vm = qemu.boot(Path(args.out), snapshot=not args.keep)
    try:
        vm.wait_port("ssh", args.timeout)
        print(f"up under {vm.accel}: ssh -p {vm.ports['ssh']} USER@127.0.0.1; "
              f"https://127.0.0.1:{vm.ports['openai']}/ ; Ctrl-C stops it")  # fmt: skip
        while vm.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        vm.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vm",
        help="the image's userspace under systemd in a virtual machine (developers)",
        description=__doc__,
    )
    vm_sub = p.add_subparsers(dest="vm_command", required=True, metavar="STEP")
    b = vm_sub.add_parser("build", help="assemble the VM disk from the rendered layer (root)")
    b.add_argument("--out", default=str(default_out()), help="folder for disk.img (%(default)s)")
    b.add_argument(
        "--llama-tree",
        default=os.environ.get("ROCKY_LLAMA_INSTALL_DIR"),
        help="llama.cpp's installed tree (the DESTDIR .ci/llama.sh made)",
    )
    b.add_argument("--ssh-key", action="append", default=[], help="a public key to log in with")
    b.set_defaults(func=_build)
    r = vm_sub.add_parser("boot", help="boot the VM disk (a first boot each time)")
    r.add_argument("--out", default=str(default_out()), help="folder of disk.img (%(default)s)")
    r.add_argument("--keep", action="store_true", help="write to disk.img (default: a snapshot)")
    r.add_argument("--timeout", type=float, default=600, help="seconds to wait for SSH")
    r.set_defaults(func=_boot)
