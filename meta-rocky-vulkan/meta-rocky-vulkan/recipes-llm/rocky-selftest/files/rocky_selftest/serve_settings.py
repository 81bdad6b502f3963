"""The server's settings, each from the board's own measurements, with the reason for each.

Inputs: the self-test's result (GPU checks, the ub sweep, the placement runs), the tuner's tile
choice, the board's RAM and the model's own shape. Every input is treated as hostile: a missing
or malformed one gives the safe value and says so; nothing here raises on bad data.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import paths
from .cluster import ClusterError, reachable
from .cluster import parse as parse_cluster
from .gguf import GgufError, model_shape
from .outcome import peek_result
from .placement import ON_GPU, SAFE_MODE, choose, mode_flags, request_seconds
from .results import write_atomic
from .settings import Settings
from .speculation import choose as choose_speculation
from .speculation import mode_flags as speculation_flags
from .tune_files import TuneFileError, read_choice
from .tune_spec import ENV_VAR

SCHEMA = "rocky-llm-settings"
SCHEMA_VERSION = 1
# The checks that prove the GPU computes right; any other than PASS: serve on the CPU.
GPU_CHECKS = ("gpu_driver", "vulkan_device", "sweep", "output_match")
DEFAULT_UBATCH = 512  # llama.cpp's own default
# Kept free beside the model and the KV cache: the OS, the server and its compute buffers.
RESERVE_BYTES = 1536 << 20
MIN_CONTEXT = 512
HTTP_TIMEOUT_S = 30
HTTP_THREADS = 16


def gpu_ok(doc: Any) -> tuple[bool, str]:
    """Did every GPU check of the self-test pass? (answer, why)"""
    if not isinstance(doc, dict):
        return False, "no self-test result"
    checks = doc.get("checks")
    status = {}
    if isinstance(checks, list):
        for c in checks:
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                status[c["name"]] = c.get("status")
    bad = [name for name in GPU_CHECKS if status.get(name) != "PASS"]
    if bad:
        return False, f"self-test GPU checks not passed: {', '.join(bad)}"
    return True, f"self-test GPU checks passed: {', '.join(GPU_CHECKS)}"


def best_ubatch(doc: Any) -> tuple[int, str]:
    """The micro-batch with the best GPU prefill among the sweep's crash-free runs."""
    runs = doc.get("sweep") if isinstance(doc, dict) else None
    best: tuple[float, int] | None = None
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, dict) or run.get("mode") != "tuned" or run.get("status") != "PASS":
            continue
        ub, tps = run.get("ubatch"), run.get("avg_ts")
        if isinstance(ub, bool) or not isinstance(ub, int) or not 1 <= ub <= 8192:
            continue
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not 0 < tps < 1e9:
            continue
        if best is None or tps > best[0]:
            best = (float(tps), ub)
    if best is None:
        return DEFAULT_UBATCH, f"no crash-free GPU sweep run: llama.cpp's default {DEFAULT_UBATCH}"
    return best[1], f"best prefill of the crash-free sweep runs: {best[0]:.2f} t/s at ub {best[1]}"


def mem_total_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh.read(16384).splitlines():
                if line.startswith("MemTotal:"):
                    parts = line.split()
                    if len(parts) == 3 and parts[1].isdigit() and parts[2] == "kB":
                        return int(parts[1]) * 1024
    except (OSError, UnicodeDecodeError):
        return None
    return None


def memory_plan(s: Settings, mem_total: int | None) -> tuple[int, int, str]:
    """(context per slot, slots, why): the config's bounds, lowered until the KV cache fits."""
    return memory_fit(s, mem_total)[:3]


def memory_fit(s: Settings, mem_total: int | None) -> tuple[int, int, str, bool]:
    """memory_plan, and whether the model with that KV cache fits this board's RAM (False when
    the RAM or the model's shape is unknown)."""
    ctx, slots = s.serve_context_tokens, s.serve_parallel
    try:
        shape = model_shape(s.served_model)
        model_bytes = os.stat(s.served_model).st_size
    except (OSError, GgufError) as err:
        return MIN_CONTEXT, 1, f"model shape unreadable ({err}): the smallest plan", False
    notes = []
    if ctx > shape.context_length:
        ctx = shape.context_length
        notes.append(f"the model was trained for {shape.context_length} tokens")
    if mem_total is None:
        return min(ctx, 4096), 1, "RAM size unknown: one slot, at most 4096 tokens", False
    budget = mem_total - model_bytes - RESERVE_BYTES
    while slots * ctx * shape.kv_bytes_per_token > budget:
        if slots > 1:
            slots -= 1
        elif ctx > MIN_CONTEXT:
            ctx = max(MIN_CONTEXT, ctx // 2)
        else:
            break
    kv = slots * ctx * shape.kv_bytes_per_token
    gib = 1 << 30
    fits = "fits" if kv <= budget else "does NOT fit; the smallest plan"
    why = (
        f"{mem_total / gib:.1f} GiB RAM - model {model_bytes / gib:.1f} GiB - "
        f"{RESERVE_BYTES / gib:.1f} GiB reserve; KV cache {kv / gib:.2f} GiB "
        f"({shape.kv_bytes_per_token} B/token) {fits}"
    )
    if (ctx, slots) != (s.serve_context_tokens, s.serve_parallel):
        notes.append(f"lowered from {s.serve_context_tokens} x {s.serve_parallel}")
    return ctx, slots, why + ("; " + "; ".join(notes) if notes else ""), kv <= budget


def alone_faster(s: Settings, doc: Any) -> str | None:
    """Why this board alone serves the typical request faster than with its workers, as the
    self-test's cluster step measured both (rocky-llm cluster bench measures the same), else
    None (not measured, a mode failed, or the cluster was faster)."""
    section = doc.get("cluster") if isinstance(doc, dict) else None
    modes = section.get("modes") if isinstance(section, dict) else None
    if not isinstance(modes, dict):
        return None
    prompt, generated = s.serve_request_prompt_tokens, s.serve_request_generated_tokens
    times = {}
    for mode in ("alone", "cluster"):
        entry = modes.get(mode)
        if not isinstance(entry, dict) or entry.get("status") != "PASS":
            return None
        times[mode] = request_seconds(entry.get("pp_tps"), entry.get("tg_tps"), prompt, generated)
        if times[mode] is None:
            return None
    if times["alone"] >= times["cluster"]:
        return None
    return (
        f"measured alone {times['alone']:.1f} s, with the workers {times['cluster']:.1f} s for "
        f"a {prompt}+{generated}-token request, and the model fits here"
    )


_ON_DISK: Any = object()


def cluster_setting(s: Settings, doc: Any = None, fits: bool = False) -> dict[str, Any]:
    """The workers' rpc-servers the head's llama-server uses (--rpc), with the reason: those
    answering now, unless the model `fits` this board and the self-test (`doc`) measured it
    faster alone (every split layer costs a network round trip per token). llama.cpp splits
    the layers over them and the GPU by each device's free memory, and leaves out a worker it
    cannot reach when it loads the model (it serves from what fits locally)."""
    try:
        c = parse_cluster(s.cluster)
    except ClusterError as err:  # load_settings refuses it; never serve half a cluster
        return {"value": [], "reason": f"cluster ignored: {err}"}
    me = s.board_name
    if c is None or c.role(me) != "head":
        role = "no cluster" if c is None else f"{me} is not the cluster's head"
        return {"value": [], "reason": f"{role}: this board alone"}
    up, down = reachable(c.rpc_endpoints())
    why = f"{len(up)} of {len(c.workers)} workers answer over {c.interface}"
    if down:
        why += f" ({'; '.join(down)})"
    faster = alone_faster(s, doc) if up and fits else None
    if faster:
        return {"value": [], "reason": f"{why}; {faster}: this board alone"}
    return {"value": up, "reason": why + ("" if up else ": this board alone")}


def derive(
    s: Settings,
    meminfo: str = "/proc/meminfo",
    doc: Any = _ON_DISK,
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every setting as {value, reason}, plus warnings for the journal and the login message.
    `doc`: the self-test's result (default: the one on disk; the self-test's serving step
    passes the run's own document so far). `cluster`: the cluster setting (default: found
    now)."""
    if doc is _ON_DISK:
        doc = peek_result(s.results_dir)
    ok, gpu_why = gpu_ok(doc)
    placement = doc.get("placement") if isinstance(doc, dict) else None
    modes = placement.get("modes") if isinstance(placement, dict) else None
    mode, mode_why = choose(
        modes, s.serve_request_prompt_tokens, s.serve_request_generated_tokens, gpu_ok=ok
    )
    ub, ub_why = best_ubatch(doc) if mode != SAFE_MODE else (DEFAULT_UBATCH, "CPU: the default")
    try:
        tiles = read_choice(s.results_dir)
        tiles_why = "the tuner's choice" if tiles else "no tuned choice: the built-in Mali tiles"
    except TuneFileError as err:
        tiles, tiles_why = None, f"tuned tiles ignored ({err}): the built-in Mali tiles"
    ctx, slots, mem_why, fits = memory_fit(s, mem_total_bytes(meminfo))
    section = doc.get("speculative") if isinstance(doc, dict) else None
    spec, spec_why = choose_speculation(section, s.served_model)
    warnings = []
    if mode == SAFE_MODE and not ok:
        warnings.append(f"serving on the CPU, not the GPU: {gpu_why}")
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "settings": {
            "placement": {"value": mode, "reason": f"{mode_why}; {gpu_why}"},
            "ubatch": {"value": ub, "reason": ub_why},
            "tiles": {"value": tiles, "reason": tiles_why},
            "context_per_slot": {"value": ctx, "reason": mem_why},
            "parallel": {"value": slots, "reason": mem_why},
            "listen": {"value": s.serve_listen, "reason": "serve.listen in rocky-vulkan.yaml"},
            "model": {"value": s.served_model, "reason": f"serve.model: {s.serve_model_name}"},
            "speculative": {"value": spec, "reason": spec_why},
            "cluster": cluster if cluster is not None else cluster_setting(s, doc, fits),
        },
        "warnings": warnings,
    }


def value(plan: dict[str, Any], name: str) -> Any:
    return plan["settings"][name]["value"]


def speculative(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The plan's speculative mode; None in a plan made before there was one."""
    item = plan["settings"].get("speculative")
    return item["value"] if item else None


def rpc_workers(plan: dict[str, Any]) -> list[str]:
    """The plan's workers (host:port); none in a plan made before there were clusters."""
    item = plan["settings"].get("cluster")
    return list(item["value"]) if item else []


def device_flags(plan: dict[str, Any], mode: str, gpu_device: str) -> list[str]:
    """On the GPU: -dev names it, so a missing GPU fails loudly, never silently the CPU. A
    cluster's head names no device: llama.cpp then uses the GPU and each worker that answers
    when the model loads (RPC0, RPC1, ... in the order that answered), so a worker lost since
    the plan was made leaves the model on this board, never a server that cannot start."""
    if mode not in ON_GPU:
        return []
    # experts-cpu keeps the experts in this board's RAM: no worker would hold them.
    workers = rpc_workers(plan) if mode == "gpu" else []
    return ["--rpc", ",".join(workers)] if workers else ["-dev", gpu_device]


def server_command(
    s: Settings, plan: dict[str, Any], credentials: str
) -> tuple[list[str], dict[str, str]]:
    """llama-server's argv and extra environment for the plan. `credentials` holds the API key
    (and, for lan, the TLS key and certificate): systemd's $CREDENTIALS_DIRECTORY."""
    mode, ub = value(plan, "placement"), value(plan, "ubatch")
    ctx, slots = value(plan, "context_per_slot"), value(plan, "parallel")
    lan = s.serve_listen == "lan"
    argv = [s.llama_server or s.tool("llama-server"), "--model", s.served_model]
    argv += ["--alias", s.serve_model_name, "--host", "0.0.0.0" if lan else "127.0.0.1"]
    argv += ["--port", str(s.serve_port), "--ctx-size", str(ctx * slots)]
    argv += ["--parallel", str(slots), "--ubatch-size", str(ub), "--batch-size", str(max(ub, 2048))]
    argv += mode_flags(mode, "server") + device_flags(plan, mode, s.gpu_device)
    argv += speculation_flags(speculative(plan), mode, s.gpu_device)
    argv += ["--api-key-file", os.path.join(credentials, paths.API_KEY_NAME)]
    if lan:
        argv += ["--ssl-key-file", os.path.join(credentials, paths.TLS_KEY_NAME)]
        argv += ["--ssl-cert-file", os.path.join(credentials, paths.TLS_CERT_NAME)]
    # /metrics for monitoring; /slots shows other users' prompts: off. Prompt cache kept small:
    # its 8 GiB default is more than a 4 GB board has. An idle kept-alive HTTPS connection holds
    # an HTTP thread for the whole read timeout (600 s by default; tests saw the server stall on
    # them): 30 s and more threads bound that (docs/verification/serving.md).
    argv += ["--metrics", "--no-slots", "--cache-ram", "256"]
    argv += ["--timeout", str(HTTP_TIMEOUT_S), "--threads-http", str(HTTP_THREADS)]
    # A crash (a lost cluster worker aborts the model's process) exits at once: ggml's
    # backtrace would first attach gdb to it.
    env = {"GGML_NO_BACKTRACE": "1"}
    if value(plan, "tiles"):
        env[ENV_VAR] = value(plan, "tiles")
    return argv, env


def write_plan(path: str, plan: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(plan, indent=2) + "\n").encode())
