"""The adversarial runs of issue 22 for the on-board self-test (`rocky-selftest`).

Every case drives the real CLI (`rocky_selftest.cli.main` in this process, or `python -m
rocky_selftest` in a subprocess where signals, locks and closed pipes need a process of its own)
against real files, FIFOs, symlinks, read-only bind mounts and real processes. The only fakes are
the llama.cpp tools and vulkaninfo: shell scripts that inject a fault the real tools cannot
produce on demand (a hang with an escaped child, escape bytes, 20 MB of output).

Classes:
- config-types: every config.json field x wrong types and out-of-range values, and broken files:
  refused, naming the field, with an ERROR verdict in the run's output, result.json, the root
  step's console and motd, and `status`; never the old PASS.
- signals: SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 at a run: an ERROR verdict naming it.
- concurrency: a second run beside a live one: a clear "in progress (pid)" and a distinct exit
  code, the stamp and result untouched; the first-boot run still happens later.
- disk: read-only, wrong-kind and full places: a visible verdict, never a stale PASS.
- files: result.json, config.json, the note, motd and the tuner's files as FIFOs, devices,
  directories, loops, huge or malformed: no hang, no traceback, no PASS from them.
- children: tools that leave a child in its own session: run_timeout_s and deadline_s hold.
- output: escape bytes from the tools, a closed stdout, 20 MB of output: clean lines, the same
  verdict, a bounded result.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from rocky_selftest import cli
from rocky_selftest.settings import Settings

from tests.helpers.adversary import Case, Outcome
from tests.helpers.project import ROOT
from tests.helpers.selftest import (
    GOOD_ENTRY,
    OLD_PASS,
    SERVER_STEPS,
    STACK,
    fake_tool,
    read_only,
    write_config,
)

AREA = "selftest"
SYSTEMD_ENV = ("SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS", "INVOCATION_ID")
# The bound this harness holds result.json to, whatever the tools print (docs/verification).
RESULT_BOUND = 1 << 20
TILE_CANDIDATES = ROOT / "tools/rocky_vulkan/tiles/tile_candidates.json"


def case(klass: str, name: str, run: Callable[[], tuple[Outcome, str]], timeout_s=30.0) -> Case:
    return Case(AREA, klass, name, run, timeout_s)


# ---- driving the CLI ---------------------------------------------------------------------------


@dataclass
class Ran:
    rc: int | None
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.text or "Exception ignored" in self.text


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """Only the systemd variables `extra` names are set (this machine may run under systemd)."""
    saved = {k: os.environ.get(k) for k in (*SYSTEMD_ENV, *extra)}
    for key in SYSTEMD_ENV:
        os.environ.pop(key, None)
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _default_note_dir(path: Path) -> Iterator[None]:
    """The runtime dir a by-hand run and `status` use by default (/run/rocky-selftest on the
    board) is this case's own: a machine path, redirected, not a behaviour replaced."""
    from rocky_selftest import outcome

    patched = [m for m in (outcome, cli) if hasattr(m, "DEFAULT_NOTE_DIR")]
    old = [m.DEFAULT_NOTE_DIR for m in patched]
    for m in patched:
        m.DEFAULT_NOTE_DIR = str(path)
    try:
        yield
    finally:
        for m, value in zip(patched, old, strict=True):
            m.DEFAULT_NOTE_DIR = value


def cli_main(argv: list[str], env: dict[str, str] | None = None) -> Ran:
    """`rocky-selftest ARGV` in this process, its output captured; an exception propagates (the
    harness counts it as a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with _environ(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as done:  # argparse
            rc = done.code if isinstance(done.code, int) else 2
    return Ran(rc, out.getvalue(), err.getvalue())


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    """`python -m rocky_selftest ARGV` in a session of its own (as a login shell's job)."""
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ENV}
    env["PYTHONPATH"] = str(ROOT / "tools")
    return subprocess.Popen(
        [sys.executable, "-m", "rocky_selftest", *argv],
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        text=True,
        **kw,
    )


def _wait_for(predicate: Callable[[], bool], bound_s: float, proc=None) -> bool:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(0.02)
    return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_pids(path: Path) -> None:
    """The escaped children a fake tool wrote down: ended here, they are ours."""
    if not path.exists():
        return
    for word in path.read_text().split():
        try:
            os.kill(int(word), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


@contextlib.contextmanager
def memory_cap(limit: int = 4 << 30) -> Iterator[None]:
    """An unbounded read (of /dev/zero, say) fails fast with MemoryError instead of filling a
    shared machine's memory: the address space is capped while the case runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def control_chars(text: str) -> list[str]:
    """Characters that would drive a terminal: anything not printable but the newline."""
    return sorted({repr(c) for c in text if not c.isprintable() and c != "\n"})


def first_line(text: str) -> str:
    return text.splitlines()[0] if text.strip() else ""


def verdict_line(text: str) -> str:
    """The `rocky-selftest VERDICT (...)` line of a summary, '' when there is none."""
    for line in text.splitlines():
        if line.startswith("rocky-selftest ") and "(" in line:
            return line
    return ""


# ---- a scene: bin dir, model, results holding an old PASS, runtime dir, motd, console --------


class Scene:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="rocky-hostile-st-"))
        self.results = self.tmp / "results"
        self.results.mkdir()
        (self.results / "result.json").write_text(json.dumps(OLD_PASS))
        self.notes = self.tmp / "run"
        self.notes.mkdir()
        self.motd = self.tmp / "motd"
        self.console = self.tmp / "console"
        self.stamp = self.results / "first-boot.stamp"
        self.model = self.tmp / "model.gguf"
        self.model.write_bytes(b"GGUF fake model: the fake tools never read it")
        self.pids = self.tmp / "escaped.pids"
        self.good = self.tmp / "bench.json"
        self.good.write_text(json.dumps([GOOD_ENTRY]))
        self.bin = fake_tool(self.tmp, "llama-bench", f"cat {self.good}")
        self.cfg = self.tmp / "config.json"
        self.write(**{})

    def __enter__(self) -> Scene:
        return self

    def __exit__(self, *exc) -> None:
        _kill_pids(self.pids)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def values(self, **kw) -> dict:
        values = dict(
            model_path=str(self.model),
            ubatch_sizes=[64],
            bin_dir=str(self.bin),
            run_timeout_s=60,
            results_dir=str(self.results),
            motd_path=str(self.motd),
            sysroot=str(self.tmp / "noroot"),
            gpu_wait_s=0,
            sweep_modes=["tuned"],
            skip_checks=[*STACK, "model_sha256", "ratio", "output_match", *SERVER_STEPS],
        )
        values.update(kw)
        return values

    def write(self, **kw) -> Path:
        return write_config(self.cfg, **self.values(**kw))

    def tool(self, name: str, body: str) -> None:
        fake_tool(self.tmp, name, body)

    def paths(self) -> list[str]:
        return ["--results-dir", str(self.results), "--motd", str(self.motd)]

    def run(self, *extra: str, env=None) -> Ran:
        """A first-boot run as the unit starts it (stamp, runtime dir)."""
        argv = ["--config", str(self.cfg), "run", "--stamp", str(self.stamp)]
        return cli_main([*argv, "--note-dir", str(self.notes), *self.paths(), *extra], env)

    def by_hand(self, *extra: str) -> Ran:
        """`sudo rocky-selftest run`: no stamp, no runtime dir given."""
        with _default_note_dir(self.notes):
            return cli_main(["--config", str(self.cfg), "run", *self.paths(), *extra])

    def publish(self, env=None, note=True) -> Ran:
        argv = ["--config", str(self.cfg), "publish", "--stamp", str(self.stamp)]
        argv += ["--console", str(self.console), *self.paths()]
        if note:
            argv += ["--note-dir", str(self.notes)]
        return cli_main(argv, env)

    def status(self) -> Ran:
        with _default_note_dir(self.notes):
            return cli_main(["--config", str(self.cfg), "status", "--results-dir",
                             str(self.results)])  # fmt: skip

    def on_disk(self) -> str:
        """result.json's verdict: PASS/FAIL/ERROR/IN-PROGRESS, 'none' or 'unreadable'."""
        path = self.results / "result.json"
        if path.is_symlink() or not path.is_file():
            return "none" if not path.exists() and not path.is_symlink() else "unreadable"
        try:
            return str(json.loads(path.read_text())["verdict"])
        except (ValueError, KeyError, TypeError, OSError):
            return "unreadable"

    def shown(self, path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""


def _stale_pass(sc: Scene, *runs: Ran) -> str | None:
    """Where an old or unearned PASS is still shown, or None."""
    for r in runs:
        if "PASS" in verdict_line(r.out):
            return f"shows PASS: {verdict_line(r.out)!r}"
    if sc.on_disk() == "PASS":
        return "result.json still says PASS"
    if "PASS" in verdict_line(sc.shown(sc.console)):
        return "the console says PASS"
    if "PASS" in verdict_line(sc.shown(sc.motd)):
        return "motd says PASS"
    if sc.shown(sc.stamp).startswith("PASS"):
        return "the stamp says PASS"
    return None


# ---- config-types ------------------------------------------------------------------------------

# Raw JSON fragments (NaN, Infinity and 1e400 are what Python's json module reads as numbers).
BIG = "1" + "0" * 30
HUGE = "9" * 400
HOSTILE_BY_KIND: dict[str, list[str]] = {
    "int": ['"5"', "5.5", "true", "null", "[5]", "{}", "-1", BIG, HUGE, "NaN"],
    "float": ['"4.8"', "true", "null", "[]", "{}", "-1", "1e400", "NaN", "-Infinity", "1e300"],
    "bool": ["1", '"true"', "null", "0", "[]"],
    "str": [
        "5",
        "null",
        "true",
        "[]",
        "{}",
        json.dumps("x" * 5000),
        '"a\\u0000b"',
        '"\\u001b]0;x\\u0007"',
        '"a\\nb"',
    ],  # fmt: skip
    "str|None": ["5", "true", "[]", '""', '"zz"', json.dumps("A" * 64), json.dumps("a" * 65)],
    "ints": [
        "5",
        "null",
        '"64"',
        "[]",
        "[0]",
        "[-1]",
        f"[{BIG}]",
        "[64.0]",
        "[true]",
        '["64"]',
        "[[64]]",
        "[64, 64]",
        json.dumps(list(range(1, 1001))),
    ],  # fmt: skip
    "strs": ["5", "null", '"tuned"', "[5]", "[null]", '["gpu"]'],
    # The cluster object (cluster.py): each rule broken once.
    "cluster": [
        "5",
        "null",
        "[]",
        '{"head": "a", "workers": ["b"]}',
        '{"subnet": "8.8.8.0/24", "head": "a", "workers": ["b"]}',
        '{"subnet": "10.77.0.0/24", "head": "a", "workers": ["a"]}',
        '{"subnet": "10.77.0.0/24", "head": "A\\u001b[2J", "workers": ["b"]}',
        '{"subnet": "10.77.0.0/24", "head": "a", "workers": []}',
        '{"subnet": "10.77.0.0/24", "head": "a", "workers": ["b"], "rpc_port": 22}',
        '{"subnet": "10.77.0.0/24", "head": "a", "workers": ["b"], "netns": "../x"}',
        '{"subnet": "10.77.0.0/24", "head": "a", "workers": ["b"], "listen": "0.0.0.0"}',
        '{"subnet": "10.77.0.0/30", "head": "a", "workers": ["b", "c"]}',
    ],
    "dict[str,str]": [
        "5",
        "null",
        "[]",
        '"K=V"',
        '{"K": 5}',
        '{"": "x"}',
        '{"A=B": "x"}',
        '{"K": "a\\u0000b"}',
        '{"K\\u0000": "v"}',
    ],  # fmt: skip
    "dict[str,float]": ["5", "null", "[]", '{"x": 1}', '{"1": "1"}', '{"1": NaN}', '{"1": true}'],
}
KIND_OF_TYPE = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "str | None": "str|None",
    "tuple[int, ...]": "ints",
    "tuple[str, ...]": "strs",
    "dict[str, str]": "dict[str,str]",
    "dict[str, float]": "dict[str,float]",
    "dict": "cluster",
}
# Empty is a legal value here ("none" / "the default"); for every other string it is refused.
EMPTY_OK = {"motd_path", "serve_model_path", "llama_server", "spec_draft_model_path", "hostname"}
EXTRA = {
    "sweep_modes": ["[]", '["tuned", "gpu"]'],
    "serve_listen": ['"wan"'],
    "ratio_tolerance": ["1", "1.5"],
    "kld_min_same_top_p": ["101"],
    "repetitions": ["0"],
    "prompt_tokens": ["0"],
    "serve_port": ["80", "70000"],
}
WHOLE_FILE = {
    "list": b"[]",
    "string": b'"config"',
    "null": b"null",
    "empty": b"",
    "invalid": b"{not json",
    "deep": b"[" * 100_000,
    "not-utf8": b'{"schema_version": 1, "model_path": "\xff"}',
    "bom": b"\xef\xbb\xbf{}",
    "big-int": b'{"schema_version": ' + b"9" * 5000 + b"}",
}


def field_kinds() -> dict[str, str]:
    kinds = {f.name: KIND_OF_TYPE[str(f.type)] for f in fields(Settings)}
    return {"schema_version": "schema", **kinds}


def hostile_values(name: str, kind: str) -> list[str]:
    if kind == "schema":
        return ["2", '"1"', "null", "true", "1.0", "0"]
    values = list(HOSTILE_BY_KIND[kind])
    if kind == "str" and name not in EMPTY_OK:
        values.append('""')
    return values + EXTRA.get(name, [])


def config_text(sc: Scene, name: str, fragment: str) -> str:
    data = {"schema_version": 1, "model_sha256": None, **sc.values()}
    data[name] = "@HOSTILE@"
    return json.dumps(data).replace('"@HOSTILE@"', fragment)


def refused_everywhere(sc: Scene, names: str) -> tuple[Outcome, str]:
    """The config is refused: the run says why (naming `names`) and no command, file or screen
    shows the old PASS; the verdict is ERROR on disk, console, motd and in `status`."""
    run = sc.run()
    if run.traceback:
        return Outcome.TRACEBACK, "run: " + run.text[-300:]
    after_run = sc.on_disk()
    pub = sc.publish(
        {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": str(run.rc)}
    )
    st = sc.status()
    by_hand = sc.by_hand()
    for what, r in (("by-hand run", by_hand), ("publish", pub), ("status", st)):
        if r.traceback:
            return Outcome.TRACEBACK, f"{what}: " + r.text[-300:]
    if run.rc == 0 or by_hand.rc == 0:
        return Outcome.WRONG, f"accepted: run exit {run.rc}, by-hand exit {by_hand.rc}"
    if names not in run.text:
        return Outcome.WRONG, f"the refusal does not name {names!r}: {run.text[-300:]!r}"
    stale = _stale_pass(sc, run, by_hand, pub, st)
    if stale or after_run == "PASS":
        return Outcome.WRONG, stale or "result.json says PASS after the run"
    for what, text in (("status", st.out), ("console", sc.shown(sc.console)),
                       ("motd", sc.shown(sc.motd))):  # fmt: skip
        if "ERROR" not in verdict_line(text):
            return Outcome.WRONG, f"{what} shows no ERROR verdict: {text[:200]!r}"
    if sc.on_disk() != "ERROR":
        return Outcome.WRONG, f"result.json says {sc.on_disk()}, not ERROR"
    return Outcome.REFUSED, ""


def _field_case(name: str, fragment: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            sc.cfg.write_text(config_text(sc, name, fragment))
            return refused_everywhere(sc, name)

    return run


def _file_case(data: bytes) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            sc.cfg.write_bytes(data)
            return refused_everywhere(sc, str(sc.cfg))

    return run


def config_cases() -> Iterator[Case]:
    for name, kind in field_kinds().items():
        for fragment in hostile_values(name, kind):
            label = fragment if len(fragment) <= 24 else f"{fragment[:12]}...({len(fragment)})"
            yield case("config-types", f"{name}={label}", _field_case(name, fragment))
    for label, data in WHOLE_FILE.items():
        yield case("config-types", f"file:{label}", _file_case(data))
    for label, change in (("unknown-key", {"ubatch_size": [64]}),
                          ("missing-model_path", {"model_path": None})):  # fmt: skip

        def run(change=change) -> tuple[Outcome, str]:
            with Scene() as sc:
                data = {"schema_version": 1, "model_sha256": None, **sc.values(), **change}
                sc.cfg.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
                return refused_everywhere(sc, next(iter(change)))

        yield case("config-types", f"file:{label}", run)


# ---- signals -----------------------------------------------------------------------------------

HOLD = "echo $$ > {started}; exec sleep 30"


def _signal_case(sig: signal.Signals, phase: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            started = sc.tmp / "started"
            sc.tool("llama-bench", HOLD.format(started=started))
            if phase == "gpu-wait":
                # No render node: the first check waits gpu_wait_s for one (a module probing).
                skip = ["csf_firmware", "no_vendor_driver", "vulkan_device", "model_sha256",
                        "ratio", "output_match", *SERVER_STEPS]  # fmt: skip
                sc.write(skip_checks=skip, gpu_wait_s=30)
            argv = ["--config", str(sc.cfg), "run", "--note-dir", str(sc.notes), *sc.paths()]
            proc = spawn(argv)
            try:
                marker = sc.results / "result.json"

                def ready() -> bool:
                    if phase != "gpu-wait":
                        return started.exists() and started.read_text().strip() != ""
                    return '"step": "gpu_driver"' in marker.read_text()

                if not _wait_for(ready, 20, proc):
                    return Outcome.WRONG, "the run never got to the phase: " + str(
                        proc.communicate(timeout=5)
                    )
                time.sleep(0.2)  # inside the phase, past the marker write
                os.killpg(proc.pid, sig)  # Ctrl-C signals the whole foreground group
                if phase == "double":
                    for _ in range(5):
                        time.sleep(0.01)
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, sig)
                out, err = proc.communicate(timeout=20)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            tool_pid = int(started.read_text()) if started.exists() else None
            if "Traceback" in err or "Exception ignored" in err:
                return Outcome.TRACEBACK, err[-300:]
            if tool_pid and _alive(tool_pid):
                return Outcome.WRONG, "the tool outlived the self-test"
            doc_verdict = sc.on_disk()
            errors = ""
            with contextlib.suppress(ValueError, KeyError, OSError):
                errors = " ".join(json.loads((sc.results / "result.json").read_text())["errors"])
            if proc.returncode != 3 or doc_verdict != "ERROR":
                return Outcome.WRONG, (
                    f"exit {proc.returncode}, result.json {doc_verdict}: no ERROR verdict; "
                    f"{(out + err)[-200:]!r}"
                )
            if sig.name not in errors:
                return Outcome.WRONG, f"the verdict does not name {sig.name}: {errors!r}"
            if "rocky-selftest ERROR" not in sc.shown(sc.motd):
                return Outcome.WRONG, "motd not updated"
            return Outcome.HELD, ""

    return run


def signal_cases() -> Iterator[Case]:
    every = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip
    for sig in every:
        yield case("signals", f"{sig.name}:tool", _signal_case(sig, "tool"), 45)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        yield case("signals", f"{sig.name}:gpu-wait", _signal_case(sig, "gpu-wait"), 45)
    for sig in (signal.SIGINT, signal.SIGTERM):
        yield case("signals", f"{sig.name}:double", _signal_case(sig, "double"), 45)


# ---- concurrency -------------------------------------------------------------------------------


@contextlib.contextmanager
def live_run(sc: Scene, *extra: str) -> Iterator[subprocess.Popen]:
    """A run in progress in a process of its own (llama-bench holds while `hold` exists)."""
    hold, started = sc.tmp / "hold", sc.tmp / "started"
    hold.write_text("")
    sc.tool("llama-bench", f"if [ -e {hold} ]; then echo $$ > {started}; exec sleep 30; fi\n"
                           f"cat {sc.good}")  # fmt: skip
    argv = ["--config", str(sc.cfg), "run", *sc.paths(), *extra]
    proc = spawn(argv)
    try:
        ok = _wait_for(lambda: started.exists() and started.read_text().strip(), 20, proc)
        if not ok:
            raise RuntimeError(f"the live run never started its tool: {proc.communicate(5)}")
        hold.unlink()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _kill_pids(started)  # the tool, where a SIGKILL left it behind


def _busy_ok(r: Ran, pid: int) -> str | None:
    """Why the refusal of a second run is not the clear one, or None."""
    if r.rc in (0, 1, 2, 3, None):
        return f"exit {r.rc}: not a distinct code for 'another run is in progress'"
    if "in progress" not in r.text or str(pid) not in r.text:
        return f"does not say another run (pid {pid}) is in progress: {r.text[-200:]!r}"
    return None


def _first_boot_beside_by_hand() -> tuple[Outcome, str]:
    with Scene() as sc, live_run(sc, "--note-dir", str(sc.tmp / "hand-notes")) as live:
        marker = (sc.results / "result.json").read_text()
        r = sc.run()
        if r.traceback:
            return Outcome.TRACEBACK, r.text[-300:]
        why = _busy_ok(r, live.pid)
        if why:
            return Outcome.WRONG, why
        if sc.stamp.exists():
            return Outcome.WRONG, f"the stamp was written: {sc.stamp.read_text()!r}"
        # systemd's root step after the refused run (ExecStopPost=+ runs in every case)
        env = {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": str(r.rc)}
        pub = sc.publish(env)
        if pub.traceback:
            return Outcome.TRACEBACK, pub.text[-300:]
        if sc.stamp.exists() or (sc.results / "result.json").read_text() != marker:
            return Outcome.WRONG, "the root step touched the stamp or the live run's result"
        if live.poll() is not None:
            return Outcome.WRONG, "the live run died"
    return Outcome.HELD, ""


def _next_boot_runs() -> tuple[Outcome, str]:
    """After a refused first-boot run, the stamp is absent: the next boot runs it, and it runs."""
    with Scene() as sc:
        with live_run(sc) as live:
            r = sc.run()
            if _busy_ok(r, live.pid):
                return Outcome.WRONG, _busy_ok(r, live.pid) or ""
        again = sc.run()  # the next boot: the live run ended (SIGTERM: its own ERROR)
        if again.traceback:
            return Outcome.TRACEBACK, again.text[-300:]
        if again.rc != 0 or sc.on_disk() != "PASS" or not sc.shown(sc.stamp).startswith("PASS"):
            return Outcome.WRONG, f"the later first-boot run did not run: exit {again.rc}"
        return Outcome.HELD, ""


def _second_by_hand() -> tuple[Outcome, str]:
    with Scene() as sc, live_run(sc, "--note-dir", str(sc.tmp / "hand-notes")) as live:
        marker = (sc.results / "result.json").read_text()
        r = sc.by_hand()
        if r.traceback:
            return Outcome.TRACEBACK, r.text[-300:]
        why = _busy_ok(r, live.pid)
        if why:
            return Outcome.WRONG, why
        if (sc.results / "result.json").read_text() != marker:
            return Outcome.WRONG, "the refused run replaced the live run's result.json"
        return Outcome.HELD, ""


def _by_hand_beside_first_boot() -> tuple[Outcome, str]:
    with Scene() as sc:
        extra = ("--stamp", str(sc.stamp), "--note-dir", str(sc.notes))
        with live_run(sc, *extra) as live:
            r = sc.by_hand()
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            why = _busy_ok(r, live.pid)
            if why:
                return Outcome.WRONG, why
            live.send_signal(signal.SIGTERM)
            live.communicate(timeout=15)
        if not sc.shown(sc.stamp).startswith("ERROR"):
            return Outcome.WRONG, "the first-boot run's own verdict (SIGTERM) was not kept"
        return Outcome.HELD, ""


def _publish_beside_run() -> tuple[Outcome, str]:
    """The root step by hand while a run is live: it must not replace the IN-PROGRESS marker."""
    with Scene() as sc, live_run(sc, "--note-dir", str(sc.tmp / "hand-notes")):
        env = {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"}
        pub = sc.publish(env)
        if pub.traceback:
            return Outcome.TRACEBACK, pub.text[-300:]
        if sc.on_disk() != "IN-PROGRESS" or sc.stamp.exists():
            return Outcome.WRONG, f"the root step replaced the live run's marker ({sc.on_disk()})"
        return Outcome.HELD, ""


def _tune_beside_run() -> tuple[Outcome, str]:
    with Scene() as sc:
        sc.write(tune_candidates=str(TILE_CANDIDATES), tune_budget_s=1)
        with live_run(sc, "--note-dir", str(sc.tmp / "hand-notes")) as live:
            r = cli_main(["--config", str(sc.cfg), "tune", *sc.paths()])
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            why = _busy_ok(r, live.pid)
            if why:
                return Outcome.WRONG, why
            return Outcome.HELD, ""


def _after_a_kill_the_lock_is_free() -> tuple[Outcome, str]:
    """A run killed outright (a reset) holds no lock: the next first-boot run reports it."""
    with Scene() as sc:
        with live_run(sc, "--stamp", str(sc.stamp), "--note-dir", str(sc.notes)) as live:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
        r = sc.run()
        if r.traceback:
            return Outcome.TRACEBACK, r.text[-300:]
        if r.rc != 3 or "interrupted" not in r.out or not sc.shown(sc.stamp).startswith("ERROR"):
            return Outcome.WRONG, f"exit {r.rc}: {r.text[-200:]!r}"
        return Outcome.HELD, ""


def concurrency_cases() -> Iterator[Case]:
    for name, fn in (
        ("first-boot-beside-by-hand", _first_boot_beside_by_hand),
        ("next-boot-runs-it", _next_boot_runs),
        ("second-by-hand", _second_by_hand),
        ("by-hand-beside-first-boot", _by_hand_beside_first_boot),
        ("publish-beside-run", _publish_beside_run),
        ("tune-beside-run", _tune_beside_run),
        ("kill-frees-the-lock", _after_a_kill_the_lock_is_free),
    ):
        yield case("concurrency", name, fn, 60)


# ---- disk --------------------------------------------------------------------------------------


def _read_only_results(first_boot: bool) -> tuple[Outcome, str]:
    with Scene() as sc, read_only(sc.results) as how:
        if not how:
            return Outcome.NOT_RUN, "cannot make a directory read-only here"
        r = sc.run() if first_boot else sc.by_hand()
        if r.traceback:
            return Outcome.TRACEBACK, r.text[-300:]
        runs = [r]
        if first_boot:
            runs.append(sc.publish())
        st = sc.status()
        runs.append(st)
        if any(x.traceback for x in runs):
            return Outcome.TRACEBACK, " ".join(x.text[-200:] for x in runs)
        if r.rc != 3 or "result NOT saved" not in r.out:
            return Outcome.WRONG, f"run: exit {r.rc}: {r.out[-200:]!r}"
        if st.rc == 0 or "PASS" in verdict_line(st.out):
            return Outcome.WRONG, f"status after an unsaved run: exit {st.rc}: {st.out[:120]!r}"
        return Outcome.HELD, how


def _results_is_a_file() -> tuple[Outcome, str]:
    with Scene() as sc:
        shutil.rmtree(sc.results)
        sc.results.write_text("not a directory")
        r = sc.run()
        st = sc.status()
        if r.traceback or st.traceback:
            return Outcome.TRACEBACK, (r.text + st.text)[-300:]
        if r.rc != 3 or "ERROR" not in verdict_line(r.out) or st.rc == 0:
            return Outcome.WRONG, f"run exit {r.rc}, status exit {st.rc}"
        return Outcome.REFUSED, ""


def _result_is_a_directory() -> tuple[Outcome, str]:
    with Scene() as sc:
        (sc.results / "result.json").unlink()
        (sc.results / "result.json").mkdir()
        r = sc.by_hand()
        st = sc.status()
        if r.traceback or st.traceback:
            return Outcome.TRACEBACK, (r.text + st.text)[-300:]
        if r.rc != 3 or st.rc == 0 or "PASS" in verdict_line(st.out):
            return Outcome.WRONG, f"run exit {r.rc}, status exit {st.rc}: {st.out[:100]!r}"
        return Outcome.REFUSED, ""


def _motd_case(kind: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            if kind == "directory":
                sc.motd.mkdir()
            elif kind == "read-only":
                place = sc.tmp / "etc"
                place.mkdir()
                sc.motd = place / "motd"
                sc.write(motd_path=str(sc.motd))
            elif kind == "missing-parent":
                sc.motd = sc.tmp / "no" / "such" / "motd"
            with contextlib.ExitStack() as stack:
                if kind == "read-only" and not stack.enter_context(read_only(sc.motd.parent)):
                    return Outcome.NOT_RUN, "cannot make a directory read-only here"
                r = sc.by_hand()
                pub = sc.publish(note=False)
            if r.traceback or pub.traceback:
                return Outcome.TRACEBACK, (r.text + pub.text)[-300:]
            if r.rc != 0 or sc.on_disk() != "PASS":
                return Outcome.WRONG, f"a motd problem changed the verdict: exit {r.rc}"
            if "motd" not in r.out and kind != "missing-parent":
                return Outcome.WRONG, "the motd failure was not reported"
            return Outcome.HELD, ""

    return run


def _console_is_a_directory() -> tuple[Outcome, str]:
    with Scene() as sc:
        sc.console.mkdir()
        r = sc.run()
        pub = sc.publish()
        if r.traceback or pub.traceback:
            return Outcome.TRACEBACK, (r.text + pub.text)[-300:]
        if "cannot write to" not in pub.out or pub.rc != 0:
            return Outcome.WRONG, pub.out[-200:]
        return Outcome.HELD, ""


def _stamp_unwritable() -> tuple[Outcome, str]:
    with Scene() as sc:
        sc.stamp = sc.tmp / "stamp-dir" / "stamp"
        sc.stamp.parent.mkdir()
        with read_only(sc.stamp.parent) as how:
            if not how:
                return Outcome.NOT_RUN, "cannot make a directory read-only here"
            r = sc.run()
        if r.traceback:
            return Outcome.TRACEBACK, r.text[-300:]
        if r.rc != 0 or "cannot write the stamp" not in r.out or sc.on_disk() != "PASS":
            return Outcome.WRONG, r.out[-200:]
        return Outcome.HELD, ""


def _note_dir_is_a_file() -> tuple[Outcome, str]:
    with Scene() as sc:
        sc.notes.rmdir()
        sc.notes.write_text("a file")
        r = sc.run(env={"INVOCATION_ID": "0123"})
        env = {"SERVICE_RESULT": "success", "EXIT_CODE": "exited", "EXIT_STATUS": "0",
               "INVOCATION_ID": "0123"}  # fmt: skip
        pub = sc.publish(env)
        if r.traceback or pub.traceback:
            return Outcome.TRACEBACK, (r.text + pub.text)[-300:]
        if r.rc != 0 or "cannot leave the verdict note" not in r.out:
            return Outcome.WRONG, r.out[-200:]
        # The root step finds no note: it shows the saved result (this run's, by invocation)
        if "PASS" not in verdict_line(sc.shown(sc.console)) and sc.on_disk() != "PASS":
            return Outcome.WRONG, "the saved PASS was lost"
        return Outcome.HELD, ""


def _full_disk() -> tuple[Outcome, str]:
    with Scene() as sc:
        mnt = sc.tmp / "fs"
        mnt.mkdir()
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                               capture_output=True)  # fmt: skip
        if mount.returncode:
            return Outcome.NOT_RUN, "cannot mount a tmpfs here"
        try:
            sc.results = mnt / "results"
            sc.results.mkdir()
            (sc.results / "result.json").write_text(json.dumps(OLD_PASS))
            sc.write(results_dir=str(sc.results))
            with contextlib.suppress(OSError), open(mnt / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
            r = sc.by_hand()
            st = sc.status()
            if r.traceback or st.traceback:
                return Outcome.TRACEBACK, (r.text + st.text)[-300:]
            if r.rc != 3 or st.rc == 0 or "PASS" in verdict_line(st.out):
                return Outcome.WRONG, f"run exit {r.rc}, status exit {st.rc}"
            return Outcome.HELD, ""
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def disk_cases() -> Iterator[Case]:
    yield case("disk", "read-only-results:by-hand", lambda: _read_only_results(False))
    yield case("disk", "read-only-results:first-boot", lambda: _read_only_results(True))
    yield case("disk", "results-dir-is-a-file", _results_is_a_file)
    yield case("disk", "result.json-is-a-directory", _result_is_a_directory)
    for kind in ("directory", "read-only", "missing-parent"):
        yield case("disk", f"motd:{kind}", _motd_case(kind))
    yield case("disk", "console-is-a-directory", _console_is_a_directory)
    yield case("disk", "stamp-unwritable", _stamp_unwritable)
    yield case("disk", "note-dir-is-a-file", _note_dir_is_a_file)
    yield case("disk", "full", _full_disk)


# ---- files -------------------------------------------------------------------------------------

PASS_DOC = json.dumps(OLD_PASS)


def plant(path: Path, kind: str, elsewhere: Path) -> None:
    """Put a hostile object of `kind` at `path` (whatever was there goes)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling":
        path.symlink_to(elsewhere / "nothing-here")
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(64 << 20)  # sparse: no disk, 64 MiB to read
    elif kind == "link-to-pass":
        target = elsewhere / "pass.json"
        target.write_text(PASS_DOC)
        path.symlink_to(target)
    else:
        path.write_bytes(CONTENT[kind])


CONTENT = {
    "deep-json": b"[" * 200_000,
    "not-utf8": b'{"schema": "rocky-selftest-result", "x": "\xff\xfe"}',
    "nan": json.dumps({**OLD_PASS, "duration_s": float("nan")}).encode(),
    "big-int": PASS_DOC.replace('"duration_s": 3600.0', '"duration_s": ' + "9" * 5000).encode(),
    "checks-not-objects": json.dumps({**OLD_PASS, "checks": [1, "x"]}).encode(),
    "errors-not-a-list": json.dumps({**OLD_PASS, "verdict": "ERROR", "errors": 5}).encode(),
    "check-missing-keys": json.dumps({**OLD_PASS, "checks": [{"name": "sweep"}]}).encode(),
    "pass-no-checks": json.dumps({**OLD_PASS, "checks": []}).encode(),
    "pass-all-skip": json.dumps(
        {**OLD_PASS, "checks": [{"name": "sweep", "status": "SKIP", "evidence": "x"}]}
    ).encode(),
    "pass-with-a-fail": json.dumps(
        {**OLD_PASS, "checks": [{"name": "sweep", "status": "FAIL", "evidence": "x"}]}
    ).encode(),
    "escapes": json.dumps(
        {
            **OLD_PASS,
            "verdict": "FAIL",
            "finished_at": "\u001b]0;X\u001b\\\u001b[2J",
            "checks": [{"name": "s\u009b2J", "status": "FAIL", "evidence": "x\r\u202eY"}],
        }
    ).encode(),  # fmt: skip
    "text": b"# a comment\nGGML_VK_MALI_WARPTILE=\x1b[2J\n",
}
DEVICE_KINDS = ["fifo", "dev-zero", "directory", "loop", "dangling", "huge"]
JSON_KINDS = ["deep-json", "not-utf8", "nan", "big-int"]
RESULT_KINDS = ["checks-not-objects", "errors-not-a-list", "check-missing-keys",
                "pass-no-checks", "pass-all-skip", "pass-with-a-fail", "escapes",
                "link-to-pass"]  # fmt: skip


def _no_pass_no_escape(r: Ran, what: str) -> tuple[Outcome, str] | None:
    if r.traceback:
        return Outcome.TRACEBACK, f"{what}: {r.text[-300:]}"
    bad = control_chars(r.text)
    if bad:
        return Outcome.WRONG, f"{what}: control characters on the terminal: {bad}"
    if "PASS" in verdict_line(r.out):
        return (
            Outcome.WRONG,
            f"{what} shows PASS from a hostile result.json: {verdict_line(r.out)!r}",
        )
    return None


def _result_file_case(kind: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            plant(sc.results / "result.json", kind, sc.tmp)
            st = sc.status()
            found = _no_pass_no_escape(st, "status")
            if found:
                return found
            if kind != "escapes" and (st.rc == 0 or "result.json" not in st.out):
                return Outcome.WRONG, f"status exit {st.rc} without naming result.json"
            by_hand_pub = sc.publish(note=False)
            found = _no_pass_no_escape(by_hand_pub, "publish (by hand)")
            if found:
                return found
            # The root step after a run that left no note (killed before its end).
            env = {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}
            pub = sc.publish(env)
            found = _no_pass_no_escape(pub, "publish (root step)")
            if found:
                return found
            if "ERROR" not in verdict_line(sc.shown(sc.console)):
                return Outcome.WRONG, "the root step's console shows no ERROR"
            # A first-boot run over it, and a tune that records into it.
            plant(sc.results / "result.json", kind, sc.tmp)
            sc.write(tune_at_first_boot=True)
            tune = cli_main(["--config", str(sc.cfg), "tune", "--first-boot", *sc.paths()])
            if tune.traceback:
                return Outcome.TRACEBACK, "tune: " + tune.text[-300:]
            r = sc.run()
            if r.traceback:
                return Outcome.TRACEBACK, "run: " + r.text[-300:]
            unsaved = r.rc == 3 and "result NOT saved" in r.out  # a directory stays one
            if (r.rc, sc.on_disk()) not in ((0, "PASS"), (3, "ERROR")) and not unsaved:
                return Outcome.WRONG, f"run over it: exit {r.rc}, result.json {sc.on_disk()}"
            return Outcome.REFUSED, ""

    return run


def _config_file_case(kind: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            plant(sc.cfg, kind, sc.tmp)
            return refused_everywhere(sc, str(sc.cfg))

    return run


def _note_file_case(kind: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            plant(sc.notes / "verdict.json", kind, sc.tmp)
            env = {"SERVICE_RESULT": "success", "EXIT_CODE": "exited", "EXIT_STATUS": "0"}
            pub = sc.publish(env)
            found = _no_pass_no_escape(pub, "publish")
            if found:
                return found
            st = sc.status()
            if st.traceback:
                return Outcome.TRACEBACK, st.text[-300:]
            return Outcome.REFUSED, ""

    return run


def _motd_file_case(kind: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            plant(sc.motd, kind, sc.tmp)
            r = sc.by_hand()
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            if r.rc != 0 or sc.on_disk() != "PASS":
                return Outcome.WRONG, f"a hostile motd changed the verdict: exit {r.rc}"
            return Outcome.HELD, ""

    return run


def _tiles_file_case(kind: str, which: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            candidates = sc.tmp / "tile_candidates.json"
            shutil.copy(TILE_CANDIDATES, candidates)
            sc.write(tune_candidates=str(candidates), tune_budget_s=1)
            if which == "cands":
                plant(candidates, kind, sc.tmp)
                argv = ["--config", str(sc.cfg), "tune", *sc.paths()]
            else:
                plant(sc.results / "tuned-tiles.env", kind, sc.tmp)
                argv = ["--config", str(sc.cfg), "tune", "--verify", *sc.paths()]
            r = cli_main(argv)
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            if control_chars(r.text):
                return Outcome.WRONG, f"control characters: {control_chars(r.text)}"
            if which == "cands" and (r.rc == 0 or "tile_candidates.json" not in r.out):
                return Outcome.WRONG, f"exit {r.rc}: {r.out[-200:]!r}"
            return Outcome.REFUSED, ""

    return run


def _capped(run: Callable[[], tuple[Outcome, str]]) -> Callable[[], tuple[Outcome, str]]:
    def capped() -> tuple[Outcome, str]:
        with memory_cap():
            return run()

    return capped


def files_cases() -> Iterator[Case]:
    targets = (
        ("result.json", DEVICE_KINDS + JSON_KINDS + RESULT_KINDS, _result_file_case),
        ("config.json", DEVICE_KINDS + JSON_KINDS, _config_file_case),
        ("note", DEVICE_KINDS + JSON_KINDS + ["link-to-pass"], _note_file_case),
        ("motd", DEVICE_KINDS + ["not-utf8"], _motd_file_case),
        ("tile-candidates", DEVICE_KINDS + JSON_KINDS, lambda k: _tiles_file_case(k, "cands")),
        (
            "tuned-tiles.env",
            DEVICE_KINDS + ["not-utf8", "text"],
            lambda k: _tiles_file_case(k, "env"),
        ),
    )
    for target, kinds, make in targets:
        for kind in kinds:
            yield case("files", f"{target}:{kind}", _capped(make(kind)), 20)


# ---- children ----------------------------------------------------------------------------------

ESCAPE = {
    # The tool leaves a child in a session of its own (not in its process group), holding ...
    "both-pipes": "setsid sleep 20 & echo $! >> {pids}",
    "stdout-only": "setsid sleep 20 2>/dev/null & echo $! >> {pids}",
    "stderr-only": "setsid sleep 20 >/dev/null & echo $! >> {pids}",
    "double-fork": "(setsid sh -c 'echo $$ >> {pids}; exec sleep 20' &)",
}
CHILD_BOUND_S = 8.0  # run_timeout_s 1 s, one tool run: anything past this did not hold


def _children_case(tool: str, escape: str, then: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            body = ESCAPE[escape].format(pids=sc.pids)
            if then in ("hang", "deadline"):
                body += "\ntrap '' TERM\nsleep 20"
            else:  # the tool itself ends at once, cleanly
                body += f"\ncat {sc.good}" if tool == "llama-bench" else "\necho GPU0:"
            sc.tool(tool, body)
            cfg: dict = {"run_timeout_s": 1}
            if tool == "vulkaninfo":
                cfg.update(vulkaninfo=str(sc.bin / "vulkaninfo"),
                           skip_checks=[s for s in sc.values()["skip_checks"]
                                        if s != "vulkan_device"])  # fmt: skip
            if then == "deadline":
                cfg.update(run_timeout_s=60, deadline_s=2)
            sc.write(**cfg)
            t0 = time.monotonic()
            r = sc.by_hand()
            took = time.monotonic() - t0
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            if took > CHILD_BOUND_S:
                return Outcome.HANG, f"the run took {took:.1f} s with run_timeout_s 1"
            if then in ("hang", "deadline") and (r.rc == 0 or sc.on_disk() == "PASS"):
                return Outcome.WRONG, f"a hung tool passed: exit {r.rc}"
            if then == "exit" and tool == "llama-bench" and sc.on_disk() != "PASS":
                return Outcome.WRONG, f"a tool that ended cleanly failed: {r.out[-200:]!r}"
            return Outcome.HELD, f"{took:.1f} s"

    return run


def children_cases() -> Iterator[Case]:
    for escape in ESCAPE:
        yield case("children", f"llama-bench:{escape}:hang",
                   _children_case("llama-bench", escape, "hang"), 25)  # fmt: skip
    for escape in ("both-pipes", "double-fork"):
        yield case("children", f"llama-bench:{escape}:exits",
                   _children_case("llama-bench", escape, "exit"), 25)  # fmt: skip
        yield case("children", f"llama-bench:{escape}:deadline",
                   _children_case("llama-bench", escape, "deadline"), 25)  # fmt: skip
    yield case("children", "vulkaninfo:both-pipes:hang",
               _children_case("vulkaninfo", "both-pipes", "hang"), 25)  # fmt: skip


# ---- output ------------------------------------------------------------------------------------

PAYLOADS = {
    "csi-clear": "\x1b[2J",
    "osc-title": "\x1b]0;X\x07",
    "c1-csi": "\x9b2J",
    "cr-overwrite": "\rrocky-selftest PASS",
    "bidi": "\u202eSSAP",
    "backspaces": "\b" * 8,
    "nul": "\x00",
}


def _escape_case(where: str, payload: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            data = sc.tmp / "payload"
            if where.startswith("vulkaninfo"):
                field = where.split(":")[1]
                names = {"deviceName": "Mali-G610" + payload, "driverName": "panvk" + payload}
                names[field] = names[field] + payload
                text = f"GPU0:\n\tdeviceName = {names['deviceName']}\n"
                text += f"\tdriverName = {names['driverName']}\n"
                data.write_text(text)
                sc.tool("vulkaninfo", f"cat {data}")
                sc.write(vulkaninfo=str(sc.bin / "vulkaninfo"),
                         skip_checks=[s for s in sc.values()["skip_checks"]
                                      if s != "vulkan_device"])  # fmt: skip
            elif where == "bench-json":
                data.write_text(json.dumps([{**GOOD_ENTRY, "gpu_info": "Mali" + payload}]))
                sc.tool("llama-bench", f"cat {data}")
            else:  # bench-stdout: not JSON at all
                data.write_text("[" + payload + " not json")
                sc.tool("llama-bench", f"cat {data}")
            r = sc.by_hand()
            pub = sc.publish(note=False)
            st = sc.status()
            for what, x in (("run", r), ("publish", pub), ("status", st)):
                if x.traceback:
                    return Outcome.TRACEBACK, f"{what}: {x.text[-300:]}"
                if control_chars(x.text):
                    return Outcome.WRONG, f"{what} printed {control_chars(x.text)}"
            for what, path in (("motd", sc.motd), ("console", sc.console)):
                if control_chars(sc.shown(path)):
                    return Outcome.WRONG, f"{what} holds {control_chars(sc.shown(path))}"
            return Outcome.HELD, ""

    return run


PIPES = {
    # shell suffix, what it does to the self-test's stdout
    "head-1": "| head -1 >/dev/null",
    "closed-at-once": "| true",
    "stdout-closed": ">&-",
    "dev-full": ">/dev/full",
    "both-to-head": "2>&1 | head -1 >/dev/null",
}


def _pipe_case(command: str, how: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            err_file = sc.tmp / "stderr"
            if command == "status":
                sc.by_hand()
            argv = ["--config", str(sc.cfg), command, *sc.paths()]
            if command == "status":
                argv = ["--config", str(sc.cfg), "status", "--results-dir", str(sc.results),
                        "--note-dir", str(sc.notes)]  # fmt: skip
            elif command == "run":
                argv += ["--note-dir", str(sc.notes)]
            py = f"PYTHONPATH={ROOT / 'tools'} {sys.executable} -m rocky_selftest"
            words = " ".join(f"'{a}'" for a in argv)
            if how == "both-to-head":
                line = f"{{ {py} {words}; echo $? > {sc.tmp}/rc; }} {PIPES[how]}"
            else:
                line = f"{{ {py} {words} 2>{err_file}; echo $? > {sc.tmp}/rc; }} {PIPES[how]}"
            env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ENV}
            subprocess.run(["bash", "-c", line], timeout=25, env=env, check=False)
            err = sc.shown(err_file)
            rc = sc.shown(sc.tmp / "rc").strip()
            if "Traceback" in err or "Exception ignored" in err or "BrokenPipe" in err:
                return Outcome.TRACEBACK, err[-300:]
            if rc != "0":
                return Outcome.WRONG, f"exit {rc} (a PASS run): {err[-200:]!r}"
            if command == "run" and sc.on_disk() != "PASS":
                return Outcome.WRONG, f"result.json says {sc.on_disk()} after a passing run"
            return Outcome.HELD, ""

    return run


BIG_OUTPUT = 20_000_000


def _flood_case(tool: str, stream: str) -> Callable[[], tuple[Outcome, str]]:
    def run() -> tuple[Outcome, str]:
        with Scene() as sc:
            redirect = ">&2" if stream == "stderr" else ""
            flood = f"head -c {BIG_OUTPUT} /dev/zero | tr '\\0' 'a' {redirect}"
            skip = sc.values()["skip_checks"]
            if tool == "llama-simple":
                # output_match: llama-perplexity (missing here: a failed KLD run), then
                # llama-simple's greedy text, kept as information.
                sc.tool("llama-simple", f"{flood}\necho 'decoded 32 tokens' >&2")
                skip = [s for s in skip if s != "output_match"]
            elif tool == "vulkaninfo":
                sc.tool("vulkaninfo", f"echo GPU0:; {flood}")
                skip = [s for s in skip if s != "vulkan_device"]
            else:
                sc.tool("llama-bench", flood)
            sc.write(skip_checks=skip, vulkaninfo=str(sc.bin / "vulkaninfo"))
            r = sc.by_hand()
            if r.traceback:
                return Outcome.TRACEBACK, r.text[-300:]
            size = (sc.results / "result.json").stat().st_size
            if size > RESULT_BOUND:
                return Outcome.WRONG, f"result.json is {size} bytes (bound {RESULT_BOUND})"
            if sc.on_disk() == "PASS":
                return Outcome.WRONG, "20 MB of junk passed"
            return Outcome.HELD, f"result.json {size} bytes"

    return run


def output_cases() -> Iterator[Case]:
    for where in ("vulkaninfo:deviceName", "vulkaninfo:driverName", "bench-json", "bench-stdout"):
        for label, payload in PAYLOADS.items():
            yield case("output", f"escapes:{where}:{label}", _escape_case(where, payload))
    for command in ("run", "status"):
        for how in PIPES:
            yield case("output", f"pipe:{command}:{how}", _pipe_case(command, how))
    for tool, stream in (("llama-simple", "stdout"), ("llama-simple", "stderr"),
                         ("llama-bench", "stdout"), ("llama-bench", "stderr"),
                         ("vulkaninfo", "stdout")):  # fmt: skip
        yield case("output", f"flood:{tool}:{stream}", _flood_case(tool, stream), 60)


def cases() -> Iterator[Case]:
    yield from config_cases()
    yield from signal_cases()
    yield from concurrency_cases()
    yield from disk_cases()
    yield from files_cases()
    yield from children_cases()
    yield from output_cases()
