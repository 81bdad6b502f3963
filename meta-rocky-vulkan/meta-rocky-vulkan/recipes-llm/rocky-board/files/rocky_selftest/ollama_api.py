"""The Ollama-compatible API (rocky-llm-ollama.service): a small proxy in front of the router.

llama-server b9101 has no Ollama endpoints, so this translates, with the standard library only:
  GET  /  /api/version  /api/tags  /api/ps       POST /api/show  /api/chat  /api/generate
  POST /api/pull (the store's checked fetch)     DELETE /api/delete
Chat and generate go to the router's /v1/chat/completions (or /v1/completions for raw
generate) and come back as Ollama streams them: one JSON object per line, the last with
"done": true and the counts and durations (from llama-server's own timings). Behind the same
API key as the OpenAI API and, for serve.listen lan, HTTPS with the board's certificate.

Every request is hostile: a bounded body, a JSON object, known fields type-checked (unknown
ones are ignored, as Ollama ignores them, and named in the journal), a model that is in the
store. Errors are {"error": "..."} with Ollama's statuses (400, 401, 404, 500); the upstream
server's answers are read with caps as serve_client reads them.
"""

from __future__ import annotations

import hmac
import http.client
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import paths, router
from .gguf import GgufError, model_shape, read_metadata
from .model_store import Model, StoreError, check_name
from .serve_client import MAX_BODY, MAX_LINE, MAX_STREAM, Api, ClientError, loads
from .serve_keys import read_api_key
from .settings import Settings
from .terminal import clean_line

VERSION = "0.12.6"  # the Ollama API version whose endpoints and fields this follows
MAX_REQUEST = 16 << 20
MAX_CONCURRENT = 32
UPSTREAM_TIMEOUT_S = 900  # one read from the router: a long prompt's prefill on the board
CLIENT_TIMEOUT_S = 60  # reading a request from the client
# llama_ftype (general.file_type) -> Ollama's quantization_level words.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}  # fmt: skip
# Ollama options -> the router's OpenAI-request fields (llama-server takes the extra ones).
OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "seed": "seed", "num_predict": "max_tokens", "stop": "stop",
    "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "typical_p": "typical_p",
    "repeat_last_n": "repeat_last_n",
}  # fmt: skip
TYPE_WORDS = {str: "string", bool: "boolean", dict: "object", list: "list", int: "number",
              float: "number"}  # fmt: skip
# Each endpoint's fields and their JSON types; anything else is ignored (and logged).
FIELDS = {
    "chat": {"model": str, "messages": list, "stream": bool, "options": dict, "format": (str, dict),
             "tools": list, "keep_alive": (str, int, float), "think": (bool, str)},
    "generate": {"model": str, "prompt": str, "system": str, "raw": bool, "stream": bool,
                 "options": dict, "format": (str, dict), "keep_alive": (str, int, float),
                 "suffix": str, "images": list, "context": list, "template": str,
                 "think": (bool, str)},
    "show": {"model": str, "name": str, "verbose": bool},
    "pull": {"model": str, "name": str, "stream": bool, "insecure": bool, "url": str,
             "sha256": str, "license": str},
    "delete": {"model": str, "name": str},
}  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _log(text: str) -> None:
    print(clean_line(text, 2000), file=sys.stderr, flush=True)


def model_name(value: str) -> str:
    """An Ollama model reference (name, name:latest) -> the store's name."""
    name = value[: -len(":latest")] if value.endswith(":latest") else value
    try:
        return check_name(name)
    except StoreError:
        raise ApiError(404, f"model {clean_line(value, 80)!r} not found") from None


TEMPLATE_KEY = "tokenizer.chat_template"


def capabilities(meta: dict[str, Any]) -> list[str]:
    """Ollama's capabilities from the GGUF's own keys: an embedding model (a pooling type) only
    embeds; a chat template that takes `tools` offers tools, one that thinks offers thinking.
    No vision: the store holds no mmproj."""
    arch = meta.get("general.architecture")
    if isinstance(arch, str) and isinstance(meta.get(f"{arch}.pooling_type"), int):
        return ["embedding"]
    found = ["completion"]
    template = meta.get(TEMPLATE_KEY)
    if isinstance(template, str):
        if re.search(r"\btools\b", template):
            found.append("tools")
        if "<think>" in template or "enable_thinking" in template:
            found.append("thinking")
    return found


def metadata(model: Model) -> dict[str, Any]:
    """The GGUF keys /api/show and /api/tags read (bounded reads; {} for an unreadable file)."""
    wanted = {"general.architecture", "general.file_type", "general.size_label", TEMPLATE_KEY}
    try:
        meta = read_metadata(model.path, wanted)
        arch = meta.get("general.architecture")
        if isinstance(arch, str):
            meta.update(read_metadata(model.path, {f"{arch}.pooling_type"}))
    except (OSError, GgufError):
        return {}
    return meta


def details(model: Model, meta: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """Ollama's `details` and `model_info` from the GGUF header (bounded reads)."""
    meta = metadata(model) if meta is None else meta
    try:
        shape = model_shape(model.path)
    except (OSError, GgufError):
        shape = None
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    size = meta.get("general.size_label")
    ftype = meta.get("general.file_type")
    info: dict[str, Any] = {"general.architecture": arch}
    if shape:
        info[f"{arch}.context_length"] = shape.context_length
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": size if isinstance(size, str) else "",
        "quantization_level": FILE_TYPES.get(ftype, "") if isinstance(ftype, int) else "",
    }, info


def _modified(model: Model) -> str:
    try:
        t = os.stat(model.path).st_mtime
    except OSError:
        t = 0
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def tag(model: Model) -> dict[str, Any]:
    det, _ = details(model)
    return {
        "name": f"{model.name}:latest",
        "model": f"{model.name}:latest",
        "modified_at": _modified(model),
        "size": model.size,
        "digest": model.sha256 or "",
        "details": det,
    }


def checked(body: Any, endpoint: str) -> dict[str, Any]:
    """The body's known fields, each of its type; unknown ones are named in the journal."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    known = FIELDS[endpoint]
    for key, value in body.items():
        want = known.get(key)
        if want is None:
            continue
        if value is not None and not isinstance(value, want):
            types = want if isinstance(want, tuple) else (want,)
            raise ApiError(400, f"{key} must be a {' or '.join(TYPE_WORDS[t] for t in types)}")
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        names = ", ".join(clean_line(k, 40) for k in unknown[:10])
        _log(f"/api/{endpoint}: ignored fields: {names}")
    return body


LOAD_TIMEOUT_S = 600  # a 3B model from microSD on the board: well under this
# Ollama's OpenAI-compatible endpoints on its own port, relayed to the router's.
OPENAI_ROUTES = (
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
)
# What the router's answers are; anything else is relayed as JSON (never as markup).
RELAYED_TYPES = ("application/json", "application/json; charset=utf-8", "text/event-stream")


def _unloads(keep_alive: Any) -> bool:
    """Whether Ollama's keep_alive means "unload now": 0 as a number or a duration ("0", "0s")."""
    if isinstance(keep_alive, bool):
        return False
    if isinstance(keep_alive, (int, float)):
        return keep_alive == 0
    if isinstance(keep_alive, str):
        return re.fullmatch(r"0+(\.0*)?(ms|s|m|h)?", keep_alive.strip()) is not None
    return False


def _options(opts: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if opts is None:
        return out
    if not isinstance(opts, dict):
        raise ApiError(400, "options must be an object")
    for key, value in opts.items():
        target = OPTIONS.get(key)
        if value is None:
            continue  # Ollama skips nil options; LangChain's classes send every unset one as null
        if target is None:
            continue  # num_ctx, num_gpu, num_thread...: the board's measurements decide those
        if key == "stop":
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ApiError(400, "options.stop must be a list of strings")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, f"options.{key} must be a number")
        out[target] = value
    return out


def _format(value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": value}}}
    raise ApiError(400, 'format must be "json" or a JSON schema object')


def _messages(messages: Any) -> list[dict[str, Any]]:
    out = []
    if not isinstance(messages, list) or len(messages) > 10000:
        raise ApiError(400, "messages must be a list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ApiError(400, f"messages[{i}] must be an object")
        role, content = msg.get("role"), msg.get("content", "")
        if role not in ("system", "user", "assistant", "tool"):
            raise ApiError(400, f"messages[{i}].role must be system, user, assistant or tool")
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string")
        if msg.get("images"):
            raise ApiError(400, "images are not supported: the served models are text only")
        one: dict[str, Any] = {"role": role, "content": content}
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            one["tool_calls"] = [
                {
                    "type": "function",
                    "id": f"call_{i}_{j}",
                    "function": {
                        "name": str(c.get("function", {}).get("name", "")),
                        "arguments": json.dumps(c.get("function", {}).get("arguments", {})),
                    },
                }
                for j, c in enumerate(calls)
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
        out.append(one)
    return out


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """OpenAI's tool calls (arguments as a JSON string) as Ollama's (an object)."""
    out = []
    for c in calls if isinstance(calls, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            continue
        try:
            args = loads(fn.get("arguments") or "{}")
        except (ValueError, TypeError):
            args = {}
        out.append({"function": {"name": str(fn.get("name", "")), "arguments": args}})
    return out


def _durations(timings: Any, total_ns: int) -> dict[str, Any]:
    t = timings if isinstance(timings, dict) else {}

    def count(key: str) -> int:
        v = t.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    def ns(key: str) -> int:
        v = t.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12
        return int(v * 1e6) if ok else 0

    return {
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": count("prompt_n"),
        "prompt_eval_duration": ns("prompt_ms"),
        "eval_count": count("predicted_n"),
        "eval_duration": ns("predicted_ms"),
    }


class Upstream:
    """The router, reached as the board's own client (serve_client.Api's connection)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def open(self, path: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, Any]:
        conn = self.api._conn(UPSTREAM_TIMEOUT_S)
        try:
            conn.request("POST", path, json.dumps(body).encode(), self.api._headers())
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise ApiError(
                500, f"the model server is not answering ({type(err).__name__})"
            ) from None
        if resp.status != 200:
            data = resp.read(MAX_BODY)
            conn.close()
            raise ApiError(
                resp.status if resp.status in (400, 404) else 500,
                _upstream_error(data, resp.status),
            )
        return conn, resp


def _upstream_error(data: bytes, status: int) -> str:
    try:
        err = loads(data).get("error")
        text = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError, UnicodeDecodeError):
        text = None
    return clean_line(text if isinstance(text, str) else f"the model server answered {status}", 500)


def sse_events(resp: Any):
    """The JSON objects of an event stream, capped as serve_client caps them."""
    total = 0
    while True:
        line = resp.readline(MAX_LINE + 1)
        if not line:
            return
        total += len(line)
        if len(line) > MAX_LINE or total > MAX_STREAM:
            raise ApiError(500, "the model server's stream is over its size limit")
        text = line.rstrip(b"\r\n")
        if not text.startswith(b"data:"):
            continue
        value = text[5:].strip()
        if value == b"[DONE]":
            return
        try:
            event = loads(value)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(500, "the model server sent a malformed event") from None
        if isinstance(event, dict):
            if "error" in event:
                raise ApiError(500, _upstream_error(json.dumps(event).encode(), 500))
            yield event


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rocky-llm-ollama"
    sys_version = ""

    # --- plumbing ------------------------------------------------------------------------------

    def log_message(self, fmt: str, *args: Any) -> None:
        _log("ollama: " + (fmt % args))

    def _send(self, status: int, doc: Any, content_type: str = "application/json") -> None:
        data = doc if isinstance(doc, bytes) else (json.dumps(doc) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _line(self, doc: dict[str, Any]) -> None:
        data = (json.dumps(doc) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization", "")
        want = "Bearer " + self.server.api_key
        return hmac.compare_digest(got.encode("utf-8", "replace"), want.encode())

    def _body(self) -> Any:
        length = self.headers.get("Content-Length", "")
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(400, "send the body with a Content-Length")
        if not length.isdigit() or int(length) > MAX_REQUEST:
            raise ApiError(400 if not length.isdigit() else 413, "the body is missing or too large")
        data = self.rfile.read(int(length))
        if len(data) != int(length):
            raise ApiError(400, "the body ended early")
        try:
            return loads(data) if data else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "the body is not valid JSON") from None

    def _route(self, method: str) -> None:
        self._streaming = False  # one handler serves every request of a kept-alive connection
        path = self.path.split("?", 1)[0]
        if method in ("GET", "HEAD") and path == "/":
            self._send(200, b"Ollama is running", "text/plain; charset=utf-8")
            return
        if not self._authorized():
            self.close_connection = True  # the body is not read: never for a stranger
            self._send(401, {"error": "unauthorized: send Authorization: Bearer <API key>"})
            return
        routes = {
            ("GET", "/api/version"): lambda: self._send(200, {"version": VERSION}),
            ("GET", "/api/tags"): self.tags,
            ("GET", "/api/ps"): self.ps,
            ("POST", "/api/show"): self.show,
            ("POST", "/api/chat"): lambda: self.generate("chat"),
            ("POST", "/api/generate"): lambda: self.generate("generate"),
            ("POST", "/api/pull"): self.pull,
            ("DELETE", "/api/delete"): self.delete,
        }
        for route in OPENAI_ROUTES:
            routes[route] = lambda route=route: self.openai(*route)
        handler = routes.get(("GET" if method == "HEAD" else method, path))
        if handler is None:
            self.close_connection = True
            self._send(404, {"error": f"no such endpoint: {method} {clean_line(path, 100)}"})
            return
        if not self.server.slots.acquire(blocking=False):
            self._send(503, {"error": "too many requests at once; try again"})
            return
        try:
            handler()
        except ApiError as err:
            self._fail(err.status, str(err))
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except (ClientError, router.RouterError, OSError) as err:  # never a dropped connection
            _log(f"{self.command} {path}: {type(err).__name__}: {err}")
            self._fail(500, f"the request failed: {clean_line(str(err), 300)}")
        finally:
            self.server.slots.release()

    def _fail(self, status: int, message: str) -> None:
        if not getattr(self, "_streaming", False):
            self._send(status, {"error": message})
        else:  # Ollama's clients raise on a line with "error"
            self.close_connection = True
            self._line({"error": message})
            self._end_stream()

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._route("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._route("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    # --- endpoints ------------------------------------------------------------------------------

    def openai(self, method: str, path: str) -> None:
        """Ollama serves its OpenAI-compatible API on its own port too: the router's, relayed
        as it answers (streamed or not), with Ollama's model names (name:latest) accepted."""
        body = self._body() if method == "POST" else None
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            body["model"] = model_name(body["model"])
        conn = self.server.api._conn(UPSTREAM_TIMEOUT_S)
        try:
            data = None if body is None else json.dumps(body).encode()
            try:
                conn.request(method, path, data, self.server.api._headers())
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as err:
                why = f"the model server is not answering ({type(err).__name__})"
                raise ApiError(500, why) from None
            kind = resp.getheader("Content-Type") or ""
            self.send_response(resp.status)
            self.send_header("Content-Type", kind if kind in RELAYED_TYPES else "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._streaming, total = True, 0
            while chunk := resp.read1(65536):
                total += len(chunk)
                if total > MAX_STREAM:
                    self.close_connection = True  # cut off: the client sees a broken stream
                    return
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self._end_stream()
        finally:
            conn.close()

    def _model(self, body: dict[str, Any]) -> Model:
        ref = body.get("model") or body.get("name")
        if not isinstance(ref, str) or not ref:
            raise ApiError(400, "model is required")
        name = model_name(ref)
        try:
            return self.server.store().get(name)
        except StoreError:
            raise ApiError(404, f"model {name!r} not found, try pulling it first") from None

    def tags(self) -> None:
        self._send(200, {"models": [tag(m) for m in self.server.store().models()]})

    def _states(self) -> dict[str, str]:
        """Each of the router's models and its state (b9101: loaded, loading, unloaded...)."""
        try:
            listed = self.server.api.json_call("GET", "/models", None, 30)
        except Exception:  # noqa: BLE001 - any failure: nothing known to be loaded
            return {}
        data = listed.get("data") if isinstance(listed, dict) else None
        return {
            m["id"]: m["status"]["value"]
            for m in data or []
            if isinstance(m, dict) and isinstance(m.get("id"), str)
            and isinstance(m.get("status"), dict) and isinstance(m["status"].get("value"), str)
        }  # fmt: skip

    def ps(self) -> None:
        loaded = {name for name, state in self._states().items() if state == "loaded"}
        out = []
        for m in self.server.store().models():
            if m.name in loaded:
                out.append({**tag(m), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0})
        self._send(200, {"models": out})

    def show(self) -> None:
        body = checked(self._body(), "show")
        model = self._model(body)
        meta = metadata(model)
        det, info = details(model, meta)
        template = meta.get(TEMPLATE_KEY)
        self._send(200, {
            "license": model.license,
            "modelfile": f"# served by rocky-llm\nFROM {model.name}\n",
            "parameters": "",
            "template": template if isinstance(template, str) else "",
            "details": det,
            "model_info": info,
            "capabilities": capabilities(meta),
            "modified_at": _modified(model),
        })  # fmt: skip

    def generate(self, endpoint: str) -> None:
        body = checked(self._body(), endpoint)
        model = self._model(body)
        stream = body.get("stream", True) is not False
        req: dict[str, Any] = {"model": model.name, **_options(body.get("options"))}
        req.update(_format(body.get("format")))
        if endpoint == "chat":
            req["messages"] = _messages(body.get("messages") or [])
            if body.get("tools"):
                req["tools"] = body["tools"]
            path = "/v1/chat/completions"
        else:
            if body.get("images"):
                raise ApiError(400, "images are not supported: the served models are text only")
            prompt = body.get("prompt") or ""
            if body.get("raw"):
                req["prompt"] = prompt
                path = "/v1/completions"
            else:
                msgs = [{"role": "system", "content": body["system"]}] if body.get("system") else []
                req["messages"] = msgs + [{"role": "user", "content": prompt}]
                path = "/v1/chat/completions"
            if not prompt:  # Ollama: an empty prompt loads (keep_alive 0: unloads) the model
                reason = self._load_or_unload(model.name, body.get("keep_alive"))
                self._send(200, {"model": body["model"], "created_at": _now(), "response": "",
                                 "done": True, "done_reason": reason})  # fmt: skip
                return
        if endpoint == "chat" and not req["messages"]:
            reason = self._load_or_unload(model.name, body.get("keep_alive"))
            self._send(200, {"model": body["model"], "created_at": _now(),
                             "message": {"role": "assistant", "content": ""}, "done": True,
                             "done_reason": reason})  # fmt: skip
            return
        self._relay(endpoint, body["model"], path, req, stream)

    def _load_or_unload(self, name: str, keep_alive: Any) -> str:
        """Ollama's empty request: keep_alive 0 unloads the model (Open WebUI's unload button),
        anything else loads it. Returns Ollama's done_reason."""
        if not _unloads(keep_alive):
            self._load(name)
            return "load"
        try:
            self.server.api.json_call("POST", "/models/unload", {"model": name}, 120)
        except ClientError as err:
            if "not running" not in str(err) and "not loaded" not in str(err):
                raise ApiError(500, f"the model server could not unload {name}: {err}") from None
        return "unload"

    def _load(self, name: str) -> None:
        """Load and return once it is loaded, as Ollama answers an empty request (b9101's
        /models/load answers while the child still starts)."""
        try:
            self.server.api.json_call("POST", "/models/load", {"model": name}, 600)
        except ClientError as err:
            if "already running" not in str(err):  # b9101's 400 for a loaded model
                raise ApiError(500, f"the model server could not load {name}: {err}") from None
        end = time.monotonic() + LOAD_TIMEOUT_S
        while (state := self._states().get(name)) != "loaded":
            if state == "failed" or time.monotonic() > end:
                raise ApiError(500, f"the model server could not load {name} (state: {state})")
            time.sleep(0.25)

    def _relay(
        self, endpoint: str, shown: str, path: str, req: dict[str, Any], stream: bool
    ) -> None:
        t0 = time.monotonic_ns()
        req.update(stream=True, stream_options={"include_usage": True})
        conn, resp = self.server.upstream.open(path, req)
        try:
            text, calls, finish, timings = [], [], None, None
            for event in sse_events(resp):
                if not getattr(self, "_streaming", False) and stream:
                    self._start_stream()
                    self._streaming = True
                timings = event.get("timings", timings)
                for choice in event.get("choices") or []:
                    if not isinstance(choice, dict):
                        continue
                    finish = choice.get("finish_reason") or finish
                    delta = choice.get("delta")
                    if isinstance(delta, dict):
                        piece = delta.get("content")
                    else:
                        piece = choice.get("text")
                    if isinstance(delta, dict) and delta.get("tool_calls"):
                        calls.extend(delta["tool_calls"])
                    if isinstance(piece, str) and piece:
                        text.append(piece)
                        if stream:
                            self._line(self._piece(endpoint, shown, piece))
            final = self._piece(endpoint, shown, "" if stream else "".join(text))
            if calls and endpoint == "chat":
                final["message"]["tool_calls"] = _tool_calls(_merge_calls(calls))
            final.update(done=True, done_reason="length" if finish == "length" else "stop")
            final.update(_durations(timings, time.monotonic_ns() - t0))
            if stream:
                if not getattr(self, "_streaming", False):
                    self._start_stream()
                    self._streaming = True
                self._line(final)
                self._end_stream()
            else:
                self._send(200, final)
        finally:
            conn.close()

    @staticmethod
    def _piece(endpoint: str, shown: str, text: str) -> dict[str, Any]:
        doc: dict[str, Any] = {"model": shown, "created_at": _now()}
        if endpoint == "chat":
            doc["message"] = {"role": "assistant", "content": text}
        else:
            doc["response"] = text
        doc["done"] = False
        return doc

    def pull(self) -> None:
        body = checked(self._body(), "pull")
        ref = body.get("model") or body.get("name")
        if not isinstance(ref, str) or not ref:
            raise ApiError(400, "model is required")
        missing = [k for k in ("url", "sha256", "license") if not body.get(k)]
        if missing:
            raise ApiError(400, (
                f"this board pulls only checked files: give {', '.join(missing)} with the model "
                "(POST /api/pull {\"model\": NAME, \"url\": GGUF URL, \"sha256\": HEX, "
                "\"license\": TEXT}) or run `sudo rocky-llm pull URL --sha256 HEX --license "
                "TEXT` on the board"
            ))  # fmt: skip
        name = model_name(ref)
        stream = body.get("stream", True) is not False
        last = [0.0]

        def progress(done: int, total: int | None) -> None:
            now = time.monotonic()
            if stream and total and (now - last[0] > 0.5 or done == total):
                last[0] = now
                self._line({"status": f"pulling {name}", "digest": f"sha256:{body['sha256']}",
                            "total": total, "completed": done})  # fmt: skip

        if stream:
            self._start_stream()
            self._streaming = True
            self._line({"status": "pulling manifest"})
        try:
            self.server.store().pull(name, body["url"], body["sha256"], body["license"],
                                     progress=progress)  # fmt: skip
        except StoreError as err:
            raise ApiError(400, str(err)) from None
        if stream:
            self._line({"status": "verifying sha256 digest"})
        self._changed(f"pull {name}")
        if stream:
            self._line({"status": "writing manifest"})
            self._line({"status": "success"})
            self._end_stream()
        else:
            self._send(200, {"status": "success"})

    def _changed(self, what: str) -> None:
        s = self.server
        _log(f"{what}: {router.sync(s.settings, s.api, s.settings_file)}")

    def delete(self) -> None:
        body = checked(self._body(), "delete")
        model = self._model(body)
        cut = router.drain(self.server.api, model.name) if model.pulled else ""
        if cut:
            _log(cut)
        try:
            self.server.store().remove(model.name)
        except StoreError as err:
            raise ApiError(400, str(err)) from None
        self._changed(f"delete {model.name}")
        self._send(200, {})


def _merge_calls(deltas: list[Any]) -> list[dict[str, Any]]:
    """Streamed tool-call fragments (by index) joined into whole calls."""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        if not isinstance(d, dict):
            continue
        i = d.get("index", 0) if isinstance(d.get("index"), int) else 0
        call = calls.setdefault(i, {"function": {"name": "", "arguments": ""}})
        fn = d.get("function") if isinstance(d.get("function"), dict) else {}
        call["function"]["name"] += str(fn.get("name") or "")
        call["function"]["arguments"] += str(fn.get("arguments") or "")
    return [calls[i] for i in sorted(calls)]


# A client that speaks plain HTTP to the TLS port (Ollama's default is http://host:11434) gets
# an answer it can show, instead of a connection closed without a word.
_PLAIN_BODY = (
    json.dumps({"error": "this port speaks HTTPS only: use https:// and the board's certificate "
                "(`rocky-llm info` on the board shows both)"}) + "\n"
).encode()  # fmt: skip
PLAIN_HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
    + f"Content-Length: {len(_PLAIN_BODY)}\r\n\r\n".encode()
    + _PLAIN_BODY
)
HTTP_METHODS = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC")


def _plain_http(sock: Any) -> bool:
    """Whether the first bytes are an HTTP request line rather than a TLS ClientHello."""
    first = sock.recv(4, socket.MSG_PEEK)
    return first in HTTP_METHODS


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, s: Settings, credentials: str, settings_file: str) -> None:
        self.settings, self.settings_file = s, settings_file
        self.api_key = read_api_key(credentials)
        self.api = router.local_api(s, credentials)
        self.upstream = Upstream(self.api)
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        lan = s.serve_listen == "lan"
        super().__init__(("0.0.0.0" if lan else "127.0.0.1", s.ollama_port), Handler)
        if lan:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(
                os.path.join(credentials, paths.TLS_CERT_NAME),
                os.path.join(credentials, paths.TLS_KEY_NAME),
            )
            self.tls = ctx
        else:
            self.tls = None

    def store(self):
        return router.store_for(self.settings)

    def get_request(self):
        sock, addr = super().get_request()
        sock.settimeout(CLIENT_TIMEOUT_S)
        return sock, addr

    def finish_request(self, request, client_address) -> None:
        # TLS is set up in the request's thread, so a slow client cannot hold up the others.
        if self.tls is not None:
            try:
                if _plain_http(request):
                    request.sendall(PLAIN_HTTP_ANSWER)
                    return
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)


def serve_forever(s: Settings, credentials: str, settings_file: str = paths.LLM_SETTINGS) -> int:
    server = Server(s, credentials, settings_file)
    scheme = "https" if server.tls else "http"
    _log(f"Ollama API on {scheme}://{server.server_address[0]}:{server.server_address[1]}")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
