"""`rocky-vulkan build`: render, check the host and the layer, run `kas build`, show progress,
explain known failures, and print the image to flash."""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rocky_vulkan import shellquote
from rocky_vulkan.config import Config, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import buildlog, doctor, sshkey
from rocky_vulkan.layer import lint
from rocky_vulkan.layer.manifest import KAS_BUILD_DIR, KAS_DIR, model_licence_url
from rocky_vulkan.layer.render import write_rendered

IMAGE_NAME = "rocky-vulkan-image"
LOG_NAME = "rocky-vulkan-build.log"
NOT_FRAGMENTS = ("base.yml",)


@dataclass(frozen=True)
class Images:
    wic: Path
    bmap: Path


def cache_root(environ: dict[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")).expanduser())
    if not environ.get("XDG_CACHE_HOME"):
        base = str(Path(base) / ".cache")
    return Path(base) / "rocky-vulkan"


# Where bitbake keeps downloads and sstate when DL_DIR / SSTATE_DIR are not set (oe-core's
# bitbake.conf: ${TOPDIR}/downloads, ${TOPDIR}/sstate-cache), i.e. a plain `kas build`.
PLAIN_KAS_DIRS = {"DL_DIR": "downloads", "SSTATE_DIR": "sstate-cache"}


def build_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment for kas: DL_DIR/SSTATE_DIR from the caller or shared defaults outside the
    repo, so downloads and sstate survive `git clean` and are shared between checkouts."""
    env = dict(environ)
    cache = cache_root(environ)
    env.setdefault("DL_DIR", str(cache / "downloads"))
    env.setdefault("SSTATE_DIR", str(cache / "sstate-cache"))
    for var in ("DL_DIR", "SSTATE_DIR"):
        env[var] = str(Path(env[var]).expanduser().absolute())
    return env


def stray_caches(build: Path, env: dict[str, str]) -> list[str]:
    """Warnings for downloads / sstate that a plain `kas build` left in the build dir while this
    build uses other folders: without them, switching to `rocky-vulkan build` rebuilds all."""
    notes = []
    for var, name in PLAIN_KAS_DIRS.items():
        plain, used = build / name, Path(env[var])
        try:
            if plain.resolve() == used.resolve() or not plain.is_dir() or not any(plain.iterdir()):
                continue
        except OSError:
            continue
        notes.append(
            f"{plain} holds what a plain `kas build` put there ({var} was not set), but this "
            f"build uses {var}={used}. To reuse it, stop and either move its contents into "
            f"{used}, or `export {var}={shellquote.quote(plain)}` for every later build, "
            "`kas build` and `rocky-vulkan build` alike"
        )
    return notes


def flash_hint(wic: Path) -> str:
    """The flash command for the built image, quoted for the shell (/dev/sdX: the user's card)."""
    return f"rocky-vulkan flash {shellquote.quote(wic)} /dev/sdX"


def login_line(cfg: Config, machine: str) -> str | None:
    """How to log in to the built image over the network, or None when nothing can."""
    host = f"{cfg.machine(machine).hostname}.local"
    user = cfg.image.user
    if cfg.image.ssh_authorized_keys:
        n = len(cfg.image.ssh_authorized_keys)
        return f"ssh {user}@{host}   ({n} key{'s' if n > 1 else ''} in image.ssh_authorized_keys)"
    if cfg.image.password_hash:
        return f"ssh {user}@{host}   (the password of image.password_hash)"
    return None


NO_LOGIN = (
    "rocky-vulkan.yaml has no SSH key and no password hash: the image will take no login over "
    "the network, only on the serial console or an HDMI screen. To log in with SSH, stop now "
    "and build with `--ssh-key ~/.ssh/id_ed25519.pub` (your public key; it is added to "
    "image.ssh_authorized_keys), see docs/user/getting-in.md"
)


NO_LOGIN_SHORT = "no SSH key and no password hash in rocky-vulkan.yaml"
LICENCE_FRAGMENT = "model-licence"


def offline_problems(cfg: Config, env: dict[str, str]) -> list[str]:
    """What a `--fragment offline` build lacks before it starts: kas still clones the layer
    repos (into KAS_WORK_DIR, the checkout), and bitbake fetches nothing."""
    work = Path(env.get("KAS_WORK_DIR") or cfg.root)
    problems = []
    missing = [r.name for r in cfg.repos if not (work / r.name / ".git").exists()]
    if missing and not env.get("KAS_PREMIRRORS"):
        problems.append(
            f"kas still clones the layer repos, and {', '.join(missing)} are not in {work} "
            "(an earlier build with the network puts them there) and KAS_PREMIRRORS is not set: "
            "build once with the network, or point KAS_PREMIRRORS at local mirrors "
            "(docs/user/build.md, 'Building offline')"
        )
    dl = Path(env["DL_DIR"])
    if not dl.is_dir() or not any(dl.iterdir()):
        problems.append(
            f"DL_DIR {dl} is empty: an offline build downloads nothing. Build once with the "
            "network, or copy a filled DL_DIR from another host and set DL_DIR to it"
        )
    return problems


def available_fragments(cfg: Config) -> list[str]:
    """Fragment names (kas/<name>.yml) that are neither the base, a lock, nor a machine."""
    machines = {m.name for m in cfg.machines}
    names = []
    for path in sorted((cfg.root / KAS_DIR).glob("*.yml")):
        name = path.stem
        if path.name in NOT_FRAGMENTS or name.endswith(".lock") or name in machines:
            continue
        names.append(name)
    return names


def kas_config_arg(cfg: Config, machine: str, fragments: list[str]) -> str:
    """'kas/rock-5-itx.yml:kas/debug.yml': kas joins files given with ':' (all in one repo)."""
    cfg.machine(machine)  # unknown machine -> ConfigError naming the known ones
    known = available_fragments(cfg)
    for name in fragments:
        if name not in known:
            raise UserError(
                f"unknown fragment {name!r}: fragments in {KAS_DIR}/ are {', '.join(known)}"
            )
    files = [f"{KAS_DIR}/{machine}.yml"] + [f"{KAS_DIR}/{name}.yml" for name in fragments]
    return ":".join(files)


def find_kas(container: bool, environ: dict[str, str]) -> str:
    name = "kas-container" if container else "kas"
    found = shutil.which(name, path=environ.get("PATH", ""))
    found = found or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        raise UserError(
            f"{name} not found: run `pip install -e '.[dev]'` in the repo's venv "
            "(pins kas==5.5, which ships kas-container)"
        )
    return found


# Read by kas/sstate-mirror.yml; kas-container forwards only its own list of variables.
CONTAINER_FORWARD = ("ROCKY_SSTATE_MIRROR", "ROCKY_PRSERV_HOST")


def kas_command(
    kas: str, config_arg: str, container: bool = False, environ: dict[str, str] | None = None
) -> list[str]:
    cmd = [kas]
    forward = [f"-e {v}" for v in CONTAINER_FORWARD if container and (environ or {}).get(v)]
    if forward:
        cmd += ["--runtime-args", " ".join(forward)]  # `-e VAR`: docker/podman copy its value
    return cmd + ["build", config_arg]


def build_dir(cfg: Config, environ: dict[str, str]) -> Path:
    return Path(environ.get("KAS_BUILD_DIR") or cfg.root / KAS_BUILD_DIR)


def find_images(build: Path, machine: str) -> Images | None:
    """The newest .wic.gz with its .wic.bmap under build/tmp*/deploy/images/<machine>/."""
    candidates = []
    for deploy in sorted(build.glob(f"tmp*/deploy/images/{machine}")):
        for wic in deploy.glob(f"{IMAGE_NAME}-{machine}*.wic.gz"):
            bmap = wic.with_name(wic.name[: -len(".gz")] + ".bmap")
            if bmap.exists():
                candidates.append((wic.is_symlink(), wic.stat().st_mtime, wic, bmap))
    if not candidates:
        return None
    # Prefer the stable symlink (…-rock-5-itx.rootfs.wic.gz) over the timestamped file.
    _, _, wic, bmap = max(candidates, key=lambda c: (c[0], c[1]))
    return Images(wic, bmap)


# Output lines shown while kas runs (the rest goes to the log): kas's progress, bitbake's errors
# and warnings, git's, and kas-container's / docker's / podman's own errors.
LIVE_MARKS = (" - INFO ", "ERROR", "WARNING", "fatal:", "Error:", "Warning:", "Cannot connect to")
TAIL_SHOWN = 8


def run_kas(
    cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path
) -> tuple[int, list, list[str]]:
    """Run kas, log everything to `log_path`, show task progress; return (rc, diagnoses, the
    last non-blank output lines)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(highlight=False)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    notable: list[str] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"),
    )
    with (
        open(log_path, "w", encoding="utf-8") as log,
        Progress(*columns, console=console, transient=False) as progress,
    ):
        bar = progress.add_task("bitbake", total=None, current="starting kas")
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip("\n")
            tail.append(line)
            step = buildlog.parse_progress(line)
            if step:
                label = "sstate" if step.setscene else "tasks"
                progress.update(
                    bar,
                    description=label,
                    total=step.total,
                    completed=step.done - 1,
                    current=step.task,
                )
                continue
            if any(mark in line for mark in LIVE_MARKS):
                notable.append(line)
                progress.console.print(line, markup=False)
        rc = proc.wait()
    return rc, buildlog.diagnose(notable + list(tail)), [t for t in tail if t.strip()]


def _print_diagnoses(diagnoses: list, failed: bool) -> None:
    for d in diagnoses:
        label = "error" if failed else "warning"
        print(f"rocky-vulkan build: {label}: {d.cause}\n  fix: {d.fix}", file=sys.stderr)


def _read_ssh_keys(files: list[str]) -> list[str]:
    """--ssh-key: every file checked before anything is written."""
    return [sshkey.read_public_key(Path(f).expanduser()) for f in files]


def _add_ssh_keys(config: str, keys: list[str]) -> None:
    """Add the keys to the config in one atomic edit; say what happened to each."""
    added = sshkey.add_authorized_keys(Path(config), keys)
    for key in keys:
        kind, comment = key.split(" ")[0], " ".join(key.split(" ")[2:]) or "(no comment)"
        state = "added to" if key in added else "already in"
        print(f"ssh key {kind} {comment}: {state} image.ssh_authorized_keys in {Path(config).name}")


def _run(args: argparse.Namespace) -> int:
    # Everything that can refuse the build is checked before the config or the tree is written.
    keys = _read_ssh_keys(args.ssh_key or [])
    cfg = load_config(args.config)
    machine = args.machine or cfg.default_machine
    fragments = args.fragment or []
    config_arg = kas_config_arg(cfg, machine, fragments)
    env = build_environment(dict(os.environ))
    if LICENCE_FRAGMENT not in fragments:
        raise UserError(
            f"the image needs the licence of the model it tests with ({cfg.model.name}) "
            "accepted, or bitbake skips the image after cloning and parsing: read it at "
            f"{model_licence_url(cfg)}, then add --fragment {LICENCE_FRAGMENT}"
        )
    if "offline" in fragments:
        problems = offline_problems(cfg, env)
        if problems:
            raise UserError("--fragment offline cannot work yet:\n  " + "\n  ".join(problems))
    if keys:
        _add_ssh_keys(args.config, keys)
        cfg = load_config(args.config)
    written = write_rendered(cfg)
    print(f"render: {len(written)} files up to date")
    login = login_line(cfg, machine)
    if login is None:
        print(f"rocky-vulkan build: warning: {NO_LOGIN}", file=sys.stderr)
    if not args.skip_doctor and not doctor.run_doctor(
        cfg.root, container=args.container, quiet_pass=True
    ):
        raise UserError("the build host is not ready (doctor FAIL lines above); fix them first")
    results = lint.run_checks(cfg)
    if lint.exit_code(results) != 0:
        for r in results:
            for line in r.findings + ([r.crashed] if r.crashed else []):
                print(f"lint: {r.name}: {line}", file=sys.stderr)
        raise UserError("lint found problems (listed above); fix them, `rocky-vulkan lint` = 0")
    cmd = kas_command(find_kas(args.container, env), config_arg, args.container, env)
    build = build_dir(cfg, env)
    print(f"DL_DIR={env['DL_DIR']}\nSSTATE_DIR={env['SSTATE_DIR']}\nbuild dir: {build}")
    print("running: " + shellquote.join(cmd))
    for var in ("DL_DIR", "SSTATE_DIR"):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    for note in stray_caches(build, env):
        print(f"rocky-vulkan build: warning: {note}", file=sys.stderr)
    log_path = build / LOG_NAME
    rc, diagnoses, last = run_kas(cmd, cfg.root, env, log_path)
    _print_diagnoses(diagnoses, failed=rc != 0)
    if rc != 0:
        name = Path(cmd[0]).name
        hint = ""
        if not diagnoses:
            shown = "\n    ".join(last[-TAIL_SHOWN:]) or "(no output)"
            hint = f"; no known cause recognised, its last lines:\n    {shown}\n"
        raise UserError(f"{name} build failed with exit {rc}{hint}; full log: {log_path}")
    images = find_images(build, machine)
    if images is None:
        raise UserError(
            f"kas finished but no {IMAGE_NAME}-{machine}*.wic.gz with .wic.bmap is under "
            f"{build}/tmp*/deploy/images/{machine}/; read {log_path}"
        )
    print(f"image: {images.wic}\nbmap:  {images.bmap}")
    print(f"next:  {flash_hint(images.wic)}   (see `rocky-vulkan flash --list`)")
    print(f"login: {login}" if login else f"login: serial console or HDMI only ({NO_LOGIN_SHORT})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("build", help="render, doctor, lint, then kas build; print the image")
    parser.add_argument("--machine", help="a machine from the config (default: default_machine)")
    parser.add_argument(
        "--fragment",
        action="append",
        metavar="NAME",
        help="add kas/NAME.yml; repeatable. model-licence (required: accepts the model's "
        "licence, read it first), debug, offline, sstate-mirror",
    )
    parser.add_argument(
        "--container", action="store_true", help="build inside kas-container (docker/podman)"
    )
    parser.add_argument(
        "--ssh-key",
        action="append",
        metavar="FILE",
        help="first add this public key (e.g. ~/.ssh/id_ed25519.pub) to image.ssh_authorized_keys "
        "in rocky-vulkan.yaml, keeping its comments; without a key or a password hash the board "
        "takes no login over the network; repeatable",
    )
    parser.add_argument(
        "--skip-doctor",
        action="store_true",
        help="do not check the host first (e.g. a CI runner already known to be good)",
    )
    parser.set_defaults(func=_run)
