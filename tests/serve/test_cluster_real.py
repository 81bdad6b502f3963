"""Several boards serving one model (issue 32): the real rpc-server on two workers behind real
WireGuard, the head's rocky-llm unit on the real router (llama-server b9101), in network
namespaces on this machine.

What stands in, said here: each board is a network namespace on one LAN (a bridge in its own
namespace, addresses from 198.18.0.0/15, the benchmarking range; the head is this test's own
namespace with a veth onto that LAN); WireGuard is wireguard-go, userspace WireGuard, because
this kernel has no wireguard module (the board's kernel has it: link_up's default makes the
interface with `ip link add ... type wireguard`; every later command is the board's, run here).
Each board's WireGuard interface has its own name: wireguard-go's control sockets share /run.
The workers compute on the CPU backend (rpc-server -d CPU) and the head hides its Vulkan
devices, so the split and the single-board runs do the same arithmetic: their greedy text must
be identical. Timings say nothing of the boards (docs/verification/cluster.md).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rocky_selftest.cluster import parse

from tests.helpers.llama_bin import BIN_DIR, BUFFER_RE
from tests.helpers.selftest import make_tiny_model
from tests.helpers.serve import (
    TEXT_ONLY,
    install_layer_copy,
    start_unit_server,
    write_serve_config,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.needs_llama_bin,
    pytest.mark.needs_root,
    pytest.mark.needs_tool("wg", "Debian's wireguard-tools"),
    pytest.mark.needs_tool("wireguard-go", "Debian's wireguard-go"),
    pytest.mark.needs_tool("/usr/sbin/sshd", "Debian's openssh-server: the boards' sshd"),
]

LAN = "198.18.77"
SUBNET = "198.19.77.0/24"
WORKERS = ("w1", "w2")
LAN_IP = {"head": f"{LAN}.1", "w1": f"{LAN}.2", "w2": f"{LAN}.3"}
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Tell me about the boards."


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-800:]}")
    return proc


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


class Net:
    """The LAN, the boards' namespaces and their wireguard-go processes; all removed at the
    end."""

    def __init__(self, tmp: Path) -> None:
        self.tag = "".join(secrets.choice("abcdefghjkmnpqrstuvwxyz") for _ in range(4))
        self.tmp = tmp
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.root_veth = f"rk{self.tag}h0"
        self.ssh_port = 0  # the boards' sshd (pair_boards)

    def ns(self, name: str) -> str:
        return f"rk{self.tag}{name}"

    def ifc(self, board: str) -> str:
        return f"rk{self.tag}{board}"

    def add_ns(self, name: str) -> str:
        ns = self.ns(name)
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def build(self) -> None:
        if sh("ip", "route", "show", "to", "match", f"{LAN}.1", check=False).stdout.count("dev"):
            routes = sh("ip", "route").stdout
            if LAN in routes or SUBNET.rsplit(".", 1)[0] in routes:
                pytest.fail(f"{LAN}.0/24 or {SUBNET} is already routed here: {routes[-300:]}")
        lan = self.add_ns("lan")
        sh("ip", "-n", lan, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", lan, "link", "set", "br0", "up")
        # The head: this namespace, one veth onto the LAN.
        veth = ("type", "veth", "peer", "name", "phead", "netns", lan)
        sh("ip", "link", "add", self.root_veth, *veth)
        self._plug(lan, "phead")
        sh("ip", "address", "add", f"{LAN}.1/24", "dev", self.root_veth)
        sh("ip", "link", "set", self.root_veth, "up")
        for i, name in enumerate((*WORKERS, "stranger"), start=2):
            ns = self.add_ns(name)
            sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{name}",
               "netns", lan)  # fmt: skip
            self._plug(lan, f"p{name}")
            host = 9 if name == "stranger" else i
            sh("ip", "-n", ns, "address", "add", f"{LAN}.{host}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def _plug(self, lan: str, port: str) -> None:
        sh("ip", "-n", lan, "link", "set", port, "master", "br0")
        sh("ip", "-n", lan, "link", "set", port, "up")

    def wireguard_go(self, ns: str | None, ifc: str) -> None:
        """Userspace WireGuard's interface `ifc` in `ns` (None: here), ready for `wg`."""
        log = (self.tmp / f"wireguard-go-{ifc}.log").open("wb")
        argv = ["wireguard-go", "-f", ifc]
        self.procs.append(
            subprocess.Popen(in_ns(ns, *argv) if ns else argv, stdout=log, stderr=log)
        )
        sock = Path(f"/var/run/wireguard/{ifc}.sock")
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, f"wireguard-go made no {sock}"
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(10)
        sh("ip", "link", "del", self.root_veth, check=False)
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)


class Board:
    """A board's config and its rocky-llm (the image's wrapper and package)."""

    def __init__(self, net: Net, name: str, tmp: Path, model: Path) -> None:
        self.net, self.name, self.tmp = net, name, tmp
        self.prefix = install_layer_copy(tmp)
        self.lib = tmp / "share/rocky-selftest"
        self.cluster = {
            "subnet": SUBNET,
            "head": "head",
            "workers": list(WORKERS),
            "interface": net.ifc(name),
            "netns": net.ns(f"{name}r"),
            "state_dir": str(tmp / "cluster"),
            "run_dir": str(tmp / "run"),
        }
        self.config = tmp / "config.json"
        # A worker's rpc-server computes on ggml's CPU device; the head's own llama-bench runs
        # (`cluster bench` alone) on no device at all (`-dev none`): the CPU, the same arithmetic.
        device = "none" if name == "head" else "CPU"
        write_serve_config(
            tmp, BIN_DIR, model, 8443, cluster=self.cluster, hostname=name, gpu_device=device
        )

    @property
    def address(self) -> str:
        return parse(self.cluster).address(self.name)

    def rocky_llm(self, *args: str, ns: str | None = None, stdin: str | None = None,
                  env: dict[str, str] | None = None, timeout: float = 120):  # fmt: skip
        argv = [*self.prefix, "--config", str(self.config), *args]
        return subprocess.run(
            in_ns(ns, *argv) if ns else argv, input=stdin, capture_output=True, text=True,
            timeout=timeout, check=False, env={**os.environ, **(env or {})},
        )  # fmt: skip

    def link_up(self, ns: str | None) -> None:
        """cluster.link_up with the interface wireguard-go made (see the module's docstring)."""
        ifc = self.cluster["interface"]
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]);"
            "from rocky_selftest import cluster as cl;"
            "from rocky_selftest.settings import load_settings;"
            "s = load_settings(sys.argv[2]); c = cl.parse(s.cluster);"
            "print('\\n'.join(cl.link_up(c, s.board_name, create=sys.argv[3:])))"
        )
        argv = [sys.executable, "-S", "-I", "-B", "-c", code, str(self.lib), str(self.config)]
        argv += ["ip", "link", "show", "dev", ifc]
        proc = sh(*(in_ns(ns, *argv) if ns else argv))
        print(proc.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pair_boards(net: Net, boards: dict[str, Board], tmp: Path) -> None:
    """The owner's one command, `rocky-vulkan cluster pair`, over real SSH: each board runs
    sshd (OpenSSH's, root login with the test's key) on its LAN address, and its `rocky-llm` is
    the image's wrapper for that board's config."""
    port, pair_dir = free_port(), tmp / "pair"
    net.ssh_port = port
    pair_dir.mkdir()
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(pair_dir / "host"))
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(pair_dir / "id"))
    (pair_dir / "authorized_keys").write_text((pair_dir / "id.pub").read_text())
    host_pub = (pair_dir / "host.pub").read_text().split()[:2]
    (pair_dir / "known_hosts").write_text(f"{','.join(boards)} {' '.join(host_pub)}\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    client = []
    for name, b in boards.items():
        bin_dir = b.tmp / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "rocky-llm"
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.join(b.prefix)} --config {b.config} "$@"\n')
        wrapper.chmod(0o755)
        lan_ip = LAN_IP[name]
        cfg = b.tmp / "sshd_config"
        cfg.write_text(
            f"ListenAddress {lan_ip}:{port}\nHostKey {pair_dir / 'host'}\nPidFile none\n"
            f"UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
            f"AuthorizedKeysFile {pair_dir / 'authorized_keys'}\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nSetEnv PATH={bin_dir}:/usr/sbin:/usr/bin:/bin\n"
        )
        log = (b.tmp / "sshd.log").open("wb")
        argv = [shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)]
        ns = None if name == "head" else net.ns(name)
        net.procs.append(subprocess.Popen(in_ns(ns, *argv) if ns else argv, stdout=log, stderr=log))
        client.append(
            f"Host {name}\n  HostName {lan_ip}\n  Port {port}\n  User root\n"
            f"  IdentityFile {pair_dir / 'id'}\n  IdentitiesOnly yes\n  HostKeyAlias {name}\n"
            f"  UserKnownHostsFile {pair_dir / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        )
    (pair_dir / "ssh_config").write_text("".join(client))
    project = ROOT / "rocky-vulkan.yaml"
    members = {"subnet": SUBNET, "head": "head", "workers": list(WORKERS)}
    config = pair_dir / "rocky-vulkan.yaml"
    (pair_dir / "patches").symlink_to(ROOT / "patches")  # the config names its patches there
    text = project.read_text().replace("\ncluster: null\n", f"\ncluster: {json.dumps(members)}\n")
    config.write_text(text)
    for name in boards:  # sshd answers
        deadline = time.monotonic() + 20
        while connect(net.ns("stranger"), LAN_IP[name], port, 1.0) != "connected":
            assert time.monotonic() < deadline, (boards[name].tmp / "sshd.log").read_text()
            time.sleep(0.2)
    argv = [sys.executable, "-m", "rocky_vulkan.cli", "--config", str(config), "cluster", "pair",
            "--ssh-config", str(pair_dir / "ssh_config")]  # fmt: skip
    for name in boards:
        argv += ["--board", f"{name}=root@{name}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, b in boards.items():
        peers = json.loads((Path(b.cluster["state_dir"]) / "peers.json").read_text())
        expect = WORKERS if name == "head" else ("head",)
        assert sorted(peers) == sorted(expect), peers
        for other, peer in peers.items():
            assert peer["endpoint"] == LAN_IP[other]
            pub = boards[other].rocky_llm("cluster", "key")
            assert peer["public_key"] == pub.stdout.strip()
    assert "systemd is not running here" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("paired: head serves with w1, w2")


def connect(ns: str, host: str, port: int, timeout: float = 3.0) -> str:
    """Whether a TCP connect from `ns` to host:port succeeds, in words."""
    code = (
        "import socket, sys\n"
        "a = sys.argv\n"
        "try:\n"
        "    socket.create_connection((a[1], int(a[2])), timeout=float(a[3]))\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    return sh(*in_ns(ns, sys.executable, "-c", code, host, str(port), str(timeout))).stdout.strip()


def greedy(server, tokens: int = 24) -> str:
    status, data = chat(server, tokens)
    assert status == 200, (status, data[:500], server.tail(3000))
    doc = json.loads(data)
    assert doc["usage"]["completion_tokens"] == tokens, doc
    return doc["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun: wireguard-go cannot make its interface here")
    tmp = tmp_path_factory.mktemp("cluster")
    model = make_tiny_model(tmp_path_factory)
    net = Net(tmp)
    workers: dict[str, subprocess.Popen] = {}
    try:
        net.build()
        boards = {n: Board(net, n, tmp / n, model) for n in ("head", *WORKERS)}
        pair_boards(net, boards, tmp)
        net.wireguard_go(None, boards["head"].cluster["interface"])
        boards["head"].link_up(None)
        for w in WORKERS:
            # Made here, not by link_up inside `ip netns exec` (whose mounts stay its own); on
            # the board link_up runs in the root namespace and makes it.
            net.add_ns(f"{w}r")
            net.wireguard_go(net.ns(w), boards[w].cluster["interface"])
            boards[w].link_up(net.ns(w))

        def start_worker(w: str) -> subprocess.Popen:
            b = boards[w]
            argv = in_ns(b.cluster["netns"], *b.prefix, "--config", str(b.config), "cluster",
                         "worker")  # fmt: skip
            env = {**os.environ, "XDG_CACHE_HOME": str(b.tmp / "cache")}
            log = (b.tmp / "rpc-server.log").open("ab")
            proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
            deadline = time.monotonic() + 60
            while connect(b.cluster["netns"], b.address, 50052, 1.0) != "connected":
                assert proc.poll() is None, (b.tmp / "rpc-server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "rpc-server never listened"
                time.sleep(0.3)
            return proc

        for w in WORKERS:
            workers[w] = start_worker(w)
        yield net, boards, workers, start_worker
    finally:
        for p in workers.values():
            p.kill()
        net.close()


def head_server(tmp: Path, boards, name: str, gpu: bool, sections: dict | None = None):
    """The head's rocky-llm unit. gpu: the synthetic self-test result lets the GPU serve (a
    cluster's head then adds --rpc); its Vulkan devices are hidden, so what it runs itself runs
    on the CPU backend, as the workers do. Not gpu: the board alone, on the CPU. `sections`:
    more of the synthetic result (its cluster measurements)."""
    head = boards["head"]
    model = Path(json.loads(head.config.read_text())["model_path"])
    return start_unit_server(
        tmp / name, BIN_DIR, model, gpu=gpu, cluster=head.cluster, hostname="head",
        extra_env={"VK_ICD_FILENAMES": "/nonexistent.json"}, serve_context_tokens=8192,
        result_sections=sections,
    )  # fmt: skip


def test_only_the_head_reaches_a_worker_s_rpc_server(cluster):
    net, boards, _, _ = cluster
    stranger = net.ns("stranger")
    for i, w in enumerate(WORKERS):
        wg_ip, lan_ip = boards[w].address, f"{LAN}.{2 + i}"
        # Only sshd listens on the worker's LAN side: rpc-server lives in the RPC namespace.
        listening = sh(*in_ns(net.ns(w), "ss", "-Hltn")).stdout.strip().splitlines()
        assert [ln.split()[3] for ln in listening] == [f"{lan_ip}:{net.ssh_port}"], listening
        assert connect(stranger, lan_ip, 50052) == "ConnectionRefusedError"
        # A stranger on the LAN that routes the cluster subnet at the worker: no such address.
        sh(*in_ns(stranger, "ip", "route", "replace", SUBNET, "via", lan_ip))
        assert connect(stranger, wg_ip, 50052) != "connected"
        sh(*in_ns(stranger, "ip", "route", "del", SUBNET))
        # The head (this namespace) does, through WireGuard.
        socket.create_connection((wg_ip, 50052), timeout=5).close()


def test_a_stranger_with_its_own_key_is_refused(cluster):
    """A board the worker does not know, claiming the head's address and endpoint: its
    handshakes go unanswered and nothing of it reaches rpc-server."""
    net, boards, _, _ = cluster
    ns, ifc = net.ns("stranger"), f"rk{net.tag}s"
    net.wireguard_go(ns, ifc)
    key = sh("wg", "genkey").stdout.strip()
    (net.tmp / "stranger.key").write_text(key + "\n")
    w1 = boards["w1"]
    w1_key = (Path(w1.cluster["state_dir"]) / "wg.pub").read_text().strip()
    sh(*in_ns(ns, "wg", "set", ifc, "private-key", str(net.tmp / "stranger.key"), "peer",
              w1_key, "allowed-ips", SUBNET, "endpoint", f"{LAN}.2:51820"))  # fmt: skip
    sh(*in_ns(ns, "ip", "address", "add", f"{boards['head'].address}/32", "dev", ifc))
    sh(*in_ns(ns, "ip", "link", "set", ifc, "up"))
    sh(*in_ns(ns, "ip", "route", "add", SUBNET, "dev", ifc))
    assert connect(ns, w1.address, 50052, 5.0) == "TimeoutError"
    shown = sh(*in_ns(ns, "wg", "show", ifc, "latest-handshakes")).stdout.split()
    assert shown == [w1_key, "0"], shown  # never a handshake
    peers = sh(*in_ns(w1.cluster["netns"], "wg", "show", w1.cluster["interface"], "peers"))
    head_key = (Path(boards["head"].cluster["state_dir"]) / "wg.pub").read_text().strip()
    assert peers.stdout.split() == [head_key]


def chat(server, tokens: int, timeout: float = 300):
    return server.request(
        "POST", "/v1/chat/completions",
        {"model": "reference", "messages": [{"role": "user", "content": PROMPT}],
         "max_tokens": tokens, "temperature": 0, "logit_bias": TEXT_ONLY},
        timeout=timeout,
    )  # fmt: skip


def cut_mid_request(server, cut, what: str, timeout: float = 120) -> float:
    """A long request runs; `cut()` takes a worker away: the request ends cut short (an error,
    or, a worker lost between two of its tokens, a 500), never hangs. Its seconds after the cut."""
    result: dict = {}

    def long_request() -> None:
        try:
            result["r"] = chat(server, 2000, timeout=timeout)
        except OSError as err:
            result["r"] = err

    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(1.0)
    cut()
    at = time.monotonic()
    th.join(timeout - 20)
    assert not th.is_alive(), f"the request hangs after {what}"
    ended = time.monotonic() - at
    shown = result["r"] if isinstance(result["r"], OSError) else result["r"][1][:300]
    print(f"the request ended {ended:.1f} s after {what}: {shown!r}")
    assert isinstance(result["r"], OSError) or result["r"][0] != 200, result["r"]
    return ended


def lose_w2_mid_request(server, workers: dict, single: str) -> None:
    """w2 dies while a long request runs: the request ends (an error, never a hang), and the
    next request is answered from what is left, with the single board's text."""

    def kill_w2() -> None:
        workers["w2"].kill()
        workers["w2"].wait(10)

    cut_mid_request(server, kill_w2, "w2 was killed", timeout=170)
    # ... and the next request is answered from what is left, with the same text.
    again, deadline = None, time.monotonic() + 120
    while again is None and time.monotonic() < deadline:
        status, data = chat(server, 24)
        if status == 200:
            again = json.loads(data)["choices"][0]["message"]["content"]
        else:
            print("after the loss:", status, data[:200])
            time.sleep(2)
    assert again == single, (again, single, server.tail(3000))


def test_split_output_is_the_single_board_s_and_a_lost_worker_is_no_hang(cluster, tmp_path):
    net, boards, workers, start_worker = cluster
    server, info = head_server(tmp_path, boards, "alone", gpu=False)
    try:
        assert "rpc = " not in info["presets"].read_text()  # the CPU placement: no cluster
        single = greedy(server)
    finally:
        server.stop()
    server, info = head_server(tmp_path, boards, "split", gpu=True)
    try:
        plan = json.loads(info["settings_file"].read_text())
        item = plan["models"]["reference"]["settings"]["cluster"]
        assert item["value"] == [f"{boards[w].address}:50052" for w in WORKERS], item
        assert "2 of 2 workers answer" in item["reason"], item
        split = plan["models"]["reference"]["settings"]["split_mode"]
        assert split["value"] == "layer" and "not measured" in split["reason"], split
        presets = info["presets"].read_text()
        assert "rpc = " + ",".join(item["value"]) in presets, presets
        assert "split-mode" not in presets, presets
        assert greedy(server) == single
        lose_w2_mid_request(server, workers, single)
    finally:
        server.stop()
        workers["w2"] = start_worker("w2")
    # Every worker gone: the plan says so and adds no --rpc.
    for w in WORKERS:
        workers[w].kill()
        workers[w].wait(10)
    try:
        out = boards["head"].rocky_llm("settings", "--json")
        assert out.returncode == 0, out.stderr
        item = json.loads(out.stdout)["models"]["reference"]["settings"]["cluster"]
        assert item["value"] == [] and "0 of 2 workers answer" in item["reason"], item
    finally:
        for w in WORKERS:
            workers[w] = start_worker(w)


def single_board_text(tmp_path: Path, boards) -> str:
    """The head alone, on the CPU: the greedy text every split must give."""
    server, _ = head_server(tmp_path, boards, "alone", gpu=False)
    try:
        return greedy(server)
    finally:
        server.stop()


def _cluster_measured(boards, alone: float, layers: float, tensor: float,
                      speed: float = 1.0) -> dict:  # fmt: skip
    """A cluster section as the self-test writes it, its rates chosen by the test (pp = tg):
    the real step's rates on one CPU would pick whichever the machine's load favours."""

    def mode(rate: float) -> dict:
        return {"status": "PASS", "pp_tps": rate, "tg_tps": rate, "runs": []}

    return {"cluster": {
        "workers": [f"{boards[w].address}:50052" for w in WORKERS], "left_out": [],
        "prompt_tokens": 2048, "decode_tokens": 128, "ubatch": 512,
        "modes": {"alone": mode(alone), "cluster": mode(layers), "tensor": mode(tensor),
                  "speed": mode(speed)},
        "tensor_split": "0.250/0.750",
    }}  # fmt: skip


def test_tensor_parallelism_where_it_was_measured_fastest(cluster, tmp_path):
    """The head's self-test measured tensor parallelism fastest (the rates are the test's, as
    said above): the real router's child splits every weight over both workers' rpc-servers
    (llama.cpp's Meta device, `split-mode = tensor` in the preset) and answers with the single
    board's greedy text; a worker lost mid-request ends that request, never hangs it."""
    _, boards, workers, start_worker = cluster
    single = single_board_text(tmp_path, boards)
    measured = _cluster_measured(boards, alone=10.0, layers=8.0, tensor=20.0)
    server, info = head_server(tmp_path, boards, "tensor", gpu=True, sections=measured)
    try:
        plan = json.loads(info["settings_file"].read_text())["models"]["reference"]["settings"]
        assert plan["cluster"]["value"] == measured["cluster"]["workers"], plan["cluster"]
        assert plan["split_mode"]["value"] == "tensor", plan["split_mode"]
        why = plan["split_mode"]["reason"]
        assert "tensor parallel 115.2 s, " in why and why.endswith(": tensor parallelism"), why
        presets = info["presets"].read_text()
        assert "split-mode = tensor" in presets and "rpc = " in presets, presets
        assert greedy(server) == single
        log = server.tail(200_000)
        assert "creating a Meta device for tensor parallelism from 2 devices" in log, log[-3000:]
        assert "enabling flash_attn since it is required for SPLIT_MODE_TENSOR" in log
        lose_w2_mid_request(server, workers, single)  # then a Meta device over w1 alone
    finally:
        server.stop()
        workers["w2"] = start_worker("w2")


def test_layers_by_speed_where_that_was_measured_fastest(cluster, tmp_path):
    """The split by each device's own decode rate measured fastest (the test's rates): the
    router's child gets `tensor-split` with the measured shares and answers with the single
    board's text. The 2-layer model's 3 slots (2 layers, the output) go by the shares: w1's
    quarter gets layer 0, w2 layer 1 and the output (by free memory, ~equal, w1 gets both
    layers: llama.cpp's default would give w1 more, not less)."""
    _, boards, _, _ = cluster
    single = single_board_text(tmp_path, boards)
    measured = _cluster_measured(boards, alone=10.0, layers=8.0, tensor=5.0, speed=20.0)
    server, info = head_server(tmp_path, boards, "speed", gpu=True, sections=measured)
    try:
        plan = json.loads(info["settings_file"].read_text())["models"]["reference"]["settings"]
        assert plan["split_mode"]["value"] == "layer", plan["split_mode"]
        assert plan["tensor_split"]["value"] == "0.250/0.750", plan["tensor_split"]
        presets = info["presets"].read_text()
        assert "tensor-split = 0.250/0.750" in presets and "split-mode" not in presets, presets
        assert greedy(server) == single
        log = server.tail(200_000)
        sizes = {dev: float(mib) for dev, mib in BUFFER_RE.findall(log)}
        print("model buffers:", sizes)
        w1, w2 = (f"[{boards[w].address}:50052]" for w in WORKERS)
        on = {w: sum(mib for dev, mib in sizes.items() if dev.endswith(w)) for w in (w1, w2)}
        assert on[w2] > on[w1] > 0, (sizes, log[-3000:])
    finally:
        server.stop()


def test_the_head_measures_itself_alone_and_with_its_workers(cluster):
    """`rocky-llm cluster bench`: real llama-bench, alone (-dev, here `none`: the head's CPU) and
    spread over the workers (-rpc); every run's devices and rates kept. The rates say nothing
    of the boards."""
    _, boards, _, _ = cluster
    hidden = {"VK_ICD_FILENAMES": "/nonexistent.json"}
    out = boards["head"].rocky_llm("cluster", "bench", "--json", env=hidden, timeout=600)
    print(out.stderr)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["workers"] == [f"{boards[w].address}:50052" for w in WORKERS]
    for mode in ("alone", "cluster", "tensor"):
        assert doc["modes"][mode]["status"] == "PASS", doc["modes"][mode]
        assert doc["modes"][mode]["pp_tps"] > 0 and doc["modes"][mode]["tg_tps"] > 0
    spread = doc["modes"]["cluster"]["runs"] + doc["modes"]["tensor"]["runs"]
    assert all("-rpc" in r["cmd"] and "-dev" not in r["cmd"] for r in spread), spread[0]["cmd"]
    assert all("RPC" in (r["devices"] or "") or r["devices"] in ("auto", "") for r in spread)
    tensor = doc["modes"]["tensor"]["runs"]
    assert tensor and all(r["cmd"][-2:] == ["-fa", "1"] and "tensor" in r["cmd"] for r in tensor)
    # each worker decoded the reference model alone; the split by speed used their shares
    speeds = doc["device_speeds"]
    assert [r["device"] for r in speeds] == ["RPC0", "RPC1"], speeds
    assert all(r["status"] == "PASS" and r["tg_tps"] > 0 for r in speeds), speeds
    assert re.fullmatch(r"0\.\d{3}/0\.\d{3}", doc["tensor_split"]), doc["tensor_split"]
    by_speed = doc["modes"]["speed"]
    assert by_speed["status"] == "PASS", by_speed
    assert all(r["cmd"][-2:] == ["-ts", doc["tensor_split"]] for r in by_speed["runs"])
    # Kept for serve.model: the head's plan now splits as measured (this board has no
    # self-test result, so the record is the latest measurement), and says where it came from.
    assert "saved in " in out.stderr and "from the server's next start" in out.stderr
    plan = boards["head"].rocky_llm("settings", "--json", env=hidden)
    assert plan.returncode == 0, plan.stderr
    settings = json.loads(plan.stdout)["models"]["reference"]["settings"]
    print("from the record:", settings["cluster"]["reason"], "|", settings["split_mode"]["reason"])
    assert "by `rocky-llm cluster bench` (20" in settings["cluster"]["reason"], settings
    # alone (the model fits) or the workers, split as measured: the reasons name the times
    assert "alone " in settings["cluster"]["reason"] + settings["split_mode"]["reason"], settings
    # A worker is refused the measurement: it is the head's.
    w = boards["w1"].rocky_llm("cluster", "bench")
    assert w.returncode == 2 and "is a worker: run `cluster bench` on head" in w.stderr, w.stderr


def test_the_head_s_self_test_records_both_and_the_report_shows_them(cluster):
    """The self-test's `cluster` step (the layer's copy, as the head runs it), its section read
    by `rocky-vulkan report`'s own checker: every mode measured, every row PASS."""
    from rocky_vulkan.host.cluster_doc import cluster_rows
    from rocky_vulkan.host.result_doc import checked

    from tests.host.test_report import _doc

    _, boards, _, _ = cluster
    head = boards["head"]
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from rocky_selftest.bench import Deadline;"
        "from rocky_selftest.cluster_step import cluster;"
        "from rocky_selftest.settings import load_settings;"
        "s = load_settings(sys.argv[2]);"
        "c, d = cluster(s, Deadline(s.deadline_s), {}, log=lambda t: print(t, file=sys.stderr));"
        "print(json.dumps({'check': c.to_json(), 'data': d}))"
    )
    argv = [sys.executable, "-S", "-I", "-B", "-c", code, str(head.lib), str(head.config)]
    env = {**os.environ, "VK_ICD_FILENAMES": "/nonexistent.json"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    step = json.loads(out.stdout)
    print(step["check"]["evidence"])  # the self-test's line (CPU here: says nothing of boards)
    assert step["check"]["status"] == "PASS", step["check"]
    assert step["check"]["evidence"].startswith("alone pp"), step["check"]
    doc = checked({**_doc(crash_at=None), "cluster": step["data"]})
    assert doc["problems"] == [], doc["problems"]
    rows = {r[0]: r for r in cluster_rows(doc["cluster"])}
    names = ["cluster: alone"] + [f"cluster: {x}, 2 worker(s)" for x in
                                  ("layers", "tensor parallel", "layers by speed")]  # fmt: skip
    assert [rows[n][3] for n in names] == ["PASS"] * 4, rows
    assert all("this board alone" in rows[n][1] for n in names[1:]), rows


def test_a_worker_lost_without_a_word_is_seen_and_the_head_plans_again(cluster, tmp_path):
    """w2's cable pulled during a request: no reset ever reaches the head. The request ends
    (an error, never a hang); the restarted child cannot reach w2 either, so requests fail
    until the server plans again. `cluster stale` sees it (what rocky-cluster-watch.service
    restarts the server on); restarted, the server plans with w1 only and answers with the
    single board's text. Cable back: stale again, the other way, and a server started then
    answers with whichever workers accept."""
    net, boards, _, _ = cluster
    head = boards["head"]
    server, info = head_server(tmp_path, boards, "before", gpu=True)
    settings_file = str(info["settings_file"])
    w2 = f"{boards['w2'].address}:50052"
    try:
        single = greedy(server)
        out = head.rocky_llm("cluster", "stale", "--settings-file", settings_file)
        assert out.returncode == 0 and "the server's workers answer" in out.stdout, out
        pull = ["ip", "link", "set", "eth0", "down"]
        cut_mid_request(server, lambda: sh(*in_ns(net.ns("w2"), *pull)), "the cable was pulled",
                        timeout=300)  # fmt: skip
        out = head.rocky_llm("cluster", "stale", "--settings-file", settings_file)
        assert out.returncode == 1, out
        assert f"a worker the server uses stopped answering ({w2}: timed out)" in out.stdout, out
    finally:
        server.stop()
    # What the watch does: restart the server, which plans with the workers that answer.
    server, info = head_server(tmp_path, boards, "after", gpu=True)
    try:
        plan = json.loads(info["settings_file"].read_text())
        item = plan["models"]["reference"]["settings"]["cluster"]
        assert item["value"] == [f"{boards['w1'].address}:50052"], item
        assert "1 of 2 workers answer" in item["reason"], item
        assert greedy(server) == single
        sh(*in_ns(net.ns("w2"), "ip", "link", "set", "eth0", "up"))
        deadline = time.monotonic() + 60
        while True:
            out = head.rocky_llm("cluster", "stale", "--settings-file", str(info["settings_file"]))
            if out.returncode == 1 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert f"a worker the server left out answers again ({w2})" in out.stdout, out
    finally:
        sh(*in_ns(net.ns("w2"), "ip", "link", "set", "eth0", "up"), check=False)
        server.stop()
    # Restarted once more, with the cable back: w2's rpc-server dropped the dead connection
    # (TCP keepalive, our patch llama.cpp-ggml-rpc-tcp-keepalive.patch: about 30 s after the
    # pull, long past here) and accepts again: the plan uses both workers and the answer is the
    # single board's.
    server, info = head_server(tmp_path, boards, "back", gpu=True)
    try:
        item = json.loads(info["settings_file"].read_text())["models"]["reference"]
        print("with the cable back:", item["settings"]["cluster"]["reason"])
        assert "2 of 2 workers answer" in item["settings"]["cluster"]["reason"], item
        t0 = time.monotonic()
        status, data = chat(server, 24, timeout=120)
        print(f"then: {status} after {time.monotonic() - t0:.1f} s")
        assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == single
    finally:
        server.stop()
