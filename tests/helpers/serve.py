"""rocky-llm's server as the board starts it, run here against the real llama-server.

What is real: the rendered units' ExecStart lines (only the config path is changed, and the
settings file is put in a temp dir), the image's copy of rocky_selftest (the rocky-selftest
recipe's files, run with `python -I` so nothing else is imported), `rocky-llm keys` with the real
openssl, llama-server from ROCKY_LLAMA_BIN_DIR, exec'd by `rocky-llm serve`. What is not: systemd
(no PID 1 here). Its part is done by hand the way the unit says: the credentials named by the
unit's LoadCredential= lines are copied into a CREDENTIALS_DIRECTORY, and the process is started
directly, as root or as whoever runs the tests, not as the unit's User=.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rocky_selftest import RESULT_SCHEMA, RESULT_SCHEMA_VERSION, paths

from tests.helpers.project import ROOT
from tests.helpers.systemd import settings

RECIPES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm"
LLM_FILES = RECIPES / "rocky-llm/files"
BOARD_FILES = RECIPES / "rocky-board/files"  # the library and config.json
SELFTEST_FILES = RECIPES / "rocky-selftest/files"
UNIT = LLM_FILES / "rocky-llm.service"
OLLAMA_UNIT = LLM_FILES / "rocky-llm-ollama.service"
KEYS_UNIT = LLM_FILES / "rocky-llm-keys.service"
WRAPPER = "/usr/bin/rocky-llm"
LIB_DIR = "/usr/share/rocky-selftest"  # where the wrapper imports rocky_selftest from
# The 'tiny' test model's vocab (testmodel.py): ids 0-2 are <unk> <s> </s>, 3-258 the byte
# tokens. Banning </s> makes every answer exactly max_tokens long, so token counts can be asserted.
# Banning the bytes keeps the random model's output valid UTF-8: a lone byte token (e.g. <0xE3>)
# makes b9101's chat parser (common/chat.cpp) fail the whole request with 500 "Failed to parse
# input at pos N" (seen; a real model emits whole characters).
N_FIXED_TOKENS = 3 + 256
TEXT_ONLY = {str(i): -100 for i in range(N_FIXED_TOKENS)}


def exec_start(unit: Path) -> list[str]:
    (line,) = settings(unit.read_text())["ExecStart"]
    return shlex.split(line)


def install_layer_copy(tmp: Path) -> list[str]:
    """The image's rocky-llm wrapper and rocky_selftest package under `tmp`; returns the argv
    prefix that stands for /usr/bin/rocky-llm (the board's python runs the wrapper the same way:
    only the library path differs)."""
    lib = tmp / "share/rocky-selftest"
    shutil.copytree(BOARD_FILES / "rocky_selftest", lib / "rocky_selftest", dirs_exist_ok=True)
    text = (LLM_FILES / "rocky-llm").read_text()
    assert f'"{LIB_DIR}"' in text
    wrapper = tmp / "rocky-llm"
    wrapper.write_text(text.replace(f'"{LIB_DIR}"', repr(str(lib))))
    wrapper.chmod(0o755)
    return [sys.executable, "-S", "-I", "-B", str(wrapper)]


def unit_argv(unit: Path, prefix: list[str], config: Path, *extra: str) -> list[str]:
    """The unit's ExecStart with /usr/bin/rocky-llm -> `prefix` and the --config value ->
    `config`; `extra` (global options) go before the sub-command."""
    argv = exec_start(unit)
    assert argv[0] == WRAPPER and argv[1] == "--config", argv
    return [*prefix, "--config", str(config), *extra, *argv[3:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_result(results_dir: Path, gpu: bool, **sections) -> Path:
    """A self-test result.json as the board would leave it: with `gpu`, every GPU check passed
    and the GPU wins the placement; without, the GPU checks failed (the server picks the CPU).
    `sections`: more of it (e.g. speculative), as given."""
    status = "PASS" if gpu else "FAIL"
    doc = {
        "schema": RESULT_SCHEMA,
        "schema_version": RESULT_SCHEMA_VERSION,
        "verdict": "PASS" if gpu else "FAIL",
        "checks": [
            {"name": n, "status": status, "evidence": "synthetic (tests/helpers/serve.py)"}
            for n in ("gpu_driver", "vulkan_device", "sweep", "output_match")
        ],
        "sweep": [
            {"mode": "tuned", "ubatch": 64, "status": "PASS", "avg_ts": 500.0},
            {"mode": "tuned", "ubatch": 128, "status": "PASS", "avg_ts": 400.0},
        ],
        "placement": {
            "modes": {
                "gpu": {"status": "PASS", "pp_tps": 500.0, "tg_tps": 50.0},
                "cpu": {"status": "PASS", "pp_tps": 50.0, "tg_tps": 20.0},
            }
        },
        **sections,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / "result.json"
    path.write_text(json.dumps(doc))
    return path


def write_serve_config(tmp: Path, bin_dir: str, model: Path, port: int, **over) -> Path:
    """The board's rendered config.json with the host's paths: bin dir, model, results, port."""
    data = json.loads((BOARD_FILES / "config.json").read_text())
    data.update(
        bin_dir=bin_dir,
        model_path=str(model),
        model_sha256=None,
        serve_model_path=str(model),
        results_dir=str(tmp / "results"),
        motd_path=str(tmp / "motd"),
        vulkaninfo="vulkaninfo",
        tune_candidates=str(SELFTEST_FILES / "tile_candidates.json"),
        serve_port=port,
        serve_context_tokens=512,
        serve_parallel=2,
        models_dir=str(tmp / "models"),
        router_presets=str(tmp / "models.ini"),
    )
    data.update(over)
    path = tmp / "config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def make_keys(prefix: list[str], config: Path, key_dir: Path) -> subprocess.CompletedProcess:
    """`rocky-llm keys` as rocky-llm-keys.service runs it, into `key_dir`. Its `--group rocky`
    (the image's login group) is left out: that group does not exist on a test host."""
    argv = unit_argv(KEYS_UNIT, prefix, config, "--key-dir", str(key_dir))
    assert argv[-3:] == ["keys", "--group", "rocky"], argv
    return subprocess.run(argv[:-2], capture_output=True, text=True, timeout=180)


def load_credentials(key_dir: Path, cred_dir: Path) -> dict[str, str]:
    """What systemd's LoadCredential= does for rocky-llm.service: each credential of the unit,
    copied from the key dir under its credential name. Returns name -> source path on the
    board."""
    creds = {}
    for spec in settings(UNIT.read_text())["LoadCredential"]:
        name, _, source = spec.partition(":")
        assert os.path.dirname(source) == paths.LLM_KEY_DIR, spec
        creds[name] = source
    cred_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, source in creds.items():
        dest = cred_dir / name
        shutil.copyfile(key_dir / os.path.basename(source), dest)
        dest.chmod(0o400)
    return creds


def pinned_context(cert: Path) -> ssl.SSLContext:
    """An SSL context that trusts this one certificate and nothing else (no system CAs)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(cert))
    return ctx


def served_fingerprint(port: int) -> str:
    """SHA-256 of the certificate the server presents, without trusting it (AA:BB:...)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def spki_sha256_b64(cert: Path) -> str:
    """base64(SHA-256(SubjectPublicKeyInfo)), Chromium's --ignore-certificate-errors-spki-list
    form, from the real openssl."""
    pub = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-pubkey"],
        capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "DER"],
        input=pub, capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def _die_with_parent() -> None:
    """The server gets SIGKILL when the test run dies (kept across the exec into llama-server):
    no stray llama-server after a killed pytest."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    """`rocky-llm serve` started with the unit's command line; it execs llama-server."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    port: int
    ctx: ssl.SSLContext
    api_key: str
    proc: subprocess.Popen | None = None
    starts: list[float] = field(default_factory=list)
    health: str = "/health"  # answers 200 without a key once the server is ready

    def start(self, timeout: float = 300) -> None:
        with self.log.open("ab") as fh:
            fh.write(f"\n==== start {shlex.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                status, _ = self.request("GET", self.health, key=None, timeout=10)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"no {self.health} 200 after {timeout} s:\n{self.tail()}")
            time.sleep(0.5)
        self.starts.append(time.monotonic() - t0)

    def pids(self) -> list[int]:
        """The router and its children (a llama-server per loaded model)."""
        kids = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            if f"\nPPid:\t{self.proc.pid}\n" in text:
                kids.append(int(status.parent.name))
        return [self.proc.pid, *sorted(kids)]

    def rss_kib(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) summed over the router and its children, in KiB."""
        both = [rss_kib(pid) for pid in self.pids()]
        return sum(r for r, _ in both), sum(h for _, h in both)

    def exe(self) -> str:
        return os.readlink(f"/proc/{self.proc.pid}/exe")

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> int:
        """SIGKILL to the router; then what systemd does to the unit's cgroup once its main
        process is gone: the rest (the models' llama-servers) killed too."""
        os.kill(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait(timeout=60)
        self._kill_group()
        return rc

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # start_new_session: the group is ours
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc is not None:
            self._kill_group()

    def connection(self, timeout: float = 120) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.ctx, timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        key: str | None = "",
        timeout: float = 120,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body). `key` "" means the right key, None no key, else that key."""
        hdrs = dict(headers or {})
        key = self.api_key if key == "" else key
        if key is not None:
            hdrs["Authorization"] = f"Bearer {key}"
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            res = conn.getresponse()
            return res.status, res.read()
        finally:
            conn.close()

    def chat_ok(self, max_tokens: int = 4, model: str = "reference") -> dict:
        """A normal request to `model`: must succeed with exactly `max_tokens` tokens."""
        status, data = self.request(
            "POST", "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
             "max_tokens": max_tokens, "temperature": 0, "logit_bias": TEXT_ONLY},
        )  # fmt: skip
        assert status == 200, (status, data[:500], self.tail(2000))
        doc = json.loads(data)
        assert doc["usage"]["completion_tokens"] == max_tokens, doc
        return doc


def start_unit_server(
    tmp: Path,
    bin_dir: str,
    model: Path,
    *,
    gpu: bool,
    extra_env: dict[str, str] | None = None,
    result_sections: dict | None = None,
    **config_values,
) -> tuple[Server, dict]:
    """Keys, config (with `config_values`), credentials, then ExecStart; returns the running
    server and what was made (paths, the key, the wrapper's argv prefix)."""
    prefix = install_layer_copy(tmp)
    port = free_port()
    synthetic_result(tmp / "results", gpu=gpu, **(result_sections or {}))
    config = write_serve_config(tmp, bin_dir, model, port, **config_values)
    key_dir, cred_dir = tmp / "keys", tmp / "credentials"
    made = make_keys(prefix, config, key_dir)
    assert made.returncode == 0, made.stdout + made.stderr
    load_credentials(key_dir, cred_dir)
    (tmp / "models").mkdir(exist_ok=True)  # the units' StateDirectory=rocky-llm/models
    from rocky_selftest.serve_keys import read_api_key

    api_key = read_api_key(str(key_dir))
    settings_file = tmp / "settings.json"
    argv = unit_argv(UNIT, prefix, config, "--settings-file", str(settings_file))
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(cred_dir), **(extra_env or {})}
    cert = key_dir / paths.TLS_CERT_NAME
    server = Server(argv, env, tmp / "server.log", port, pinned_context(cert), api_key)
    server.start()
    info = {
        "config": config,
        "key_dir": key_dir,
        "cred_dir": cred_dir,
        "cert": cert,
        "settings_file": settings_file,
        "presets": tmp / "models.ini",
        "keys_output": made.stdout,
        "prefix": prefix,
    }
    return server, info


def start_ollama_unit(server: Server, info: dict, port: int) -> Server:
    """rocky-llm-ollama.service's ExecStart beside a running unit server: the same config
    (whose ollama_port is `port`), credentials and settings file."""
    argv = unit_argv(
        OLLAMA_UNIT, info["prefix"], info["config"], "--settings-file", str(info["settings_file"])
    )
    assert argv[-1] == "ollama", argv
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(info["cred_dir"])}
    log = server.log.with_name("ollama.log")
    proxy = Server(argv, env, log, port, server.ctx, server.api_key, health="/")
    proxy.start(timeout=60)
    return proxy


@contextmanager
def unit_server(
    tmp_path_factory, name: str, bin_dir: Path, model: Path | None = None, **config_values
) -> Iterator[tuple]:
    """The unit's server on `model` (default: the tiny model), CPU placement, for one test
    module: (server, info, its temp dir); stopped at the end, its log path printed."""
    from tests.helpers.selftest import make_tiny_model

    tmp = tmp_path_factory.mktemp(name)
    model = model or make_tiny_model(tmp_path_factory)
    server, info = start_unit_server(tmp, bin_dir, model, gpu=False, **config_values)
    try:
        yield server, info, tmp
    finally:
        server.stop()
        print(f"server log: {server.log}")
