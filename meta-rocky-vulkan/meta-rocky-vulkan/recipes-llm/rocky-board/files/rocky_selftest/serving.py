"""The `serving` step: what a user of the board's server feels, through the real HTTP API.

The real llama-server is started twice, one after the other: with the settings the board's
server would derive from this run (serve_settings.derive over the result so far: placement, ub,
tiles, context) and as a CPU-only server (placement cpu, llama.cpp's default ub), each on
127.0.0.1 in plain HTTP with a per-run random API key in a private temp dir. For each prompt size
(serving_prompt_tokens: 2048 and 8192 on the board) one streamed /v1/completions request of
exactly that many prompt tokens (ids from the server's own /tokenize; the prompt cache is off and
`timings.prompt_n` must say so) and serving_generated_tokens generated ones (EOS ignored):
time to first token from the client's clock, decode rate from the server's own timings (and from
the client's clock, for information). A size that does not fit the slot's context with the
generated tokens is run at the largest prompt that does (recorded), or left out if that is no
longer than an earlier size.

Goal (issue 20): at the first size the GPU-configured server's time to first token is at most
TTFT_RATIO_MAX of the CPU-only server's, and its decode is at least DECODE_RATIO_MIN of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from typing import Any

from . import paths
from .bench import Deadline
from .checks import SKIP, Check, failed, passed
from .match import PROMPT
from .runner import STOP_SIGNALS, TAIL_CHARS, TAIL_LINES, merged_env
from .serve_client import Api, ClientError, free_port, stream_completion
from .serve_settings import DEFAULT_UBATCH, derive, server_command
from .settings import Settings
from .terminal import say

NAME = "serving"
TTFT_RATIO_MAX = 0.8  # 1 / 1.25
DECODE_RATIO_MIN = 1.0
HOST = "127.0.0.1"
STOP_GRACE_S = 15.0  # SIGTERM, then SIGKILL of the whole process group
LOG_NAME = "llama-server.log"
WARMUP_TOKENS = 16


def cpu_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The same plan on the CPU only: placement cpu, the default ub, no GPU tiles."""
    cpu = json.loads(json.dumps(plan))  # a deep copy
    settings = cpu["settings"]
    settings["placement"] = {"value": "cpu", "reason": "the CPU-only comparison server"}
    settings["ubatch"] = {"value": DEFAULT_UBATCH, "reason": "CPU: the default"}
    settings["tiles"] = {"value": None, "reason": "CPU: no GPU tiles"}
    return cpu


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - 64 * 1024, 0))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    tail = "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])
    return tail[-TAIL_CHARS:]


class Server:
    """llama-server in its own process group, its output in a log file; `stop()` ends the
    whole group (SIGTERM, then SIGKILL after STOP_GRACE_S) and is safe to call twice."""

    def __init__(self, argv: list[str], env: dict[str, str | None], log_path: str) -> None:
        self.argv, self.log_path = argv, log_path
        self.env = merged_env(env)
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None

    def start(self) -> str | None:
        """None when started, else why not."""
        # As runner.run_tool: a stop signal between fork and knowing the child must not leave
        # it running.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held),
                )
        except OSError as err:
            return f"cannot start {self.argv[0]}: {err}"
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # whatever is left of the group, the leader too
        self.proc.wait()
        self.exit_code = self.proc.returncode
        end = time.monotonic() + 5  # SIGKILL is delivered asynchronously: let the group go
        while time.monotonic() < end:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)

    def log_tail(self) -> str:
        return _tail(self.log_path)


def wait_healthy(api: Api, server: Server, timeout_s: float) -> str | None:
    """Poll /health until 200; None when healthy, else why not (exited, out of time)."""
    end = time.monotonic() + timeout_s
    while True:
        if not server.running():
            code = server.proc.returncode if server.proc else None
            return f"llama-server exited (status {code}) before it was healthy"
        if api.healthy(min(2.0, max(end - time.monotonic(), 0.1))):
            return None
        if time.monotonic() >= end:
            return f"llama-server not healthy after {timeout_s:.0f} s"
        time.sleep(0.5)


def request_body(s: Settings, tokens: list[int], generated: int) -> dict[str, Any]:
    extra = {"logit_bias": dict(s.serving_logit_bias)} if s.serving_logit_bias else {}
    return {
        **extra,
        "model": s.serve_model_name,
        "prompt": tokens,
        "max_tokens": generated,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "cache_prompt": False,  # every request evaluates its whole prompt
        "ignore_eos": True,  # exactly `generated` tokens
    }


def measure_one(
    api: Api, s: Settings, tokens: list[int], generated: int, timeout_s: float
) -> dict[str, Any]:
    """One streamed request: TTFT, decode t/s (server and wall), and whether it is usable."""
    stats, reason = stream_completion(api, request_body(s, tokens, generated), timeout_s)
    rec: dict[str, Any] = {}
    timings = stats.get("timings")
    first, last, sent = stats.get("first_at"), stats.get("last_at"), stats.get("sent_at")
    if first is not None and sent is not None:
        rec["ttft_s"] = round(first - sent, 4)
    if timings:
        rec["timings"] = timings  # the server's own, as it sent them
        rec["server_prompt_s"] = round(timings["prompt_ms"] / 1000, 4)
        rec["prompt_tps"] = timings["prompt_per_second"]
        rec["decode_tps"] = timings["predicted_per_second"]
        n = timings["predicted_n"]
        if first is not None and last is not None and last > first and n > 1:
            rec["decode_tps_wall"] = round((n - 1) / (last - first), 4)
    rec["chunks"] = stats.get("chunks", 0)
    if reason is None and timings:
        if timings["prompt_n"] != len(tokens):
            reason = f"the server evaluated {timings['prompt_n']} prompt tokens, not {len(tokens)}"
        elif timings["predicted_n"] != generated:
            reason = f"the server generated {timings['predicted_n']} tokens, not {generated}"
        elif rec.get("decode_tps") is None:
            reason = "the server reported no decode rate"
    if reason is None and "ttft_s" not in rec:
        reason = "no time to first token"
    rec["status"] = "FAIL" if reason else "PASS"
    if reason:
        rec["reason"] = reason
    return rec


def _sizes(s: Settings, n_ctx: int, generated: int) -> list[tuple[int, int | None, str | None]]:
    """(requested, prompt tokens or None when left out, note) per configured size."""
    out: list[tuple[int, int | None, str | None]] = []
    done = 0
    fits = n_ctx - generated
    for size in s.serving_prompt_tokens:
        n, note = size, None
        if size > fits:
            n = fits
            note = f"{size} + {generated} tokens exceed the slot's context {n_ctx}: {n} used"
        if n <= done or n < 1:
            out.append((size, None, f"left out: the slot's context is {n_ctx} tokens"))
            continue
        done = n
        out.append((size, n, note))
    return out


def run_server(
    s: Settings,
    label: str,
    plan: dict[str, Any],
    deadline: Deadline,
    work: str,
    log=say,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start one server, run every size through it, stop it. (runs, server record)"""
    port = free_port(HOST)
    local = replace(s, serve_listen="localhost", serve_port=port)  # 127.0.0.1, plain HTTP
    argv, tiles_env = server_command(local, plan, work)
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}
    env.update({key: None for key in s.stock_env})
    env.update(tiles_env)
    mode = plan["settings"]["placement"]["value"]
    info: dict[str, Any] = {"server": label, "placement": mode, "cmd": argv, "port": port}
    generated = s.serving_generated_tokens
    runs: list[dict[str, Any]] = []

    def fail_all(reason: str) -> None:
        for size in s.serving_prompt_tokens:
            if not any(r["requested_tokens"] == size for r in runs):
                runs.append(_run(label, mode, size, None, status="FAIL", reason=reason))

    log_path = os.path.join(work, f"{label}-{LOG_NAME}")
    server = Server(argv, env, log_path)
    try:
        left = deadline.left()
        if left <= 1:
            fail_all("not run: the self-test's deadline passed")
            return runs, info
        t0 = time.monotonic()
        why = server.start()
        if server.proc is not None:
            info["pid"] = server.proc.pid  # also its process group: gone once stopped
        if why is None:
            key = _read_key(work)
            api = Api(HOST, port, key)
            why = wait_healthy(api, server, min(s.run_timeout_s, left))
        info["start_s"] = round(time.monotonic() - t0, 3)
        if why is None:
            try:
                n_ctx = api.slot_context(min(30.0, max(deadline.left(), 0.1)))
            except ClientError as err:
                why = str(err)
        if why is not None:
            info.update(reason=why, log_tail=server.log_tail())
            fail_all(why)
            log(f"  {label}: FAIL {why}")
            return runs, info
        info["slot_context"] = n_ctx
        # One short request first, unmeasured, as a user's first one would find the server
        # after any other: buffers sized, threads up.
        try:
            warm = api.prompt_tokens(PROMPT, min(WARMUP_TOKENS, n_ctx - 2), 60.0)
            _, why = stream_completion(api, request_body(s, warm, 2), min(120.0, deadline.left()))
        except ClientError as err:
            why = str(err)
        if why is not None:
            info.update(reason=f"warm-up request: {why}", log_tail=server.log_tail())
            fail_all(info["reason"])
            log(f"  {label}: FAIL {info['reason']}")
            return runs, info
        for size, n, note in _sizes(s, n_ctx, generated):
            if n is None:
                runs.append(_run(label, mode, size, None, status="SKIP", reason=note))
                continue
            left = min(s.run_timeout_s, deadline.left())
            if left <= 1:
                runs.append(_run(label, mode, size, n, status="FAIL", reason="not run: deadline"))
                continue
            try:
                tokens = api.prompt_tokens(PROMPT, n, min(60.0, left))
            except ClientError as err:
                runs.append(_run(label, mode, size, n, status="FAIL", reason=str(err)))
                continue
            rec = _run(label, mode, size, n, **measure_one(api, s, tokens, generated, left))
            if note:
                rec["note"] = note
            runs.append(rec)
            log("  " + _line(rec))
            if not server.running():
                info["reason"] = "llama-server died during the requests"
                info["log_tail"] = server.log_tail()
                fail_all(info["reason"])
                break
        if any(r["status"] == "FAIL" for r in runs) and "log_tail" not in info:
            info["log_tail"] = server.log_tail()
        return runs, info
    finally:
        server.stop()
        info["exit_code"] = server.exit_code


def _read_key(work: str) -> str:
    with open(os.path.join(work, paths.API_KEY_NAME), encoding="ascii") as fh:
        return fh.read().strip()


def _run(label: str, mode: str, size: int, n: int | None, **fields: Any) -> dict[str, Any]:
    return {
        "server": label,
        "placement": mode,
        "requested_tokens": size,
        "prompt_tokens": n,
        **fields,
    }


def _line(rec: dict[str, Any]) -> str:
    head = f"{rec['server']:3} ({rec['placement']}) {rec['prompt_tokens']} tokens"
    if rec["status"] != "PASS":
        return f"{head}: {rec['status']} {rec.get('reason')}"
    wall = rec.get("decode_tps_wall")
    wall_text = f", wall {wall:.2f}" if wall else ""
    decode = f"decode {rec['decode_tps']:.2f} t/s (server{wall_text})"
    return f"{head}: TTFT {rec['ttft_s']:.2f} s, {decode}"


def _credentials(work: str) -> None:
    """A random API key for this run only, readable by this user only."""
    path = os.path.join(work, paths.API_KEY_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(os.urandom(24).hex() + "\n")


def verdict(runs: list[dict[str, Any]], size: int) -> tuple[dict[str, Any], str | None]:
    """The ratios at `size` (the first configured size) and why there are none."""
    pick = {}
    for label in ("gpu", "cpu"):
        rec = next(
            (r for r in runs if r["server"] == label and r["requested_tokens"] == size), None
        )
        if rec is None or rec["status"] != "PASS":
            why = rec.get("reason") if rec else "not run"
            return {}, f"{label} server at {size} tokens not measured: {why}"
        pick[label] = rec
    gpu, cpu = pick["gpu"], pick["cpu"]
    if cpu["ttft_s"] <= 0:
        return {}, f"cpu time to first token {cpu['ttft_s']} s is not positive"
    return {
        "ttft_ratio": round(gpu["ttft_s"] / cpu["ttft_s"], 4),
        "decode_ratio": round(gpu["decode_tps"] / cpu["decode_tps"], 4),
        "at_prompt_tokens": gpu["prompt_tokens"],
    }, None


def serving(
    s: Settings, deadline: Deadline, doc: dict[str, Any], log=say
) -> tuple[Check, dict[str, Any]]:
    """Both servers, one after the other, then the goal. `doc` is the result so far."""
    goal = {"ttft_ratio_max": TTFT_RATIO_MAX, "decode_ratio_min": DECODE_RATIO_MIN}
    if s.serve_listen == "off":
        return Check(NAME, SKIP, "serve.listen is off: no server to measure"), {"goal": goal}
    plan = derive(s, doc=doc)
    data: dict[str, Any] = {
        "goal": goal,
        "prompt_sizes": list(s.serving_prompt_tokens),
        "generated_tokens": s.serving_generated_tokens,
        "plan": {name: item["value"] for name, item in plan["settings"].items()},
        "servers": [],
        "runs": [],
    }
    gpu_mode = plan["settings"]["placement"]["value"]
    work = tempfile.mkdtemp(prefix="rocky-serving-")  # 0700: the key stays ours
    try:
        _credentials(work)
        plans = [("gpu", plan), ("cpu", cpu_plan(plan))]
        if gpu_mode == "cpu":
            why = "not run: the derived plan serves on the CPU "
            why += f"({plan['settings']['placement']['reason']})"
            for n in s.serving_prompt_tokens:
                data["runs"].append(_run("gpu", "cpu", n, None, status="FAIL", reason=why))
            plans = plans[1:]
        for label, p in plans:
            log(f"  {label} server ({p['settings']['placement']['value']})")
            runs, info = run_server(s, label, p, deadline, work, log=log)
            data["runs"] += runs
            data["servers"].append(info)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = s.serving_prompt_tokens[0]
    ratios, why = verdict(data["runs"], size)
    data.update(ratios)
    data.setdefault("ttft_ratio", None)
    data.setdefault("decode_ratio", None)
    if why:
        return failed(NAME, why), data
    ok = data["ttft_ratio"] <= TTFT_RATIO_MAX and data["decode_ratio"] >= DECODE_RATIO_MIN
    gpu = next(r for r in data["runs"] if r["server"] == "gpu" and r["requested_tokens"] == size)
    cpu = next(r for r in data["runs"] if r["server"] == "cpu" and r["requested_tokens"] == size)
    text = (
        f"{data['at_prompt_tokens']}-token prompt: TTFT {gpu['ttft_s']:.2f} s ({gpu_mode}) vs "
        f"{cpu['ttft_s']:.2f} s CPU = {data['ttft_ratio']:.2f}x (goal <= {TTFT_RATIO_MAX}); "
        f"decode {gpu['decode_tps']:.2f} vs {cpu['decode_tps']:.2f} t/s = "
        f"{data['decode_ratio']:.2f}x (goal >= {DECODE_RATIO_MIN})"
    )
    return (passed if ok else failed)(NAME, text), data
