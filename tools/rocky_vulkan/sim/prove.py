"""`rocky-vulkan sim prove`: the simulated-G610 proof of both patches, from nothing, in one command.

Stages (each timed; a warm rerun reuses what is cached and re-measures everything):
  root            Debian sid root with Mesa's and llama.cpp's build deps (mesa-panvk-build.sh root)
  mesa-stock      panvk + panfrost drm-shim from the given Mesa tree, with the simulation-only
                  instrumentation (`panvk-privva:` lines) and the 32 GiB shim
  mesa-patched    the same plus the series in mesa.patches (patches/mesa-000N-*.patch, first)
  llama-src       llama.cpp b9101 assembled from PyPI + ggml f76511eb blobs, our patch applied
  llama-build     llama-bench + llama-quantize, Vulkan, built natively inside the root
  models          the sweep model (Qwen2.5-3B shapes, 36 layers, Q8_0) and a Q4_K_M one
                  (written F16, converted with the built llama-quantize)
  sweep-*         llama-bench -p 512 -n 0 -ngl 99 per ub, stock tiles, stock and patched panvk
  stats-*         GGML_VK_PIPELINE_STATS=matmul on the Q4_K_M model, stock and Mali tiles
  waits-*         WAIT instructions panvk records per prefill (ub 512) and decode graph of the
                  sweep model, built-in tiles (sim/waits.py)
  vkcheck-*       rocky-vkcheck (the image's driver check, tools/rocky_vkcheck) built in the root
                  and run on each driver: recording only, as nothing executes (results are
                  mismatches); what it shows is whether recording and submission succeed
  mesa-previous   only with --previous-mesa-patch: a third driver with those patches (e.g. an
                  earlier revision of the fix), counted like the others

Everything runs natively on amd64 (drm-shim, no qemu). The result is prove.json, prove.md and one
table of the claims with pass/fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocky_vulkan.errors import UserError
from rocky_vulkan.sim import waits
from rocky_vulkan.sim.stats import parse_stats

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "mesa-panvk-build.sh"
# Measurement aids for the simulator only, never shipped: a private-VA counter, a WAIT counter
# and a 32 GiB shim.
INSTRUMENTATION = HERE / "patches/mesa-panvk-privva-instrumentation.patch"
WAIT_COUNT = HERE / "patches/mesa-panvk-csf-wait-count.patch"
SHIM_32G = HERE / "patches/mesa-drm-shim-32g.patch"
# The Mesa tree the patch was verified on: 26.2.0-rc1 as imported in GitHub leegao/mesa-26.2.
DEFAULT_MESA_COMMIT = "3c34d70f234f43053eeda159dd16958190280310"
GGML_COMMIT = "f76511eb"
UBS = (64, 128, 256, 512, 1024)
VKCHECK_SOURCES = HERE.parents[1] / "rocky_vkcheck"
VKCHECK_DIR = "/work/rocky-vkcheck"  # inside the root
STATS_UB = 512
STATS_PIPELINE = "matmul_q4_k_q8_1_l"
# Inside the root.
LLAMA_SRC = "/work/llama-src-b9101"
LLAMA_NAME = "b9101-mali"
BENCH = f"/work/llama-{LLAMA_NAME}/bin/llama-bench"
QUANTIZE = f"/work/llama-{LLAMA_NAME}/bin/llama-quantize"
SWEEP_MODEL = "/work/model/q3b-36l-q8_0.gguf"
Q4KM_MODEL = "/work/model/q3b-4l-q4_k_m.gguf"
STOCK_TILES = {"GGML_VK_MALI_WARPTILE": "0"}


@dataclass
class ProveArgs:
    mesa_git: Path
    mesa_commit: str
    ggml_git: Path
    cache: Path
    out: Path
    jobs: int = 2
    ubs: tuple[int, ...] = UBS
    # The product's patches, from rocky-vulkan.yaml (mesa.patches, llama_cpp.patches, in order).
    mesa_patches: tuple[Path, ...] = ()
    llama_patches: tuple[Path, ...] = ()
    # A third driver to compare with (e.g. the fix's previous revision); none when empty.
    previous_mesa_patches: tuple[Path, ...] = ()


def check_args(args: ProveArgs) -> None:
    """Fail before anything is built when an input is missing; each message names the fix."""
    if os.geteuid() != 0:
        raise UserError("sim prove needs root (debootstrap, chroot, bind mounts): run it as root")
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", args.mesa_commit):
        raise UserError(f"--mesa-commit {args.mesa_commit!r} is not a git commit id (hex)")
    _check_commit(
        args.mesa_git,
        args.mesa_commit,
        "--mesa-git",
        "No Mesa tarball is used: the Mesa tree is an input, "
        "a git dir holding Mesa 26.2.0-rc1 (the tree the patch was verified on), e.g. a clone of "
        "github.com/leegao/mesa-26.2 "
        f"(commit {DEFAULT_MESA_COMMIT}), given with --mesa-git DIR or ROCKY_MESA_GIT.",
    )
    _check_commit(
        args.ggml_git,
        GGML_COMMIT,
        "--ggml-git",
        "llama.cpp b9101's Vulkan shaders are on no registry; they come from a ggml-org/ggml "
        f"git dir holding commit {GGML_COMMIT}, given with --ggml-git DIR or ROCKY_GGML_GIT.",
    )
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: want at least 1")
    if not args.ubs or any(u <= 0 for u in args.ubs):
        raise UserError(f"--ubs {args.ubs}: want positive micro-batch sizes")
    for patch in args.previous_mesa_patches:
        if not patch.is_file():
            raise UserError(
                f"--previous-mesa-patch {patch}: no such file; give a patch made with "
                "`git format-patch` against the Mesa tree, e.g. an earlier revision from git "
                "history (`git show REV:patches/NAME.patch > FILE`)"
            )


def _check_commit(git_dir: Path | None, commit: str, option: str, why: str) -> None:
    if git_dir is None:
        raise UserError(f"{option} is missing. {why}")
    if not git_dir.is_dir():
        raise UserError(f"{option} {git_dir}: no such directory. {why}")
    proc = subprocess.run(
        ["git", f"--git-dir={git_dir}", "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise UserError(f"{option} {git_dir} has no commit {commit}. {why}")


@dataclass
class Stage:
    name: str
    seconds: float
    ok: bool
    note: str = ""


@dataclass
class Runner:
    """Runs stages in order (or two lanes side by side), timing each and logging to out/."""

    out: Path
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))
    stages: list[Stage] = field(default_factory=list)

    def stage(self, name: str, fn: Callable[[], str | None]) -> None:
        self.log(f"[prove] stage {name} ...")
        start = time.monotonic()
        try:
            note = fn() or ""
        except BaseException as err:
            self.stages.append(Stage(name, time.monotonic() - start, False, str(err)[-300:]))
            self.save()
            raise
        self.stages.append(Stage(name, time.monotonic() - start, True, note))
        self.log(f"[prove] stage {name} done in {self.stages[-1].seconds:.0f} s")
        self.save()

    def lanes(self, *lanes: list[tuple[str, Callable[[], str | None]]]) -> None:
        """Run lists of stages side by side (one thread per list); the first failure is raised."""
        with ThreadPoolExecutor(len(lanes)) as pool:
            futures = [pool.submit(lambda ln=ln: [self.stage(n, f) for n, f in ln]) for ln in lanes]
            errors = [f.exception() for f in futures]
        for err in errors:
            if err is not None:
                raise err

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "stages.json").write_text(
            json.dumps([asdict(s) for s in self.stages], indent=2) + "\n"
        )


# ---- results: parsing the sweep and the statistics ----------------------------------------


@dataclass
class UbRun:
    ub: int
    exit_code: int
    peak_mib: float | None
    error: str
    first_exhausted_mib: list[float]


_PEAK = re.compile(r"panvk-privva: peak ([0-9.]+) MiB")
_EXHAUSTED = re.compile(r"panvk-privva: priv heap exhausted allocating ([0-9.]+) MiB")
_WHAT = re.compile(r"what\(\):\s*(.*\S)")


def parse_ub_run(ub: int, exit_code: int, stderr: str) -> UbRun:
    """One llama-bench run of a sweep: exit code, peak private VA, the exception, and the sizes
    of the first allocations the private heap refused (in order)."""
    peaks = [float(m) for m in _PEAK.findall(stderr)]
    what = _WHAT.search(stderr)
    error = what.group(1) if what else ""
    if not error:
        error = next((ln.strip() for ln in stderr.splitlines() if "ErrorOutOf" in ln), "")
    exhausted = [float(m) for m in _EXHAUSTED.findall(stderr)][:3]
    return UbRun(ub, exit_code, max(peaks) if peaks else None, error, exhausted)


def read_sweep(folder: Path, ubs: tuple[int, ...]) -> list[UbRun]:
    """Read a `mesa-panvk-build.sh sweep` folder (summary.tsv + ubN.stderr)."""
    codes: dict[int, int] = {}
    summary = folder / "summary.tsv"
    if summary.is_file():
        for line in summary.read_text().splitlines()[1:]:
            cells = line.split("\t")
            if len(cells) >= 2 and cells[0].isdigit() and cells[1].lstrip("-").isdigit():
                codes[int(cells[0])] = int(cells[1])
    runs = []
    for ub in ubs:
        err = folder / f"ub{ub}.stderr"
        if ub not in codes or not err.is_file():
            runs.append(UbRun(ub, -1, None, "not run", []))
            continue
        runs.append(parse_ub_run(ub, codes[ub], err.read_text(errors="replace")))
    return runs


def spills(rows: list[dict[str, str]], pipeline: str = STATS_PIPELINE) -> int | None:
    for row in rows:
        if row.get("pipeline") == pipeline and row.get("Spills", "").isdigit():
            return int(row["Spills"])
    return None


# ---- claims --------------------------------------------------------------------------------


@dataclass
class Claim:
    name: str
    expected: str
    seen: str
    ok: bool


# Bands around the numbers claimed in docs/verification/mesa-patch.md (reruns may differ by a few
# MiB as the heap fills in a different order; a different Mesa or llama.cpp would move them more).
STOCK_PEAK_MIB = (3700.0, 4096.0)
PATCHED_PEAK_MIB = (704.1 * 0.95, 704.1 * 1.05)
STOCK_SPILLS = (604 * 0.95, 604 * 1.05)
MALI_SPILLS_MAX = 16


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f}"


def check_claims(
    stock: list[UbRun],
    patched: list[UbRun],
    spills_stock_tiles: dict[str, int | None],
    spills_mali_tiles: dict[str, int | None],
) -> list[Claim]:
    """Compare measured results with the claims; every claim is a row with pass or fail."""
    claims = []
    big = [r for r in stock if r.ub >= 128]
    oom = [r for r in big if r.exit_code not in (0, -1) and "ErrorOutOfDeviceMemory" in r.error]
    small = [r for r in stock if r.ub < 128]
    claims.append(
        Claim(
            "stock panvk, stock tiles: ErrorOutOfDeviceMemory at ub 128-1024, ub 64 passes",
            "vk::CommandBuffer::end: ErrorOutOfDeviceMemory at every ub >= 128",
            ", ".join(
                f"ub {r.ub}: " + ("ok" if r.exit_code == 0 else f"exit {r.exit_code}")
                for r in stock
            ),
            bool(big) and len(oom) == len(big) and all(r.exit_code == 0 for r in small),
        )
    )
    peaks = [r.peak_mib for r in big if r.peak_mib is not None]
    lo, hi = STOCK_PEAK_MIB
    claims.append(
        Claim(
            "stock panvk: peak private VA when it fails",
            f"~3.9 GB (3878-3935 MiB seen before; band {lo:.0f}-{hi:.0f} MiB)",
            "-".join(_fmt(p) for p in (min(peaks), max(peaks))) + " MiB" if peaks else "?",
            bool(peaks) and len(peaks) == len(big) and all(lo <= p <= hi for p in peaks),
        )
    )
    lo, hi = PATCHED_PEAK_MIB
    passed = [r for r in patched if r.exit_code == 0]
    claims.append(
        Claim(
            "patched panvk, stock tiles: every ub 64-1024 passes",
            "exit 0 at every ub",
            ", ".join(f"ub {r.ub}: exit {r.exit_code}" for r in patched),
            bool(patched) and len(passed) == len(patched),
        )
    )
    top = max((r.peak_mib for r in patched if r.peak_mib is not None), default=None)
    claims.append(
        Claim(
            "patched panvk: peak private VA",
            f"~704 MiB (704.1 seen before; band {lo:.0f}-{hi:.0f} MiB)",
            f"{_fmt(top)} MiB",
            top is not None and lo <= top <= hi,
        )
    )
    lo, hi = STOCK_SPILLS
    for driver in sorted(set(spills_stock_tiles) | set(spills_mali_tiles)):
        a, b = spills_stock_tiles.get(driver), spills_mali_tiles.get(driver)
        claims.append(
            Claim(
                f"{STATS_PIPELINE} spills, stock -> Mali tiles ({driver} panvk)",
                f"604 -> 7 (band {lo:.0f}-{hi:.0f} -> <= {MALI_SPILLS_MAX})",
                f"{'?' if a is None else a} -> {'?' if b is None else b}",
                a is not None and b is not None and lo <= a <= hi and b <= MALI_SPILLS_MAX,
            )
        )
    return claims


def check_wait_claims(per_driver: dict[str, dict[str, waits.Counts | None]]) -> list[Claim]:
    """Every driver's counters were read; with a previous revision, the series records no more
    waits on all compute iterators per graph than it (issue 24, D2)."""
    missing = [f"{d} {g}" for d, graphs in per_driver.items() for g, c in graphs.items() if not c]
    claims = [
        Claim(
            "WAIT counters read for every driver and graph",
            "a `panvk-csf:` line in every run, one more graph giving no fewer instructions",
            "missing: " + ", ".join(missing) if missing else "all read",
            bool(per_driver) and not missing,
        )
    ]
    if "previous" in per_driver and "patched" in per_driver:
        for graph in per_driver["patched"]:
            now, before = per_driver["patched"][graph], per_driver["previous"].get(graph)
            claims.append(
                Claim(
                    f"waits on all compute iterators per {graph} graph, previous -> series",
                    "the series records no more than the previous revision",
                    f"{before.waits_all_iters if before else '?'} -> "
                    f"{now.waits_all_iters if now else '?'}",
                    now is not None
                    and before is not None
                    and now.waits_all_iters <= before.waits_all_iters,
                )
            )
    return claims


def ub_table(stock: list[UbRun], patched: list[UbRun]) -> str:
    def cell(r: UbRun) -> str:
        text = f"{r.exit_code}, {_fmt(r.peak_mib)} MiB"
        if r.first_exhausted_mib:
            text += ", heap refused " + " / ".join(f"{x:.1f}" for x in r.first_exhausted_mib)
            text += " MiB"
        return text

    by_ub = {r.ub: r for r in patched}
    lines = [
        "| ub | stock panvk: exit, peak, first refused allocations | patched panvk: exit, peak |",
        "| ---: | --- | --- |",
    ]
    for r in stock:
        p = by_ub.get(r.ub)
        lines.append(f"| {r.ub} | {cell(r)} | {cell(p) if p else '-'} |")
    return "\n".join(lines) + "\n"


def claims_table(claims: list[Claim]) -> str:
    lines = ["| claim | expected | seen | result |", "| --- | --- | --- | --- |"]
    for c in claims:
        lines.append(f"| {c.name} | {c.expected} | {c.seen} | {'PASS' if c.ok else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def stages_table(stages: list[Stage], wall: float | None = None) -> str:
    """Stage times; with `wall`, the command's own wall time too (the two build lanes overlap,
    so it is less than the sum)."""
    lines = ["| stage | wall (s) | result |", "| --- | ---: | --- |"]
    for s in stages:
        lines.append(f"| {s.name} | {s.seconds:.0f} | {'ok' if s.ok else 'FAILED'} {s.note} |")
    if wall is not None:
        lines.append(f"| whole command | {wall:.0f} | |")
    return "\n".join(lines) + "\n"


# ---- the stages ----------------------------------------------------------------------------


class Prove:
    def __init__(self, args: ProveArgs) -> None:
        self.args = args
        self.root = args.cache / "mesa/root-sid"
        self.runner = Runner(args.out)
        self.env = dict(os.environ, ROCKY_CACHE=str(args.cache), MESA_ROOT=str(self.root))

    def script(self, *argv: str, jobs: int | None = None, log: str | None = None) -> None:
        env = dict(self.env, MESA_JOBS=str(jobs or self.args.jobs))
        cmd = ["bash", str(SCRIPT), *argv]
        self.runner.log("+ " + " ".join(cmd))
        out = open(self.args.out / log, "w") if log else None  # noqa: SIM115
        try:
            proc = subprocess.run(cmd, env=env, stdout=out, stderr=out, check=False)
        finally:
            if out:
                out.close()
        if proc.returncode != 0:
            where = f"; log: {self.args.out / log}" if log else ""
            raise UserError(f"`{' '.join(argv[:2])}` failed (exit {proc.returncode}){where}")

    def host(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    # Stages.
    def mesa(self, tag: str, patches: list[Path], jobs: int) -> Callable[[], str]:
        def run() -> str:
            argv = ["build", "--tag", tag, "--git-dir", str(self.args.mesa_git)]
            argv += ["--commit", self.args.mesa_commit]
            for p in patches:
                argv += ["--patch", str(p)]
            self.script(*argv, jobs=jobs, log=f"mesa-{tag}.log")
            return (self.host(f"/work/drivers/{tag}/mesa-commit")).read_text().strip()[:12]

        return run

    def llama_src(self) -> str:
        from rocky_vulkan.llama.sources import STAMP, prepare, source_key

        dest = self.host(LLAMA_SRC)
        stamp = dest / STAMP
        if stamp.is_file() and json.loads(stamp.read_text()).get("source_key") == source_key(
            list(self.args.llama_patches)
        ):
            return "cached"
        prepare(
            dest,
            patches=list(self.args.llama_patches),
            cache=self.args.cache / "pypi",
            ggml_git=self.args.ggml_git,
            force=True,
        )
        return json.loads(stamp.read_text())["source_key"]

    def llama_build(self, jobs: int) -> str:
        self.script("llama", "--src", LLAMA_SRC, "--name", LLAMA_NAME, jobs=jobs, log="llama.log")
        log = self.host(f"/work/llama-{LLAMA_NAME}/configure.log")
        text = log.read_text(errors="replace") if log.is_file() else ""
        return "int dot in glslc" if "GL_EXT_integer_dot_product supported" in text else ""

    def models(self) -> str:
        from rocky_vulkan.llama.testmodel import write_preset, write_quant_source

        sweep = self.host(SWEEP_MODEL)
        if not sweep.is_file():
            write_preset("qwen2.5-3b-shape", sweep, n_layer=36)
        q4 = self.host(Q4KM_MODEL)
        if not q4.is_file():
            f16 = q4.with_name(q4.stem + ".f16.gguf")
            write_quant_source("qwen2.5-3b-shape-q4km", f16)
            tmp = Q4KM_MODEL + ".tmp"
            f16_inside = str(Path(Q4KM_MODEL).with_name(f16.name))
            try:
                self.script("exec", "--", QUANTIZE, f16_inside, tmp, "Q4_K_M", log="quantize.log")
                os.replace(self.host(tmp), q4)
            finally:
                f16.unlink(missing_ok=True)
                self.host(tmp).unlink(missing_ok=True)
        return f"{sweep.stat().st_size} B, {q4.stat().st_size} B"

    def sweep(self, driver: str) -> str:
        out = self.host(f"/work/prove/sweep-{driver}")
        argv = ["sweep", "--driver", driver, "--model", SWEEP_MODEL, "--bench", BENCH]
        argv += ["--ubs", " ".join(map(str, self.args.ubs)), "--out", str(out)]
        for k, v in STOCK_TILES.items():
            argv += ["--env", f"{k}={v}"]
        self.script(*argv, log=f"sweep-{driver}.log")
        runs = read_sweep(out, self.args.ubs)
        return ", ".join(f"{r.ub}:{r.exit_code}" for r in runs)

    def stats(self, driver: str, tiles: str) -> dict[str, int | None]:
        env = [f"{k}={v}" for k, v in STOCK_TILES.items()] if tiles == "stock" else []
        log = f"stats-{driver}-{tiles}.log"
        # Exit status is not checked: stock panvk with stock tiles may die after compiling (the
        # statistics are printed when a pipeline is created, before the failing submit).
        try:
            self.script(
                "run", "--driver", driver, "--", "env", "GGML_VK_PIPELINE_STATS=matmul", *env,
                BENCH, "-m", Q4KM_MODEL, "-p", str(STATS_UB), "-n", "0", "-ngl", "99", "-r", "1",
                "-ub", str(STATS_UB), "-o", "json", log=log,
            )  # fmt: skip
        except UserError:
            pass
        rows = parse_stats((self.args.out / log).read_text(errors="replace"))
        (self.args.out / f"stats-{driver}-{tiles}.json").write_text(json.dumps(rows, indent=2))
        return {driver: spills(rows)}

    def waits(self, driver: str) -> dict[str, waits.Counts | None]:
        """Counters per graph (sim/waits.py): two llama-bench runs per graph, built-in tiles."""
        counts: dict[str, waits.Counts | None] = {}
        for graph, _one, _override in waits.GRAPHS:
            runs = []
            for twice in (False, True):
                log = f"waits-{driver}-{graph}-{'2' if twice else '1'}.log"
                argv = ["run", "--driver", driver, "--", BENCH, "-m", SWEEP_MODEL]
                self.script(*argv, *waits.bench_args(graph, twice), log=log)
                runs.append(waits.parse_counts((self.args.out / log).read_text(errors="replace")))
            counts[graph] = waits.per_graph(*runs)
        return counts

    def vkcheck_build(self) -> str:
        dest = self.host(VKCHECK_DIR)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(
            VKCHECK_SOURCES, dest, ignore=shutil.ignore_patterns("rocky-vkcheck", "*.inc")
        )
        self.script(
            "exec", "--", "make", "-C", VKCHECK_DIR, "CC=cc", "GLSLC=glslc", log="vkcheck-build.log"
        )
        return "built"

    def vkcheck(self, driver: str) -> dict[str, object]:
        """One run on `driver`: its exit code and the parsed document (or why it is not one)."""
        from rocky_selftest.driver import BadDocument, parse_document

        log = f"vkcheck-{driver}"
        stdout = f"/work/prove/{log}.stdout"
        self.host(stdout).parent.mkdir(parents=True, exist_ok=True)
        run = f"exec {VKCHECK_DIR}/rocky-vkcheck --timeout-s 60 > {stdout}"
        try:
            self.script("run", "--driver", driver, "--", "sh", "-c", run, log=f"{log}.stderr")
            code = 0
        except UserError as err:
            found = re.search(r"exit (\d+)", str(err))
            code = int(found.group(1)) if found else -1
        text = self.host(stdout).read_text(errors="replace")
        shutil.copyfile(self.host(stdout), self.args.out / f"{log}.stdout")
        try:
            doc: dict[str, object] = {"exit": code, "document": parse_document(text, code)}
        except BadDocument as err:
            doc = {"exit": code, "unreadable": str(err)[:300]}
        err_text = (self.args.out / f"{log}.stderr").read_text(errors="replace")
        peaks = [float(m) for m in _PEAK.findall(err_text)]
        doc["peak_privva_mib"] = max(peaks) if peaks else None
        counts = waits.parse_counts(err_text)
        doc["csf_counts"] = asdict(counts) if counts else None
        (self.args.out / f"{log}.json").write_text(json.dumps(doc, indent=2) + "\n")
        return doc

    def run(self) -> list[Claim]:
        start = time.monotonic()
        a = self.args
        a.out.mkdir(parents=True, exist_ok=True)
        r = self.runner
        r.stage("root", lambda: self.script("root", log="root.log"))
        # Two lanes side by side, one core each: Mesa, and llama.cpp + models.
        half = max(1, a.jobs // 2)
        aids = [INSTRUMENTATION, WAIT_COUNT, SHIM_32G]
        drivers = {"stock": [], "patched": list(a.mesa_patches)}
        if a.previous_mesa_patches:
            drivers["previous"] = list(a.previous_mesa_patches)
        r.lanes(
            [(f"mesa-{d}", self.mesa(d, [*p, *aids], half)) for d, p in drivers.items()],
            [
                ("llama-src", self.llama_src),
                ("llama-build", lambda: self.llama_build(half)),
                ("models", self.models),
            ],
        )
        for driver in ("stock", "patched"):
            r.stage(f"sweep-{driver}", lambda d=driver: self.sweep(d))
        spills_stock: dict[str, int | None] = {}
        spills_mali: dict[str, int | None] = {}
        for driver in ("stock", "patched"):
            for tiles, into in (("stock", spills_stock), ("mali", spills_mali)):

                def one(d: str = driver, t: str = tiles, into: dict = into) -> str:
                    into.update(self.stats(d, t))
                    return f"{STATS_PIPELINE} spills {into[d]}"

                r.stage(f"stats-{driver}-{tiles}-tiles", one)
        per_driver: dict[str, dict[str, waits.Counts | None]] = {}
        for driver in drivers:

            def count(d: str = driver) -> str:
                per_driver[d] = self.waits(d)
                return ", ".join(
                    f"{g}: {c.waits_all_iters if c else '?'}" for g, c in per_driver[d].items()
                )

            r.stage(f"waits-{driver}", count)
        r.stage("vkcheck-build", self.vkcheck_build)
        vkcheck: dict[str, dict[str, object]] = {}
        for driver in drivers:

            def check(d: str = driver) -> str:
                vkcheck[d] = self.vkcheck(d)
                return f"exit {vkcheck[d]['exit']}"

            r.stage(f"vkcheck-{driver}", check)
        stock = read_sweep(self.host("/work/prove/sweep-stock"), a.ubs)
        patched = read_sweep(self.host("/work/prove/sweep-patched"), a.ubs)
        claims = check_claims(stock, patched, spills_stock, spills_mali)
        claims += check_wait_claims(per_driver)
        report = {
            "stages": [asdict(s) for s in r.stages],
            "stock": [asdict(x) for x in stock],
            "patched": [asdict(x) for x in patched],
            "spills_stock_tiles": spills_stock,
            "spills_mali_tiles": spills_mali,
            "vkcheck": vkcheck,
            "waits_per_graph": {
                d: {g: asdict(c) if c else None for g, c in graphs.items()}
                for d, graphs in per_driver.items()
            },
            "claims": [asdict(c) for c in claims],
        }
        (a.out / "prove.json").write_text(json.dumps(report, indent=2) + "\n")
        wall = time.monotonic() - start
        text = "\n".join(
            [
                "Stages\n",
                stages_table(r.stages, wall),
                "Sweep (stock tiles, -p 512 -n 0 -ngl 99)\n",
                ub_table(stock, patched),
                "WAIT instructions per graph (sweep model, built-in tiles)\n",
                waits.waits_table(per_driver),
                "Claims\n",
                claims_table(claims),
            ]
        )
        (a.out / "prove.md").write_text(text)
        print(text, end="")
        return claims
