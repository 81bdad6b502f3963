"""Prune tile candidates with no hardware: compile each on the simulated G610 and keep the ones
whose integer-dot large pipelines do not spill.

Each candidate runs llama-bench once in the sim root (qemu-user + panvk + drm-shim) with
GGML_VK_MALI_WARPTILE=<spec> and GGML_VK_PIPELINE_STATS=<filter>. ggml-vulkan prints panvk's
statistics (Spills, Fills, Registers used, ...) as it creates each pipeline; the GPU work itself
is not executed, so the run proves only that the spec is accepted and compiles, and what the
compiler made of it. panvk reports no shared-memory statistic: shared memory is the shader's
formula (tune_spec.shared_bytes). The result, committed as
tools/rocky_vulkan/tiles/tile_candidates.json, is shipped in the image for `rocky-selftest tune`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocky_selftest.results import write_atomic
from rocky_selftest.tune_spec import (
    IGNORED_MARKER,
    MALI_TILES_MARKER,
    rejection,
    spec_applied,
)

from rocky_vulkan.sim.stats import parse_stats
from rocky_vulkan.tiles.space import Candidate

SCHEMA = "rocky-tile-candidates"
SCHEMA_VERSION = 1
# The large integer-dot pipelines: matmul_<type>_q8_1_l (f16acc variants end in _f16acc_l).
STATS_FILTER = "q8_1"
KEEP_STATUS = "kept"

# A run: spec -> (exit status, stderr). The real one runs llama-bench in the sim root.
Runner = Callable[[str], tuple[int, str]]


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def large_pipelines(stderr: str) -> dict[str, dict[str, int | None]]:
    """{pipeline: {registers, spills, fills}} of the large integer-dot pipelines in the log."""
    out: dict[str, dict[str, int | None]] = {}
    for row in parse_stats(stderr):
        name = row["pipeline"]
        if "_q8_1" not in name or not name.endswith("_l"):
            continue
        out[name] = {
            "registers": _int(row.get("Registers used")),
            "spills": _int(row.get("Spills")),
            "fills": _int(row.get("Fills")),
        }
    return out


def judge(cand: Candidate, returncode: int, stderr: str, max_spills: int = 0) -> dict[str, Any]:
    """The sim record of one candidate: what compiled, and whether it is kept."""
    pipes = large_pipelines(stderr)
    rec: dict[str, Any] = {"exit_code": returncode, "pipelines": pipes}
    rule = rejection(stderr)
    spills = [p["spills"] for p in pipes.values()]
    if rule is not None:
        rec.update(status="rejected", reason=f"ggml-vulkan rejected the spec: {rule}")
    elif returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-3:])
        rec.update(status="failed", reason=f"llama-bench exit {returncode}: {tail[-300:]}")
    elif IGNORED_MARKER in stderr:
        rec.update(status="failed", reason="this llama-bench does not know tile specs (old patch)")
    elif not spec_applied(stderr, cand.spec):
        rec.update(
            status="failed", reason=f"no '{MALI_TILES_MARKER} ... {cand.spec}' line in the log"
        )
    elif not pipes or None in spills:
        rec.update(status="failed", reason="no statistics of a large q8_1 pipeline in the log")
    else:
        worst = max(s for s in spills if s is not None)
        rec["max_spills"] = worst
        rec["max_registers"] = max((p["registers"] or 0) for p in pipes.values())
        if worst > max_spills:
            rec.update(status="spills", reason=f"{worst} spill instructions (> {max_spills})")
        else:
            rec["status"] = KEEP_STATUS
    return rec


def prune(
    cands: list[Candidate], run: Runner, max_spills: int = 0, log=print
) -> list[dict[str, Any]]:
    """One sim record per candidate, in order; the built-in stays whatever it scores (it is the
    fallback the tuner compares against)."""
    records = []
    for i, cand in enumerate(cands, 1):
        t0 = time.monotonic()
        code, stderr = run(cand.spec)
        rec = judge(cand, code, stderr, max_spills)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        log(f"[{i}/{len(cands)}] {cand.name}: {rec['status']} {rec.get('reason', '')}".rstrip())
        records.append(rec)
    return records


def document(
    cands: list[Candidate],
    builtin: dict[str, tuple[int, ...]],
    records: list[dict[str, Any]] | None,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """tile_candidates.json: every candidate, with its sim record and whether the tuner runs it
    (`kept`). Without records the list is unpruned and every candidate is kept."""
    entries = []
    for i, cand in enumerate(cands):
        entry = cand.to_json()
        if records is None:
            entry["kept"] = True
        else:
            entry["sim"] = records[i]
            entry["kept"] = cand.builtin or records[i]["status"] == KEEP_STATUS
        entries.append(entry)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "pruning": {"status": "unpruned" if records is None else "pruned", **provenance},
        "builtin": {k: list(v) for k, v in builtin.items()},
        "candidates": entries,
    }


def write_document(doc: dict[str, Any], path: Path) -> None:
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    write_atomic(str(path), text.encode("utf-8"))
