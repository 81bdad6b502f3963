"""`rocky-vulkan cluster pair`: the owner pairs the boards of `cluster:` with one command.

Each board makes its own WireGuard key at its first boot (no secret is in the image). This logs
in to every board over SSH, as `rocky-vulkan board` does, asks it for its public key, then gives
each board the keys and LAN addresses of the boards it talks to: a worker the head's only, the
head every worker's. The boards restart their link and what uses it; workers first, so that the
head's server finds them answering.

A board's WireGuard endpoint is the address this computer reached it at over SSH (the board's
side of SSH_CONNECTION), so it must be an IPv4 address on the boards' LAN; `--endpoint
NAME=IPV4` gives another. Everything a board sends back is hostile: bounded, matched by exact
pattern, and checked to come from the board named (a host answering for another board is
refused before any board is changed).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import shlex
from dataclasses import dataclass

from rocky_selftest import cluster as cl

from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.board import (
    COMMAND_TIMEOUT_S,
    HOST_FORMS,
    BoardError,
    SshOptions,
    Target,
    _port,
    _seconds,
    _shown,
    parse_target,
    remote,
)
from rocky_vulkan.host.result_doc import clean_text

MAX_ANSWER_BYTES = 4 << 10
# Root needs no sudo; image.user's sudo asks nothing of a keys-only user (-n: never a prompt).
AS_ROOT = 'S=; [ "$(id -u)" -eq 0 ] || S="sudo -n"; '
KEY_COMMAND = AS_ROOT + '$S rocky-llm cluster key --json && echo "ssh $SSH_CONNECTION"'
SSH_CONNECTION_RE = re.compile(r"ssh (\S{1,64}) ([0-9]{1,5}) (\S{1,64}) ([0-9]{1,5})")


class PairError(UserError):
    """A board could not be paired; nothing was changed on any board if it came before."""


@dataclass(frozen=True)
class Member:
    name: str
    target: Target
    public_key: str
    endpoint: str  # IPv4 on the boards' LAN


def _name_value(text: str, what: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not cl.HOSTNAME_RE.fullmatch(name) or not value:
        raise PairError(f"--{what} {_shown(text)}: expected NAME={what.upper()}, NAME a board")
    return name, value


def targets(cluster, default_user: str, boards: list[str]) -> dict[str, Target]:
    """Each board's SSH target: --board NAME=HOST, else NAME.local (mDNS)."""
    given = dict(_name_value(b, "board") for b in boards)
    unknown = sorted(set(given) - set(cluster.members))
    if unknown:
        raise PairError(
            f"--board {', '.join(unknown)}: not a board of cluster: ({', '.join(cluster.members)})"
        )
    return {n: parse_target(given.get(n, f"{n}.local"), default_user) for n in cluster.members}


def parse_key_answer(name: str, target: Target, out: bytes) -> tuple[str, str]:
    """(public key, the board's address as SSH saw it) from KEY_COMMAND's output."""
    lines = out.decode("utf-8", "replace").splitlines()
    where = f"{target.host} (board {name})"
    try:
        doc = json.loads(lines[0]) if len(lines) == 2 else None
    except ValueError:
        doc = None
    seen = SSH_CONNECTION_RE.fullmatch(lines[1]) if doc is not None else None
    if not isinstance(doc, dict) or set(doc) != {"board", "public_key"} or seen is None:
        shown = clean_text(" | ".join(lines[:3]), 200)
        raise PairError(
            f"{where} did not answer as a rocky-llm board does ({shown!r}). Fix: flash it with "
            "an image built with cluster: in rocky-vulkan.yaml"
        )
    if doc["board"] != name:
        raise PairError(
            f"{where} says it is board {clean_text(str(doc['board']), 64)!r}, not {name!r}: "
            f"another board answers at that address. Fix: give --board {name}=ITS_ADDRESS"
        )
    key = doc["public_key"]
    if not isinstance(key, str) or not cl.KEY_RE.fullmatch(key):
        raise PairError(f"{where} sent no WireGuard public key ({clean_text(str(key), 60)!r})")
    return key, seen.group(3)


def lan_endpoint(name: str, seen: str, given: str | None) -> str:
    """The board's WireGuard endpoint: --endpoint, else where SSH reached it (IPv4 only)."""
    text = given if given is not None else seen
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        ip = None
    if ip is None or ip.version != 4 or ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        how = "--endpoint gives" if given is not None else "SSH reached it at"
        raise PairError(
            f"board {name}: {how} {clean_text(text, 64)!r}, not an IPv4 address the other "
            f"boards can reach. Fix: give --endpoint {name}=IPV4 (its LAN address, "
            "`ip -br addr` on the board)"
        )
    return str(ip)


def peers_of(cluster, name: str, members: dict[str, Member]) -> dict[str, dict[str, str]]:
    """What board `name` keeps: a worker knows the head only, the head every worker."""
    others = cluster.workers if name == cluster.head else (cluster.head,)
    return {o: {"public_key": members[o].public_key, "endpoint": members[o].endpoint}
            for o in others}  # fmt: skip


def _ask(target: Target, command: str, opts: SshOptions, timeout: float, what: str) -> bytes:
    res = remote(target, command, opts, MAX_ANSWER_BYTES, timeout)
    if res.rc != 0 or res.overflow:
        said = res.err.splitlines()[-1] if res.err else "no message"
        raise PairError(
            f"{target.host}: {what} failed (exit {res.rc}): {said}. Fix: check on the board "
            f"with `ssh {target.ssh_dest} rocky-llm cluster status`; {target.user} needs sudo"
        )
    return res.out


def pair(cfg, boards: list[str], endpoints: list[str], opts: SshOptions,
         timeout: float = COMMAND_TIMEOUT_S, say=print) -> int:  # fmt: skip
    cluster = cl.parse(cfg.cluster) if cfg.cluster else None
    if cluster is None:
        raise PairError(
            "rocky-vulkan.yaml has no cluster: (head, workers, subnet): nothing to pair; "
            "see docs/user/cluster.md"
        )
    where = targets(cluster, cfg.image.user, boards)
    given = dict(_name_value(e, "endpoint") for e in endpoints)
    unknown = sorted(set(given) - set(cluster.members))
    if unknown:
        raise PairError(f"--endpoint {', '.join(unknown)}: not a board of cluster:")
    members: dict[str, Member] = {}
    for name, target in where.items():  # every key first: a failure here changes nothing
        out = _ask(target, KEY_COMMAND, opts, timeout, "`rocky-llm cluster key`")
        key, seen = parse_key_answer(name, target, out)
        endpoint = lan_endpoint(name, seen, given.get(name))
        members[name] = Member(name, target, key, endpoint)
        say(f"{name}: key {key} at {endpoint} ({cluster.address(name)} on the link)")
    for name in (*cluster.workers, cluster.head):
        target = members[name].target
        doc = json.dumps(peers_of(cluster, name, members), sort_keys=True)
        command = f"{AS_ROOT}printf '%s' {shlex.quote(doc)} | $S rocky-llm cluster peers"
        out = _ask(target, command, opts, timeout, "`rocky-llm cluster peers`")
        for line in out.decode("utf-8", "replace").splitlines()[-4:]:
            say(f"{name}: {clean_text(line, 200)}")
    head = members[cluster.head].target.ssh_dest
    say(f"paired: {cluster.head} serves with {', '.join(cluster.workers)}; "
        f"`ssh {head} rocky-llm cluster status` shows the link")  # fmt: skip
    return 0


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    opts = SshOptions(port=args.ssh_port, config=args.ssh_config)
    try:
        return pair(cfg, args.board or [], args.endpoint or [], opts, timeout=args.timeout)
    except (BoardError, cl.ClusterError) as err:
        raise PairError(str(err)) from None


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cluster", help="the boards of cluster: (see docs/user/cluster.md)")
    csub = parser.add_subparsers(dest="cluster_command", required=True)
    p = csub.add_parser(
        "pair",
        help="over SSH: exchange the boards' WireGuard keys, start their link",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--board", action="append", metavar="NAME=HOST",
                   help="reach board NAME at HOST (default NAME.local); HOST: "
                   + HOST_FORMS.replace("%", "%%"))  # fmt: skip
    p.add_argument("--endpoint", action="append", metavar="NAME=IPV4",
                   help="board NAME's LAN address for the other boards (default: where SSH "
                   "reached it)")  # fmt: skip
    p.add_argument("--ssh-port", type=_port, help="the boards' SSH port (default: ssh's)")
    p.add_argument("--ssh-config", help="an ssh config file to use (ssh -F)")
    p.add_argument("--timeout", type=_seconds, default=COMMAND_TIMEOUT_S,
                   help="seconds for each command on a board (default: %(default)s)")  # fmt: skip
    p.set_defaults(func=_run)
