"""`rocky-vulkan tiles`: the matmul tiles of a source tree, the tuner's candidates, and their
pruning on the simulated G610."""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.tiles import WARPTILE_PATCH, prune, space, warptile


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "tiles",
        help="matmul tile candidates for the board's tuner, pruned on the simulated G610",
        description=space.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = parser.add_subparsers(dest="tiles_command", required=True)

    p = tsub.add_parser("show", help="accumulators per thread and tile rule, stock vs Mali")
    p.add_argument("dir", help="llama.cpp source tree (patched)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=warptile._run)

    p = tsub.add_parser("candidates", help="the legal int / int_k tile specs the tuner may try")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_candidates)

    p = tsub.add_parser(
        "prune",
        help="compile each candidate on the simulated G610, keep the spill-free ones",
        description=prune.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--sim-root", type=Path, help="the qemu-user sim root (sim setup)")
    where.add_argument(
        "--panvk-root",
        type=Path,
        help="the native root of `sim prove` ($ROCKY_CACHE/mesa/root-sid): amd64 panvk + drm-shim",
    )
    p.add_argument(
        "--llama-bench",
        required=True,
        help="a spec-capable llama-bench inside the root (/opt/rocky/llama-NAME/bin/llama-bench, "
        "or /work/llama-b9101-mali/bin/llama-bench in a --panvk-root)",
    )
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a Q4_K_M GGUF: a host file for --sim-root, a path inside the root for --panvk-root",
    )
    p.add_argument(
        "--driver",
        default=None,
        help="panvk to use: `sim run --help` for --sim-root (default stock), a driver bundle of "
        "`sim prove` for --panvk-root (default patched)",
    )
    p.add_argument("--max-spills", type=int, default=0, help="spills allowed (default: 0)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per candidate")
    p.add_argument("--logs", type=Path, required=True, help="folder for each candidate's log")
    p.add_argument("--only", default=None, help="comma-separated candidate names (a subset)")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="where the pruned list goes (the committed list is "
        "tools/rocky_vulkan/tiles/tile_candidates.json in a checkout)",
    )
    p.set_defaults(func=_prune)


def _builtin(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """The built-in Mali tiles, read from the project's warptile patch (named in the config)."""
    cfg = load_config(args.config)
    if WARPTILE_PATCH not in cfg.llama_cpp.patches:
        raise UserError(
            f"{cfg.path}: llama_cpp.patches does not list {WARPTILE_PATCH}, which holds the "
            "built-in Mali tiles: add it back"
        )
    return space.builtin_tiles(cfg.patch_paths((WARPTILE_PATCH,))[0])


def _candidates(args: argparse.Namespace) -> int:
    cands = space.candidates(_builtin(args))
    if args.json:
        print(json.dumps([c.to_json() for c in cands], indent=1))
        return 0
    print(f"{'name':30} {'acc':>3} {'regs int/k':>10} {'shmem':>6}  spec")
    for c in cands:
        regs = f"{c.est_registers['int']}/{c.est_registers['int_k']}"
        print(f"{c.name:30} {c.accumulators:3} {regs:>10} {c.shared_bytes['int_k']:6}  {c.spec}")
    print(f"{len(cands)} candidates (register counts are estimates; `tiles prune` measures them)")
    return 0


def _panvk_runner(args: argparse.Namespace):
    """spec -> (exit status, stderr) of llama-bench -v in the native root of `sim prove`."""
    from rocky_selftest.runner import run_tool
    from rocky_selftest.tune_spec import ENV_VAR

    from rocky_vulkan.sim.prove import SCRIPT
    from rocky_vulkan.sim.sweep import bench_argv

    root = args.panvk_root.resolve()
    driver = args.driver or "patched"
    if not (root / "work/drivers" / driver / "panfrost_icd.json").is_file():
        raise UserError(
            f"--panvk-root {root}: no driver bundle {driver!r} under work/drivers; "
            "run `rocky-vulkan sim prove` first (it builds stock and patched)"
        )
    for inside in (args.llama_bench, str(args.model)):
        if not (root / inside.lstrip("/")).is_file():
            raise UserError(f"{inside}: not in {root}; give a path inside the root")
    args.logs.mkdir(parents=True, exist_ok=True)
    counter = iter(range(1, 10_000))

    def run(spec: str) -> tuple[int, str]:
        cmd = ["bash", str(SCRIPT), "run", "--driver", driver, "--", "env"]
        cmd += [f"{ENV_VAR}={spec}", f"GGML_VK_PIPELINE_STATS={prune.STATS_FILTER}"]
        cmd += [args.llama_bench, *bench_argv(str(args.model), 512, 512, 1), "-v"]
        # run_tool kills the whole process group on timeout: llama-bench in the chroot too.
        res = run_tool(cmd, {"MESA_ROOT": str(root)}, args.timeout)
        stderr, code = res.stderr, res.returncode
        if res.timed_out or res.error:
            stderr, code = f"{stderr}\n{res.failure()}\n", 124
        n = next(counter)
        (args.logs / f"{n:02d}.stderr").write_text(f"# {spec}\n{stderr}")
        return code, stderr

    return run, driver


def _sim_runner(args: argparse.Namespace):
    """spec -> (exit status, stderr) of llama-bench -v in the sim root, logs kept per spec."""
    from rocky_selftest.tune_spec import ENV_VAR

    from rocky_vulkan.sim.guest import guest_argv, guest_env, resolve_driver
    from rocky_vulkan.sim.root import Bind, SimRoot
    from rocky_vulkan.sim.sweep import MODEL_DIR, bench_argv

    root = SimRoot(args.sim_root)
    root.require()
    model = args.model.resolve()
    if not model.is_file():
        raise UserError(f"--model {model}: not a file; pass the GGUF the board runs")
    driver = resolve_driver(root, args.driver or "stock")
    args.logs.mkdir(parents=True, exist_ok=True)
    counter = iter(range(1, 10_000))

    def run(spec: str) -> tuple[int, str]:
        extra = {ENV_VAR: spec, "GGML_VK_PIPELINE_STATS": prune.STATS_FILTER}
        env = guest_env(driver, None, extra)
        # -v: ggml-vulkan's info line (the tiles in use) and a rejection would be dropped.
        argv = guest_argv(
            args.llama_bench, [*bench_argv(f"{MODEL_DIR}/{model.name}", 512, 512, 1), "-v"], env
        )
        binds = (Bind(model.parent, MODEL_DIR),)
        proc = root.run(argv, binds=binds, check=False, capture=True, timeout=args.timeout)
        n = next(counter)
        (args.logs / f"{n:02d}.stderr").write_text(f"# {spec}\n{proc.stderr}")
        return proc.returncode, proc.stderr

    return run, driver


def _prune(args: argparse.Namespace) -> int:
    builtin = _builtin(args)
    cands = space.candidates(builtin)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c.name for c in cands}
        if unknown:
            raise UserError(
                f"--only: no candidates named {sorted(unknown)}; see `tiles candidates`"
            )
        cands = [c for c in cands if c.name in wanted or c.builtin]
    if args.panvk_root:
        run, driver_name = _panvk_runner(args)
    else:
        run, driver = _sim_runner(args)
        driver_name = driver.name
    records = prune.prune(cands, run, args.max_spills)
    provenance = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "llama_bench": args.llama_bench,
        "model": args.model.name,
        "driver": driver_name,
        "root": "sim prove (native panvk + drm-shim)" if args.panvk_root else "sim setup (qemu)",
        "max_spills": args.max_spills,
    }
    doc = prune.document(cands, builtin, records, provenance)
    prune.write_document(doc, args.out)
    kept = sum(1 for e in doc["candidates"] if e["kept"])
    print(f"wrote {args.out}: {kept} of {len(cands)} candidates kept")
    return 0
