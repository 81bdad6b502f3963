"""Hostile downloads for `rocky-vulkan model fetch` (issue 22, area model-fetch).

Every case runs the real CLI (`main([... "model", "fetch" ...])`, in this process, or in a
subprocess where a resource limit is the fault) against a real server on 127.0.0.1: a raw socket
server (fetch_server.RawServer) whose script answers each request, so it can cut, drip, lie in its
headers or send what http.server never would. The model is a real GGUF file (gguf_files).

A case is judged by what the user is left with (`judge`): a pinned sha256 must be the sha256 of
one file the server sent whole (and the model file those bytes), a refusal must name its cause,
leave the config as it was and write no model, and no run may outlast its --max-time by more than
the slack. Classes: resume, completeness, time, paths, pinning, protocol."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.adversary import Case, Outcome
from tests.helpers.fetch_server import RawServer, Req, respond
from tests.helpers.gguf_files import (
    HOSTILE_HEADERS,
    LONGER,
    OTHER,
    PAYLOAD,
    TRUNCATIONS,
    payload_layout,
)
from tests.helpers.project import ROOT

AREA = "model-fetch"
NAME = "test-model.gguf"
SECRET = "hunter2-s3cret"
# Seconds a run may take past its --max-time (interpreter, config load, sha256 of 1 MiB).
SLACK_S = 1.5
FAST = ("--retries", "2", "--retry-wait", "0", "--connect-timeout", "2", "--read-timeout", "2")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the project a case runs in ------------------------------------------------------------------


def write_project(tmp: Path, url: str, sha256: str | None = None, text: str | None = None) -> Path:
    """The committed config with model.url, filename and sha256 set (or `text` as given)."""
    if text is None:
        text = config_text(url, sha256)
    path = tmp / "rocky-vulkan.yaml"
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    if not (tmp / "patches").exists():
        shutil.copytree(ROOT / "patches", tmp / "patches")
    return path


def config_text(url: str, sha256: str | None = None) -> str:
    text = (ROOT / "rocky-vulkan.yaml").read_text()
    head, model = text.split("\nmodel:\n", 1)
    model = re.sub(r"(?m)^  url: .*$", lambda _: f"  url: {url}", model, count=1)
    model = re.sub(r"(?m)^  filename: .*$", f"  filename: {NAME}", model, count=1)
    model = re.sub(r"(?m)^  sha256: .*$", f"  sha256: {sha256 or 'null'}", model, count=1)
    return head + "\nmodel:\n" + model


@dataclass
class Run:
    rc: int | None
    out: str
    err: str
    elapsed: float
    config: Path
    before: bytes
    dest: Path
    max_time: float
    model_existed: bool = False
    files_before: dict[str, bytes] = field(default_factory=dict)

    @property
    def after(self) -> bytes:
        return self.config.read_bytes()

    @property
    def model(self) -> Path:
        return self.dest / NAME


def fetch(
    tmp: Path,
    url: str,
    *args: str,
    sha256: str | None = None,
    max_time: float = 8.0,
    setup: Callable[[Path, Path], None] | None = None,
    config: Path | None = None,
    dest: Path | None = None,
    subprocess_limit: int | None = None,
) -> Run:
    """`rocky-vulkan --config CONFIG model fetch --dest DEST ...` with FAST settings; `setup`
    (config, dest) prepares the files first."""
    config = config or write_project(tmp, url, sha256)
    dest = dest or tmp / "models"
    if setup:
        setup(config, dest)
    before = config.read_bytes()
    existed = os.path.lexists(dest / NAME)
    argv = ["--config", str(config), "model", "fetch", "--dest", str(dest), "--no-progress"]
    argv += [*FAST, "--max-time", f"{max_time:g}", *args]
    t0 = time.monotonic()
    if subprocess_limit is None:
        out, err = io.StringIO(), io.StringIO()
        from rocky_vulkan.cli import main

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        text_out, text_err = out.getvalue(), err.getvalue()
    else:
        rc, text_out, text_err = _in_subprocess(argv, subprocess_limit, max_time)
    elapsed = time.monotonic() - t0
    return Run(rc, text_out, text_err, elapsed, config, before, dest, max_time, existed)


def _in_subprocess(argv: list[str], fsize: int, max_time: float) -> tuple[int | None, str, str]:
    """The CLI in a child whose files may grow to `fsize` bytes (RLIMIT_FSIZE: a full disk
    that needs no root; SIGXFSZ ignored so a write fails with EFBIG instead of killing it)."""
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); "
        "from rocky_vulkan.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    # The child imports what this process imports (a worktree's tools/ before the venv's).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            timeout=max_time + 20,
            env=env,
        )
    except subprocess.TimeoutExpired as err:
        return None, str(err.stdout or ""), str(err.stderr or "")
    return proc.returncode, proc.stdout, proc.stderr


# --- judging -------------------------------------------------------------------------------------


def _pinned(run: Run) -> str | None:
    model = re.split(rb"[\r\n]model:", run.after, maxsplit=1)[-1]
    m = re.search(rb"[\r\n]  sha256: ([0-9a-f]{64})\b", model)
    return m.group(1).decode() if m else None


def judge(
    run: Run,
    whole: list[bytes],
    cause: str | None = None,
    *,
    expect_refusal: bool = False,
    untouched: list[Path] = (),
) -> tuple[Outcome, str]:
    """REFUSED or HELD, else the finding. `whole`: the files the server sent whole (a pin must be
    one of them); `cause`: a regex the refusal must match; `untouched`: paths (and their bytes
    before the run, in run.files_before) that must be left as they were."""
    text = run.out + run.err
    if "Traceback" in text:
        return Outcome.TRACEBACK, text.strip().splitlines()[-1][:200]
    if run.rc is None or run.elapsed > run.max_time + SLACK_S:
        return Outcome.HANG, f"took {run.elapsed:.1f} s with --max-time {run.max_time:g}"
    if SECRET in text or any(SECRET.encode() in p.read_bytes() for p in _files(run.dest)):
        return Outcome.WRONG, "the URL's password was shown or written"
    if "\x1b" in text or "\x07" in text:
        return Outcome.WRONG, f"control characters reached the terminal: {text[-120:]!r}"
    for path in untouched:
        now = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        if run.files_before.get(str(path)) != now:
            return Outcome.WRONG, f"{path} was changed"
    if run.rc == 0:
        pinned = _pinned(run)
        good = {sha(b): b for b in whole}
        if expect_refusal or not whole:
            return Outcome.WRONG, f"accepted (pinned {pinned}) what should be refused"
        if pinned not in good:
            return Outcome.WRONG, f"pinned {pinned}: not the sha256 of a file the server sent whole"
        if not run.model.is_file() or run.model.read_bytes() != good[pinned]:
            return Outcome.WRONG, "the model file is not the bytes that were pinned"
        if "verified" not in run.out:
            return Outcome.WRONG, "exit 0 without saying it verified the file"
        return Outcome.HELD, f"pinned {pinned[:12]}"
    at = run.err.rfind("rocky-vulkan: error:")
    message = " ".join(run.err[at:].split()) if at >= 0 else ""
    if not message:
        return Outcome.WRONG, f"exit {run.rc} without an error message: {text[-200:]!r}"
    if run.after != run.before:
        return Outcome.WRONG, f"refused ({message[:80]}) but the config was changed"
    if os.path.lexists(run.model) and not run.model_existed:
        return Outcome.WRONG, f"refused but {run.model} was written"
    if cause and not re.search(cause, message, re.I | re.S):
        return Outcome.WRONG, f"refused without naming the cause /{cause}/: {message[:240]}"
    return Outcome.REFUSED, message[21:141]


def _files(dest: Path) -> list[Path]:
    if not dest.is_dir():
        return []
    return [p for p in dest.iterdir() if p.is_file() and not p.is_symlink()]


def held_when(run: Run, ok: bool, why: str) -> tuple[Outcome, str]:
    """For cases whose own check decides: a traceback or hang first, else HELD or WRONG."""
    first = judge(run, [PAYLOAD])
    if first[0] in (Outcome.TRACEBACK, Outcome.HANG):
        return first
    return (Outcome.HELD, why) if ok else (Outcome.WRONG, why)


# --- case building -------------------------------------------------------------------------------


def _case(klass: str, name: str, run: Callable[[], tuple[Outcome, str]], timeout: float = 25.0):
    return Case(AREA, klass, name, run, timeout)


def served(script, check, **kw) -> Callable[[], tuple[Outcome, str]]:
    """A case body: a RawServer running `script`, `fetch` against it, `check(run, server)`."""

    def run() -> tuple[Outcome, str]:
        with tempfile.TemporaryDirectory() as d, RawServer(script) as srv:
            return check(fetch(Path(d), srv.url, **kw), srv)

    return run


def plain(body: bytes = PAYLOAD, *extra: tuple[str, str], etag: str | None = '"v1"'):
    """A script that sends `body` whole, honouring Range and If-Range like a good server."""
    return file_server(lambda n: body, *extra, etag=lambda n: etag)


def file_server(
    body_for: Callable[[int], bytes],
    *extra: tuple[str, str],
    etag: Callable[[int], str | None] = lambda n: '"v1"',
    cut: Callable[[int], int | None] = lambda n: None,
    honour_if_range: bool = True,
    length: bool = True,
    modified: Callable[[int], str | None] = lambda n: None,
):
    """A well-behaved file server whose file (and ETag, Last-Modified) may change per request
    number n, that cuts the body of request n after cut(n) bytes."""

    def script(n: int, req: Req, srv: RawServer) -> None:
        body, tag, date = body_for(n), etag(n), modified(n)
        headers = [*extra] + ([("ETag", tag)] if tag else [])
        headers += [("Last-Modified", date)] if date else []
        m = re.fullmatch(r"bytes=(\d+)-", req.headers.get("range", ""))
        if_range = req.headers.get("if-range")
        if m and (not honour_if_range or if_range is None or if_range in (tag, date)):
            start = int(m.group(1))
            if start >= len(body):
                respond(srv, 416, [*headers, ("Content-Range", f"bytes */{len(body)}")])
                return
            rng = ("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            respond(srv, 206, [*headers, rng], body[start:], cut=cut(n), length=length)
            return
        respond(srv, 200, headers, body, cut=cut(n), length=length)

    return script


# --- resume --------------------------------------------------------------------------------------


def _resume_cases() -> Iterator[Case]:
    half = len(PAYLOAD) // 2
    both = [PAYLOAD, OTHER]

    # A cut download, then the file changes on the server; the server honours If-Range or not,
    # keeps its ETag or not (what it sends on the resumed request).
    for honour in (True, False):
        for tags in (("v1", "v2"), ("v1", None), (None, None), ("v1", "v1")):
            if tags == ("v1", "v1") and honour:
                continue  # the same ETag for a changed file: a lying server, If-Range cannot help
            name = f"changed-file-if-range-{'honoured' if honour else 'ignored'}-etag-{tags}"
            etag = (lambda t: lambda n: f'"{t[0]}"' if n == 1 and t[0] else (t[1] and f'"{t[1]}"'))(
                tags
            )
            script = file_server(
                lambda n: PAYLOAD if n == 1 else OTHER,
                etag=etag,
                cut=lambda n: half if n == 1 else None,
                honour_if_range=honour,
            )
            if tags == ("v1", "v1"):
                # Same ETag, different length: the Content-Range total gives it away.
                script = file_server(
                    lambda n: PAYLOAD if n == 1 else LONGER,
                    etag=lambda n: '"v1"',
                    cut=lambda n: half if n == 1 else None,
                    honour_if_range=False,
                )
                whole = [PAYLOAD, LONGER]
            else:
                whole = both
            yield _case("resume", name, served(script, _judge_whole(whole, r"")))

    # Last-Modified as the only validator (the date changes with the file); a weak ETag only
    # (If-Range needs a strong validator, so that part cannot be resumed).
    for honour in (True, False):
        for label, tag, dates in (
            (
                "last-modified",
                None,
                ("Wed, 21 Oct 2015 07:28:00 GMT", "Thu, 22 Oct 2015 07:28:00 GMT"),
            ),
            ("weak-etag", 'W/"1"', (None, None)),
        ):
            script = file_server(
                lambda n: PAYLOAD if n == 1 else OTHER,
                etag=lambda n, t=tag: t,
                modified=lambda n, d=dates: d[0] if n == 1 else d[1],
                cut=lambda n: half if n == 1 else None,
                honour_if_range=honour,
            )
            name = f"validator-{label}-if-range-{'honoured' if honour else 'ignored'}"
            yield _case("resume", name, served(script, _judge_whole(both, r"")))

    # The resumed answer lies about where it starts or what it holds.
    def lying_206(content_range: Callable[[int, int], str], length_delta: int = 0):
        def script(n: int, req: Req, srv: RawServer) -> None:
            m = re.fullmatch(r"bytes=(\d+)-", req.headers.get("range", ""))
            if n == 1 or not m:
                respond(srv, 200, [("ETag", '"v1"')], PAYLOAD, cut=half if n == 1 else None)
                return
            start = int(m.group(1))
            rest = OTHER[start:]
            headers = [("ETag", '"v1"'), ("Content-Range", content_range(start, len(OTHER)))]
            respond(srv, 206, headers, rest, length_value=len(rest) + length_delta)

        return script

    ranges = {
        "start-off-by-one": lambda s, t: f"bytes {s + 1}-{t - 1}/{t}",
        "start-zero": lambda s, t: f"bytes 0-{t - 1}/{t}",
        "total-other": lambda s, t: f"bytes {s}-{t}/{t + 1}",
        "total-star": lambda s, t: f"bytes {s}-{t - 1}/*",
        "end-short": lambda s, t: f"bytes {s}-{t - 2}/{t}",
        "malformed": lambda s, t: f"bytes={s}-",
        "missing": lambda s, t: "",
        "huge-numbers": lambda s, t: f"bytes {s}-{10**30}/{10**30 + 1}",
        "5000-digits": lambda s, t: f"bytes {s}-{'9' * 5000}/{'9' * 5000}",
    }
    for name, cr in ranges.items():
        yield _case(
            "resume", f"206-content-range-{name}", served(lying_206(cr), _judge_whole(both))
        )
    yield _case(
        "resume",
        "206-content-length-disagrees",
        served(lying_206(lambda s, t: f"bytes {s}-{t - 1}/{t}", 7), _judge_whole(both)),
    )

    # A stale .part from another file (longer, as long, shorter), alone or with the state an
    # earlier fetch saved beside it: for a file the server no longer has, or for another URL.
    for label, stale, total in (
        ("longer", OTHER + b"x" * 4096, 1 << 30),
        ("same-length", OTHER, len(OTHER)),
        ("shorter", OTHER[:half], len(OTHER)),
    ):
        for saved in ("no-state", "state-of-an-old-etag", "state-of-another-url"):

            def setup(config: Path, dest: Path, stale=stale, saved=saved, total=total) -> None:
                dest.mkdir(parents=True, exist_ok=True)
                (dest / (NAME + ".part")).write_bytes(stale)
                if saved != "no-state":
                    _write_state(dest, config, total, saved == "state-of-another-url")

            name = f"stale-part-{label}-{saved}"
            yield _case(
                "resume", name, served(plain(PAYLOAD), _judge_whole([PAYLOAD]), setup=setup)
            )

    # A server that answers 206 without being asked for a range, or 416 to a fresh request.
    def unasked_206(n: int, req: Req, srv: RawServer) -> None:
        rng = ("Content-Range", f"bytes 0-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        respond(srv, 206, [rng], PAYLOAD)

    yield _case("resume", "206-to-a-whole-file-request", served(unasked_206, _judge_whole([])))

    def fresh_416(n: int, req: Req, srv: RawServer) -> None:
        respond(srv, 416, [("Content-Range", f"bytes */{len(PAYLOAD)}")])

    yield _case("resume", "416-to-a-whole-file-request", served(fresh_416, _judge_whole([])))

    # Cut several times: each resume continues the same file.
    for cuts in (2, 3):
        script = file_server(
            lambda n: PAYLOAD,
            cut=lambda n, c=cuts: (len(PAYLOAD) * n // (c + 1)) if n <= c else None,
        )
        yield _case(
            "resume",
            f"cut-{cuts}-times",
            served(
                script,
                _judge_whole([PAYLOAD]),
            ),
        )

    # State files that are not what fetch wrote: garbage, huge, a FIFO, a symlink.
    for label, make in _odd_state_files().items():

        def setup(config: Path, dest: Path, make=make) -> None:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / (NAME + ".part")).write_bytes(OTHER[:half])
            make(dest / (NAME + ".part.json"), dest)

        yield _case(
            "resume",
            f"saved-validator-{label}",
            served(plain(PAYLOAD), _judge_whole([PAYLOAD]), setup=setup),
        )


def _write_state(dest: Path, config: Path, total: int, other_url: bool) -> None:
    """The state fetch saves beside a .part, for a file whose ETag was "old"."""
    import json

    from rocky_vulkan.config import load_config

    url = "http://elsewhere.invalid/m.gguf" if other_url else load_config(config).model.url
    state = {"url_sha256": sha(url.encode()), "kind": "etag", "validator": '"old"', "total": total}
    (dest / (NAME + ".part.json")).write_text(json.dumps(state))


def _odd_state_files() -> dict[str, Callable[[Path, Path], None]]:
    def fifo(path: Path, dest: Path) -> None:
        os.mkfifo(path)

    def huge(path: Path, dest: Path) -> None:
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)  # sparse: 1 GiB of nothing

    def link(path: Path, dest: Path) -> None:
        path.symlink_to("/dev/zero")

    def directory(path: Path, dest: Path) -> None:
        path.mkdir()

    return {
        "garbage": lambda p, d: p.write_bytes(b"\x00\xff{not json"),
        "wrong-types": lambda p, d: p.write_text(
            '{"validator": 5, "total": "x", "url_sha256": []}'
        ),
        "huge-total": lambda p, d: p.write_text(
            '{"url_sha256": "", "validator": "\\"v1\\"", "total": 1' + "0" * 5000 + "}"
        ),
        "sparse-1GiB": huge,
        "fifo": fifo,
        "symlink-dev-zero": link,
        "directory": directory,
    }


def _judge_whole(whole: list[bytes], cause: str | None = None):
    def check(run: Run, srv: RawServer) -> tuple[Outcome, str]:
        return judge(run, whole, cause, expect_refusal=not whole)

    return check


# --- completeness --------------------------------------------------------------------------------


def _completeness_cases() -> Iterator[Case]:
    layout = payload_layout()
    # A close-delimited body (no Content-Length) cut at points of the file, every time or once.
    points = {
        "in-magic": 2,
        "in-counts": 20,
        "in-metadata": layout["kv_mid"],
        "in-tensor-infos": layout["infos_mid"],
        "at-data-start": layout["data_offset"],
        "in-data": layout["data_offset"] + (len(PAYLOAD) - layout["data_offset"]) // 2,
        "one-byte-short": len(PAYLOAD) - 1,
    }
    for where, at in points.items():
        for always in (True, False):
            script = file_server(
                lambda n: PAYLOAD,
                cut=lambda n, at=at, always=always: at if (always or n == 1) else None,
                length=False,
            )
            name = f"close-delimited-cut-{where}-{'every-time' if always else 'once'}"
            whole = [] if always else [PAYLOAD]
            yield _case("completeness", name, served(script, _judge_whole(whole, r"")))

    # The server's file itself is cut (Content-Length agrees with the cut file) or has extra bytes.
    for where, body in TRUNCATIONS.items():
        yield _case(
            "completeness",
            f"served-file-{where}",
            served(plain(body), _judge_whole([], r"GGUF|cut|ends|bytes")),
        )
    # Hostile GGUF headers: counts, lengths, dims, types, offsets, alignment. Refused fast.
    for label, body in HOSTILE_HEADERS.items():
        yield _case(
            "completeness",
            f"header-{label}",
            served(plain(body), _judge_whole([], r"GGUF|tensor|header|bytes")),
        )
    # Real files of other shapes (several types, alignments): accepted and pinned.
    for label, body in _good_variants().items():
        yield _case("completeness", f"valid-{label}", served(plain(body), _judge_whole([body])))


def _good_variants() -> dict[str, bytes]:
    from tests.helpers.gguf_files import valid_variants

    return valid_variants()


# --- time ----------------------------------------------------------------------------------------


def _drip(payload: bytes, every: float, budget: float = 3.0):
    """Send `payload` one byte every `every` s, for at most `budget` s, then hang up."""

    def send(srv: RawServer) -> None:
        end = time.monotonic() + budget
        for i in range(len(payload)):
            if time.monotonic() > end or not srv.send(payload[i : i + 1]):
                return
            time.sleep(every)

    return send


def _time_cases() -> Iterator[Case]:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAYLOAD)}\r\n\r\n".encode()

    def status_drip(n, req, srv):
        _drip(head, 0.3)(srv)

    def header_drip(n, req, srv):
        srv.send(b"HTTP/1.1 200 OK\r\n")
        _drip(b"X-Slow: " + b"a" * 200 + b"\r\n" + head.split(b"\r\n", 1)[1], 0.3)(srv)

    def body_drip(n, req, srv):
        srv.send(head)
        _drip(PAYLOAD, 0.3)(srv)

    def silent(n, req, srv):
        time.sleep(3.0)

    def continues(n, req, srv):
        end = time.monotonic() + 3.0
        while time.monotonic() < end and srv.send(b"HTTP/1.1 100 Continue\r\n\r\n"):
            time.sleep(0.1)

    def slow_redirects(n, req, srv):
        time.sleep(0.4)
        respond(srv, 302, [("Location", f"/hop{n}")])

    scripts = {
        "status-line-drip": status_drip,
        "header-drip": header_drip,
        "body-drip": body_drip,
        "silent-after-accept": silent,
        "endless-100-continue": continues,
        "slow-redirect-chain": slow_redirects,
    }
    for label, script in scripts.items():
        for retries in ("0", "5"):
            # The server keeps at it for 3 s: only the 1 s deadline can end the run sooner.
            name = f"{label}-max-time-1-retries-{retries}"
            yield _case("time", name, _time_run(script, 1.0, retries), timeout=15.0)


def _time_run(script, max_time: float, retries: str):
    def run() -> tuple[Outcome, str]:
        with tempfile.TemporaryDirectory() as d, RawServer(script) as srv:
            # A long read timeout: only the overall deadline can end these.
            r = fetch(
                Path(d),
                srv.url,
                "--retries",
                retries,
                "--read-timeout",
                "60",
                "--stall-time",
                "600",
                max_time=max_time,
            )
            return _judge_time(r, srv)

    return run


def _judge_time(run: Run, srv: RawServer) -> tuple[Outcome, str]:
    return judge(run, [], r"max-time|gave up|timeout|no data|redirect")


# --- paths ---------------------------------------------------------------------------------------


def _paths_cases() -> Iterator[Case]:
    specials: dict[str, Callable[[Path], Path]] = {
        "dest-under-a-regular-file": lambda tmp: tmp / "afile" / "models",
        "dest-is-a-regular-file": lambda tmp: tmp / "afile",
        "dest-is-dev-null": lambda tmp: Path("/dev/null"),
        "dest-under-dev-null": lambda tmp: Path("/dev/null/models"),
        "dest-in-proc": lambda tmp: Path("/proc/self"),
        "dest-is-a-fifo": lambda tmp: tmp / "fifo",
    }
    for label, where in specials.items():

        def run(where=where) -> tuple[Outcome, str]:
            with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
                tmp = Path(d)
                (tmp / "afile").write_text("x")
                os.mkfifo(tmp / "fifo")
                r = fetch(tmp, srv.url, dest=where(tmp))
                if r.dest == Path("/dev/null") or str(r.dest).startswith("/proc"):
                    r.dest = tmp / "nowhere"
                return judge(r, [], r"--dest|folder|directory|not a")

        yield _case("paths", label, run)

    # What is already at the model's path, its .part, and the paths a refused file is set aside at.
    target_text = b"a file elsewhere that must stay as it is\n"

    def odd(kind: str) -> Callable[[Path, Path], None]:
        def make(path: Path, tmp: Path) -> None:
            if kind == "directory":
                path.mkdir()
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "symlink-dev-null":
                path.symlink_to("/dev/null")
            elif kind == "symlink-file":
                (tmp / "elsewhere").write_bytes(target_text)
                path.symlink_to(tmp / "elsewhere")
            elif kind == "dangling-symlink":
                path.symlink_to(tmp / "missing" / "x")
            elif kind == "symlink-loop":
                path.symlink_to(path.name)

        return make

    kinds = ("directory", "fifo", "symlink-dev-null", "symlink-file", "dangling-symlink")
    kinds += ("symlink-loop",)
    for suffix, body, pinned in (
        ("", PAYLOAD, None),
        ("", PAYLOAD, "pinned"),
        (".part", PAYLOAD, None),
        (".not-gguf", b"<html>login</html>\n" * 60000, None),
        (".sha256-mismatch", OTHER, "pinned"),
    ):
        for kind in kinds:
            label = f"{(NAME + suffix)}-is-{kind}" + ("-sha-pinned" if pinned else "")
            yield _case("paths", label, _odd_path_run(suffix, body, pinned, odd(kind)))

    # Two fetches into one folder at once: the second is refused, the first ends as it would.
    yield _case("paths", "second-fetch-into-the-same-folder", _concurrent_run, timeout=30.0)

    # A full disk (RLIMIT_FSIZE in a child: the write fails with EFBIG), with and without a pin.
    for limit in (0, 4096, len(PAYLOAD) // 2):
        for pinned in (False, True):

            def run(limit=limit, pinned=pinned) -> tuple[Outcome, str]:
                with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
                    r = fetch(
                        Path(d),
                        srv.url,
                        sha256=sha(PAYLOAD) if pinned else None,
                        subprocess_limit=limit,
                        max_time=10,
                    )
                    return judge(r, [], r"space|large|write|EFBIG|disk")

            label = f"file-size-limit-{limit}" + ("-sha-pinned" if pinned else "")
            yield _case("paths", label, run, timeout=40.0)


def _concurrent_run() -> tuple[Outcome, str]:
    def slow(n, req, srv):  # the first fetch's body: 2.5 s of drip, then the rest
        srv.send(f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAYLOAD)}\r\n\r\n".encode())
        _drip(PAYLOAD[:10], 0.25)(srv)
        srv.send(PAYLOAD[10:])

    with tempfile.TemporaryDirectory() as d, RawServer(slow) as srv:
        tmp = Path(d)
        config = write_project(tmp, srv.url)
        argv = ["--config", str(config), "model", "fetch", "--dest", str(tmp / "models")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from rocky_vulkan.cli import main; sys.exit(main(sys.argv[1:]))"
        first = subprocess.Popen(
            [sys.executable, "-c", code, *argv, "--no-progress", "--max-time", "20"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            end = time.monotonic() + 15
            while not (tmp / "models" / (NAME + ".part")).exists() and time.monotonic() < end:
                time.sleep(0.05)
            second = fetch(tmp, srv.url, config=config, max_time=4)
            out, err = first.communicate(timeout=25)
        finally:
            first.kill()
            first.wait()
        if first.returncode != 0:
            return Outcome.WRONG, f"the first fetch failed: {err.strip()[-200:]}"
        # The first fetch pinned the config and wrote the model after the second was judged.
        second.before, second.model_existed = second.after, True
        outcome = judge(second, [], r"another .*model fetch")
        if outcome[0] == Outcome.REFUSED and (tmp / "models" / NAME).read_bytes() != PAYLOAD:
            return Outcome.WRONG, "the first fetch's model is not the file"
        return outcome


def _odd_path_run(suffix: str, body: bytes, pinned: str | None, make) -> Callable:
    def run() -> tuple[Outcome, str]:
        with tempfile.TemporaryDirectory() as d, RawServer(plain(body)) as srv:
            tmp = Path(d)
            dest = tmp / "models"
            dest.mkdir()
            path = dest / (NAME + suffix)
            make(path, tmp)
            elsewhere = tmp / "elsewhere"
            files_before = {str(elsewhere): elsewhere.read_bytes()} if elsewhere.exists() else {}
            r = fetch(tmp, srv.url, sha256=sha(PAYLOAD) if pinned else None, max_time=4)
            r.files_before = files_before
            untouched = [elsewhere] if elsewhere.exists() else []
            if not suffix and not pinned:
                # The model path itself: refusing is right, so is replacing a link by the file.
                return judge(
                    r, [PAYLOAD], r"regular file|not a|directory|link", untouched=untouched
                )
            return judge(
                r, [PAYLOAD], r"regular file|not a|directory|link|sha256", untouched=untouched
            )

    return run


# --- pinning -------------------------------------------------------------------------------------


def _pinning_cases() -> Iterator[Case]:
    good = sha(PAYLOAD)

    def variants(url: str) -> dict[str, tuple[bytes, bytes | None]]:
        """name -> (config bytes, the bytes expected after pinning; None: must be refused)."""
        base = config_text(url)
        token = "\n  sha256: null"
        assert base.count(token) == 1
        out: dict[str, tuple[bytes, bytes | None]] = {}

        def add(name: str, text: str, null: str = "null", refuse: bool = False) -> None:
            for enc_name, bom in (("", b""), ("-bom", b"\xef\xbb\xbf")):
                data = bom + text.encode("utf-8")
                model = re.search(rb"[\r\n]model:", data).start()
                i = data.index(b"sha256: " + null.encode(), model) + 8
                after = data[:i] + good.encode() + data[i + len(null.encode()) :]
                out[name + enc_name] = (data, None if refuse else after)

        add("lf", base)
        add("crlf", base.replace("\n", "\r\n"))
        add("cr-only", base.replace("\n", "\r"))
        add(
            "mixed",
            "".join(line + ("\r\n" if i % 2 else "\n") for i, line in enumerate(base.split("\n"))),
        )
        add("no-final-newline", base.rstrip("\n"))
        for null in ("~", "Null", "NULL"):
            add(f"null-as-{null}", base.replace(token, f"\n  sha256: {null}"), null)
        add("comment-after", base.replace(token, token + "   # pin me"))
        add("trailing-spaces", base.replace(token, token + "   "))
        add("empty-value", base.replace(token, "\n  sha256:"), "", refuse=True)
        add("quoted-null", base.replace(token, '\n  sha256: "null"'), '"null"', refuse=True)
        alias = base.replace(token, "\n  sha256: *nothing")
        alias = alias.replace("\n  password_hash: null", "\n  password_hash: &nothing null")
        add("alias-to-null", alias, "*nothing", refuse=True)
        anchored = base.replace(token, "\n  sha256: &nothing null")
        anchored = anchored.replace("\n  password_hash: null", "\n  password_hash: *nothing")
        add("anchored-null", anchored, "&nothing null", refuse=True)
        add(
            "tagged-null",
            base.replace(token, "\n  sha256: !!null null"),
            "!!null null",
            refuse=True,
        )
        add("non-ascii-comment", base.replace(token, token + " # café"))
        return out

    names = list(variants("http://x/m.gguf"))
    for name in names:

        def run(name=name) -> tuple[Outcome, str]:
            with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
                tmp = Path(d)
                data, after = variants(srv.url)[name]
                config = write_project(tmp, srv.url, text=data)
                r = fetch(tmp, srv.url, config=config)
                if after is None:
                    return judge(r, [], r"sha256|anchor|alias")
                outcome = judge(r, [PAYLOAD])
                if outcome[0] != Outcome.HELD:
                    return outcome
                if r.after != after:
                    return Outcome.WRONG, "pinning changed more than the sha256 value's bytes"
                return outcome

        yield _case("pinning", name, run)

    # A symlinked config (relative and absolute): the link stays, its target gets the pin.
    for label in ("absolute", "relative", "chain"):

        def run(label=label) -> tuple[Outcome, str]:
            with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
                tmp = Path(d)
                (tmp / "real").mkdir()
                real = write_project(tmp / "real", srv.url)
                link = tmp / "link.yaml"
                if label == "absolute":
                    link.symlink_to(real)
                elif label == "relative":
                    link.symlink_to(os.path.relpath(real, tmp))
                else:
                    (tmp / "mid.yaml").symlink_to(real)
                    link.symlink_to("mid.yaml")
                before = real.read_bytes()
                r = fetch(tmp, srv.url, config=link)
                r.before = r.after  # judged on the target below
                outcome = judge(r, [PAYLOAD]) if r.rc == 0 else judge(r, [], r"link")
                if r.rc == 0:
                    expected = before.replace(b"sha256: null", f"sha256: {good}".encode(), 1)
                    if not link.is_symlink():
                        return Outcome.WRONG, "the config symlink was replaced by a file"
                    if real.read_bytes() != expected:
                        return Outcome.WRONG, "the link's target was not pinned exactly"
                return outcome

        yield _case("pinning", f"config-symlink-{label}", run)

    # Pin permissions: a read-only config file keeps its mode.
    def readonly() -> tuple[Outcome, str]:
        with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
            tmp = Path(d)
            config = write_project(tmp, srv.url)
            config.chmod(0o440)
            r = fetch(tmp, srv.url, config=config)
            outcome = judge(r, [PAYLOAD])
            mode = config.stat().st_mode & 0o777
            if outcome[0] == Outcome.HELD and mode != 0o440:
                return Outcome.WRONG, f"the config's mode became {mode:o}"
            return outcome

    yield _case("pinning", "config-mode-0440-kept", readonly)


# --- protocol ------------------------------------------------------------------------------------


def _protocol_cases() -> Iterator[Case]:
    def redirect_to(location: str, status: int = 302):
        def script(n, req, srv):
            if req.target == "/final":
                respond(srv, 200, [("ETag", '"v1"')], PAYLOAD)
            else:
                respond(srv, status, [("Location", location.format(port=srv.port))])

        return script

    for label, loc in {
        "file": "file:///etc/passwd",
        "file-relative-host": "file://localhost/etc/hostname",
        "ftp": "ftp://127.0.0.1/x",
        "gopher": "gopher://127.0.0.1/x",
        "data": "data:text/plain,GGUF",
        "javascript": "javascript:alert(1)",
        "credentials": f"http://user:{SECRET}@127.0.0.1:{{port}}/final",
        "empty": "",
        "control-chars": "/fin\x1b[2Jal",
    }.items():
        yield _case(
            "protocol",
            f"redirect-to-{label}",
            served(redirect_to(loc), _judge_whole([], r"redirect|scheme|http|password|Location")),
        )
    for status in (301, 302, 303, 307, 308):
        yield _case(
            "protocol",
            f"redirect-{status}-relative-ok",
            served(redirect_to("/final", status), _judge_whole([PAYLOAD])),
        )

    def loop(n, req, srv):
        respond(srv, 302, [("Location", req.target)])

    def chain(n, req, srv):
        respond(srv, 302, [("Location", f"/c{n}")])

    def no_location(n, req, srv):
        respond(srv, 302, [])

    for label, script in (("loop", loop), ("endless-chain", chain), ("no-location", no_location)):
        yield _case(
            "protocol", f"redirect-{label}", served(script, _judge_whole([], r"redirect|Location"))
        )

    # Content-Length values: garbage, negative, several, huge (more than the disk), short.
    for label, value in {
        "garbage": "abc",
        "negative": "-5",
        "float": "1e6",
        "superscript-two": "\u00b2",
        "plus-sign": f"+{len(PAYLOAD)}",
        "two-values": f"{len(PAYLOAD)}, {len(PAYLOAD)}",
        "two-different": f"{len(PAYLOAD)}, 5",
        "5000-digits": "9" * 5000,
        "empty": "",
    }.items():

        def script(n, req, srv, value=value):
            respond(srv, 200, [("Content-Length", value)], PAYLOAD, length=False)

        yield _case(
            "protocol",
            f"content-length-{label}",
            served(script, _judge_whole([PAYLOAD], r"length|header|Content|GGUF|closed")),
        )
    for label, value in {"more-than-the-disk": 10**15, "2^63": 2**63, "10^30": 10**30}.items():

        def script(n, req, srv, value=value):
            respond(srv, 200, [("ETag", '"v1"')], PAYLOAD, length_value=value)

        yield _case(
            "protocol",
            f"content-length-{label}",
            served(script, _judge_whole([], r"free|space|bytes|disk")),
        )

    # Content-Encoding the client did not ask for: the stored bytes would not be the file.
    import gzip
    import zlib

    for enc, body in (
        ("gzip", gzip.compress(PAYLOAD)),
        ("deflate", zlib.compress(PAYLOAD)),
        ("br", PAYLOAD),
        ("x-unknown", PAYLOAD),
    ):
        yield _case(
            "protocol",
            f"content-encoding-{enc}",
            served(plain(body, ("Content-Encoding", enc)), _judge_whole([], r"encod")),
        )
    yield _case(
        "protocol",
        "content-encoding-identity",
        served(plain(PAYLOAD, ("Content-Encoding", "identity")), _judge_whole([PAYLOAD])),
    )

    # Checksums the server offers: never trusted, the pin is the sha256 of the bytes.
    lie = sha(OTHER)
    for hdr in (
        ("ETag", f'"{lie}"'),
        ("X-Linked-Etag", f'"{lie}"'),
        ("Digest", f"sha-256={lie}"),
        ("X-Checksum-Sha256", lie),
        ("Repr-Digest", f"sha-256=:{lie}:"),
    ):
        yield _case(
            "protocol",
            f"server-checksum-{hdr[0].lower()}",
            served(plain(PAYLOAD, hdr, etag=None), _judge_whole([PAYLOAD])),
        )

    # Status lines and statuses a file server does not send.
    for label, line in {
        "garbage-status-line": b"garbage\r\n\r\n",
        "status-999": b"HTTP/1.1 999 Weird\r\nContent-Length: 4\r\n\r\nGGUF",
        "status-204": b"HTTP/1.1 204 No Content\r\n\r\n",
        "status-203": b"HTTP/1.1 203 Non-Authoritative\r\nContent-Length: %d\r\n\r\n",
        "status-304": b"HTTP/1.1 304 Not Modified\r\n\r\n",
        "reason-with-escapes": b"HTTP/1.1 503 \x1b]0;owned\x07\x1b[2JBusy\r\n"
        b"Content-Length: 0\r\n\r\n",
        "404-reason-with-escapes": b"HTTP/1.1 404 \x1b[2J\x1b[8mgone\r\nContent-Length: 0\r\n\r\n",
        "http-0.9": b"GGUF",
        "200-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
        "header-line-100k": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
        "chunked-bad-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
        "chunked-no-end": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10\r\n0123456789abcdef\r\n",
    }.items():

        def script(n, req, srv, line=line):
            data = line % len(PAYLOAD) + PAYLOAD if b"%d" in line else line
            srv.send(data)

        yield _case("protocol", label, served(script, _judge_whole([], r"")))

    def chunked(n, req, srv):
        srv.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(PAYLOAD), 65536):
            piece = PAYLOAD[i : i + 65536]
            srv.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
        srv.send(b"0\r\n\r\n")

    yield _case("protocol", "chunked-ok", served(chunked, _judge_whole([PAYLOAD])))

    # URLs in the config: credentials, schemes fetch cannot use, plain http (allowed).
    for label, url in {
        "user-password": f"http://user:{SECRET}@127.0.0.1:{{port}}/m.gguf",
        "user-only": f"http://{SECRET}@127.0.0.1:{{port}}/m.gguf",
        "file-scheme": "file:///etc/passwd",
        "git-scheme": "git://127.0.0.1:{port}/m.gguf",
    }.items():

        def run(url=url) -> tuple[Outcome, str]:
            with tempfile.TemporaryDirectory() as d, RawServer(plain()) as srv:
                r = fetch(Path(d), url.format(port=srv.port))
                return judge(r, [], r"password|user|http|scheme|url")

        yield _case("protocol", f"config-url-{label}", run)
    yield _case("protocol", "config-url-plain-http", served(plain(), _judge_whole([PAYLOAD])))


def cases() -> Iterator[Case]:
    yield from _resume_cases()
    yield from _completeness_cases()
    yield from _time_cases()
    yield from _paths_cases()
    yield from _pinning_cases()
    yield from _protocol_cases()
