"""`rocky-vulkan board HOST`: what a board says about itself, over SSH, from the build host.

It copies the self-test's result.json (bounded, into a temp file), prints the report of it, then
how to reach the board's API: the URL, the TLS certificate's SHA-256 fingerprint as this computer
sees it on the port (and as the board says it made it: they must be the same), and how to get the
API key. The key itself is never fetched.

Only the system's `ssh` is run, with BatchMode (no prompt can hang it) and a connect timeout, and
only fixed commands are sent. HOST is checked against exact patterns first (a host name, a
`.local` name, an IPv4 or IPv6 address, each optionally `user@`), so nothing the user types can
reach ssh as an option or the board's shell as a command. Everything the board sends back is
treated as hostile: bounded in size, parsed with the report's own checks, shown as text without
control characters.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import re
import shlex
import socket
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rocky_selftest import paths as board_paths
from rocky_selftest.results import IN_PROGRESS, RESULT_NAME

from rocky_vulkan import boundedrun
from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.plot_files import check_plot_out
from rocky_vulkan.host.result_doc import MAX_RESULT_BYTES, ResultError, clean_text, load_result

RESULT_PATH = f"{board_paths.RESULTS_DIR}/{RESULT_NAME}"
SELFTEST_UNIT = "rocky-selftest.service"
SERVER_UNIT = "rocky-llm.service"
MAX_HOST_CHARS = 253  # a DNS name's limit
MAX_INFO_BYTES = 64 << 10  # `rocky-llm info --short` prints a few lines
MAX_STDERR_BYTES = 64 << 10
CONNECT_TIMEOUT_S = 10
COMMAND_TIMEOUT_S = 60
TLS_TIMEOUT_S = 10

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # image.user's form, and root
ZONE_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}")  # fe80::1%eth0
FINGERPRINT_RE = re.compile(r"\b(?:[0-9A-F]{2}:){31}[0-9A-F]{2}\b")
URL_PORT_RE = re.compile(r"\b(https?)://[^\s/]+:([0-9]{1,5})/v1\b")

HOST_FORMS = (
    "a host name (rock-5-itx), a .local name (rock-5-itx.local), an IPv4 address "
    "(192.168.1.50) or an IPv6 address (fd00::50, [fe80::1%eth0]), optionally as user@HOST"
)


class BoardError(UserError):
    """The board could not be reached or asked; the message names the cause and the fix."""


class NoResult(BoardError):
    """The board answered, but has no result to read (yet)."""


@dataclass(frozen=True)
class Target:
    user: str
    host: str  # as ssh and getaddrinfo take it (IPv6 without brackets)
    ipv6: bool = False

    @property
    def ssh_dest(self) -> str:
        return f"{self.user}@{self.host}"

    @property
    def url_host(self) -> str:
        """The host as written in a URL: IPv6 in brackets, a zone's % escaped."""
        return f"[{self.host.replace('%', '%25')}]" if self.ipv6 else self.host


def _shown(text: str) -> str:
    """The user's own input, quoted for a message, bounded: a 10 kB name is not echoed."""
    return repr(clean_text(text, 60))


def parse_target(text: str, default_user: str) -> Target:
    """HOST as typed, checked against exact patterns; BoardError names the allowed forms."""
    if not isinstance(text, str) or not text:
        raise BoardError(f"no board given: give {HOST_FORMS}")
    if len(text) > MAX_HOST_CHARS + 40:
        raise BoardError(
            f"board {_shown(text)} ({len(text)} characters) is too long: give {HOST_FORMS}"
        )
    user, at, host = text.rpartition("@")
    if not at:
        user = default_user
    if not USER_RE.fullmatch(user):
        raise BoardError(
            f"user {_shown(user)} in {_shown(text)} is not a login name (lower-case letters, "
            "digits, '_', '-'): give user@HOST, or set image.user in rocky-vulkan.yaml"
        )
    bracketed = host.startswith("[") and host.endswith("]")
    bare = host[1:-1] if bracketed else host
    address, zone = bare.partition("%")[::2]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None and ip.version == 6 and (not zone or ZONE_RE.fullmatch(zone)):
        return Target(user, bare, ipv6=True)
    if ip is not None and ip.version == 4 and not zone and not bracketed:
        return Target(user, address)
    last = host.rsplit(".", 1)[-1]
    if (
        not bracketed
        and len(host) <= MAX_HOST_CHARS
        and HOSTNAME_RE.fullmatch(host)
        and not last.isdigit()  # "10.1.2" is an address to ssh, not a name
    ):
        return Target(user, host)
    raise BoardError(f"board {_shown(text)} is not {HOST_FORMS}")


# ---- ssh -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    config: str | None = None  # ssh -F FILE
    connect_timeout: int = CONNECT_TIMEOUT_S
    ssh: str = "ssh"


def ssh_command(target: Target, remote: str, opts: SshOptions) -> list[str]:
    """ssh's argv: our options first, `--`, then the checked destination and a fixed command."""
    cmd = [opts.ssh]
    if opts.config:
        cmd += ["-F", opts.config]
    cmd += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={opts.connect_timeout}"]
    cmd += ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    cmd += ["-o", "ClearAllForwardings=yes", "-o", "RequestTTY=no", "-T"]
    if opts.port:
        cmd += ["-p", str(opts.port)]
    return [*cmd, "--", target.ssh_dest, remote]


@dataclass(frozen=True)
class Remote:
    rc: int
    out: bytes
    err: str  # cleaned, bounded
    overflow: bool  # stdout passed the limit (the command was stopped)


def run_bounded(cmd: list[str], limit: int, timeout: float) -> Remote:
    """Run `cmd`; keep at most `limit` bytes of stdout (stop it past that) and 64 kB of stderr;
    stop it after `timeout` seconds (BoardError)."""
    try:
        res = boundedrun.run_bounded(cmd, limit, timeout, MAX_STDERR_BYTES)
    except FileNotFoundError:
        raise BoardError(
            f"{cmd[0]} not found: install OpenSSH's client (Debian: sudo apt-get install "
            "openssh-client)"
        ) from None
    if res.timed_out:
        raise BoardError(
            f"no complete answer within {timeout:.0f} s: the board or the network is too slow "
            "or hangs. Fix: try again, or give a longer --timeout"
        )
    # ssh's own messages and the board's: each line as text, the last 20 kept.
    lines = res.err.decode("utf-8", "replace").replace("\r", "\n").splitlines()
    text = "\n".join([clean_text(ln, 300) for ln in lines if ln.strip()][-20:])
    return Remote(res.rc, res.out, text, res.overflow)


def ssh_failure(target: Target, res: Remote, opts: SshOptions) -> BoardError:
    """What ssh's exit 255 means, from its own words, with the fix."""
    err = res.err
    dest, host = target.ssh_dest, target.host
    port = f" -p {opts.port}" if opts.port else ""
    if re.search(r"Could not resolve hostname|Name or service not known|not known|"
                 r"Temporary failure in name resolution", err):  # fmt: skip
        local = (
            "; a .local name needs mDNS on this computer (Debian: sudo apt-get install "
            "libnss-mdns) and the board on the same network"
            if host.endswith(".local")
            else ""
        )
        why = f"cannot resolve {host}: no such name on this network{local}"
        fix = "use the board's IP address (`ip -br addr` on its serial console)"
        return BoardError(f"{why}. Fix: check the name, or {fix}")
    if "Connection refused" in err:
        return BoardError(
            f"{host} refused the SSH connection{port}: the board is still booting or sshd is "
            f"not running there. Fix: wait a minute and try again; check on the serial console "
            "with `systemctl status sshd`"
        )
    if re.search(r"timed out|No route to host|Network is unreachable|Host is down", err):
        return BoardError(
            f"{host} does not answer on SSH{port} ({_last_line(err)}): it is off, on another "
            "network, or a firewall drops SSH. Fix: check the cable and power, and the address "
            "(`ip -br addr` on its serial console)"
        )
    if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
        return BoardError(
            f"the SSH host key of {host} is not known here, or has changed (each board makes its "
            f"own at first boot; a re-flashed board has a new one). Fix: run `ssh{port} {dest}` "
            f"once and compare the key with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` "
            f"on the board's console; for a re-flashed board first `ssh-keygen -R {host}`"
        )
    if "Permission denied" in err or "Too many authentication failures" in err:
        return BoardError(
            f"{host} refused the login as {target.user} (no key it accepts; BatchMode asks no "
            "password). Fix: put your public key into image.ssh_authorized_keys before building, "
            "or into ~/.ssh/authorized_keys from the console (docs/user/getting-in.md); or give "
            "another user as USER@HOST"
        )
    return BoardError(
        f"ssh to {dest} failed (exit {res.rc}): {_last_line(err) or 'no message'}. "
        f"Fix: try `ssh{port} {dest}` by hand to see why"
    )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return clean_text(lines[-1], 200) if lines else ""


def remote(target: Target, command: str, opts: SshOptions, limit: int, timeout: float) -> Remote:
    """Run a fixed command on the board; BoardError when ssh itself failed (exit 255)."""
    res = run_bounded(ssh_command(target, command, opts), limit, timeout)
    if res.rc == 255:
        raise ssh_failure(target, res, opts)
    return res


# ---- the result --------------------------------------------------------------------------------


def fetch_result(target: Target, opts: SshOptions, folder: Path, timeout: float) -> Path:
    """result.json from the board into `folder` (BoardError: none yet, unreadable, too big)."""
    dest, port = target.ssh_dest, f" -p {opts.port}" if opts.port else ""
    res = remote(target, f"cat -- {shlex.quote(RESULT_PATH)}", opts, MAX_RESULT_BYTES, timeout)
    if res.overflow:
        raise NoResult(
            f"{RESULT_PATH} on {target.host} is larger than {MAX_RESULT_BYTES >> 20} MiB: not a "
            "self-test result. Fix: run the self-test again on the board (`rocky-selftest run`)"
        )
    if res.rc != 0:
        if "No such file" in res.err:
            raise NoResult(
                f"no self-test result on {target.host} yet ({RESULT_PATH} does not exist): the "
                "first-boot self-test has not run or not finished. Fix: wait for it (it runs once "
                f"after the first boot); `ssh{port} {dest} systemctl status {SELFTEST_UNIT}` "
                "says where it is"
            )
        if "Permission denied" in res.err:
            raise NoResult(
                f"{target.user} may not read {RESULT_PATH} on {target.host}. Fix: log in as the "
                "image's user (image.user in rocky-vulkan.yaml)"
            )
        raise NoResult(
            f"reading {RESULT_PATH} on {target.host} failed (exit {res.rc}): "
            f"{_last_line(res.err) or 'no message'}. Fix: `ssh{port} {dest} cat {RESULT_PATH}` "
            "by hand to see why"
        )
    path = folder / RESULT_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(res.out)
    return path


# ---- the server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoardInfo:
    lines: tuple[str, ...]  # `rocky-llm info --short`, cleaned
    scheme: str | None = None  # what its URL says
    port: int | None = None
    fingerprint: str | None = None
    off: bool = False


def parse_info(text: str) -> BoardInfo:
    """`rocky-llm info --short`'s lines, cleaned, and what they say of the URL and certificate."""
    lines = tuple(clean_text(ln, 300) for ln in text.splitlines()[:40] if ln.strip())
    joined = "\n".join(lines)
    scheme = port = None
    m = URL_PORT_RE.search(joined)
    if m and 1 <= int(m.group(2)) <= 65535:
        scheme, port = m.group(1), int(m.group(2))
    fp = FINGERPRINT_RE.search(joined)
    return BoardInfo(
        lines, scheme, port, fp.group(0) if fp else None, off="server is off" in joined
    )


def board_info(target: Target, opts: SshOptions, timeout: float) -> tuple[BoardInfo, str | None]:
    """(what `rocky-llm info --short` said, a problem or None)."""
    res = remote(target, "rocky-llm info --short", opts, MAX_INFO_BYTES, timeout)
    info = parse_info(res.out.decode("utf-8", "replace"))
    if res.rc == 127:  # the shell's "command not found"
        return info, (
            f"{target.host} has no rocky-llm: its image was built before the server was added. "
            "Fix: build and flash a current image"
        )
    if res.rc != 0:
        return info, (
            f"`rocky-llm info --short` on {target.host} failed (exit {res.rc}): "
            f"{_last_line(res.err) or 'no message'}"
        )
    return info, None


def fingerprint(der: bytes) -> str:
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def server_fingerprint(host: str, port: int, timeout: float = TLS_TIMEOUT_S) -> str:
    """SHA-256 of the DER certificate that HOST:PORT presents (not verified: it is self-signed,
    and this is how its identity is checked)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with ctx.wrap_socket(sock, server_hostname=None) as tls:
                der = tls.getpeercert(binary_form=True)
    except ConnectionRefusedError:
        raise BoardError(
            f"nothing listens on {host}:{port}: the server (rocky-llm) is not running, or it "
            "listens on another port"
        ) from None
    except TimeoutError:
        raise BoardError(
            f"no answer from {host}:{port} within {timeout:.0f} s: a firewall, or the board is "
            "busy starting the server"
        ) from None
    except socket.gaierror as err:
        raise BoardError(f"cannot resolve {host}: {clean_text(str(err), 200)}") from None
    except ssl.SSLError as err:
        raise BoardError(
            f"{host}:{port} answers, but not with TLS ({clean_text(str(err), 200)}): "
            "serve.listen may be localhost (plain HTTP) on the board"
        ) from None
    except OSError as err:
        raise BoardError(f"cannot connect to {host}:{port}: {clean_text(str(err), 200)}") from None
    if not der:
        raise BoardError(f"{host}:{port} presented no certificate")
    return fingerprint(der)


# ---- the command -----------------------------------------------------------------------------


def _say(console, text: str, style: str | None = None) -> None:
    from rich.text import Text

    console.print(Text(text, style=style or ""))


def describe_server(console, target: Target, listen: str, port: int, opts: SshOptions,
                    info: BoardInfo | None, tls_timeout: float,
                    api_port: int | None = None) -> list[str]:  # fmt: skip
    """Print how to reach the API; returns the problems found (each with its fix). api_port:
    the port this computer reaches the API on when it is forwarded (else the board's)."""
    problems: list[str] = []
    ssh_port = f" -p {opts.port}" if opts.port else ""
    dest = target.ssh_dest
    if info is not None:
        if info.off:
            listen = "off"
        elif info.scheme == "https":
            listen = "lan"
        elif info.scheme == "http":
            listen = "localhost"
        if info.port and info.port != port:
            _say(console, f"note: the board serves on port {info.port} (the config says {port})")
            port = info.port
    if api_port and api_port != port:
        _say(console, f"note: reaching the board's port {port} through port {api_port} here")
        port = api_port
    console.rule("the board's API (OpenAI-compatible)")
    if listen == "off":
        _say(console, "The server is off (serve.listen: off): no API on this board.")
        return problems
    if listen == "localhost":
        _say(
            console, f"API: http://127.0.0.1:{port}/v1 on the board only (serve.listen: localhost)"
        )
        _say(console, f"From here: ssh{ssh_port} -N -L {port}:127.0.0.1:{port} {dest}")
        _say(console, f"  then http://127.0.0.1:{port}/v1 on this computer")
    else:
        _say(
            console,
            f"API:  https://{target.url_host}:{port}/v1   (web UI: https://{target.url_host}:{port}/)",
        )
        try:
            seen = server_fingerprint(target.host, port, tls_timeout)
        except BoardError as err:
            seen = None
            problems.append(
                f"{err}. Fix: `ssh{ssh_port} {dest} systemctl status {SERVER_UNIT}` and "
                f"`journalctl -u {SERVER_UNIT}` on the board say why"
            )
        if seen:
            _say(console, f"TLS certificate SHA-256 (seen on the port): {seen}")
        said = info.fingerprint if info else None
        if said:
            _say(console, f"TLS certificate SHA-256 (the board's own):  {said}")
        if seen and said and seen != said:
            problems.append(
                f"the certificate on {target.host}:{port} is NOT the one the board made: another "
                "machine answers for that name or address, or something intercepts the "
                "connection. Fix: do not send the API key there; check the address and the "
                "network"
            )
        elif seen and said:
            _say(console, "The two match: this is the board's own certificate.", "green")
    _say(console, f"API key: `ssh{ssh_port} {dest} rocky-llm info` shows it (not copied here)")
    return problems


def board(
    text: str,
    cfg,
    opts: SshOptions,
    plot_out: Path | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    tls_timeout: float = TLS_TIMEOUT_S,
    console=None,
    api_port: int | None = None,
) -> int:
    from rich.console import Console

    from rocky_vulkan.host.report import show

    console = console or Console(highlight=False)
    target = parse_target(text, cfg.image.user)
    problems: list[str] = []
    rc = 0
    with tempfile.TemporaryDirectory(prefix="rocky-board-") as tmp:
        doc = None
        try:  # an ssh failure (BoardError) ends here; a missing or bad result does not
            path = fetch_result(target, opts, Path(tmp), timeout)
            doc = load_result(path)
        except NoResult as err:
            problems.append(str(err))
        except ResultError as err:
            where = f"{target.host}:{RESULT_PATH}"
            problems.append(str(err).replace(str(Path(tmp) / RESULT_NAME), where))
        if doc is not None and doc["verdict"] == IN_PROGRESS:
            problems.append(
                f"the self-test on {target.host} is still running (result.json holds its "
                f"progress marker). Fix: wait, then run this again; `ssh {target.ssh_dest} "
                f"systemctl status {SELFTEST_UNIT}` says where it is"
            )
        elif doc is not None:
            console.rule(f"self-test result from {target.host}")
            rc = show(doc, cfg, plot_out, console)
    info, info_problem = board_info(target, opts, timeout)
    if info_problem:
        problems.append(info_problem)
    if info.lines:
        console.rule(f"`rocky-llm info --short` on {target.host}")
        for line in info.lines:
            _say(console, line)
    problems += describe_server(
        console, target, cfg.serve.listen, cfg.serve.port, opts, info, tls_timeout, api_port
    )
    for problem in problems:
        print(f"rocky-vulkan: error: {problem}", file=sys.stderr)
    return 2 if problems else rc


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    opts = SshOptions(port=args.ssh_port, config=args.ssh_config)
    plot_out = Path(args.plot) if args.plot else None
    if plot_out is not None:
        check_plot_out(plot_out)  # before ssh: a refused name wastes no round trip
    return board(args.host, cfg, opts, plot_out, timeout=args.timeout, api_port=args.api_port)


def _port(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return int(text)


def _seconds(text: str) -> float:
    if not re.fullmatch(r"[0-9]{1,4}", text) or not 1 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds (1 to 3600)")
    return float(text)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "board",
        help="over SSH: the board's self-test report, its API URL, certificate fingerprint, key",
        description=__doc__.split("\n\n")[1],
    )
    # argparse formats help with %: the IPv6 zone's % is doubled
    parser.add_argument("host", metavar="HOST", help="the board: " + HOST_FORMS.replace("%", "%%"))
    parser.add_argument("--plot", help="also write the report's PNGs (this name, -serving, -tune)")
    parser.add_argument("--ssh-port", type=_port, help="the board's SSH port (default: ssh's)")
    parser.add_argument("--ssh-config", help="an ssh config file to use (ssh -F)")
    parser.add_argument(
        "--api-port",
        type=_port,
        help="the port this computer reaches the API on, where it is forwarded (a VM, a NAT); "
        "default: the one the board serves on",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=COMMAND_TIMEOUT_S,
        help="seconds for each command on the board (default: %(default)s)",
    )
    parser.set_defaults(func=_run)
