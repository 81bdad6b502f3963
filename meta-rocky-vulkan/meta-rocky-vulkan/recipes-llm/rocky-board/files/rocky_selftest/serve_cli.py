"""`rocky-llm`: the board's OpenAI-compatible server and its models.

- `serve` (rocky-llm.service, as the unprivileged user rocky-llm): derive every model's settings
  from the board's measurements, record them with their reasons (journal and settings.json),
  write the router's presets, then exec llama-server in router mode;
- `settings`: the same derivation, printed, nothing started;
- `pull`, `list`, `use`, `rm` (pull, use and rm as root): the model store (model_store.py); the
  running server is told of each change;
- `place NAME` (root, the server stopped): the placement step's measurements for that model
  (model_placement.py), used for its settings at the server's next start;
- `ollama` (rocky-llm-ollama.service): the Ollama-compatible API in front of the server;
- `keys` (root, rocky-llm-keys.service): make the per-board API key and TLS certificate when
  missing; `rotate-key` (root): a new API key, then restart the server;
- `info` (the login user): the URL, the certificate's fingerprint, the key, the settings;
- `cluster ...`: this board's part in a cluster of boards (cluster_cli.py).
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import socket
import subprocess
import sys
from typing import Any

from . import cluster_cli, model_placement, paths, router
from .cluster import ClusterError
from .files import read_json
from .model_store import Store, StoreError, name_from_source
from .serve_keys import ServeKeyError, cert_fingerprint, make_missing, read_api_key, write_api_key
from .serve_settings import write_plan
from .settings import DEFAULT_CONFIG, SettingsError, load_settings
from .terminal import LOG_LINE_CHARS, clean_line

UNIT = "rocky-llm.service"


def _clean(text: str) -> str:
    """Data shown as text: no terminal control characters."""
    return clean_line(text, LOG_LINE_CHARS)


def _print_plan(plan: dict[str, Any], out=sys.stdout) -> None:
    """The router's plan: the default model, models_max, then each model's settings."""
    print(_clean(f"default model: {plan['default']}"), file=out)
    item = plan["models_max"]
    print(_clean(f"models loaded at once: {item['value']} ({item['reason']})"), file=out)
    for model, p in plan["models"].items():
        print(_clean(f"[{model}]"), file=out)
        for name, item in p["settings"].items():
            print(_clean(f"  {name}: {item['value']} ({item['reason']})"), file=out)
    for warning in plan["warnings"]:
        print(_clean(f"WARNING: {warning}"), file=out)


def cmd_serve(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    if s.serve_listen == "off":
        print("serve.listen is off in rocky-vulkan.yaml: no server", file=sys.stderr)
        return 0
    credentials = args.credentials or os.environ.get("CREDENTIALS_DIRECTORY", "")
    if not credentials:
        print("no credentials: run under rocky-llm.service (LoadCredential=)", file=sys.stderr)
        return 2
    plan = router.plan(s)
    router.write_presets(s, plan)
    argv, env = router.command(s, plan, credentials)
    plan["command"] = argv
    plan["environment"] = env
    _print_plan(plan)
    try:
        write_plan(args.settings_file, plan)
    except OSError as err:  # the server still starts; the journal has the settings
        print(_clean(f"could not record {args.settings_file}: {err}"), file=sys.stderr)
    print(_clean("exec " + " ".join(argv)), flush=True)
    os.execve(argv[0], argv, {**os.environ, **env})
    return 1  # not reached


def cmd_settings(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    plan = router.plan(s)
    argv, env = router.command(s, plan, args.credentials or "$CREDENTIALS_DIRECTORY")
    plan.update(command=argv, environment=env, presets=router.preset_ini(plan))
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        _print_plan(plan)
    return 0


def _store(s) -> Store:
    return router.store_for(s)


def _server_api(s, args: argparse.Namespace):
    """The running server as this board's client, or None (off, or its key unreadable)."""
    if s.serve_listen == "off":
        return None
    try:
        return router.local_api(s, args.key_dir)
    except (ServeKeyError, OSError) as err:
        print(_clean(f"cannot reach the server ({err})"), file=sys.stderr)
        return None


def _tell_server(s, args: argparse.Namespace, api=None) -> None:
    api = api or _server_api(s, args)
    print(_clean(router.sync(s, api, args.settings_file)))


class _Progress:
    """A line per 5 % on stderr (the journal and `ssh board rocky-llm pull` stay readable)."""

    def __init__(self) -> None:
        self.shown = -1

    def __call__(self, done: int, total: int | None) -> None:
        if not total:
            return
        step = done * 20 // total
        if step != self.shown:
            self.shown = step
            print(f"  {done * 100 // total:3d} %  {done} of {total} bytes", file=sys.stderr)


def cmd_pull(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    name = args.name or name_from_source(args.source)
    source = args.source
    if "://" not in source:
        source = os.path.abspath(source)
    model = _store(s).pull(name, source, args.sha256, args.license, progress=_Progress())
    print(_clean(f"{model.name}: {model.size} bytes, sha256 {model.sha256}, checked"))
    _tell_server(s, args)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    store = _store(s)
    default = store.default() or s.serve_model_name
    for m in store.models():
        mark = "*" if m.name == default else " "
        size = f"{m.size / (1 << 30):6.2f} GiB"
        print(_clean(f"{mark} {m.name:32} {size}  {m.source}  licence: {m.license}"))
    print("* the default model (`rocky-llm use NAME`); every model is served by its name")
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    model = _store(s).use(args.name)
    print(_clean(f"{model.name} is the default model: loaded at start, first in the list"))
    _tell_server(s, args)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    store = _store(s)
    api = _server_api(s, args)
    if store.get(args.name).pulled:  # (the image's models stay: remove says so below)
        cut = router.drain(api, args.name)  # its requests in flight finish first
        if cut:
            print(_clean(cut), file=sys.stderr)
    model = store.remove(args.name)
    model_placement.remove(s, model.name)
    print(_clean(f"removed {model.name} ({model.size} bytes)"))
    _tell_server(s, args, api)
    return 0


def cmd_place(args: argparse.Namespace) -> int:
    """Measure where NAME runs fastest; the server must be stopped: it holds memory and the GPU,
    and its requests would share the timings."""
    from .outcome import peek_result

    s = load_settings(args.config)
    model = _store(s).get(args.name)
    command = f"rocky-llm place {model.name}"
    busy = model_placement.server_in_the_way(s, command)
    busy = busy or model_placement.not_writable(s, "placement", command)
    if busy:
        print(f"rocky-llm: {busy}", file=sys.stderr)
        return 2
    check, section = model_placement.measure(
        s, model, peek_result(s.results_dir), log=lambda text: print(_clean(text), file=sys.stderr)
    )
    if check.status != "PASS" or not section:
        print(_clean(f"{check.status} {model.name}: {check.evidence}; nothing saved"))
        return 1
    path = model_placement.save(s, model, section)
    print(_clean(f"{model.name}: {check.evidence}; saved in {path}, used from the server's start"))
    return 0


def cmd_ollama(args: argparse.Namespace) -> int:
    from .ollama_api import serve_forever

    s = load_settings(args.config)
    if s.serve_listen == "off":
        print("serve.listen is off in rocky-vulkan.yaml: no Ollama API", file=sys.stderr)
        return 0
    credentials = args.credentials or os.environ.get("CREDENTIALS_DIRECTORY", "")
    if not credentials:
        print("no credentials: run under rocky-llm-ollama.service", file=sys.stderr)
        return 2
    return serve_forever(s, credentials, args.settings_file)


def _group_gid(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ServeKeyError(f"group {name!r} does not exist; check image.user") from None


def cmd_keys(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    made = make_missing(
        args.key_dir, socket.gethostname(), _group_gid(args.group), tls=s.serve_listen == "lan"
    )
    print("made: " + ", ".join(made) if made else "keys present: nothing to do")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    write_api_key(args.key_dir, _group_gid(args.group))
    print("new API key written; `rocky-llm info` shows it. Restarting the server.")
    if not args.no_restart:
        res = subprocess.run(["systemctl", "try-restart", UNIT], timeout=120)
        if res.returncode != 0:
            print(f"systemctl try-restart {UNIT} failed: restart it by hand", file=sys.stderr)
            return 1
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    if s.serve_listen == "off":
        print("The server is off (serve.listen: off in rocky-vulkan.yaml).")
        return 0
    host = socket.gethostname()
    if s.serve_listen == "lan":
        print(_clean(f"API:  https://{host}.local:{s.serve_port}/v1  (web UI: the same, /)"))
        cert = os.path.join(args.key_dir, paths.TLS_CERT_NAME)
        try:
            print(_clean(f"TLS certificate SHA-256 fingerprint: {cert_fingerprint(cert)}"))
        except ServeKeyError as err:
            print(_clean(f"TLS certificate: {err}"))
    else:
        print(_clean(f"API:  http://127.0.0.1:{s.serve_port}/v1 on the board only"))
    if not args.short:
        try:
            print(f"API key: {read_api_key(args.key_dir)}")
        except ServeKeyError as err:
            print(_clean(f"API key: {err}"))
    try:
        # Written by the server's user, read at every login: never a FIFO, never unbounded.
        plan = read_json(args.settings_file, 1 << 20)
        if args.short:
            for warning in plan["warnings"]:
                print(_clean(f"WARNING: {warning}"))
            default = plan["default"]
            placement = plan["models"][default]["settings"]["placement"]["value"]
            print(
                _clean(f"Serving {default} (and {len(plan['models']) - 1} more) on the {placement}")
            )
        else:
            print(_clean(f"Settings (from {args.settings_file}):"))
            _print_plan(plan)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(_clean(f"No settings yet ({err}): the server has not started."))
    if args.short:
        print("`rocky-llm info` shows the API key.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocky-llm", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="default: %(default)s")
    parser.add_argument("--key-dir", default=paths.LLM_KEY_DIR, help="default: %(default)s")
    parser.add_argument("--settings-file", default=paths.LLM_SETTINGS, help="default: %(default)s")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="derive the settings, record them, exec llama-server")
    settings = sub.add_parser("settings", help="print the settings and the command, start nothing")
    settings.add_argument("--json", action="store_true")
    for p in (serve, settings):
        p.add_argument("--credentials", help="default: $CREDENTIALS_DIRECTORY")
    keys = sub.add_parser("keys", help="(root) make the API key and TLS certificate if missing")
    rotate = sub.add_parser("rotate-key", help="(root) a new API key, then restart the server")
    rotate.add_argument("--no-restart", action="store_true")
    for p in (keys, rotate):
        p.add_argument("--group", help="the login user's group, which may read the API key")
    info = sub.add_parser("info", help="URL, certificate fingerprint, API key, settings")
    info.add_argument("--short", action="store_true", help="URL, fingerprint, warnings only")
    pull = sub.add_parser("pull", help="(root) fetch a GGUF model (URL or local file), checked")
    pull.add_argument("source", help="an https URL of the .gguf file, or its path on the board")
    pull.add_argument("--sha256", required=True, help="the file's sha256 (64 hex digits)")
    pull.add_argument("--license", required=True, help="the model's licence, as you accept it")
    pull.add_argument("--name", help="its name here (default: from the file name)")
    sub.add_parser("list", help="the models: the image's and the pulled ones")
    use = sub.add_parser("use", help="(root) make NAME the default model")
    rm = sub.add_parser("rm", help="(root) remove a pulled model")
    place = sub.add_parser(
        "place", help="(root, server stopped) measure where NAME runs fastest (GPU, CPU, ...)"
    )
    for p in (use, rm, place):
        p.add_argument("name")
    ollama = sub.add_parser("ollama", help="the Ollama-compatible API (rocky-llm-ollama.service)")
    ollama.add_argument("--credentials", help="default: $CREDENTIALS_DIRECTORY")
    cluster_cli.register(sub)
    for p, func in ((pull, cmd_pull), (use, cmd_use), (rm, cmd_rm), (place, cmd_place),
                    (ollama, cmd_ollama)):  # fmt: skip
        p.set_defaults(func=func)
    sub.choices["list"].set_defaults(func=cmd_list)
    serve.set_defaults(func=cmd_serve)
    settings.set_defaults(func=cmd_settings)
    keys.set_defaults(func=cmd_keys)
    rotate.set_defaults(func=cmd_rotate)
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SettingsError, ServeKeyError, StoreError, router.RouterError, ClusterError) as err:
        print(_clean(f"rocky-llm: {err}"), file=sys.stderr)
        return 2
    except OSError as err:
        print(_clean(f"rocky-llm: {err}"), file=sys.stderr)
        return 3
