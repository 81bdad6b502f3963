"""The `placement` step: prefill and decode on the GPU, the CPU and hybrid, measured with
llama-bench, and the mode the server should use (placement.choose) for a typical request.

One llama-bench run per mode and repetition, `-p P -n 128`: its JSON holds two entries, the
prefill test (n_prompt P, n_gen 0) and the decode test (n_prompt 0, n_gen 128), told apart by
those two fields. The modes are interleaved per repetition (like the ratio step) so drift hits
all alike; each mode's rate is the median of its runs. P is the typical request's prompt
(serve_request_prompt_tokens); the micro-batch is what the server would use in that mode (the
sweep's best for the GPU modes, llama.cpp's default on the CPU).
"""

from __future__ import annotations

from typing import Any

from .bench import Deadline, _count, clean_entry, median, start_record
from .checks import SKIP, Check, failed, passed
from .files import parse_json
from .gguf import GgufError, model_shape
from .placement import EXPERTS_CPU, ON_GPU, choose, mode_flags, modes_for, request_seconds
from .serve_settings import DEFAULT_UBATCH, best_ubatch, gpu_ok
from .settings import Settings
from .terminal import say

NAME = "placement"
DECODE_TOKENS = 128  # tg128, llama.cpp's usual decode measurement


def bench_command(
    s: Settings, mode: str, ubatch: int, n_layer: int = 0
) -> tuple[list[str], dict[str, str | None]]:
    """The llama-bench command line and extra environment for one placement run (`n_layer`:
    the model's, for experts-cpu)."""
    cmd = [s.tool("llama-bench"), "-m", s.served_model]  # the model the server will load
    cmd += ["-p", str(s.serve_request_prompt_tokens), "-n", str(DECODE_TOKENS)]
    cmd += mode_flags(mode, "bench", n_layer)
    if mode in ON_GPU:
        cmd += ["-dev", s.gpu_device]  # a missing GPU exits 1 instead of silently using the CPU
    if mode != "cpu":
        cmd += ["-v"]  # ggml-vulkan's info line says which tiles ran (stderr)
    cmd += ["-ub", str(ubatch), "-r", "1", "-o", "json"]
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}
    env.update({key: None for key in s.stock_env})  # the product's (tuned) tiles
    return cmd, env


def parse_pp_tg(stdout: str, prompt: int) -> tuple[dict[str, Any] | None, str | None]:
    """{'pp': entry, 'tg': entry} from llama-bench's JSON, each type-checked by
    bench.clean_entry, or why not. Hostile data: anything unexpected is a reason, never an
    exception."""
    try:
        data = parse_json(stdout, allow_nan=True)  # NaN is then named by clean_entry
    except ValueError:
        return None, f"invalid JSON on stdout ({len(stdout)} bytes: {stdout.strip()[:60]!r})"
    if not isinstance(data, list):
        return None, "JSON is not a list of test entries"
    found: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            return None, f"entry {i} is not an object"
        n_prompt, n_gen = _count(raw, "n_prompt"), _count(raw, "n_gen")
        for value in (n_prompt, n_gen):
            if isinstance(value, str):
                return None, f"entry {i}: {value}"
        if (n_prompt, n_gen) == (prompt, 0):
            kind = "pp"
        elif (n_prompt, n_gen) == (0, DECODE_TOKENS):
            kind = "tg"
        else:
            return None, f"entry {i} is neither pp{prompt} nor tg{DECODE_TOKENS}: " + (
                f"n_prompt {n_prompt!r}, n_gen {n_gen!r}"
            )
        if kind in found:
            return None, f"two {kind} entries"
        entry, reason = clean_entry(raw)
        if reason:
            return None, f"malformed {kind} entry: {reason}"
        found[kind] = entry
    missing = [k for k in ("pp", "tg") if k not in found]
    if missing:
        return None, f"no {' / '.join(missing)} entry in the JSON"
    return found, None


def device_problem(s: Settings, mode: str, entry: dict[str, Any], n_layer: int = 0) -> str | None:
    """Did the run use what `mode` asks for? (`backends` lists compiled-in backends: ignored.)"""
    devices = entry.get("devices") or ""
    gpu_info = entry.get("gpu_info") or ""
    layers = entry.get("n_gpu_layers")
    if mode == "cpu":
        if devices and devices != "none":
            return f"CPU run used devices {devices!r}"
        return None
    if mode == EXPERTS_CPU and entry.get("n_cpu_moe") != n_layer:
        return f"kept the experts of {entry.get('n_cpu_moe')!r} layers on the CPU, not {n_layer}"
    if mode in ON_GPU:
        if not layers:
            return "no layers offloaded (n_gpu_layers 0)"
        if devices and devices != s.gpu_device:
            return f"ran on devices {devices!r}, not {s.gpu_device}"
    elif layers:
        return f"hybrid run offloaded {layers} layers (expected 0: weights in CPU memory)"
    if s.gpu_name not in gpu_info:
        # hybrid: without the GPU present nothing is offloaded and it is a plain CPU run
        return f"gpu_info {gpu_info!r} does not name {s.gpu_name}"
    return None


def run_mode(
    s: Settings, mode: str, ubatch: int, deadline: Deadline, n_layer: int = 0
) -> dict[str, Any]:
    """One llama-bench run in `mode`, recorded whatever happens to it."""
    cmd, env = bench_command(s, mode, ubatch, n_layer)
    rec: dict[str, Any] = {"mode": mode, "ubatch": ubatch, "cmd": cmd}
    res = start_record(s, mode, cmd, env, deadline, rec)
    if res is None:
        return rec
    reason = res.failure()
    found = None
    if reason is None:
        found, reason = parse_pp_tg(res.stdout, s.serve_request_prompt_tokens)
    if found is not None:
        pp, tg = found["pp"], found["tg"]
        rec.update(
            pp_tps=pp["avg_ts"],
            tg_tps=tg["avg_ts"],
            n_gpu_layers=pp["n_gpu_layers"],
            n_cpu_moe=pp["n_cpu_moe"],
            n_ubatch=pp["n_ubatch"],
            n_threads=pp["n_threads"],
            devices=pp["devices"],
            gpu_info=pp["gpu_info"],
        )
        reason = device_problem(s, mode, pp, n_layer) or device_problem(s, mode, tg, n_layer)
        if reason is None and pp["n_ubatch"] is not None and pp["n_ubatch"] != ubatch:
            reason = f"ran at ub {pp['n_ubatch']}, not {ubatch}"
    if reason:
        rec.update(status="FAIL", reason=reason, stderr_tail=res.stderr_tail())
    else:
        rec["status"] = "PASS"
    return rec


def summarize(runs: list[dict[str, Any]], mode: str, prompt: int, generated: int) -> dict[str, Any]:
    """A mode's entry of doc['placement']['modes']: the median rates, or why there are none."""
    mine = [r for r in runs if r["mode"] == mode]
    out: dict[str, Any] = {"runs": mine}
    bad = [r for r in mine if r["status"] != "PASS"]
    if bad or not mine:
        out.update(status="FAIL", reason=bad[0]["reason"] if bad else "not run")
        return out
    pp = median([r["pp_tps"] for r in mine])
    tg = median([r["tg_tps"] for r in mine])
    seconds = request_seconds(pp, tg, prompt, generated)
    if seconds is None:  # cannot happen after clean_entry; kept so nothing non-finite slips out
        out.update(status="FAIL", reason=f"unusable rates pp {pp!r}, tg {tg!r}")
        return out
    out.update(status="PASS", pp_tps=pp, tg_tps=tg, request_s=round(seconds, 3))
    return out


def _line(rec: dict[str, Any]) -> str:
    if rec["status"] == "PASS":
        return (
            f"  {rec['mode']:11} ub {rec['ubatch']:>4}: pp {rec['pp_tps']:.2f} t/s, "
            f"tg {rec['tg_tps']:.2f} t/s"
        )
    return f"  {rec['mode']:11} ub {rec['ubatch']:>4}: FAIL {rec['reason']}"


def ubatch_for(mode: str, doc: dict[str, Any]) -> int:
    """What the server would run in `mode` (serve_settings.derive): the sweep's best ub on the
    GPU modes, llama.cpp's default on the CPU."""
    return DEFAULT_UBATCH if mode == "cpu" else best_ubatch(doc)[0]


def _experts(s: Settings, log) -> tuple[int, int]:
    """The served model's experts per layer and layer count; (0, 0) (a dense model's modes,
    with the reason logged) when its GGUF header cannot be read: llama-bench then says why."""
    try:
        shape = model_shape(s.served_model)
    except (OSError, GgufError) as err:
        log(f"  cannot read the model's shape ({err}): measured as a dense model")
        return 0, 0
    if shape.n_expert:
        log(f"  a mixture of experts ({shape.n_expert} per layer): experts-cpu measured too")
    return shape.n_expert, shape.n_layer


def placement(
    s: Settings, deadline: Deadline, doc: dict[str, Any], log=say
) -> tuple[Check, dict[str, Any]]:
    """Measure every mode, choose with placement.choose. `doc` is the result so far (its
    `checks` as JSON and the `sweep`). PASS only when every mode was measured, the GPU checks
    passed and the choice came from the measurements: a failed GPU mode is never hidden by a
    CPU choice."""
    if s.serve_listen == "off":
        return Check(NAME, SKIP, "serve.listen is off: no server to place"), {}
    prompt, generated = s.serve_request_prompt_tokens, s.serve_request_generated_tokens
    ok, gpu_why = gpu_ok(doc)
    n_expert, n_layer = _experts(s, log)
    measured = modes_for(n_expert)
    runs = []
    for rep in range(s.repetitions):
        for mode in measured:
            rec = run_mode(s, mode, ubatch_for(mode, doc), deadline, n_layer)
            rec["repeat"] = rep
            log(_line(rec))
            runs.append(rec)
    modes = {mode: summarize(runs, mode, prompt, generated) for mode in measured}
    chosen, reason = choose(modes, prompt, generated, gpu_ok=ok)
    data = {
        "request": {"prompt_tokens": prompt, "generated_tokens": generated},
        "decode_tokens": DECODE_TOKENS,
        "experts_per_layer": n_expert,
        "modes": modes,
        "chosen": chosen,
        "reason": reason,
    }
    log(f"  chosen: {chosen} ({reason})")
    if not ok:
        return failed(NAME, f"{gpu_why}: the server runs on the CPU whatever the rates"), data
    bad = [m for m in measured if modes[m]["status"] != "PASS"]
    if bad:
        first = modes[bad[0]]
        text = f"{', '.join(bad)} not measured ({bad[0]}: {first['reason']})"
        text += f"; would serve on {chosen}"
        return failed(NAME, text), data
    return passed(NAME, f"serve on {chosen}: {reason}"), data
