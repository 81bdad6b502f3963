"""Each device's own decode speed in a cluster, for a split of whole layers by speed.

llama.cpp's default gives each device layers by its free memory; boards of other RAM speeds
(LPDDR4X or LPDDR5, 2 or 4 channels) decode at other rates with the same G610. Each device
(every worker's rpc-server, then this board's GPU: llama.cpp's own order with `-rpc` and no
`-dev`) decodes the reference model alone, which fits any board, over the same link the
server uses; its share of the layers (`-ts`) is then its share of the summed rates. Whether
that split is faster than the others is measured like them (cluster_bench's `speed` mode).
"""

from __future__ import annotations

import re
from typing import Any

from .bench import Deadline, parse_bench_json, start_record
from .settings import Settings

SPEED_TOKENS = 32
# `-ts` as llama-bench and llama-server read it: one share per device, "/" between them.
SPLIT_RE = re.compile(r"0\.\d{3}(/0\.\d{3}){1,8}")
NO_GPU = "none"  # the tests' stand-in for a head without a GPU: its CPU takes no layers


def devices(s: Settings, workers: list[str]) -> list[str]:
    """The devices llama.cpp splits over, in its order: RPC servers first, then the GPU."""
    rpc = [f"RPC{i}" for i in range(len(workers))]
    return rpc + ([] if s.gpu_device == NO_GPU else [s.gpu_device])


def command(s: Settings, workers: list[str], device: str) -> list[str]:
    # -rpc before -dev: llama-bench looks the device up as it parses -dev.
    return [s.tool("llama-bench"), "-m", s.model_path, "-p", "0", "-n", str(SPEED_TOKENS),
            "-ngl", "99", "-rpc", ",".join(workers), "-dev", device, "-r", "1",
            "-o", "json"]  # fmt: skip


def measure(s: Settings, workers: list[str], env: dict, deadline: Deadline) -> list[dict[str, Any]]:
    """One decode run per device: {device, cmd, status, tg_tps | reason}."""
    runs = []
    for device in devices(s, workers):
        cmd = command(s, workers, device)
        rec: dict[str, Any] = {"device": device, "cmd": cmd}
        res = start_record(s, "gpu", cmd, env, deadline, rec)
        if res is not None:
            reason = res.failure()
            entry = None
            if reason is None:
                entry, reason = parse_bench_json(res.stdout)
            if entry is not None and entry["devices"] != device:
                reason = f"llama-bench ran on {entry['devices']!r}, not {device}"
            if reason:
                rec.update(status="FAIL", reason=reason, stderr_tail=res.stderr_tail())
            else:
                rec.update(status="PASS", tg_tps=entry["avg_ts"])
        runs.append(rec)
    return runs


def split(runs: list[dict[str, Any]]) -> tuple[str | None, str]:
    """The `-ts` shares from every device's rate, or None and why not."""
    bad = [r for r in runs if r.get("status") != "PASS"]
    if bad or len(runs) < 2:
        why = f"{bad[0]['device']}: {bad[0]['reason']}" if bad else "fewer than 2 devices"
        return None, f"no split by speed ({why})"
    total = sum(r["tg_tps"] for r in runs)
    shares = [min(0.999, max(0.001, round(r["tg_tps"] / total, 3))) for r in runs]
    text = "/".join(f"{x:.3f}" for x in shares)
    rates = ", ".join(f"{r['device']} {r['tg_tps']:.2f} t/s" for r in runs)
    return text, f"decode alone on the reference model: {rates}"
