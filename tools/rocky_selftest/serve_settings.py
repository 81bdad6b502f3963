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
from .cluster_speed import SPLIT_RE
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
    """The board's RAM: MemTotal from meminfo, else the kernel's sysinfo(2) (glibc's
    sysconf(_SC_PHYS_PAGES)). The server's units mount /proc with ProcSubset=pid, where
    /proc/meminfo does not exist; sysinfo(2) needs no /proc."""
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh.read(16384).splitlines():
                if line.startswith("MemTotal:"):
                    parts = line.split()
                    if len(parts) == 3 and parts[1].isdigit() and parts[2] == "kB":
                        return int(parts[1]) * 1024
    except FileNotFoundError:
        return _sysinfo_ram_bytes()
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _sysinfo_ram_bytes() -> int | None:
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
    return pages * page if pages > 0 and page > 0 else None


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


# The self-test's cluster modes (cluster_bench.MODES) and llama.cpp's --split-mode for each.
CLUSTER_SPLITS = {"cluster": "layer", "tensor": "tensor", "speed": "layer"}
CLUSTER_NAMES = {"alone": "alone", "cluster": "whole layers", "tensor": "tensor parallel",
                 "speed": "layers by speed"}  # fmt: skip
DEFAULT_SPLIT = "llama.cpp's default: whole layers per device by its free memory"


def cluster_times(s: Settings, doc: Any) -> dict[str, float]:
    """The typical request's seconds in each cluster mode the self-test measured and passed
    (rocky-llm cluster bench measures the same); hostile or failed modes are left out."""
    section = doc.get("cluster") if isinstance(doc, dict) else None
    modes = section.get("modes") if isinstance(section, dict) else None
    times: dict[str, float] = {}
    for mode in CLUSTER_NAMES:
        entry = modes.get(mode) if isinstance(modes, dict) else None
        if not isinstance(entry, dict) or entry.get("status") != "PASS":
            continue
        seconds = request_seconds(
            entry.get("pp_tps"), entry.get("tg_tps"),
            s.serve_request_prompt_tokens, s.serve_request_generated_tokens,
        )  # fmt: skip
        if seconds is not None:
            times[mode] = seconds
    return times


def speed_shares(doc: Any, workers: list[str]) -> str | None:
    """The measured split by speed (`-ts`), where it was measured over these very workers: the
    shares are per device, in order."""
    section = doc.get("cluster") if isinstance(doc, dict) else None
    if not isinstance(section, dict) or section.get("workers") != workers:
        return None
    shares = section.get("tensor_split")
    return shares if isinstance(shares, str) and SPLIT_RE.fullmatch(shares) else None


def fastest_cluster_mode(
    s: Settings, doc: Any, fits: bool, workers: list[str]
) -> tuple[str | None, str]:
    """The measured mode with the least typical-request time ("alone" only where the model
    `fits` this board, "speed" only over the `workers` it was measured with), and the
    measurements; None when the self-test compared none with the workers."""
    times = cluster_times(s, doc)
    if not fits:
        times.pop("alone", None)
    if speed_shares(doc, workers) is None:
        times.pop("speed", None)
    if not set(times) & set(CLUSTER_SPLITS):
        return None, "not measured with the workers"
    best = min(times, key=times.__getitem__)  # a tie keeps the earlier: alone, then layers
    request = f"{s.serve_request_prompt_tokens}+{s.serve_request_generated_tokens}-token request"
    measured = ", ".join(f"{CLUSTER_NAMES[m]} {t:.1f} s" for m, t in times.items())
    return best, f"measured for a {request}: {measured}"


_ON_DISK: Any = object()


def cluster_settings(s: Settings, doc: Any = None, fits: bool = False) -> dict[str, Any]:
    """The `cluster` setting (the workers' rpc-servers the head's llama-server uses, --rpc) and
    the `split_mode` setting (--split-mode), with their reasons. The workers answering now are
    used, split as the self-test (`doc`) measured fastest: whole layers per device by its free
    memory (llama.cpp's default, also when nothing was measured) or tensor parallelism; none
    where this board alone was measured faster and the model `fits` here (every device
    boundary costs network round trips per token). llama.cpp leaves out a worker it cannot
    reach when it loads the model (it serves from what fits locally)."""

    def alone(why: str) -> dict[str, Any]:
        return {
            "cluster": {"value": [], "reason": why},
            "split_mode": {"value": "layer", "reason": "no workers: unused"},
            "tensor_split": {"value": None, "reason": "no workers: unused"},
        }

    try:
        c = parse_cluster(s.cluster)
    except ClusterError as err:  # load_settings refuses it; never serve half a cluster
        return alone(f"cluster ignored: {err}")
    me = s.board_name
    if c is None or c.role(me) != "head":
        role = "no cluster" if c is None else f"{me} is not the cluster's head"
        return alone(f"{role}: this board alone")
    up, down = reachable(c.rpc_endpoints())
    why = f"{len(up)} of {len(c.workers)} workers answer over {c.interface}"
    if down:
        why += f" ({'; '.join(down)})"
    if not up:
        return alone(why + ": this board alone")
    best, measured = fastest_cluster_mode(s, doc, fits, up)
    if best == "alone":
        return alone(f"{why}; {measured}, and the model fits here: this board alone")
    split = CLUSTER_SPLITS[best or "cluster"]
    how = {"tensor": "tensor parallelism", "speed": "whole layers, each device's share by its "
           "own decode rate"}.get(best or "", DEFAULT_SPLIT)  # fmt: skip
    shares = speed_shares(doc, up) if best == "speed" else None
    return {
        "cluster": {"value": up, "reason": why},
        "split_mode": {"value": split, "reason": f"{measured}: {how}"},
        "tensor_split": {
            "value": shares,
            "reason": f"{measured}: layers by speed" if shares else "each device's free memory",
        },
    }


def derive(
    s: Settings,
    meminfo: str = "/proc/meminfo",
    doc: Any = _ON_DISK,
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every setting as {value, reason}, plus warnings for the journal and the login message.
    `doc`: the self-test's result (default: the one on disk; the self-test's serving step
    passes the run's own document so far). `cluster`: the cluster setting, split by whole
    layers (default: found now, split as measured)."""
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
    if cluster is None:
        spread = cluster_settings(s, doc, fits)
    else:
        spread = {
            "cluster": cluster,
            "split_mode": {"value": "layer", "reason": DEFAULT_SPLIT},
            "tensor_split": {"value": None, "reason": "each device's free memory"},
        }
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
            **spread,
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


def split_mode(plan: dict[str, Any]) -> str:
    """The plan's --split-mode; whole layers in a plan made before there was a choice."""
    item = plan["settings"].get("split_mode")
    return item["value"] if item else "layer"


def tensor_split(plan: dict[str, Any]) -> str | None:
    """The plan's --tensor-split; none (free memory) in a plan made before there was one."""
    item = plan["settings"].get("tensor_split")
    return item["value"] if item else None


def device_flags(plan: dict[str, Any], mode: str, gpu_device: str) -> list[str]:
    """On the GPU: -dev names it, so a missing GPU fails loudly, never silently the CPU. A
    cluster's head names no device: llama.cpp then uses the GPU and each worker that answers
    when the model loads (RPC0, RPC1, ... in the order that answered), so a worker lost since
    the plan was made leaves the model on this board, never a server that cannot start.
    Tensor parallelism needs flash attention, which llama-server's default (auto) turns on."""
    if mode not in ON_GPU:
        return []
    # experts-cpu keeps the experts in this board's RAM: no worker would hold them.
    workers = rpc_workers(plan) if mode == "gpu" else []
    if not workers:
        return ["-dev", gpu_device]
    how = ["--split-mode", "tensor"] if split_mode(plan) == "tensor" else []
    if tensor_split(plan):
        how += ["--tensor-split", tensor_split(plan)]
    return ["--rpc", ",".join(workers), *how]


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
