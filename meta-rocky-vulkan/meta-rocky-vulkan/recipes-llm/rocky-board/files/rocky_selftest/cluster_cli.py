"""`rocky-llm cluster ...`: this board's part in a cluster (cluster.py).

- `key` (root, rocky-cluster-link.service): make the board's WireGuard key when missing; print
  its public key (what the owner's `rocky-vulkan cluster pair` collects);
- `peers` (root): the other boards' public keys and endpoints, as JSON on stdin, checked and
  kept for the next `up`;
- `up` (root, rocky-cluster-link.service): the WireGuard link (a worker's in its RPC namespace);
- `worker` (rocky-rpc.service, inside that namespace): exec rpc-server on the GPU;
- `role` (rocky-rpc.service's ExecCondition): head, worker or none;
- `status`: the role, the address, the peers and which workers answer;
- `bench` (root, head, server stopped): prefill and decode alone and with the workers
  (cluster_bench.py), kept for serve.model's settings (model_placement.py);
- `stale`, `watch` (head, rocky-cluster-watch.service): whether the server's workers still
  answer; restart the server when they changed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from . import cluster as cl
from . import paths
from .files import UnreadableFile, read_json
from .settings import Settings, load_settings
from .terminal import LOG_LINE_CHARS, clean_line


def _say(text: str, out=sys.stdout) -> None:
    print(clean_line(text, LOG_LINE_CHARS), file=out)


def _cluster(s: Settings) -> cl.Cluster:
    c = cl.parse(s.cluster)
    if c is None:
        raise cl.ClusterError("no cluster in rocky-vulkan.yaml (cluster: head, workers, subnet)")
    if c.role(s.board_name) is None:
        raise cl.ClusterError(
            f"this board ({s.board_name}) is neither the head nor a worker of the cluster "
            f"({c.head}: {', '.join(c.workers)}); set its hostname or fix cluster: in the config"
        )
    return c


def cmd_key(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    key = cl.ensure_key(_cluster(s))
    # --json: what `rocky-vulkan cluster pair` reads; the board's name lets it refuse a host
    # that answers for another board.
    print(json.dumps({"board": s.board_name, "public_key": key}) if args.json else key)
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    c = _cluster(s)
    raw = sys.stdin.read(cl.PEERS_MAX_BYTES + 1)
    if len(raw) > cl.PEERS_MAX_BYTES:
        raise cl.ClusterError(f"peers: more than {cl.PEERS_MAX_BYTES} bytes on stdin")
    try:
        peers = json.loads(raw)
    except ValueError as err:
        raise cl.ClusterError(f"peers: not JSON ({err})") from None
    cl.save_peers(c, s.board_name, peers)
    _say(f"peers of {s.board_name} kept: {', '.join(sorted(peers))}")
    if not os.path.isdir("/run/systemd/system"):
        _say("systemd is not running here: start the link with `rocky-llm cluster up`")
        return 0
    # The new peers take effect now: the link is remade, and what uses it restarts (a head's
    # server asks the workers again; a worker's rpc-server binds its address on the new link).
    units = cl.UNITS[c.role(s.board_name)]
    try:
        proc = subprocess.run(["systemctl", "restart", *units], capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise cl.ClusterError(f"systemctl restart {' '.join(units)}: {err}") from None
    if proc.returncode != 0:
        raise cl.ClusterError(
            f"systemctl restart {' '.join(units)} failed: {clean_line(proc.stderr, 300)}; "
            f"see `journalctl -u {units[0]}`"
        )
    _say(f"restarted {' '.join(units)}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    c = _cluster(s)
    cl.ensure_key(c)
    for done in cl.link_up(c, s.board_name):
        _say(f"+ {done}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    c = _cluster(s)
    if c.role(s.board_name) != "worker":
        raise cl.ClusterError(f"{s.board_name} is the cluster's head, not a worker")
    argv = cl.rpc_server_argv(c, s.board_name, s.tool("rpc-server"), s.gpu_device)
    _say("exec " + " ".join(argv))
    sys.stdout.flush()
    os.execve(argv[0], argv, {**os.environ, **s.env})
    return 1  # not reached


def cmd_bench(args: argparse.Namespace) -> int:
    """The head alone and with its workers, kept for serve.model's settings (model_placement,
    kind "cluster"); the server must be stopped (it holds the GPU's memory)."""
    from .cluster_bench import bench, summary, works
    from .model_placement import not_writable, save, server_in_the_way
    from .router import store_for

    s = load_settings(args.config)
    c = _cluster(s)
    if c.role(s.board_name) != "head":
        raise cl.ClusterError(f"{s.board_name} is a worker: run `cluster bench` on {c.head}")
    busy = server_in_the_way(s, "rocky-llm cluster bench")
    busy = busy or not_writable(s, "cluster", "rocky-llm cluster bench")
    if busy:
        _say(f"rocky-llm: {busy}", sys.stderr)
        return 2
    model = store_for(s).get(s.serve_model_name)
    doc = bench(s, c, args.ubatch, log=lambda text: _say(text, sys.stderr))
    print(json.dumps(doc, indent=1) if args.json else summary(doc))
    if not works(doc):
        _say("nothing saved: the server keeps what the self-test measured", sys.stderr)
        return 1
    path = save(s, model, doc, "cluster")
    _say(f"saved in {path}: {model.name}'s settings use it from the server's next start",
         sys.stderr)  # fmt: skip
    return 0


def _used_workers(settings_file: str) -> list[str] | None:
    """The running server's workers, from the settings it wrote; None when it wrote none."""
    try:
        return cl.plan_workers(read_json(settings_file, 1 << 20))
    except (FileNotFoundError, UnreadableFile):
        return None


def cmd_stale(args: argparse.Namespace) -> int:
    """Exit 1 when the server's plan no longer matches the workers that answer, saying why."""
    s = load_settings(args.config)
    c = _cluster(s)
    used = _used_workers(args.settings_file)
    if used is None:
        raise cl.ClusterError(f"no server settings at {args.settings_file}: is rocky-llm running?")
    why = cl.stale(c, used)
    _say(why or f"the server's workers answer ({', '.join(used) or 'none used'})")
    return 1 if why else 0


def cmd_watch(args: argparse.Namespace) -> int:
    """rocky-cluster-watch.service on the head: restart the server when its plan is stale on two
    probes in a row, so it plans again with the workers that answer; then give it time."""
    s = load_settings(args.config)
    c = _cluster(s)
    if c.role(s.board_name) != "head":
        raise cl.ClusterError(f"{s.board_name} is a worker: only the head watches")
    strikes = 0
    while True:
        used = _used_workers(args.settings_file)
        why = cl.stale(c, used) if used is not None else None
        strikes = strikes + 1 if why else 0
        if strikes >= 2:
            _say(f"restarting {cl.SERVER_UNIT}: {why}")
            sys.stdout.flush()
            try:
                subprocess.run(["systemctl", "restart", cl.SERVER_UNIT], timeout=300, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                _say(f"systemctl restart {cl.SERVER_UNIT}: {err}")
            strikes = 0
            time.sleep(args.settle)  # the new server plans, loads and writes its settings
        time.sleep(args.interval)


def cmd_role(args: argparse.Namespace) -> int:
    """This board's role; with --is ROLE, exit 0 when it is that (systemd's ExecCondition=),
    1 when not."""
    s = load_settings(args.config)
    c = cl.parse(s.cluster)
    role = (c.role(s.board_name) if c else None) or "none"
    if args.is_role:
        return 0 if role == args.is_role else 1
    print(role)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    s = load_settings(args.config)
    c = _cluster(s)
    me = s.board_name
    _say(f"{me}: {c.role(me)} at {c.address(me)} on {c.interface} (WireGuard port {c.wg_port})")
    try:
        for host, peer in sorted(cl.load_peers(c, me).items()):
            _say(f"  peer {host} {c.address(host)} key {peer['public_key']} at {peer['endpoint']}")
    except cl.ClusterError as err:
        _say(f"  {err}")
    if c.role(me) == "head":
        up, down = cl.reachable(c.rpc_endpoints())
        for ep in up:
            _say(f"  rpc-server {ep}: answers")
        for why in down:
            _say(f"  rpc-server {why}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="this board's part in a cluster of boards (WireGuard, RPC)")
    csub = p.add_subparsers(dest="cluster_command", required=True)
    for name, func, text in (
        ("peers", cmd_peers, "(root) the other boards' keys and endpoints, JSON on stdin"),
        ("up", cmd_up, "(root) make the WireGuard link"),
        ("worker", cmd_worker, "exec rpc-server on the GPU (rocky-rpc.service)"),
        ("status", cmd_status, "role, address, peers, which workers answer"),
    ):
        csub.add_parser(name, help=text).set_defaults(func=func)
    key = csub.add_parser("key", help="(root) make this board's key if missing; print it")
    key.add_argument("--json", action="store_true", help="as JSON, with the board's name")
    key.set_defaults(func=cmd_key)
    bench = csub.add_parser(
        "bench",
        help="(root, head) prefill and decode alone and with the workers; kept for the server",
    )
    bench.add_argument("--ubatch", type=int, default=512, choices=(64, 128, 256, 512, 1024),
                       help="llama-bench -ub (default: %(default)s)")  # fmt: skip
    bench.add_argument("--json", action="store_true", help="every run, as JSON")
    bench.set_defaults(func=cmd_bench)
    stale = csub.add_parser("stale", help="(head) exit 1 if the server's workers changed")
    stale.add_argument("--settings-file", default=paths.LLM_SETTINGS, help="default: %(default)s")
    stale.set_defaults(func=cmd_stale)
    watch = csub.add_parser("watch", help="(head) restart the server when its workers change")
    watch.add_argument("--settings-file", default=paths.LLM_SETTINGS, help="default: %(default)s")
    watch.add_argument("--interval", type=float, default=10.0, help="seconds between probes")
    watch.add_argument("--settle", type=float, default=60.0, help="seconds after a restart")
    watch.set_defaults(func=cmd_watch)
    role = csub.add_parser("role", help="head, worker or none; --is ROLE: exit 0 if so, else 1")
    role.add_argument("--is", dest="is_role", choices=("head", "worker", "none"))
    role.set_defaults(func=cmd_role)
