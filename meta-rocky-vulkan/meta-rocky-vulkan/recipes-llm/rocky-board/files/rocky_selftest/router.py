"""llama-server's router mode (b9101 has it): one server on the API's port, a child llama-server
per model, loaded on demand by the request's `model`, at most `models_max` at once (the least
recently used one is unloaded first).

Every model of the store (the image's and the pulled ones) gets a section of the router's
preset file with its own settings, each derived as serve_settings.derive derives the served
model's: placement and micro-batch from the board's measurements, context and slots from the
model's own GGUF shape and the RAM. The router's own command line holds only what every child
shares (listen address, key, TLS, limits): in b9101 it overrides any preset value.
"""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import replace
from typing import Any

from . import model_placement, paths
from .files import UnreadableFile, read_json
from .gguf import GgufError, model_shape
from .model_store import Model, Store
from .outcome import peek_result
from .placement import mode_flags
from .results import write_atomic
from .serve_client import Api, ClientError
from .serve_keys import read_api_key
from .serve_settings import (
    HTTP_THREADS,
    HTTP_TIMEOUT_S,
    RESERVE_BYTES,
    derive,
    device_flags,
    mem_total_bytes,
    speculative,
    value,
)
from .settings import Settings
from .speculation import mode_flags as speculation_flags
from .tune_spec import ENV_VAR

# llama-server's flags as preset keys (the long names without dashes, as common/preset.cpp
# reads them).
PRESET_KEYS = {
    "-ngl": "n-gpu-layers", "-dev": "device", "--rpc": "rpc", "--split-mode": "split-mode",
    "--tensor-split": "tensor-split",
}  # fmt: skip
PRESET_SWITCHES = {"--cpu-moe": "cpu-moe"}  # flags without a value
# A child asked to stop is killed after this many seconds (a request in flight gets them).
STOP_TIMEOUT_S = 30
MAX_MODELS = 64
RELOAD_TIMEOUT_S = 60
DRAIN_TIMEOUT_S = 120  # how long `rocky-llm rm` waits for the model's requests in flight


class RouterError(Exception):
    """The router's presets cannot be made; the message names the cause and the fix."""


def store_for(s: Settings) -> Store:
    """The board's store: the image's served model and the reference model, then the pulls."""
    image = {"reference": s.model_path}
    if s.serve_model_name != "reference":
        image[s.serve_model_name] = s.served_model
    return Store(s.models_dir, image)


def _cluster_bench(s: Settings, model: Model, doc: Any) -> tuple[Any, str | None]:
    """The self-test's result with serve.model's cluster section from `rocky-llm cluster
    bench` where that ran after the self-test started (workers are usually paired after first
    boot), and where the section came from; else the result as it is."""
    bench, why, when = model_placement.load(s, model, "cluster")
    started = doc.get("started_at") if isinstance(doc, dict) else None
    if bench is None or (
        isinstance(started, str) and model_placement.TIMESTAMP.fullmatch(started)
        and (when is None or when <= started)
    ):  # fmt: skip
        return doc, None
    return {**(doc if isinstance(doc, dict) else {}), "cluster": bench}, why


def _model_settings(s: Settings, model: Model, meminfo: str, doc: Any) -> dict[str, Any]:
    one = replace(s, serve_model_path=model.path, serve_model_name=model.name)
    doc = doc if doc is not None else peek_result(s.results_dir)
    cluster, bench_why = None, None  # serve.model: derive asks the workers, the measurements decide
    if model.name != s.serve_model_name:
        # One rpc-server serves one client at a time: the workers hold serve.model alone.
        cluster = {"value": [], "reason": f"the cluster serves {s.serve_model_name} only"}
    else:
        doc, bench_why = _cluster_bench(s, model, doc)
    own, own_why, _ = model_placement.load(s, model)
    if own is not None:  # its own measurements (`rocky-llm place`), the self-test's GPU checks
        doc = {**(doc if isinstance(doc, dict) else {}), "placement": own}
    p = derive(one, meminfo=meminfo, cluster=cluster, doc=doc)
    item = p["settings"]["placement"]
    if own is not None:
        item["reason"] = f"{own_why}: {item['reason']}"
    elif model.name != s.serve_model_name:  # the self-test measured serve.model, not this one
        item["reason"] += f"; {own_why}"
    if bench_why:
        p["settings"]["cluster"]["reason"] += f"; the cluster {bench_why}"
    return p


def _footprint(plan: dict[str, Any], model: Model) -> int:
    """The model's bytes plus its KV cache at the planned context and slots, and its draft
    model's bytes (its own small KV cache is inside the reserve)."""
    try:
        per_token = model_shape(model.path).kv_bytes_per_token
    except (OSError, GgufError):
        per_token = 0
    tokens = value(plan, "context_per_slot") * value(plan, "parallel")
    spec = speculative(plan) or {}
    try:
        draft = os.stat(spec["draft_model"]).st_size if "draft_model" in spec else 0
    except OSError:
        draft = 0
    return model.size + tokens * per_token + draft


def models_max(footprints: list[int], mem_total: int | None) -> tuple[int, str]:
    """How many models may be loaded at once: the largest ones, added while they fit."""
    if mem_total is None:
        return 1, "RAM size unknown: one model at a time"
    budget = mem_total - RESERVE_BYTES
    n, used = 0, 0
    for size in sorted(footprints, reverse=True):
        if used + size > budget:
            break
        n, used = n + 1, used + size
    n = max(n, 1)
    gib = 1 << 30
    return n, (
        f"{n} at once: the {n} largest models with their KV caches take {used / gib:.1f} GiB of "
        f"{mem_total / gib:.1f} GiB RAM less {RESERVE_BYTES / gib:.1f} GiB reserve"
    )


def _ini_value(text: str) -> str:
    if not text.isprintable() or any(c in text for c in "[]=;#\"'") or text != text.strip():
        raise RouterError(f"{text!r} cannot go into the router's preset file; rename the file")
    return text


def plan(
    s: Settings,
    store: Store | None = None,
    meminfo: str = "/proc/meminfo",
    doc: Any = None,
    loaded_at_start: str | None = "",
) -> dict[str, Any]:
    """The router's plan: every model's settings (with reasons), the default, models_max.
    `loaded_at_start`: the model whose preset says load-on-startup; "" (at start): the
    default."""
    store = store or store_for(s)
    found = store.models()[:MAX_MODELS]
    if not found:
        raise RouterError(f"no model in {s.models_dir} and none in the image: nothing to serve")
    default = store.default() or s.serve_model_name
    if default not in {m.name for m in found}:
        default = found[0].name
    models, footprints = {}, []
    for model in found:
        p = _model_settings(s, model, meminfo, doc)
        models[model.name] = p
        footprints.append(_footprint(p, model))
    n, why = models_max(footprints, mem_total_bytes(meminfo))
    tiles = value(models[default], "tiles")
    return {
        "schema": "rocky-llm-router",
        "schema_version": 1,
        "default": default,
        "loaded_at_start": default if loaded_at_start == "" else loaded_at_start,
        "models_max": {"value": n, "reason": why},
        "tiles": tiles,
        "gpu_device": s.gpu_device,
        "models": models,
        "warnings": [w for p in models.values() for w in p["warnings"]][:20],
    }


def preset_ini(router: dict[str, Any]) -> str:
    """The router's --models-preset file: one section per model. b9101 makes keys above the
    first section a model preset named "default" (with no model): the format's version goes
    into the global section, [*]."""
    lines = ["; made by rocky-llm from the board's measurements; rewritten at every change"]
    lines += ["[*]", "version = 1", ""]
    for name, p in router["models"].items():
        mode, ub = value(p, "placement"), value(p, "ubatch")
        ctx, slots = value(p, "context_per_slot"), value(p, "parallel")
        lines.append(f"[{_ini_value(name)}]")
        lines.append(f"model = {_ini_value(value(p, 'model'))}")
        lines += [f"ctx-size = {ctx * slots}", f"parallel = {slots}"]
        lines += [f"ubatch-size = {ub}", f"batch-size = {max(ub, 2048)}"]
        flags = mode_flags(mode, "server") + device_flags(p, mode, router["gpu_device"])
        for flag in [f for f in flags if f in PRESET_SWITCHES]:
            lines.append(f"{PRESET_SWITCHES[flag]} = true")
        flags = [f for f in flags if f not in PRESET_SWITCHES]
        for flag, val in zip(flags[::2], flags[1::2], strict=True):
            lines.append(f"{PRESET_KEYS[flag]} = {_ini_value(val)}")
        spec = speculation_flags(speculative(p), mode, router["gpu_device"])
        for flag, val in zip(spec[::2], spec[1::2], strict=True):
            lines.append(f"{flag.removeprefix('--')} = {_ini_value(val)}")  # its long name
        lines.append(f"stop-timeout = {STOP_TIMEOUT_S}")
        if name == router["loaded_at_start"]:
            lines.append("load-on-startup = true")
        lines.append("")
    return "\n".join(lines)


def write_presets(s: Settings, router: dict[str, Any]) -> None:
    """The preset file, atomically, owned as the store is (root's `rocky-llm pull` writes it
    too)."""
    path = s.router_presets
    write_atomic(path, preset_ini(router).encode())
    if os.geteuid() == 0:
        owner = os.stat(os.path.dirname(path))
        os.chown(path, owner.st_uid, owner.st_gid)


def command(
    s: Settings, router: dict[str, Any], credentials: str
) -> tuple[list[str], dict[str, str]]:
    """The router's argv and environment: what every child shares, nothing per model."""
    lan = s.serve_listen == "lan"
    argv = [s.llama_server or s.tool("llama-server"), "--models-preset", s.router_presets]
    argv += ["--models-max", str(router["models_max"]["value"])]
    argv += ["--host", "0.0.0.0" if lan else "127.0.0.1", "--port", str(s.serve_port)]
    argv += ["--api-key-file", os.path.join(credentials, paths.API_KEY_NAME)]
    if lan:
        argv += ["--ssl-key-file", os.path.join(credentials, paths.TLS_KEY_NAME)]
        argv += ["--ssl-cert-file", os.path.join(credentials, paths.TLS_CERT_NAME)]
    # As serve_settings.server_command: /metrics on, /slots off, a small prompt cache, short
    # HTTP timeouts with more threads.
    argv += ["--metrics", "--no-slots", "--cache-ram", "256"]
    argv += ["--timeout", str(HTTP_TIMEOUT_S), "--threads-http", str(HTTP_THREADS)]
    # A child that crashes (a lost cluster worker aborts it) exits at once: ggml's backtrace
    # would first attach gdb to it.
    env = {"GGML_NO_BACKTRACE": "1"}
    if router["tiles"]:
        env[ENV_VAR] = router["tiles"]
    return argv, env


def local_api(s: Settings, secrets_dir: str) -> Api:
    """The router on this board, as root (paths.LLM_KEY_DIR) or the server's user
    ($CREDENTIALS_DIRECTORY) reaches it: the API key, and for lan the board's own certificate
    pinned (its names include 127.0.0.1)."""
    key = read_api_key(secrets_dir)
    tls = None
    if s.serve_listen == "lan":
        tls = ssl.create_default_context(cafile=os.path.join(secrets_dir, paths.TLS_CERT_NAME))
    return Api("127.0.0.1", s.serve_port, key, tls)


def _recorded(settings_file: str) -> dict[str, Any]:
    """What the running server recorded at its start (settings.json), {} if unreadable."""
    try:
        doc = read_json(settings_file, 1 << 20)
    except (OSError, UnreadableFile):
        return {}
    return doc if isinstance(doc, dict) else {}


def started_with(settings_file: str) -> str | None:
    """The model the running server loaded at its start (settings.json), if recorded."""
    recorded = _recorded(settings_file).get("loaded_at_start")
    return recorded if isinstance(recorded, str) else None


def started_max(settings_file: str) -> int | None:
    """The running router's --models-max (fixed at its start), if recorded."""
    item = _recorded(settings_file).get("models_max")
    n = item.get("value") if isinstance(item, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_MODELS else None


def _states(api: Api) -> dict[str, str]:
    """The router's models and their states (b9101: GET /models), re-reading the presets."""
    listed = api.json_call("GET", "/models?reload=1", None, RELOAD_TIMEOUT_S)
    out = {}
    for m in listed.get("data", []) if isinstance(listed, dict) else []:
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            state = m.get("status", {}).get("value") if isinstance(m.get("status"), dict) else ""
            out[m["id"]] = state if isinstance(state, str) else ""
    return out


def busy_requests(api: Api, name: str) -> int:
    """Requests on a loaded model, running or queued for a slot (its llama-server's
    llamacpp:requests_processing and requests_deferred); 0 when it is not loaded (asking an
    unloaded model's /metrics would load it)."""
    if _states(api).get(name) != "loaded":
        return 0
    status, data = api.call("GET", f"/metrics?model={name}", None, 30)
    if status != 200:
        return 0
    n = 0
    for line in data.decode("utf-8", "replace").splitlines():
        key, _, rest = line.partition(" ")
        if key in ("llamacpp:requests_processing", "llamacpp:requests_deferred"):
            try:
                n += max(0, min(int(float(rest)), 1 << 20))
            except ValueError:
                pass
    return n


def drain(api: Api | None, name: str, timeout_s: float = DRAIN_TIMEOUT_S) -> str:
    """Before a model is removed: wait (bounded) for its requests to finish, since b9101 ends
    a stopped model's streams at once. What happened, in words ("" when none were running)."""
    if api is None:
        return ""
    t0 = time.monotonic()
    try:
        first = n = busy_requests(api, name)
        while n > 0:
            if time.monotonic() - t0 > timeout_s:
                return f"{n} request(s) on {name} still running after {timeout_s:.0f} s: ended"
            time.sleep(0.25)
            n = busy_requests(api, name)
    except ClientError as err:
        # Unknown, not none: say so (the server may be down, or too busy to answer).
        return f"could not ask the server about requests on {name} ({err}): not waited for"
    if not first:
        return ""
    return f"waited {time.monotonic() - t0:.1f} s for {first} request(s) on {name} to finish"


def sync(s: Settings, api: Api | None, settings_file: str = paths.LLM_SETTINGS) -> str:
    """After a pull, rm or use: the preset file made anew, and the running router told to read
    it (b9101: GET /models?reload=1). b9101 stops a running child whose preset changed, so a
    running model's section must stay as it was: the load-on-startup mark stays where the
    server's start put it, and a new default is loaded with /models/load when the router has
    room for it (loading it at models_max would unload a model that may be answering). A
    removed model's child is stopped. What happened, in words."""
    router = plan(s, loaded_at_start=started_with(settings_file))
    write_presets(s, router)
    if s.serve_listen == "off" or api is None:
        return "the server is off; the models are ready for its next start"
    running_max = started_max(settings_file)
    default = router["default"]
    try:
        states = _states(api)
        running = [n for n, st in states.items() if st in ("loaded", "loading")]
        room = running_max is not None and len(running) < running_max
        if default in states and default not in running and room:
            api.json_call("POST", "/models/load", {"model": default}, RELOAD_TIMEOUT_S)
    except (ClientError, AttributeError) as err:
        return f"the server did not take the change now ({err}); it will at its next start"
    words = [f"the server now offers: {', '.join(states)} (default {default})"]
    wanted = router["models_max"]["value"]
    if running_max is not None and wanted > running_max:
        words.append(
            f"{wanted} models fit in RAM at once but the server keeps {running_max} (set at its "
            "start): `sudo systemctl restart rocky-llm` to raise it; until then a request for "
            "another model unloads the least recently used one"
        )
    return "; ".join(words)
