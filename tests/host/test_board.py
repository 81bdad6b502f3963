"""`rocky-vulkan board HOST`: HOST checked before ssh sees it, the real `ssh` against a real sshd
(OpenSSH's, run unprivileged-namespaced by ROCKY_SSHD) whose ForceCommand plays the board with the
board's own code (`cat` of a result.json, the real `rocky-llm info --short`), a real TLS server on
localhost with a certificate made by the board's own code (openssl), and every failure a message.

No fake ssh is used: "connection refused" and "unknown host" come from the real ssh against a
closed port and a `.invalid` name.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rocky_selftest.serve_keys import make_certificate, write_api_key
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.host import board as board_mod
from rocky_vulkan.host.board import BoardError, SshOptions, parse_info, parse_target
from rocky_vulkan.layer.board import selftest_board_config

from tests.helpers.project import ROOT
from tests.host.test_report import _doc
from tests.host.test_report_serving import good_placement, good_serving

pytestmark = pytest.mark.timeout(120)
CFG = load_config(ROOT / "rocky-vulkan.yaml")
USER = getpass.getuser()
needs_ssh = pytest.mark.needs_tool("ssh", "Debian: openssh-client")
needs_openssl = pytest.mark.needs_tool("openssl", "Debian: openssl")


# ---- HOST -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "user", "host", "url_host"),
    [
        ("rock-5-itx", "rocky", "rock-5-itx", "rock-5-itx"),
        ("rock-5-itx.local", "rocky", "rock-5-itx.local", "rock-5-itx.local"),
        ("alice@rock-5-itx.local", "alice", "rock-5-itx.local", "rock-5-itx.local"),
        ("192.168.1.50", "rocky", "192.168.1.50", "192.168.1.50"),
        ("fd00::50", "rocky", "fd00::50", "[fd00::50]"),
        ("root@[fe80::1%eth0]", "root", "fe80::1%eth0", "[fe80::1%25eth0]"),
        ("::1", "rocky", "::1", "[::1]"),
    ],
)
def test_good_hosts(text, user, host, url_host):
    t = parse_target(text, "rocky")
    assert (t.user, t.host, t.url_host) == (user, host, url_host)


HOSTILE_HOSTS = [
    "-oProxyCommand=touch /tmp/pwned",
    "-oProxyCommand=sh",
    "rocky@-oProxyCommand=sh",
    "-p22",
    "rock 5",
    "rock-5-itx\n",
    "rock-5-itx\nrm -rf /",
    "rock-5-itx;id",
    "$(id)",
    "`id`",
    "rock-5-itx.local.",
    "-rock",
    "rock-",
    "a" * 10_000,
    ("a" * 63 + ".") * 5,
    "a" * 64,
    "10.1.2",
    "256.1.1.1",
    "01.2.3.4",
    "[192.168.1.5]",
    "fe80::1%-oProxyCommand=sh",
    "fe80::1%eth0 x",
    "Root@rock",
    "a@b@rock",
    "@rock",
    "",
    "rock\x00x",
    "rock\u200b5",
    "rоck",  # a Cyrillic о
    "ssh://rock",
    "rock:22",
]


@pytest.mark.parametrize("text", HOSTILE_HOSTS, ids=lambda t: repr(t)[:40])
def test_hostile_hosts_are_refused_before_ssh(text, monkeypatch):
    def no_ssh(*args, **kwargs):
        raise AssertionError("ssh must not run for a refused HOST")

    monkeypatch.setattr(subprocess, "Popen", no_ssh)
    with pytest.raises(BoardError) as err:
        parse_target(text, "rocky")
    message = str(err.value)
    assert "\n" not in message and len(message) < 600  # a 10 kB name is not echoed back
    assert "host name" in message or "login name" in message or "too long" in message
    # Through the command line: after `--` it reaches the check; without, argparse may refuse
    # what looks like an option first (exit 2 either way, ssh never runs).
    argv = ["--config", str(ROOT / "rocky-vulkan.yaml"), "board"]
    assert main([*argv, "--", text]) == 2
    try:
        rc = main([*argv, text])
    except SystemExit as exited:
        rc = exited.code
    assert rc == 2


def test_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["board", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "[fe80::1%eth0]" in out and "--ssh-port" in out


def test_ssh_argv_puts_the_destination_after_double_dash():
    t = parse_target("rock-5-itx.local", "rocky")
    argv = board_mod.ssh_command(t, "rocky-llm info --short", SshOptions(port=2222))
    assert argv[:1] == ["ssh"] and "BatchMode=yes" in argv and "ConnectTimeout=10" in argv
    assert argv[-3:] == ["--", "rocky@rock-5-itx.local", "rocky-llm info --short"]
    assert argv[argv.index("-p") + 1] == "2222"


def test_info_lines_are_cleaned_and_read():
    fp = ":".join(["AB"] * 32)
    info = parse_info(
        "API:  https://rock.local:9443/v1  (web UI: the same, /)\n"
        f"TLS certificate SHA-256 fingerprint: {fp}\n"
        "\x1b]0;owned\x07Serving \x1b[31mx\x1b[0m on the gpu\n"
    )
    assert (info.scheme, info.port, info.fingerprint) == ("https", 9443, fp)
    assert not any("\x1b" in line or "\x07" in line for line in info.lines)
    assert parse_info("API:  https://rock.local:99999/v1").port is None
    assert parse_info("The server is off (serve.listen: off in rocky-vulkan.yaml).").off


# ---- real ssh, no sshd needed -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_ssh
def test_connection_refused_is_a_message(capsys):
    # The real ssh against a closed port of this machine.
    port = _free_port()
    rc = main(["--config", str(ROOT / "rocky-vulkan.yaml"), "board", "--ssh-port", str(port),
               f"{USER}@127.0.0.1"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "refused the SSH connection" in err and "Fix:" in err
    assert "Traceback" not in err


@needs_ssh
def test_unknown_host_is_a_message(capsys):
    rc = main(["--config", str(ROOT / "rocky-vulkan.yaml"), "board", "no-such-board.invalid"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot resolve no-such-board.invalid" in err and "IP address" in err


def test_missing_ssh_binary_is_a_message():
    t = parse_target("rock", "rocky")
    with pytest.raises(BoardError, match="openssh-client"):
        board_mod.remote(t, "true", SshOptions(ssh="/nonexistent/ssh"), 100, 5)


# ---- a real TLS server -------------------------------------------------------------------------


class TlsServer:
    """A TLS server on 127.0.0.1 with the given certificate: handshakes, then closes."""

    def __init__(self, cert: Path, key: Path, host: str = "127.0.0.1") -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, 0), family=family)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            try:
                conn.settimeout(5)
                with self.ctx.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def _openssl_fingerprint(cert: Path) -> str:
    """The fingerprint as openssl computes it (independent of our code)."""
    out = subprocess.run(
        ["openssl", "x509", "-in", cert, "-noout", "-fingerprint", "-sha256"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.strip().split("=", 1)[1]


@needs_openssl
def test_fingerprint_of_a_real_tls_server(tmp_path):
    make_certificate(str(tmp_path), "rock-5-itx")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    server = TlsServer(cert, key)
    try:
        got = board_mod.server_fingerprint("127.0.0.1", server.port, 5)
    finally:
        server.close()
    assert got == _openssl_fingerprint(cert)


def test_fingerprint_of_a_closed_port_and_a_plain_server():
    with pytest.raises(BoardError, match="nothing listens"):
        board_mod.server_fingerprint("127.0.0.1", _free_port(), 5)
    plain = socket.create_server(("127.0.0.1", 0))
    port = plain.getsockname()[1]

    def answer():
        conn, _ = plain.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(BoardError, match="not with TLS"):
            board_mod.server_fingerprint("127.0.0.1", port, 5)
    finally:
        t.join(5)
        plain.close()


# ---- the real sshd ---------------------------------------------------------------------------

FORCE = """#!/bin/sh
# The board, as far as `rocky-vulkan board` may ask it: anything else is refused.
RUN='import sys; from rocky_selftest.serve_cli import main; sys.exit(main())'
case "$SSH_ORIGINAL_COMMAND" in
  "cat -- /var/lib/rocky-selftest/result.json")
    [ -f {board}/huge ] && exec head -c 20000000 /dev/zero
    [ -f {board}/slow ] && exec sleep 6  # outlives --timeout 2, ends soon after
    exec cat -- {board}/result.json ;;
  "rocky-llm info --short")
    PYTHONPATH={tools} exec {python} -c "$RUN" --config {board}/config.json \\
      --key-dir {board}/keys --settings-file {board}/settings.json info --short ;;
  *) echo "unexpected command: $SSH_ORIGINAL_COMMAND" >&2; exit 99 ;;
esac
"""


class Board:
    """A real sshd on 127.0.0.1 playing the board, a TLS server with the board's certificate."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "board"
        (self.dir / "keys").mkdir(parents=True)
        make_certificate(str(self.dir / "keys"), "rock-5-itx")
        write_api_key(str(self.dir / "keys"), None)
        self.cert = self.dir / "keys/tls.crt"
        self.tls = TlsServer(self.cert, self.dir / "keys/tls.key")
        config = selftest_board_config(CFG)
        config["serve_port"] = self.tls.port  # the board says its port; the config says 8443
        (self.dir / "config.json").write_text(json.dumps(config))
        self.write_result(_with_sections(_doc(crash_at=None)))
        force = self.dir / "force.sh"
        force.write_text(FORCE.format(board=self.dir, tools=ROOT / "tools", python=sys.executable))
        force.chmod(0o755)
        for name in ("host", "client", "other"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp / name],
                           check=True)  # fmt: skip
        shutil.copy(tmp / "client.pub", tmp / "authorized_keys")
        self.port = _free_port()
        sshd_config = tmp / "sshd_config"
        sshd_config.write_text(
            f"ListenAddress 127.0.0.1:{self.port}\nListenAddress [::1]:{self.port}\n"
            f"HostKey {tmp / 'host'}\n"
            f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
            "PidFile none\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"PermitRootLogin prohibit-password\nAllowUsers {USER}\nForceCommand {force}\n"
        )
        host_key = (tmp / "host.pub").read_text().strip()
        (tmp / "known_hosts").write_text(
            f"[127.0.0.1]:{self.port} {host_key}\n[localhost]:{self.port} {host_key}\n"
            f"[::1]:{self.port} {host_key}\n"
        )
        self.ssh_config = tmp / "ssh_config"
        self.write_ssh_config("client", tmp / "known_hosts")
        self.log = open(tmp / "sshd.log", "w")  # noqa: SIM115 - closed in close()
        argv = [*os.environ["ROCKY_SSHD"].split(), "-D", "-e", "-f", str(sshd_config)]
        self.sshd = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.close()
            raise AssertionError(f"sshd did not start: {(tmp / 'sshd.log').read_text()}")
        self.tmp = tmp

    def write_ssh_config(self, key: str, known_hosts: Path) -> None:
        tmp = self.ssh_config.parent
        self.ssh_config.write_text(
            f"Host *\n  Port {self.port}\n  IdentityFile {tmp / key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
        )

    def write_result(self, doc) -> None:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        (self.dir / "result.json").write_text(text)

    def run(self, *extra: str, host: str = "localhost") -> int:
        argv = ["--config", str(ROOT / "rocky-vulkan.yaml"), "board"]
        return main([*argv, "--ssh-config", str(self.ssh_config), *extra, f"{USER}@{host}"])

    def close(self) -> None:
        self.tls.close()
        if self.sshd.poll() is None:
            self.sshd.terminate()
            self.sshd.wait(10)
        self.log.close()


def _with_sections(doc: dict) -> dict:
    doc["placement"] = good_placement()
    doc["serving"] = good_serving()
    return doc


@pytest.fixture
def real_board(tmp_path):
    b = Board(tmp_path)
    yield b
    b.close()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_report_url_fingerprint_and_key(real_board, capsys, monkeypatch, host):
    monkeypatch.setenv("COLUMNS", "250")
    rc = real_board.run(host=host)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "VERDICT: PASS" in out and "placement gpu" in out and "serving goal" in out
    port = real_board.tls.port
    assert f"API:  https://{host}:{port}/v1" in out
    assert f"the board serves on port {port} (the config says {CFG.serve.port})" in out
    fp = _openssl_fingerprint(real_board.cert)
    assert f"TLS certificate SHA-256 (seen on the port): {fp}" in out
    assert f"TLS certificate SHA-256 (the board's own):  {fp}" in out
    assert "The two match" in out
    assert "ssh -F" not in out and f"{USER}@{host} rocky-llm info` shows it" in out
    assert "rk-" not in out  # the key itself is never fetched
    assert "unexpected command" not in err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_over_ipv6(real_board, capsys, monkeypatch):
    real_board.tls.close()
    real_board.tls = TlsServer(real_board.cert, real_board.dir / "keys/tls.key", host="::1")
    config = json.loads((real_board.dir / "config.json").read_text())
    config["serve_port"] = real_board.tls.port
    (real_board.dir / "config.json").write_text(json.dumps(config))
    rc = real_board.run(host="::1")
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"API:  https://[::1]:{real_board.tls.port}/v1" in out and "The two match" in out


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_with_plot(real_board, tmp_path, capsys):
    assert real_board.run("--plot", str(tmp_path / "out/board.png")) == 0
    assert (tmp_path / "out/board.png").is_file()
    assert (tmp_path / "out/board-serving.png").is_file()


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_without_a_result(real_board, capsys):
    (real_board.dir / "result.json").unlink()
    rc = real_board.run()
    out, err = capsys.readouterr()
    assert rc == 2
    assert "no self-test result on localhost yet" in err and "systemctl status" in err
    assert "API:  https://localhost:" in out  # the rest is still shown
    assert "Traceback" not in err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_still_running(real_board, capsys):
    real_board.write_result({"schema": "rocky-selftest-result", "schema_version": 1,
                             "verdict": "IN-PROGRESS", "checks": [], "step": "sweep"})  # fmt: skip
    assert real_board.run() == 2
    assert "still running" in capsys.readouterr().err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_port_closed(real_board, capsys):
    real_board.tls.close()
    rc = real_board.run()
    out, err = capsys.readouterr()
    assert rc == 2 and "nothing listens on localhost:" in err and "rocky-llm" in err
    assert "VERDICT: PASS" in out


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_certificate_mismatch(real_board, tmp_path, capsys):
    other = tmp_path / "other-cert"
    other.mkdir()
    make_certificate(str(other), "rock-5-itx")
    real_board.tls.close()
    impostor = TlsServer(other / "tls.crt", other / "tls.key")
    config = json.loads((real_board.dir / "config.json").read_text())
    config["serve_port"] = impostor.port
    (real_board.dir / "config.json").write_text(json.dumps(config))
    try:
        rc = real_board.run()
    finally:
        impostor.close()
    out, err = capsys.readouterr()
    assert rc == 2 and "NOT the one the board made" in err and "do not send the API key" in err
    assert "The two match" not in out


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_hostile_result(real_board, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    doc = _with_sections(_doc(crash_at=None))
    doc["checks"][2]["evidence"] = "\x1b]0;owned\x07\x1b[2J[red]x[/red]\u202e"
    doc["serving"]["ttft_ratio"] = float("nan")
    doc["placement"]["modes"]["gpu"]["pp_tps"] = 10**400
    real_board.write_result(json.dumps(doc))
    rc = real_board.run()
    out, _ = capsys.readouterr()
    assert rc == 1 and "VERDICT: FAIL" in out and "BAD" in out
    assert "\x1b]0" not in out and "\x1b[2J" not in out and "\u202e" not in out
    assert "[red]x[/red]" in out  # shown as text, not markup
    assert "serving.ttft_ratio" in out and "placement.modes.gpu.pp_tps" in out


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_oversized_result_is_cut_off(real_board, capsys):
    (real_board.dir / "huge").write_text("")
    rc = real_board.run()
    assert rc == 2 and "larger than 8 MiB" in capsys.readouterr().err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_unknown_host_key(real_board, tmp_path, capsys):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    real_board.write_ssh_config("client", empty)
    rc = real_board.run()
    err = capsys.readouterr().err
    assert rc == 2 and "SSH host key of localhost is not known" in err and "ssh-keygen" in err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_login_refused(real_board, tmp_path, capsys):
    real_board.write_ssh_config("other", tmp_path / "known_hosts")
    rc = real_board.run()
    err = capsys.readouterr().err
    assert rc == 2 and f"refused the login as {USER}" in err and "ssh_authorized_keys" in err


@pytest.mark.needs_sshd
@needs_ssh
@needs_openssl
def test_real_board_that_hangs_is_stopped(real_board, capsys):
    (real_board.dir / "slow").write_text("")
    started = time.monotonic()
    rc = real_board.run("--timeout", "2")
    assert time.monotonic() - started < 15
    assert rc == 2 and "no complete answer within 2 s" in capsys.readouterr().err


def test_run_bounded_keeps_stderr_lines_clean():
    res = board_mod.run_bounded(
        [sys.executable, "-c", "import sys; sys.stderr.write('a\\x1b[31m\\n' * 100 + 'last\\n')"],
        100,
        30,
    )
    assert res.err.splitlines()[-1] == "last" and "\x1b" not in res.err
    assert len(res.err.splitlines()) == 20
