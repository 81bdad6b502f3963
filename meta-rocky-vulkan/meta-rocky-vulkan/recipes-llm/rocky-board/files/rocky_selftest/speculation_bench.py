"""The `speculative` step: plain decode against each speculative mode, through the real server.

For each mode (plain, the pin's draft-free n-gram modes, and the draft model where one is
configured) the real llama-server is started with the settings the board's server derives from
this run (placement, ub, tiles, context: serve_settings.derive) plus that mode, on 127.0.0.1 in
plain HTTP with a per-run key. Each runs the typical requests, greedy, generating exactly
serve_request_generated_tokens (EOS ignored): a chat question with a free answer, and a request
whose answer repeats its prompt (editing, quoting: where n-grams of the context can be drafted).
The server's own timings give the decode time and the drafts made and accepted.

The choice (speculation.choose) is made again from this section wherever the server's settings
are derived; the step records it and whether it meets the goal (speculation.GOAL).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Any

from .bench import Deadline
from .checks import SKIP, Check, failed, passed
from .match import PROMPT
from .serve_client import Api, ClientError, free_port, parse_timings
from .serve_settings import derive, server_command
from .serving import HOST, Server, _credentials, _read_key, wait_healthy
from .settings import Settings
from .speculation import DRAFT, GOAL, MODES, NGRAM_MODES, OFF, choose, goal, speedups
from .terminal import say

NAME = "speculative"
REQUESTS = (
    ("chat", PROMPT + " what the Vulkan backend does with them."),
    (
        "repeat",
        "Repeat the following text exactly, word for word, and nothing else:\n\n"
        + PROMPT
        + " what the Vulkan backend does with them.",
    ),
)
MAX_TEXT = 16 << 10  # characters of each answer kept to compare with plain decode's
WARMUP_TOKENS = 8


def _answer(
    api: Api, s: Settings, prompt: str, timeout_s: float, generated: int | None = None
) -> tuple[dict[str, Any], str]:
    """One greedy chat request of `generated` tokens (default: the typical request's); (record,
    answer text). Raises ClientError."""
    generated = generated or s.serve_request_generated_tokens
    extra = {"logit_bias": dict(s.serving_logit_bias)} if s.serving_logit_bias else {}
    body = {
        **extra,
        "model": s.serve_model_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": generated,
        "temperature": 0,
        "seed": 1,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    res = api.json_call("POST", "/v1/chat/completions", body, timeout_s)
    try:
        text = res["choices"][0]["message"]["content"]
    except (TypeError, KeyError, IndexError):
        raise ClientError("the answer has no choices[0].message.content") from None
    if not isinstance(text, str):
        raise ClientError("choices[0].message.content is not a string")
    timings, why = parse_timings(res.get("timings"))
    if why:
        raise ClientError(why)
    raw = res["timings"]
    rec: dict[str, Any] = {
        "predicted_n": timings["predicted_n"],
        "predicted_ms": timings["predicted_ms"],
        "decode_tps": timings["predicted_per_second"],
    }
    for key in ("draft_n", "draft_n_accepted"):  # b9101 sends them when it drafted
        n = raw.get(key, 0)
        rec[key] = n if type(n) is int and 0 <= n <= 1 << 31 else None
    if timings["predicted_n"] != generated:
        raise ClientError(f"the server generated {timings['predicted_n']} tokens, not {generated}")
    return rec, text[:MAX_TEXT]


def run_mode(
    s: Settings, mode: str, plan: dict[str, Any], deadline: Deadline, work: str, log=say
) -> tuple[dict[str, Any], dict[str, str]]:
    """Start the server with `mode`, run every request, stop it. (entry, answers by request)"""
    port = free_port(HOST)
    local = replace(s, serve_listen="localhost", serve_port=port)
    argv, tiles_env = server_command(local, plan, work)
    env: dict[str, str | None] = {"GGML_NO_BACKTRACE": "1", **s.env}
    env.update({key: None for key in s.stock_env})
    env.update(tiles_env)
    entry: dict[str, Any] = {"status": "FAIL", "cmd": argv, "runs": []}
    answers: dict[str, str] = {}
    server = Server(argv, env, os.path.join(work, f"{mode}-llama-server.log"))
    try:
        if deadline.left() <= 1:
            entry["reason"] = "not run: the self-test's deadline passed"
            return entry, answers
        t0 = time.monotonic()
        why = server.start()
        api = Api(HOST, port, _read_key(work))
        if why is None:
            why = wait_healthy(api, server, min(s.run_timeout_s, deadline.left()))
        entry["start_s"] = round(time.monotonic() - t0, 3)
        if why is None:  # unmeasured: the first request of a process builds its GPU pipelines
            try:
                _answer(api, s, REQUESTS[0][1], min(120.0, deadline.left()), WARMUP_TOKENS)
            except ClientError as err:
                why = f"warm-up request: {err}"
        for name, prompt in REQUESTS if why is None else ():
            left = min(s.run_timeout_s, deadline.left())
            if left <= 1:
                why = "not run: the self-test's deadline passed"
                break
            try:
                rec, answers[name] = _answer(api, s, prompt, left)
            except ClientError as err:
                why = f"{name} request: {err}"
                break
            rec.update(request=name, status="PASS")
            entry["runs"].append(rec)
            log(f"  {mode:12} {name:6}: decode {rec['decode_tps']:.2f} t/s{_drafts(rec)}")
        if why is None:
            entry["status"] = "PASS"
        else:
            entry.update(reason=why, log_tail=server.log_tail())
            log(f"  {mode:12}: FAIL {why}")
        return entry, answers
    finally:
        server.stop()


def _drafts(rec: dict[str, Any]) -> str:
    made, took = rec.get("draft_n"), rec.get("draft_n_accepted")
    if not made or took is None:
        return ""
    return f", {took}/{made} drafted tokens accepted"


def with_mode(plan: dict[str, Any], mode: str, draft: str) -> dict[str, Any]:
    """The plan with speculative decoding set to `mode`."""
    value = None if mode == OFF else {"mode": mode}
    if mode == DRAFT:
        value["draft_model"] = draft
    settings = {**plan["settings"], "speculative": {"value": value, "reason": "measured"}}
    return {**plan, "settings": settings}


def speculative(
    s: Settings, deadline: Deadline, doc: dict[str, Any], log=say
) -> tuple[Check, dict[str, Any]]:
    """Every mode, one server after the other, then the choice and the goal."""
    if s.serve_listen == "off":
        return Check(NAME, SKIP, "serve.listen is off: no server to speed up"), {"goal": GOAL}
    plan = derive(s, doc={k: v for k, v in doc.items() if k != NAME})
    draft = s.spec_draft_model_path
    modes = [OFF, *NGRAM_MODES] + ([DRAFT] if draft else [])
    data: dict[str, Any] = {
        "goal": GOAL,
        "model": s.served_model,
        "draft_model": draft or None,
        "placement": plan["settings"]["placement"]["value"],
        "generated_tokens": s.serve_request_generated_tokens,
        "requests": [{"name": name, "prompt_chars": len(text)} for name, text in REQUESTS],
        "modes": {},
    }
    work = tempfile.mkdtemp(prefix="rocky-speculative-")  # 0700: the key stays ours
    plain: dict[str, str] = {}
    try:
        _credentials(work)
        for mode in modes:
            entry, answers = run_mode(s, mode, with_mode(plan, mode, draft), deadline, work, log)
            if mode == OFF:
                plain = answers
            else:  # for information: batched verification may round differently
                for run in entry["runs"]:
                    run["same_text"] = answers.get(run["request"]) == plain.get(run["request"])
            data["modes"][mode] = entry
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return verdict(data)


def verdict(data: dict[str, Any]) -> tuple[Check, dict[str, Any]]:
    """The choice and the goal from the measured modes; FAIL when a mode could not be run."""
    ratios, why = speedups(data)
    chosen, reason = choose(data, data["model"])
    met, goal_why = goal(ratios, chosen, data["draft_model"] or "")
    data.update(
        speedups={m: round(r, 4) for m, r in ratios.items()},
        chosen=chosen["mode"] if chosen else OFF,
        reason=reason,
        goal_met=met,
        goal_why=goal_why,
    )
    if why:  # plain decode itself: nothing to compare with
        off = data["modes"].get(OFF, {}).get("reason")
        return failed(NAME, why + (f" ({off})" if off else "")), data
    broken = [m for m in MODES if data["modes"].get(m, {}).get("status") == "FAIL"]
    text = f"server decode: {reason}; goal {GOAL}x {'met' if met else 'NOT met'}"
    if not met:
        text += f": {goal_why}"
    if broken:
        why = "; ".join(f"{m}: {data['modes'][m].get('reason')}" for m in broken)
        return failed(NAME, f"{why}; {text}"), data
    return passed(NAME, text), data
