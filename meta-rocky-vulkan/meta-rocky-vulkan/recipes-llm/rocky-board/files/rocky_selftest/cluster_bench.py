"""`rocky-llm cluster bench`: the head's prefill and decode on the served model, alone and with
the workers that answer, measured as the placement step measures (llama-bench `-p P -n 128`,
the server's micro-batch, modes interleaved per repetition, the median of each).

Alone is this board's GPU (`-dev GPU`). The two cluster runs name no device and register the
workers (`-rpc`), as the server does, and differ in how llama.cpp splits the model over this GPU
and theirs: `cluster` gives each device whole layers by its free memory (llama.cpp's default;
one board at a time computes a token), `tensor` splits every weight matrix over all devices
(`-sm tensor`, tensor parallelism, which needs flash attention): each board reads only its share
of the weights per token, at the price of a network exchange per layer; `speed` gives each
device whole layers by its own measured decode rate (`-ts`, cluster_speed.py). Which is fastest
depends on the boards and the link, so all are measured.
"""

from __future__ import annotations

from typing import Any

from . import cluster as cl
from . import cluster_speed
from .bench import Deadline, start_record
from .placement_bench import DECODE_TOKENS, bench_command, parse_pp_tg, summarize
from .serve_settings import DEFAULT_UBATCH
from .settings import Settings
from .terminal import say

MODES = ("alone", "cluster", "tensor", "speed")
# llama.cpp's split mode per bench mode, as llama-bench's JSON must report it.
SPLIT_MODES = {"alone": "layer", "cluster": "layer", "tensor": "tensor", "speed": "layer"}
# The cluster works when these pass; the other splits are candidates the server takes only
# where they ran and were faster (b9101 lacks tensor parallelism for some architectures, e.g.
# deepseek2; a split by speed needs every device's own rate).
REQUIRED = ("alone", "cluster")


def works(doc: dict[str, Any]) -> bool:
    return all(doc["modes"][m]["status"] == "PASS" for m in REQUIRED)


def commands(
    s: Settings, ubatch: int, workers: list[str], shares: str | None = None
) -> dict[str, tuple[list[str], dict]]:
    """Each mode's llama-bench command; `speed` only with the devices' `shares` (-ts)."""
    alone, env = bench_command(s, "gpu", ubatch)
    at = alone.index("-dev")
    spread = [*alone[:at], *alone[at + 2 :], "-rpc", ",".join(workers)]  # no -dev: all devices
    tensor = [*spread, "-sm", "tensor", "-fa", "1"]
    out = {"alone": (alone, env), "cluster": (spread, env), "tensor": (tensor, env)}
    if shares:
        out["speed"] = ([*spread, "-ts", shares], env)
    return out


def run_one(s: Settings, mode: str, cmd: list[str], env: dict, ubatch: int,
            deadline: Deadline) -> dict[str, Any]:  # fmt: skip
    rec: dict[str, Any] = {"mode": mode, "ubatch": ubatch, "cmd": cmd}
    res = start_record(s, "gpu", cmd, env, deadline, rec)
    if res is None:
        return rec
    reason = res.failure()
    found = None
    if reason is None:
        found, reason = parse_pp_tg(res.stdout, s.serve_request_prompt_tokens)
    if found is not None:
        pp, tg = found["pp"], found["tg"]
        rec.update(pp_tps=pp["avg_ts"], tg_tps=tg["avg_ts"], devices=pp["devices"],
                   n_gpu_layers=pp["n_gpu_layers"])  # fmt: skip
        if not pp["n_gpu_layers"]:
            reason = "no layers offloaded (n_gpu_layers 0)"
        elif pp["split_mode"] != SPLIT_MODES[mode]:
            reason = f"llama-bench ran split mode {pp['split_mode']!r}, not {SPLIT_MODES[mode]!r}"
    if reason:
        rec.update(status="FAIL", reason=reason, stderr_tail=res.stderr_tail())
    else:
        rec["status"] = "PASS"
    return rec


def bench(s: Settings, c: cl.Cluster, ubatch: int = DEFAULT_UBATCH, log=say) -> dict[str, Any]:
    """Every mode, s.repetitions times each (after each device's own rate, for `speed`);
    ClusterError when no worker answers."""
    up, down = cl.reachable(c.rpc_endpoints())
    if not up:
        raise cl.ClusterError(
            f"no worker's rpc-server answers over {c.interface} ({'; '.join(down)}): pair the "
            "boards (`rocky-vulkan cluster pair`) and check `rocky-llm cluster status`"
        )
    for why in down:
        log(f"  left out: rpc-server {why}")
    deadline = Deadline(s.deadline_s)
    env = bench_command(s, "gpu", ubatch)[1]
    speeds = cluster_speed.measure(s, up, env, deadline)
    shares, shares_why = cluster_speed.split(speeds)
    log(f"  split by speed: {shares or '-'} ({shares_why})")
    cmds = commands(s, ubatch, up, shares)
    runs = []
    for rep in range(s.repetitions):
        for mode in [m for m in MODES if m in cmds]:
            rec = run_one(s, mode, *cmds[mode], ubatch, deadline)
            rec["repeat"] = rep
            runs.append(rec)
            if rec["status"] == "PASS":
                log(f"  {mode:7} pp {rec['pp_tps']:.2f} t/s, tg {rec['tg_tps']:.2f} t/s")
            else:
                log(f"  {mode:7} FAIL {rec['reason']}")
    prompt, generated = s.serve_request_prompt_tokens, s.serve_request_generated_tokens
    modes = {m: summarize(runs, m, prompt, generated) for m in MODES if m in cmds}
    if shares is None:
        modes["speed"] = {"status": "FAIL", "reason": shares_why, "runs": []}
    return {
        "workers": up,
        "left_out": down,
        "device_speeds": speeds,
        "tensor_split": shares,
        "prompt_tokens": prompt,
        "decode_tokens": DECODE_TOKENS,
        "ubatch": ubatch,
        "modes": modes,
    }


def summary(doc: dict[str, Any]) -> str:
    """One line: every mode's rates, or which failed and why."""
    modes = doc["modes"]
    bad = [m for m in REQUIRED if modes[m]["status"] != "PASS"]
    if bad:
        return f"{', '.join(bad)} not measured ({bad[0]}: {modes[bad[0]]['reason']})"
    a = modes["alone"]
    parts = [f"alone pp{doc['prompt_tokens']} {a['pp_tps']:.2f} t/s, tg{doc['decode_tokens']} "
             f"{a['tg_tps']:.2f} t/s"]  # fmt: skip
    names = {"cluster": "layers", "tensor": "tensor", "speed": f"layers {doc['tensor_split']}"}
    for mode, name in names.items():
        c = modes[mode]
        if c["status"] != "PASS":
            parts.append(f"{name} not measured ({c['reason']})")
            continue
        parts.append(
            f"{name} over {', '.join(doc['workers'])}: pp {c['pp_tps']:.2f} t/s "
            f"({c['pp_tps'] / a['pp_tps']:.2f}x), tg {c['tg_tps']:.2f} t/s "
            f"({c['tg_tps'] / a['tg_tps']:.2f}x)"
        )
    return "; ".join(parts)
