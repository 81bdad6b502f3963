"""The `rocky-vulkan sim` sub-commands: argument parsing and printing only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.sim import pins
from rocky_vulkan.sim.build_llama import build_llama
from rocky_vulkan.sim.guest import (
    driver_version,
    guest_argv,
    guest_env,
    resolve_driver,
    resolve_program,
)
from rocky_vulkan.sim.root import Bind, SimRoot, setup
from rocky_vulkan.sim.stats import DEFAULT_FILTER, collect_stats, compare_table, stats_table
from rocky_vulkan.sim.sweep import DEFAULT_UBS, sweep, table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="a simulated Mali-G610 (qemu + panvk + drm-shim)",
        description=sys.modules[__package__].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the Debian root (default: ${ROCKY_CACHE:-/var/cache/rocky-vulkan}/sim/root)",
    )
    sub = parser.add_subparsers(dest="sim_command", required=True)

    p = sub.add_parser("setup", help="create the root and install the pinned Debian packages")
    p.add_argument(
        "--float",
        dest="pinned",
        action="store_false",
        help="install sid's current versions instead of the pins (prints them)",
    )
    p.add_argument("--mirror", default=pins.MIRROR, help="Debian mirror (default: %(default)s)")
    p.add_argument(
        "--no-extra-drivers",
        dest="extra_drivers",
        action="store_false",
        help="skip unpacking the older Debian panvk builds used for comparison",
    )
    p.add_argument(
        "--cross",
        action="store_true",
        help="also install the arm64 cross toolchain for `sim build-llama`",
    )
    p.set_defaults(func=_setup)

    p = sub.add_parser("versions", help="print installed package versions and the pins")
    p.set_defaults(func=_versions)

    driver_help = (
        "panvk to use: 'stock' (Debian's), a name from `sim versions`, or a path to "
        "a locally built arm64 libvulkan_panfrost.so folder / ICD json"
    )
    p = sub.add_parser("run", help="run one arm64 program on the simulated G610")
    p.add_argument("--driver", default="stock", help=driver_help)
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the program",
    )
    p.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="HOST:TARGET",
        help="make a host folder visible inside the root (read-write)",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    p.set_defaults(func=_run)

    p = sub.add_parser("sweep", help="llama-bench over micro-batch sizes, peak private VA")
    _add_bench_args(p, driver_help, "llama-bench inside the root (e.g. a `sim build-llama` one)")
    p.add_argument(
        "--ubs",
        default=",".join(map(str, DEFAULT_UBS)),
        help="comma-separated micro-batch sizes (default: %(default)s)",
    )
    p.add_argument("--prompt", type=int, default=512, help="pp tokens (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per ub")
    p.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for logs and sweep.json/md")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("stats", help="pipeline statistics of the matmul pipelines")
    _add_bench_args(
        p,
        driver_help,
        "llama-bench inside the root (a cross-built one, e.g. "
        "/opt/rocky/llama-patched/bin/llama-bench)",
    )
    p.add_argument(
        "--filter",
        default=DEFAULT_FILTER,
        help="GGML_VK_PIPELINE_STATS pipeline-name substring (default: %(default)s)",
    )
    p.add_argument(
        "--compare",
        default=None,
        metavar="LLAMA_BENCH",
        help="a second llama-bench inside the root (e.g. the patched build), shown side by side",
    )
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the (first) run",
    )
    p.add_argument(
        "--compare-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the --compare run (e.g. GGML_VK_MALI_WARPTILE=force)",
    )
    p.add_argument("--ub", type=int, default=512)
    p.add_argument("--out", type=Path, required=True, help="folder for the log and stats.json/md")
    p.set_defaults(func=_stats)
    _register_build(sub)
    _register_prove(sub)


def _add_bench_args(p: argparse.ArgumentParser, driver_help: str, bench_help: str) -> None:
    """The model, driver and llama-bench that sweep and stats share."""
    p.add_argument("--model", type=Path, required=True, help="a GGUF file on the host")
    p.add_argument("--driver", default="stock", help=driver_help)
    p.add_argument("--llama-bench", default="/usr/bin/llama-bench", help=bench_help)


def _register_build(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build-llama", help="cross-build llama-bench for arm64 in the root")
    p.add_argument("--src", type=Path, required=True, help="llama.cpp source tree on the host")
    p.add_argument("--patch", type=Path, action="append", default=[], help="patch to apply")
    p.add_argument("--name", default="patched", help="install as /opt/rocky/llama-NAME")
    p.add_argument("--build-number", default="9101", help="LLAMA_BUILD_NUMBER")
    p.add_argument("--build-commit", default="389ff61", help="LLAMA_BUILD_COMMIT")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument(
        "--in-tree",
        default=None,
        metavar="NAME",
        help="apply the patches on top of build NAME's tree and rebuild incrementally",
    )
    p.set_defaults(func=_build)


def _register_prove(sub: argparse._SubParsersAction) -> None:
    from rocky_vulkan.sim import prove

    p = sub.add_parser(
        "prove",
        help="build stock and patched panvk and llama.cpp b9101, sweep, check the claims",
        description=prove.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--mesa-git",
        type=Path,
        default=os.environ.get("ROCKY_MESA_GIT") or None,
        help="git dir holding Mesa 26.2.0-rc1, the tree the patch was verified on (default: "
        "$ROCKY_MESA_GIT), e.g. a clone of github.com/leegao/mesa-26.2",
    )
    p.add_argument(
        "--mesa-commit",
        default=prove.DEFAULT_MESA_COMMIT,
        help="Mesa commit to build (default: %(default)s, 26.2.0-rc1)",
    )
    p.add_argument(
        "--ggml-git",
        type=Path,
        default=os.environ.get("ROCKY_GGML_GIT") or None,
        help=f"ggml-org/ggml git dir holding {prove.GGML_COMMIT} (default: $ROCKY_GGML_GIT)",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("ROCKY_CACHE", "/var/cache/rocky-vulkan")),
        help="cache dir for the root, builds and models (default: $ROCKY_CACHE or %(default)s)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results folder (default: CACHE/sim-prove)"
    )
    p.add_argument("-j", "--jobs", type=int, default=2, help="build jobs in all (default: 2)")
    p.add_argument(
        "--ubs",
        default=",".join(map(str, prove.UBS)),
        help="comma-separated micro-batch sizes (default: %(default)s)",
    )
    p.add_argument(
        "--previous-mesa-patch",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also build panvk with these patches (repeatable, in order), e.g. an earlier "
        "revision of the fix, and compare its waits per graph with the series",
    )
    p.set_defaults(func=_prove)


def _prove(args: argparse.Namespace) -> int:
    from rocky_vulkan.config import load_config
    from rocky_vulkan.sim import prove

    cfg = load_config(args.config)
    try:
        ubs = tuple(int(x) for x in args.ubs.split(",") if x.strip())
    except ValueError as err:
        raise UserError(f"--ubs {args.ubs!r}: want comma-separated integers") from err
    pargs = prove.ProveArgs(
        mesa_git=args.mesa_git,
        mesa_commit=args.mesa_commit,
        ggml_git=args.ggml_git,
        cache=args.cache.resolve(),
        out=(args.out or args.cache / "sim-prove").resolve(),
        jobs=args.jobs,
        ubs=ubs,
        mesa_patches=tuple(cfg.patch_paths(cfg.mesa.patches)),
        llama_patches=tuple(cfg.patch_paths(cfg.llama_cpp.patches)),
        previous_mesa_patches=tuple(p.resolve() for p in args.previous_mesa_patch),
    )
    prove.check_args(pargs)
    claims = prove.Prove(pargs).run()
    return 0 if all(c.ok for c in claims) else 1


def _build(args: argparse.Namespace) -> int:
    root = _root(args)
    root.require()
    if not root.stamp().get("cross"):
        raise UserError("the root has no cross toolchain; run `rocky-vulkan sim setup --cross`")
    path = build_llama(
        root,
        args.src,
        args.patch,
        args.name,
        args.build_number,
        args.build_commit,
        args.jobs,
        args.in_tree,
    )
    print(path)
    return 0


def _root(args: argparse.Namespace) -> SimRoot:
    return SimRoot(args.root) if args.root else SimRoot.default()


def _print_versions(root: SimRoot) -> None:
    installed = root.installed_versions(pins.query_names())
    wanted = {
        **pins.HOST_PACKAGES,
        **pins.CROSS_PACKAGES,
        **{f"{n}:{pins.GUEST_ARCH}": v for n, v in pins.GUEST_PACKAGES.items()},
    }
    for name, version in installed.items():
        if name in pins.CROSS_PACKAGES and not version:
            continue  # the cross toolchain is optional (`sim setup --cross`)
        pin = wanted.get(name)
        mark = "" if pin is None else (" (pinned)" if pin == version else f" (pin: {pin})")
        print(f"{name} {version or 'not installed'}{mark}")
    for name, path in sorted((p.name, p) for p in root.host_path("/opt/rocky/drivers").glob("*")):
        version = path / "version"
        if version.exists():
            print(f"driver {name}: {version.read_text().strip()}")


def _setup(args: argparse.Namespace) -> int:
    root = _root(args)
    stamp = setup(
        root,
        pinned=args.pinned,
        mirror=args.mirror,
        extra_drivers=args.extra_drivers,
        cross=args.cross,
    )
    print(f"simulator root: {root.path} ({'pinned' if stamp['pinned'] else 'floating'} versions)")
    _print_versions(root)
    return 0


def _versions(args: argparse.Namespace) -> int:
    root = _root(args)
    root.require()
    _print_versions(root)
    return 0


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--env {item!r} is not KEY=VALUE")
        env[key] = value
    return env


def _run(args: argparse.Namespace) -> int:
    root = _root(args)
    root.require()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UserError("nothing to run: give `sim run -- PROGRAM ARGS...`")
    binds = []
    for item in args.bind:
        host, sep, target = item.partition(":")
        if not sep or not target.startswith("/"):
            raise UserError(f"--bind {item!r} is not HOST:/ABSOLUTE/TARGET")
        binds.append(Bind(Path(host).resolve(), target, read_only=False))
    driver = resolve_driver(root, args.driver)
    counter = "/tmp/rocky-vacount.txt"
    env = guest_env(driver, counter, _parse_env(args.env))
    program = resolve_program(root, argv[0])
    # The counter file lives in the run's private /tmp: print it before the namespace goes.
    script = (
        'q="$1"; shift; "$@"; rc=$?; [ -f "$q" ] && sed "s/^/rocky-vacount: /" "$q" >&2; exit $rc'
    )
    inner = ["sh", "-c", script, "sh", counter, *guest_argv(program, argv[1:], env)]
    return root.run(inner, binds=tuple(binds), check=False).returncode


def _sweep(args: argparse.Namespace) -> int:
    root = _root(args)
    root.require()
    if not args.model.is_file():
        raise UserError(
            f"model {args.model} not found; write one with "
            "`rocky-vulkan testmodel` (preset qwen2.5-3b-shape)"
        )
    try:
        ubs = [int(x) for x in args.ubs.split(",") if x]
    except ValueError as err:
        raise UserError(f"--ubs {args.ubs!r}: want comma-separated integers") from err
    driver = resolve_driver(root, args.driver)
    label = f"{driver.name} ({driver_version(root, driver)})"
    results = sweep(
        root,
        driver,
        label,
        args.model,
        ubs,
        args.out,
        args.prompt,
        args.timeout,
        _parse_env(args.env),
        args.llama_bench,
    )
    print(table(results, label), end="")
    return 0


def _stats(args: argparse.Namespace) -> int:
    root = _root(args)
    root.require()
    if not args.model.is_file():
        raise UserError(f"model {args.model} not found")
    driver = resolve_driver(root, args.driver)
    runs = [(args.llama_bench, _parse_env(args.env))]
    if args.compare:
        runs.append((args.compare, _parse_env(args.compare_env)))
    labels = [" ".join([*(f"{k}={v}" for k, v in env.items()), prog]) for prog, env in runs]
    results = []
    for i, (program, env) in enumerate(runs):
        out = args.out / f"run{i}" if args.compare else args.out
        rows = collect_stats(
            root, driver, args.model, out, args.filter, args.ub, program, extra_env=env
        )
        if not rows:
            print(
                f"no pipeline statistics matched {args.filter!r}; see {out}/stats.stderr",
                file=sys.stderr,
            )
            return 1
        (out / "stats.json").write_text(json.dumps(rows, indent=2) + "\n")
        (out / "stats.md").write_text(stats_table(rows, labels[i]))
        results.append(rows)
    if args.compare:
        text = compare_table(results[0], results[1], labels[0], labels[1])
        (args.out / "compare.md").write_text(text)
    else:
        text = stats_table(results[0], labels[0])
    print(text, end="")
    return 0
