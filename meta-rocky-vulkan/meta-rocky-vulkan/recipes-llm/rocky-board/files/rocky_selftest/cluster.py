"""Several boards, one model: llama.cpp's RPC backend over WireGuard.

rpc-server has no authentication and must never face an open network, so the boards of a
cluster talk only through a WireGuard link: each board makes its own key at first boot (nothing
secret is in the image), the owner hands each board the others' public keys (`rocky-vulkan
cluster pair`), a worker knows the head alone and the head knows its workers. A worker's
WireGuard interface is moved into a network namespace of its own, where rpc-server runs: that
interface and loopback are all it can listen on, and only the head's key gets packets into it.
The head's llama-server reaches each worker's rpc-server at its cluster address.
"""

from __future__ import annotations

import binascii
import ipaddress
import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from . import paths
from .files import UnreadableFile, read_json, read_text
from .results import write_atomic

# A WireGuard key: 32 bytes in base64 (44 characters, the last one "=").
KEY_RE = re.compile(r"[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=")
HOSTNAME_RE = re.compile(r"(?=.{1,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?")
ENDPOINT_HOST_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
IFNAME_RE = re.compile(r"[a-z][a-z0-9]{0,14}")
NETNS_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")
MAX_WORKERS = 8
OPENSSL_TIMEOUT_S = 60
PEERS_MAX_BYTES = 64 << 10
# An X25519 private key in PKCS#8 DER is this prefix and the 32 raw bytes (RFC 8410).
X25519_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b656e04220420")
KEY_NAME = "wg.key"
PUBLIC_NAME = "wg.pub"
PEERS_NAME = "peers.json"
# What a board restarts when its peers change: the link first, then what uses it.
SERVER_UNIT = "rocky-llm.service"
UNITS = {
    "head": ("rocky-cluster-link.service", SERVER_UNIT, "rocky-cluster-watch.service"),
    "worker": ("rocky-cluster-link.service", "rocky-rpc.service"),
}
DEFAULTS = {
    "interface": "rkc0",
    "netns": "rocky-rpc",
    "wg_port": 51820,
    "rpc_port": 50052,
    "state_dir": paths.CLUSTER_STATE_DIR,
    "run_dir": "/run/rocky-cluster",
}
KNOWN = {"subnet", "head", "workers", *DEFAULTS}


class ClusterError(Exception):
    """A cluster setting, key or peer list is wrong, or the link could not be made; the
    message says what to do."""


@dataclass(frozen=True)
class Cluster:
    subnet: ipaddress.IPv4Network
    head: str
    workers: tuple[str, ...]
    interface: str
    netns: str
    wg_port: int
    rpc_port: int
    state_dir: str
    run_dir: str

    @property
    def members(self) -> tuple[str, ...]:
        return (self.head, *self.workers)

    def address(self, host: str) -> str:
        """The board's cluster address: the head .1, the workers .2 on, in config order."""
        return str(self.subnet.network_address + 1 + self.members.index(host))

    def role(self, host: str) -> str | None:
        if host == self.head:
            return "head"
        return "worker" if host in self.workers else None

    def rpc_endpoints(self) -> list[str]:
        return [f"{self.address(w)}:{self.rpc_port}" for w in self.workers]


def problem(value: Any) -> str | None:
    """What is wrong with the config's `cluster` object (empty: no cluster), else None."""
    if value == {}:
        return None
    try:
        parse(value)
    except ClusterError as err:
        return str(err)
    return None


def parse(value: Any) -> Cluster | None:
    if not isinstance(value, dict):
        raise ClusterError("an object with subnet, head and workers")
    if not value:
        return None
    unknown = sorted(set(value) - KNOWN)
    if unknown:
        raise ClusterError(f"an object without the unknown keys {unknown[:5]!r}")
    v = {**DEFAULTS, **value}
    head, workers = v.get("head"), v.get("workers")
    if not isinstance(head, str) or not HOSTNAME_RE.fullmatch(head):
        raise ClusterError("an object whose head is a hostname (a-z, 0-9, '-')")
    if not isinstance(workers, list) or not 1 <= len(workers) <= MAX_WORKERS:
        raise ClusterError(f"an object with 1 to {MAX_WORKERS} workers")
    for w in workers:
        if not isinstance(w, str) or not HOSTNAME_RE.fullmatch(w):
            raise ClusterError("an object whose workers are hostnames (a-z, 0-9, '-')")
    if len(set(workers) | {head}) != len(workers) + 1:
        raise ClusterError("an object naming each board once (head and workers)")
    try:
        subnet = ipaddress.IPv4Network(str(v.get("subnet")), strict=True)
    except ValueError:
        raise ClusterError("an object whose subnet is an IPv4 network like 10.77.0.0/24") from None
    if not subnet.is_private or subnet.num_addresses < len(workers) + 3:
        raise ClusterError("an object whose subnet is private and holds every board")
    if not isinstance(v["interface"], str) or not IFNAME_RE.fullmatch(v["interface"]):
        raise ClusterError("an object whose interface is 1-15 of a-z, 0-9 (a letter first)")
    if not isinstance(v["netns"], str) or not NETNS_RE.fullmatch(v["netns"]):
        raise ClusterError("an object whose netns is 1-31 of a-z, 0-9, '-' (a letter first)")
    for key in ("wg_port", "rpc_port"):
        if type(v[key]) is not int or not 1024 <= v[key] <= 65535:
            raise ClusterError(f"an object whose {key} is a whole number 1024..65535")
    for key in ("state_dir", "run_dir"):
        if not isinstance(v[key], str) or not v[key].startswith("/") or not v[key].isprintable():
            raise ClusterError(f"an object whose {key} is an absolute path")
    return Cluster(
        subnet, head, tuple(workers), v["interface"], v["netns"], v["wg_port"], v["rpc_port"],
        v["state_dir"], v["run_dir"],
    )  # fmt: skip


# ---- keys: each board's own, made on the board with openssl (X25519 = WireGuard's curve) ---


def _openssl(args: list[str], data: bytes | None = None) -> bytes:
    try:
        proc = subprocess.run(
            ["openssl", *args], input=data, capture_output=True, timeout=OPENSSL_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ClusterError(f"openssl {args[0]} failed ({err}); is openssl installed?") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip()[-300:]
        raise ClusterError(f"openssl {args[0]} failed (exit {proc.returncode}): {why}")
    return proc.stdout


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).decode()


def public_key(private: str) -> str:
    """The WireGuard public key of a base64 private key (what `wg pubkey` prints)."""
    if not KEY_RE.fullmatch(private):
        raise ClusterError("not a WireGuard private key (44 characters of base64)")
    der = X25519_PKCS8_PREFIX + binascii.a2b_base64(private)
    out = _openssl(["pkey", "-inform", "DER", "-pubout", "-outform", "DER"], der)
    return _b64(out[-32:])


def new_private_key() -> str:
    der = _openssl(["genpkey", "-algorithm", "X25519", "-outform", "DER"])
    if len(der) != len(X25519_PKCS8_PREFIX) + 32 or not der.startswith(X25519_PKCS8_PREFIX):
        raise ClusterError("openssl genpkey gave no X25519 key: is openssl 1.1.1 or newer?")
    return _b64(der[-32:])


def ensure_key(c: Cluster) -> str:
    """This board's public key; the key pair is made (0600, root) the first time."""
    key_path = os.path.join(c.state_dir, KEY_NAME)
    if not os.path.exists(key_path):
        os.makedirs(c.state_dir, mode=0o700, exist_ok=True)
        write_atomic(key_path, (new_private_key() + "\n").encode(), mode=0o600)
    private = _read_key(key_path)
    public = public_key(private)
    write_atomic(os.path.join(c.state_dir, PUBLIC_NAME), (public + "\n").encode(), mode=0o644)
    return public


def _read_key(path: str) -> str:
    try:
        text = read_text(path, 256).strip()
    except (OSError, UnreadableFile) as err:
        raise ClusterError(f"cannot read {path}: {err}") from None
    if not KEY_RE.fullmatch(text):
        raise ClusterError(f"{path}: not a WireGuard key; remove it to make a new one")
    return text


# ---- peers: the other boards' public keys and where to reach them, set by the owner ---------


def check_peers(c: Cluster, me: str, peers: Any) -> dict[str, dict[str, str]]:
    """The peers this board may talk to: for a worker the head alone, for the head every
    worker; each with its public key and WireGuard endpoint (host or IPv4, no port)."""
    if not isinstance(peers, dict):
        raise ClusterError("peers: expected an object of hostname -> {public_key, endpoint}")
    role = c.role(me)
    if role is None:
        raise ClusterError(f"{me!r} is not in the cluster (head {c.head}, workers {c.workers})")
    wanted = set(c.workers) if role == "head" else {c.head}
    if set(peers) != wanted:
        raise ClusterError(
            f"peers for {me} ({role}) must be exactly {sorted(wanted)}, not {sorted(peers)[:9]}"
        )
    out = {}
    for host, peer in peers.items():
        if not isinstance(peer, dict) or set(peer) != {"public_key", "endpoint"}:
            raise ClusterError(f"peers: {host}: expected {{public_key, endpoint}}")
        key, endpoint = peer["public_key"], peer["endpoint"]
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise ClusterError(f"peers: {host}: public_key is not a WireGuard key")
        if not isinstance(endpoint, str) or not ENDPOINT_HOST_RE.fullmatch(endpoint):
            raise ClusterError(f"peers: {host}: endpoint must be a hostname or IPv4 address")
        out[host] = {"public_key": key, "endpoint": endpoint}
    return out


def save_peers(c: Cluster, me: str, peers: Any) -> None:
    checked = check_peers(c, me, peers)
    os.makedirs(c.state_dir, mode=0o700, exist_ok=True)
    write_atomic(os.path.join(c.state_dir, PEERS_NAME), (json.dumps(checked) + "\n").encode())


def load_peers(c: Cluster, me: str) -> dict[str, dict[str, str]]:
    path = os.path.join(c.state_dir, PEERS_NAME)
    try:
        data = read_json(path, PEERS_MAX_BYTES)
    except FileNotFoundError:
        raise ClusterError(
            f"{path}: no peers yet; pair the boards from your PC with `rocky-vulkan cluster pair`"
        ) from None
    except (OSError, UnreadableFile, ValueError) as err:
        raise ClusterError(f"cannot read {path}: {err}") from None
    return check_peers(c, me, data)


def wg_config(c: Cluster, me: str, private: str, peers: dict[str, dict[str, str]]) -> str:
    """`wg setconf` text: this board's key and port, each peer's key, its one cluster address
    (WireGuard drops packets from any other source) and endpoint."""
    lines = ["[Interface]", f"PrivateKey = {private}", f"ListenPort = {c.wg_port}"]
    for host in sorted(peers):
        lines += [
            "",
            f"# {host}",
            "[Peer]",
            f"PublicKey = {peers[host]['public_key']}",
            f"AllowedIPs = {c.address(host)}/32",
            f"Endpoint = {peers[host]['endpoint']}:{c.wg_port}",
            # A worker behind NAT or a switch's ARP timeout still answers the head.
            "PersistentKeepalive = 25",
        ]
    return "\n".join(lines) + "\n"


def link_commands(c: Cluster, me: str, conf_path: str, create: list[str] | None) -> list[list[str]]:
    """The commands that make this board's link, after `create` made the interface (default:
    the kernel's WireGuard). The key and peers go on before a worker's interface moves into
    its RPC namespace: the UDP socket stays in the namespace it was made in, on the LAN."""
    ifc, prefix = c.interface, c.subnet.prefixlen
    cmds = [create or ["ip", "link", "add", "dev", ifc, "type", "wireguard"]]
    cmds.append(["wg", "setconf", ifc, conf_path])
    ip = ["ip"]
    if c.role(me) == "worker":
        cmds.append(["ip", "link", "set", "dev", ifc, "netns", c.netns])
        ip = ["ip", "-n", c.netns]
        cmds.append([*ip, "link", "set", "dev", "lo", "up"])
    cmds.append([*ip, "address", "add", f"{c.address(me)}/{prefix}", "dev", ifc])
    cmds.append([*ip, "link", "set", "dev", ifc, "up"])
    return cmds


def link_up(c: Cluster, me: str, create: list[str] | None = None, wg: str = "wg") -> list[str]:
    """Make this board's cluster link; the commands run, in words. A worker's RPC namespace is
    made first (and kept: rocky-rpc.service joins it)."""
    private = _read_key(os.path.join(c.state_dir, KEY_NAME))
    peers = load_peers(c, me)
    os.makedirs(c.run_dir, mode=0o700, exist_ok=True)
    conf = os.path.join(c.run_dir, f"{c.interface}.conf")
    write_atomic(conf, wg_config(c, me, private, peers).encode(), mode=0o600)
    cmds = link_commands(c, me, conf, create)
    if c.role(me) == "worker" and not os.path.exists(f"/run/netns/{c.netns}"):
        cmds.insert(0, ["ip", "netns", "add", c.netns])
    done = []
    for cmd in cmds:
        argv = [wg, *cmd[1:]] if cmd[0] == "wg" else cmd
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ClusterError(f"{' '.join(argv)}: {err}") from None
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-300:]}")
        done.append(" ".join(argv))
    return done


def rpc_server_argv(c: Cluster, me: str, rpc_server: str, device: str) -> list[str]:
    """A worker's rpc-server: its cluster address only, its GPU, the tensor cache (-c: a
    restarted head sends hashes, not gigabytes)."""
    return [rpc_server, "-H", c.address(me), "-p", str(c.rpc_port), "-d", device, "-c"]


def reachable(endpoints: list[str], timeout_s: float = 3.0) -> tuple[list[str], list[str]]:
    """Which workers' rpc-servers answer a TCP connect now, and why each other one does not."""
    up, why = [], []
    for ep in endpoints:
        host, port = ep.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                up.append(ep)
        except OSError as err:
            why.append(f"{ep}: {err.strerror or err}")
    return up, why


def plan_workers(plan: Any) -> list[str]:
    """The workers (host:port) the running server's plan gave its served model: the `cluster`
    setting of the one model that has it (router.plan gives it to serve.model only)."""
    models = plan.get("models") if isinstance(plan, dict) else None
    used: list[str] = []
    for entry in (models or {}).values():
        item = entry.get("settings", {}).get("cluster") if isinstance(entry, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if isinstance(value, list):
            used += [ep for ep in value if isinstance(ep, str)]
    return used


def stale(c: Cluster, used: list[str], timeout_s: float = 3.0) -> str | None:
    """Why the server's plan no longer matches the workers that answer (one it uses is gone, or
    one it left out is back), else None. A lost worker is seen here even when its TCP
    connection to the server never ends (power cut, cable pulled: no reset ever comes)."""
    up, down = reachable(c.rpc_endpoints(), timeout_s)
    gone = [why for why in down if why.split(": ", 1)[0] in used]
    back = [ep for ep in up if ep not in used]
    if gone:
        return f"a worker the server uses stopped answering ({'; '.join(gone)})"
    if back:
        return f"a worker the server left out answers again ({', '.join(back)})"
    return None
