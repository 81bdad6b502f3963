"""`rocky-selftest tune`: the board picks its own matmul tiles.

1. sweep: pp512 of every shipped candidate (tile_candidates.json, pruned on the simulated G610),
   one short llama-bench run each (-p 512 -n 0 -r 1 -ub 512 -dev Vulkan0);
2. repeat: the top `tune_top` get `tune_repeats` more runs each, ranked by their median;
3. validate: the best one must pass the KLD check against the CPU (kld.py) with its spec; one
   that fails is dropped and the next is validated;
4. write the winner to tuned-tiles.env (atomically), or remove that file when the built-in tiles
   won or nothing validated: users of llama.cpp then get the built-in tiles.

Bounded by `tune_budget_s` of llama-bench time (checked before every run, across reboots);
resumable: the progress file is rewritten after every run and a rerun skips what is done. A
candidate that was in flight when the board went down twice (a hang, a reset) is given up.
Every candidate's t/s goes into result.json's `tune` section.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import kld
from .bench import Deadline, bench_command, device_problem, median, parse_bench_json
from .outcome import now
from .results import add_section
from .runner import run_tool
from .settings import Settings
from .terminal import say
from .tune_files import (
    PROGRESS_SCHEMA,
    TuneFileError,
    candidates_digest,
    load_candidates,
    progress_path,
    read_choice,
    read_progress,
    remove_choice,
    write_choice,
    write_progress,
)
from .tune_spec import ENV_VAR, MALI_TILES_MARKER, rejection, spec_applied

TUNE_UB = 512
MAX_IN_FLIGHT = 2  # interrupted this often mid-run: the candidate is given up
DONE, SWEEP, REPEAT, VALIDATE = "done", "sweep", "repeat", "validate"

Log = Callable[[str], None]


def tune_bench(s: Settings, spec: str, timeout_s: float) -> dict[str, Any]:
    """One pp run with `spec`: {'tps', 'elapsed_s'} or {'reason', 'elapsed_s'}."""
    cmd, env = bench_command(s, "tuned", TUNE_UB)
    env[ENV_VAR] = spec
    res = run_tool(cmd, env, timeout_s)
    rec: dict[str, Any] = {"elapsed_s": res.elapsed_s}
    rule = rejection(res.stderr)
    reason = f"rejected by ggml-vulkan: {rule}" if rule else res.failure()
    entry = None
    if reason is None:
        entry, reason = parse_bench_json(res.stdout)
    if reason is None and entry is not None:
        reason = device_problem(s, "tuned", entry)
    if reason is None and not spec_applied(res.stderr, spec):
        reason = f"no '{MALI_TILES_MARKER} ... <spec>' line: the spec did not reach ggml-vulkan"
    if reason:
        rec.update(reason=reason, rejected=bool(rule), stderr_tail=res.stderr_tail()[-800:])
    else:
        rec["tps"] = entry["avg_ts"]
    return rec


def validate_spec(s: Settings, spec: str) -> dict[str, Any]:
    """The KLD check with this spec (the product's binaries, GPU vs CPU): {'ok', 'evidence'}."""
    s = replace(s, env={**s.env, ENV_VAR: spec}, stock_env={})
    data = kld.measure(s, Deadline(2 * s.run_timeout_s + 60))
    gpu = data["gpu"]
    if "reason" in gpu or "reason" in data["cpu"]:
        why = gpu.get("reason") or data["cpu"].get("reason")
        return {"ok": False, "evidence": f"KLD check did not run: {why}"}
    ok, text = kld.verdict(s, gpu)
    return {"ok": ok, "evidence": text}


class Tuner:
    """One tune, resumable from its progress file."""

    def __init__(self, s: Settings, log: Log = say, bench=tune_bench, clock=time.monotonic):
        self.s, self.log, self.bench, self.clock = s, log, bench, clock
        self.kept, self.builtin, self.pruning = load_candidates(s.tune_candidates)
        self.by_name = {c["name"]: c for c in self.kept}
        digest = candidates_digest(self.kept)
        self.p = read_progress(s.results_dir, digest) or {
            "schema": PROGRESS_SCHEMA,
            "candidates_sha256": digest,
            "phase": SWEEP,
            "elapsed_s": 0.0,
            "longest_run_s": 0.0,
            "started_at": now(),
            "results": {},
            "validation": {},
        }

    # -- bookkeeping ---------------------------------------------------------------------------
    def save(self) -> None:
        write_progress(self.s.results_dir, self.p)

    def left(self) -> float:
        return self.s.tune_budget_s - self.p["elapsed_s"]

    def result(self, name: str) -> dict[str, Any]:
        return self.p["results"].setdefault(name, {"tps": [], "in_flight": 0})

    def ok(self, name: str) -> bool:
        r = self.p["results"].get(name, {})
        return bool(r.get("tps")) and "reason" not in r

    def median(self, name: str) -> float:
        return median(self.p["results"][name]["tps"])

    def ranking(self) -> list[str]:
        names = [n for n in self.by_name if self.ok(n)]
        return sorted(names, key=lambda n: (-self.median(n), n))

    # -- runs ----------------------------------------------------------------------------------
    def run_once(self, name: str) -> bool:
        """One measured run, or False when the budget cannot take another run."""
        left = self.left()
        # A run may take as long as the longest so far: do not start one that cannot finish.
        if left <= max(self.p["longest_run_s"], 1.0):
            return False
        r = self.result(name)
        if r["in_flight"] >= MAX_IN_FLIGHT:
            r["reason"] = f"interrupted {r['in_flight']} times during its run (hang or reset?)"
            self.save()
            return True
        r["in_flight"] += 1
        self.save()  # a reset during this run is counted against this candidate
        rec = self.bench(self.s, self.by_name[name]["spec"], min(self.s.run_timeout_s, left))
        r["in_flight"] = 0
        self.p["elapsed_s"] = round(self.p["elapsed_s"] + rec["elapsed_s"], 3)
        self.p["longest_run_s"] = max(self.p["longest_run_s"], rec["elapsed_s"])
        if "tps" in rec:
            r["tps"].append(rec["tps"])
            self.log(f"  {name}: {rec['tps']:.2f} t/s")
        else:
            r.update({k: rec[k] for k in ("reason", "rejected", "stderr_tail") if k in rec})
            self.log(f"  {name}: FAIL {rec['reason']}")
        self.save()
        return True

    def sweep(self) -> bool:
        for name in self.by_name:
            r = self.p["results"].get(name, {})
            if r.get("tps") or "reason" in r:
                continue  # done before a reboot or a kill
            if not self.run_once(name):
                return False
        return True

    def repeat(self) -> bool:
        for name in self.ranking()[: self.s.tune_top]:
            while self.ok(name) and len(self.p["results"][name]["tps"]) < 1 + self.s.tune_repeats:
                if not self.run_once(name):
                    return False
        return True

    # -- choice --------------------------------------------------------------------------------
    def choose(self) -> str | None:
        """Validate down the ranking (top `tune_top`); the first that passes wins."""
        for name in self.ranking()[: self.s.tune_top]:
            v = self.p["validation"].get(name)
            if v is None:
                if self.by_name[name].get("builtin"):
                    v = {"ok": True, "evidence": "the built-in tiles (validated by the self-test)"}
                else:
                    self.log(f"---- validating {name} against the CPU (KLD)")
                    v = validate_spec(self.s, self.by_name[name]["spec"])
                self.p["validation"][name] = v
                self.save()
                self.log(f"  {name}: {'PASS' if v['ok'] else 'FAIL'} {v['evidence']}")
            if v["ok"]:
                return name
        return None

    def finish(self, winner: str | None, budget_hit: bool) -> None:
        rd = self.s.results_dir
        builtin = next(n for n, c in self.by_name.items() if c.get("builtin"))
        if winner and not self.by_name[winner].get("builtin"):
            base = self.median(builtin) if self.ok(builtin) else None
            note = f"rocky-selftest tune {now()}: {winner} {self.median(winner):.2f} t/s" + (
                f" (built-in {base:.2f} t/s)" if base else ""
            )
            write_choice(rd, self.by_name[winner]["spec"], note)
            self.log(f"tuned tiles: {winner} -> {rd}/tuned-tiles.env")
        else:
            remove_choice(rd)
            self.log("tuned tiles: the built-in tiles" + ("" if winner else " (none validated)"))
        self.p.update(phase=DONE, winner=winner, budget_exhausted=budget_hit, finished_at=now())
        self.save()

    def run(self) -> dict[str, Any]:
        self.log(
            f"---- tune: {len(self.kept)} candidates ({self.pruning}), budget "
            f"{self.s.tune_budget_s} s, {self.p['elapsed_s']:.0f} s used"
        )
        if self.p["phase"] == DONE:
            self.log("already done (remove the progress file or pass --restart to tune again)")
            return self.summary()
        complete = self.sweep() and self.repeat()
        if not complete:
            self.log(f"budget reached after {self.p['elapsed_s']:.0f} s: ranking what ran")
        self.p["phase"] = VALIDATE
        self.save()
        self.finish(self.choose(), not complete)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """result.json's `tune` section: every candidate's t/s, the winner and the budget."""
        rows = []
        for name, cand in self.by_name.items():
            r = self.p["results"].get(name, {})
            rows.append(
                {
                    "name": name,
                    "spec": cand["spec"],
                    "builtin": bool(cand.get("builtin")),
                    "tps": r.get("tps", []),
                    "median_tps": self.median(name) if self.ok(name) else None,
                    "status": "ok" if self.ok(name) else ("failed" if "reason" in r else "not run"),
                    "reason": r.get("reason"),
                    "validation": self.p["validation"].get(name),
                }
            )
        return {
            "phase": self.p["phase"],
            "winner": self.p.get("winner"),
            "winner_spec": self.by_name[self.p["winner"]]["spec"] if self.p.get("winner") else None,
            "budget_s": self.s.tune_budget_s,
            "elapsed_s": self.p["elapsed_s"],
            "budget_exhausted": self.p.get("budget_exhausted", False),
            "pruning": self.pruning,
            "started_at": self.p.get("started_at"),
            "finished_at": self.p.get("finished_at"),
            "candidates": rows,
        }


def record_in_result(results_dir: str, section: dict[str, Any], log: Log = say) -> bool:
    """Put the tune section into result.json (atomically); False when there is no result yet."""
    return add_section(results_dir, "tune", section, log, "see tune-progress") is True


def verify_choice(s: Settings, log: Log = say, bench=tune_bench) -> dict[str, Any]:
    """Check the tuned spec in tuned-tiles.env still holds (after a llama.cpp or Mesa update): it
    must parse, obey the rules, be accepted by ggml-vulkan and pass the KLD check. Anything else
    removes the file, so llama.cpp's users fall back to the built-in tiles."""
    _, builtin, _ = load_candidates(s.tune_candidates)
    try:
        spec = read_choice(s.results_dir, builtin)
    except TuneFileError as err:
        remove_choice(s.results_dir)
        log(f"tuned tiles: {err}; removed, the built-in tiles are used")
        return {"ok": False, "evidence": str(err), "fallback": True}
    if spec is None:
        log("tuned tiles: none (the built-in tiles are used)")
        return {"ok": True, "evidence": "no tuned spec: built-in tiles", "fallback": False}
    rec = bench(s, spec, s.run_timeout_s)
    if "reason" in rec:
        verdict = {"ok": False, "evidence": rec["reason"]}
    else:
        verdict = validate_spec(s, spec)
    if not verdict["ok"]:
        remove_choice(s.results_dir)
        log(f"tuned tiles: {verdict['evidence']}; removed, the built-in tiles are used")
    else:
        log(f"tuned tiles: {spec} still valid ({verdict['evidence']})")
    return {**verdict, "spec": spec, "fallback": not verdict["ok"]}


def restart(s: Settings) -> None:
    """Forget the progress (a new tune from scratch); the current choice stays until replaced."""
    try:
        os.unlink(progress_path(s.results_dir))
    except FileNotFoundError:
        pass
