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

from rocky_vulkan.config import Config, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import buildlog, doctor
from rocky_vulkan.layer import lint
from rocky_vulkan.layer.manifest import KAS_DIR
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
    return Path(environ.get("KAS_BUILD_DIR") or cfg.root / "build")


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


def run_kas(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> tuple[int, list]:
    """Run kas, log everything to `log_path`, show task progress; return (rc, diagnoses)."""
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
            if " - INFO " in line or "ERROR" in line or "WARNING" in line or "fatal:" in line:
                notable.append(line)
                progress.console.print(line, markup=False)
        rc = proc.wait()
    return rc, buildlog.diagnose(notable + list(tail))


def _print_diagnoses(diagnoses: list, failed: bool) -> None:
    for d in diagnoses:
        label = "error" if failed else "warning"
        print(f"rocky-vulkan build: {label}: {d.cause}\n  fix: {d.fix}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    machine = args.machine or cfg.default_machine
    written = write_rendered(cfg)
    print(f"render: {len(written)} files up to date")
    config_arg = kas_config_arg(cfg, machine, args.fragment or [])
    env = build_environment(dict(os.environ))
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
    print("running: " + " ".join(cmd))
    for var in ("DL_DIR", "SSTATE_DIR"):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    log_path = build / LOG_NAME
    rc, diagnoses = run_kas(cmd, cfg.root, env, log_path)
    _print_diagnoses(diagnoses, failed=rc != 0)
    if rc != 0:
        hint = "" if diagnoses else " (no known cause recognised; read the ERROR lines)"
        raise UserError(f"kas build failed with exit {rc}{hint}; full log: {log_path}")
    images = find_images(build, machine)
    if images is None:
        raise UserError(
            f"kas finished but no {IMAGE_NAME}-{machine}*.wic.gz with .wic.bmap is under "
            f"{build}/tmp*/deploy/images/{machine}/; read {log_path}"
        )
    print(f"image: {images.wic}\nbmap:  {images.bmap}")
    print(f"next:  rocky-vulkan flash {images.wic} /dev/sdX   (see `rocky-vulkan flash --list`)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("build", help="render, doctor, lint, then kas build; print the image")
    parser.add_argument("--machine", help="a machine from the config (default: default_machine)")
    parser.add_argument(
        "--fragment",
        action="append",
        metavar="NAME",
        help="add kas/NAME.yml (e.g. debug, sstate-mirror, offline); repeatable",
    )
    parser.add_argument(
        "--container", action="store_true", help="build inside kas-container (docker/podman)"
    )
    parser.add_argument(
        "--skip-doctor",
        action="store_true",
        help="do not check the host first (e.g. a CI runner already known to be good)",
    )
    parser.set_defaults(func=_run)
