"""`rocky-selftest cts`: a chosen subset of dEQP-VK (Vulkan's conformance tests) on the board,
within a time budget.

The image has them when it was built with kas/vulkan-cts.yml (meta-oe's vulkan-cts recipe:
deqp-vk, its data and the mustpass lists under CTS_DIR). The case list is built from the
installed mustpass lists filtered by the patterns (deqp's own wildcard: `*` matches anything,
dots included), then deqp-vk runs it in chunks, each with its own case list file and QPA log.
New chunks stop starting once the budget is spent; a chunk that crashes records the case it was
running as Crash and the rest of the chunk runs again in the next one; a chunk that writes
nothing to its log for case_timeout_s is killed and its case recorded as Timeout.

Everything deqp-vk writes is read as hostile input: the log is read up to MAX_LOG_BYTES, line by
line with exact patterns, and only what the writer itself emits counts (a result needs its
`#beginTestCaseResult`, a `<Result StatusCode=...>` and `#endTestCaseResult` after the closing
`</TestCaseResult>`; log text cannot forge those, as the writer escapes `<`). A status code
that is not one of deqp's is counted as Unknown. Counts come from the log, never from deqp-vk's
own summary on stdout.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import paths
from .runner import STOP_SIGNALS, Capture, kill_group, merged_env, pump, reap

if TYPE_CHECKING:
    from .settings import Settings

# What meta-oe's recipe (meta-oe/recipes-graphics/vk-gl-cts/vulkan-cts_1.4.5.2.bb, with
# khronos-cts.inc) builds and installs: CTSDIR = /usr/lib/${BPN}, all in the ${PN} package.
CTS_RECIPE = "vulkan-cts"
CTS_PACKAGE = "vulkan-cts"
CTS_DIR = paths.CTS_DIR
DEQP_NAME = "deqp-vk"
# The recipe copies external/vulkancts/mustpass/main/ to ${CTSDIR}/mustpass/main: vk-default.txt
# lists the files (vk-default/<group>.txt) that hold the case names.
MUSTPASS_INDEX = "mustpass/main/vk-default.txt"
FRAGMENT = "kas/vulkan-cts.yml"
CTS_SUBDIR = "cts"  # under results_dir: the chunks' case lists and QPA logs
SECTION_FILE = "cts.json"  # the whole cts section, also when there is no result.json yet

DEFAULT_CASES = (
    "dEQP-VK.compute.*",
    "dEQP-VK.api.command_buffers.*",
    "dEQP-VK.synchronization2.op.multi_queue.*",
    "dEQP-VK.memory_model.shared.*",
    "dEQP-VK.glsl.indexing.tmp_array.*",
)

# deqp's test case name characters (tcu isValidTestCaseNameChar), groups joined by '.'.
CASE = re.compile(r"dEQP-VK(?:\.[A-Za-z0-9_-]{1,200}){1,30}")
CASE_BYTES = re.compile(rb"dEQP-VK(?:\.[A-Za-z0-9_-]{1,200}){1,30}")
# A pattern: case name characters, '.' and deqp's '*' wildcard.
PATTERN = re.compile(r"dEQP-VK[A-Za-z0-9_.*-]{0,300}")
MAX_PATTERNS = 64
MAX_CASE_CHARS = 1000
# Reading the mustpass lists: at most this many files, bytes in all, and cases kept.
MAX_LIST_FILES = 2000
MAX_LIST_BYTES = 1 << 30
MAX_SELECTED = 200_000
MAX_INCLUDE_DEPTH = 3
INCLUDE = re.compile(r"[A-Za-z0-9_-]{1,100}(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}){0,5}\.txt")
# One chunk's QPA log (images and shader sources off: a few kB a case).
MAX_LOG_BYTES = 64 << 20
MAX_FAILED_LISTED = 200  # failed case names kept in result.json (all of them are counted)
POLL_S = 0.25
GRACE_S = 2.0

# deqp's status codes (qpTestLog.c s_qpTestResultMap), and ours for what the log cannot say.
DEQP_STATUSES = (
    "Pass",
    "Fail",
    "QualityWarning",
    "CompatibilityWarning",
    "Pending",
    "NotSupported",
    "ResourceError",
    "InternalError",
    "Crash",
    "Timeout",
    "Waiver",
)
UNKNOWN = "Unknown"  # a StatusCode deqp does not write
NO_RESULT = "NoResult"  # asked for, ended without a result, or never reached by a clean run
BAD_LOG = "BadLog"  # the log contradicts itself about this case
STATUSES = (*DEQP_STATUSES, UNKNOWN, NO_RESULT, BAD_LOG)
FAILED = ("Fail", "Crash", "Timeout", "InternalError", "ResourceError")
FAILING = (*FAILED, UNKNOWN, NO_RESULT, BAD_LOG)  # listed by name; the verdict is FAIL
SUMMARY_GROUPS = {
    "pass": ("Pass",),
    "fail": FAILED,
    "not_supported": ("NotSupported",),
}

Log = Callable[[str], None]


class CtsError(Exception):
    """Nothing can be run (no CTS in the image, unreadable lists, bad patterns); the message
    says why and what to do."""


# --- patterns and the case list -------------------------------------------------------------


def pattern_problem(pattern: object) -> str | None:
    """Why `pattern` is not a dEQP-VK case pattern, or None."""
    if not isinstance(pattern, str) or not PATTERN.fullmatch(pattern):
        return (
            "a dEQP-VK case name or pattern (letters, digits, '_', '-', '.', '*'; e.g. "
            "dEQP-VK.compute.*)"
        )
    return None


@dataclass(frozen=True)
class Matcher:
    """deqp's wildcard matching of case names against patterns (`*` matches any characters)."""

    patterns: tuple[str, ...]

    def __post_init__(self) -> None:
        for p in self.patterns:
            problem = pattern_problem(p)
            if problem:
                raise CtsError(f"case pattern {_show(p)}: expected {problem}")
        if not self.patterns:
            raise CtsError("no case patterns: give at least one, e.g. --case 'dEQP-VK.compute.*'")

    @property
    def regex(self) -> re.Pattern[bytes]:
        parts = ["".join(".*" if c == "*" else re.escape(c) for c in p) for p in self.patterns]
        return re.compile("|".join(f"(?:{p})" for p in parts).encode())

    @property
    def prefixes(self) -> tuple[bytes, ...]:
        """The literal start of each pattern: a line that starts with none cannot match."""
        return tuple(p.split("*", 1)[0].encode() for p in self.patterns)


@dataclass
class Selection:
    cases: list[str] = field(default_factory=list)
    matched: int = 0  # may exceed len(cases) when MAX_SELECTED cut the list
    files: int = 0
    bytes_read: int = 0
    bad_lines: int = 0
    notes: list[str] = field(default_factory=list)


def _lines(path: str, budget: list[int]) -> Iterator[bytes | None]:
    """The lines of `path` without their line break, each read with a bounded readline; a line
    longer than MAX_CASE_CHARS is yielded as None. `budget[0]` counts down the bytes read."""
    with open(path, "rb") as f:
        while True:
            line = f.readline(MAX_CASE_CHARS + 2)
            if not line:
                return
            budget[0] -= len(line)
            if budget[0] < 0:
                raise CtsError(
                    f"the mustpass lists under {os.path.dirname(path)} are larger than "
                    f"{MAX_LIST_BYTES >> 20} MiB: not the lists vulkan-cts installs; rebuild the "
                    f"image with {FRAGMENT}"
                )
            if not line.endswith(b"\n") and len(line) > MAX_CASE_CHARS:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = f.readline(1 << 16)
                    budget[0] -= len(line)
                yield None
                continue
            yield line.rstrip(b"\r\n")


def _regular(path: str) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)


def select_cases(cts_dir: str, patterns: Iterable[str], max_cases: int = MAX_SELECTED) -> Selection:
    """The installed mustpass cases that match `patterns`, in list order, without duplicates."""
    matcher = Matcher(tuple(patterns))
    regex, prefixes = matcher.regex, matcher.prefixes
    index = os.path.join(cts_dir, MUSTPASS_INDEX)
    if not _regular(os.path.join(cts_dir, DEQP_NAME)) or not _regular(index):
        raise CtsError(
            f"dEQP-VK is not installed ({os.path.join(cts_dir, DEQP_NAME)} or {index} missing): "
            f"build the image with the {CTS_PACKAGE} package, e.g. "
            f"`kas build kas/<machine>.yml:{FRAGMENT}`, and flash it"
        )
    sel = Selection()
    seen: set[str] = set()
    budget = [MAX_LIST_BYTES]

    base = os.path.dirname(index)  # deqp resolves every listed file from one folder

    def read(path: str, depth: int) -> None:
        include_mode: bool | None = None
        sel.files += 1
        if sel.files > MAX_LIST_FILES:
            raise CtsError(f"more than {MAX_LIST_FILES} mustpass list files: not vulkan-cts's")
        for line in _lines(path, budget):
            if line is None:
                sel.bad_lines += 1
                continue
            line = line.strip()
            if not line or line.startswith(b"#"):
                continue
            if include_mode is None:  # deqp: a first line ending in .txt makes a list of lists
                include_mode = line.endswith(b".txt")
            if include_mode:
                name = line.decode("ascii", "replace")
                target = os.path.join(base, name)
                if not INCLUDE.fullmatch(name) or ".." in name.split("/"):
                    sel.bad_lines += 1
                elif depth >= MAX_INCLUDE_DEPTH:
                    sel.notes.append(f"{name}: lists nested deeper than {MAX_INCLUDE_DEPTH}")
                elif not _regular(target):
                    sel.notes.append(f"{name}: listed in {os.path.basename(path)} but missing")
                else:
                    read(target, depth + 1)
                continue
            if not line.startswith(prefixes):
                continue
            if not CASE_BYTES.fullmatch(line):
                sel.bad_lines += 1
                continue
            if regex.fullmatch(line):
                case = line.decode("ascii")
                if case in seen:
                    continue
                seen.add(case)
                sel.matched += 1
                if len(sel.cases) < max_cases:
                    sel.cases.append(case)

    try:
        read(index, 0)
    except OSError as err:
        raise CtsError(f"cannot read the mustpass lists under {cts_dir}: {err}") from None
    sel.bytes_read = MAX_LIST_BYTES - budget[0]
    if sel.matched > len(sel.cases):
        sel.notes.append(
            f"{sel.matched} cases matched; only the first {len(sel.cases)} are listed: "
            "narrow the patterns"
        )
    if sel.bad_lines:
        sel.notes.append(f"{sel.bad_lines} lines of the mustpass lists are no case name (skipped)")
    return sel


# --- the QPA log ----------------------------------------------------------------------------

BEGIN = re.compile(rb"#beginTestCaseResult (.{1,%d})" % MAX_CASE_CHARS)
TERMINATE = re.compile(rb"#terminateTestCaseResult ([A-Za-z]{1,40})")
END = b"#endTestCaseResult"
RESULT = re.compile(rb' *<Result StatusCode="([A-Za-z]{1,40})"(?: />|>)')
CASE_ELEMENT = re.compile(
    rb'<TestCaseResult Version="[0-9.]{1,20}" CasePath="([^"]{1,%d})"' % MAX_CASE_CHARS
)
CLOSE_ELEMENT = b"</TestCaseResult>"


@dataclass
class QpaLog:
    results: list[tuple[str, str]] = field(default_factory=list)  # (case, status) in log order
    in_flight: str | None = None  # begun, neither ended nor terminated (the process died there)
    unknown_codes: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    truncated: bool = False

    def note(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)


def parse_qpa(data: bytes, truncated: bool = False) -> QpaLog:
    """The case results in the text of a QPA log (deqp's TestResults.qpa format)."""
    log = QpaLog(truncated=truncated)
    case: str | None = None
    status: str | None = None
    bad = False
    closed = False  # the case's </TestCaseResult> was seen (the writer's, not log text)
    for n, raw in enumerate(data.split(b"\n"), 1):
        line = raw.rstrip(b"\r")
        if case is None:
            match = BEGIN.fullmatch(line)
            if match:
                name = match.group(1)
                if not CASE_BYTES.fullmatch(name):
                    log.note(f"line {n}: a case begins whose name is no dEQP-VK case name")
                    continue
                case, status, bad, closed = name.decode("ascii"), None, False, False
            elif line == END or TERMINATE.fullmatch(line):
                log.note(f"line {n}: a case ends that never began")
            continue
        if BEGIN.fullmatch(line):
            # Log text inside the open case (the writer never begins a case inside another).
            continue
        match = TERMINATE.fullmatch(line)
        if match:
            code = match.group(1).decode("ascii")
            log.results.append((case, code if code in ("Crash", "Timeout") else BAD_LOG))
            case = None
            continue
        if line == END:
            if not closed:
                continue  # log text: the writer ends a case only after </TestCaseResult>
            if bad:
                final = BAD_LOG
            elif status is None:
                final = NO_RESULT
            elif status in DEQP_STATUSES:
                final = status
            else:
                log.unknown_codes[status] = log.unknown_codes.get(status, 0) + 1
                final = UNKNOWN
            log.results.append((case, final))
            case = None
            continue
        if line.strip() == CLOSE_ELEMENT:
            closed = True
            continue
        match = CASE_ELEMENT.match(line)
        if match and match.group(1).decode("ascii", "replace") != case:
            log.note(f"line {n}: {case} logs a result for another case path")
            bad = True
            continue
        match = RESULT.match(line)
        if match:
            if status is not None:
                log.note(f"line {n}: {case} has a second result")
                bad = True
            status = match.group(1).decode("ascii")
    log.in_flight = case
    return log


def read_qpa(path: str) -> QpaLog:
    """The log at `path`, read up to MAX_LOG_BYTES (an absent log: nothing ran)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except FileNotFoundError:
        return QpaLog()
    truncated = len(data) > MAX_LOG_BYTES
    log = parse_qpa(data[:MAX_LOG_BYTES], truncated)
    if truncated:
        log.note(f"log larger than {MAX_LOG_BYTES >> 20} MiB: read only that much")
    return log


# --- running deqp-vk ------------------------------------------------------------------------


@dataclass
class ChunkRun:
    returncode: int | None
    killed: str | None  # "stall" (no log output for case_timeout_s), "budget", or None
    elapsed_s: float
    stderr_tail: str
    error: str | None = None  # deqp-vk could not be started


def deqp_command(deqp: str, cts_dir: str, caselist: str, log: str, work: str) -> list[str]:
    """deqp-vk's options (tcuCommandLine.cpp): the case list file, the QPA log, no images or
    shader sources in it, data from the install and the shader cache in our work dir."""
    return [
        deqp,
        f"--deqp-caselist-file={caselist}",
        f"--deqp-log-filename={log}",
        "--deqp-log-images=disable",
        "--deqp-log-shader-sources=disable",
        f"--deqp-archive-dir={cts_dir}",
        f"--deqp-shadercache-filename={os.path.join(work, 'shadercache.bin')}",
    ]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def run_chunk(
    cmd: list[str],
    env: dict[str, str],
    log_path: str,
    cwd: str,
    deadline: float,
    case_timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> ChunkRun:
    """Run deqp-vk in its own process group; kill the group when its log stops growing for
    case_timeout_s or the budget's deadline passes. Output is kept bounded (the tail of stderr
    is reported; stdout's counts are never believed)."""
    start = clock()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held),
        )
    except (OSError, ValueError) as err:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return ChunkRun(None, None, 0.0, "", error=f"cannot start {cmd[0]}: {err}")
    out, err = Capture(1 << 16), Capture(1 << 16)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    killed = None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        size, progress_at = _size(log_path), clock()
        while proc.poll() is None:
            for key, _ in sel.select(timeout=POLL_S):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
            now, new = clock(), _size(log_path)
            if new != size:
                size, progress_at = new, now
            if now >= deadline:
                killed = "budget"
            elif now - progress_at >= case_timeout_s:
                killed = "stall"
            if killed:
                kill_group(proc)
                break
        pump(proc, sel, time.monotonic() + GRACE_S)  # what is left in the pipes
        returncode = reap(proc)
    except BaseException:
        kill_group(proc)  # stopped ourselves: deqp-vk must not outlive the self-test
        raise
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    tail = "\n".join(err.text().rstrip().splitlines()[-10:])[-2000:]
    return ChunkRun(returncode, killed, round(clock() - start, 3), tail)


# --- the run --------------------------------------------------------------------------------


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _prepare_work(work: str) -> None:
    """An empty work dir for this run's chunks: our own names from the last run are removed
    (links too, never followed), nothing else; a work dir that is a link is refused."""
    os.makedirs(work, mode=0o755, exist_ok=True)
    if os.path.islink(work) or not os.path.isdir(work):
        raise CtsError(f"{work} is not a directory: remove it, then run `rocky-selftest cts`")
    for name in os.listdir(work):
        path = os.path.join(work, name)
        ours = re.fullmatch(r"chunk-\d{1,6}\.(qpa|txt)|shadercache\.bin", name)
        if ours and (os.path.islink(path) or not os.path.isdir(path)):
            os.unlink(path)  # a link is removed, never followed


@dataclass
class Tally:
    statuses: dict[str, str] = field(default_factory=dict)  # case -> status, first one wins
    unknown_codes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, case: str, status: str) -> None:
        self.statuses.setdefault(case, status)

    def note(self, text: str) -> None:
        if len(self.notes) < 100:
            self.notes.append(text)


def _chunk_outcome(
    chunk: list[str], log: QpaLog, run: ChunkRun, tally: Tally
) -> tuple[list[str], list[str], bool]:
    """(cases to run again, cases the budget cut, whether the chunk made progress) after one
    chunk; its results go into `tally`."""
    wanted = set(chunk)
    done: set[str] = set()
    for case, status in log.results:
        if case not in wanted:
            tally.note(f"the log has {case}, which this chunk did not ask for (ignored)")
            continue
        if case in done:
            tally.note(f"{case}: a second result in one log (the first is kept)")
            continue
        done.add(case)
        tally.add(case, status)
    for code, count in log.unknown_codes.items():
        tally.unknown_codes[code] = tally.unknown_codes.get(code, 0) + count
    for problem in log.problems:
        tally.note(problem)
    cut: list[str] = []
    if log.in_flight in wanted and log.in_flight not in done:
        if run.killed == "budget":
            cut.append(log.in_flight)
        else:
            tally.add(log.in_flight, "Timeout" if run.killed == "stall" else "Crash")
        done.add(log.in_flight)
    rest = [c for c in chunk if c not in done]
    clean = run.error is None and run.killed is None and run.returncode == 0
    if run.killed == "budget":
        return [], cut + rest, bool(done)
    if clean:
        for case in rest:  # deqp-vk ran to the end without them: not in this binary
            tally.add(case, NO_RESULT)
        return [], [], bool(done)
    return rest, [], bool(done)


def run_cts(
    s: Settings,
    patterns: tuple[str, ...],
    budget_s: int,
    chunk_cases: int,
    log: Log,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Select the cases, run them in chunks within `budget_s`, and return the cts section."""
    started_wall = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = clock()
    deadline = start + budget_s
    cts_dir = s.cts_dir
    sel = select_cases(cts_dir, patterns)
    log(
        f"rocky-selftest cts: {len(sel.cases)} cases match {', '.join(patterns)} "
        f"({sel.files} list files, {sel.bytes_read >> 10} KiB read)"
    )
    work = os.path.join(s.results_dir, CTS_SUBDIR)
    _prepare_work(work)
    deqp = os.path.join(cts_dir, DEQP_NAME)
    env = merged_env(dict(s.env))
    tally = Tally(notes=list(sel.notes))
    queue = list(sel.cases)
    not_run: list[str] = []
    chunks = crashes = stalls = 0
    budget_exhausted = False
    while queue:
        if clock() >= deadline:
            budget_exhausted = True
            not_run += queue
            break
        chunk, queue = queue[:chunk_cases], queue[chunk_cases:]
        chunks += 1
        caselist = os.path.join(work, f"chunk-{chunks:03d}.txt")
        qpa = os.path.join(work, f"chunk-{chunks:03d}.qpa")
        with open(caselist, "x", encoding="ascii") as f:  # new: no link planted there is used
            f.write("".join(c + "\n" for c in chunk))
        cmd = deqp_command(deqp, cts_dir, caselist, qpa, work)
        run = run_chunk(cmd, env, qpa, work, deadline, s.cts_case_timeout_s, clock)
        qlog = read_qpa(qpa)
        again, cut, progress = _chunk_outcome(chunk, qlog, run, tally)
        if run.error:
            tally.note(run.error)
        if run.killed == "stall":
            stalls += 1
        elif run.killed is None and (run.returncode or 0) != 0 and qlog.in_flight:
            crashes += 1
        if run.killed == "budget":
            budget_exhausted = True
            not_run += cut + queue
            queue = []
            break
        if again and not progress:
            why = run.error or (
                f"no log output for {s.cts_case_timeout_s} s, killed"
                if run.killed == "stall"
                else f"exit status {run.returncode}"
            )
            tally.note(
                f"deqp-vk ended ({why}) before it ran any case of chunk {chunks}: "
                f"stopped; stderr: {run.stderr_tail or '(empty)'}"
            )
            not_run += again + queue
            queue = []
            break
        queue = again + queue
        log(
            f"rocky-selftest cts: chunk {chunks}: {len(chunk) - len(again)} of {len(chunk)} "
            f"cases done in {run.elapsed_s:.0f} s"
            + (f" ({len(again)} to run again after a {run.killed or 'crash'})" if again else "")
        )
    return _section(
        s, patterns, sel, tally, not_run, chunks, crashes, stalls, budget_s,
        budget_exhausted, started_wall, clock() - start, work,
    )  # fmt: skip


def _section(
    s, patterns, sel, tally, not_run, chunks, crashes, stalls, budget_s, exhausted, started,
    elapsed, work,
) -> dict[str, Any]:  # fmt: skip
    counts = dict.fromkeys(STATUSES, 0)
    for status in tally.statuses.values():
        counts[status] += 1
    summary = {k: sum(counts[s] for s in group) for k, group in SUMMARY_GROUPS.items()}
    ran = sum(counts.values())
    summary["other"] = ran - sum(summary.values())
    failed = [{"case": c, "status": st} for c, st in tally.statuses.items() if st in FAILING]
    if failed:
        verdict = "FAIL"
    elif ran == 0:
        verdict = "ERROR"
    else:
        verdict = "PASS"
    return {
        "verdict": verdict,
        "started_at": started,
        "duration_s": round(elapsed, 1),
        "budget_s": budget_s,
        "budget_exhausted": exhausted,
        "patterns": list(patterns),
        "cts_dir": s.cts_dir,
        "selected": len(sel.cases),
        "matched": sel.matched,
        "ran": ran,
        "not_run": len(not_run),
        "chunks": chunks,
        "crashes": crashes,
        "stalls": stalls,
        "counts": {k: v for k, v in counts.items() if v},
        "summary": summary,
        "failed": failed[:MAX_FAILED_LISTED],
        "failed_total": len(failed),
        "unknown_codes": dict(sorted(tally.unknown_codes.items())[:20]),
        "notes": tally.notes[:100],
        "log_dir": work,
    }


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The run in a few lines for the console."""
    sm = section["summary"]
    lines = [
        f"rocky-selftest cts {section['verdict']}: {section['ran']} cases run in "
        f"{section['duration_s']:.0f} s of {section['budget_s']} s: {sm['pass']} pass, "
        f"{sm['fail']} fail, {sm['not_supported']} not supported, {sm['other']} other"
    ]
    if section["not_run"]:
        lines.append(
            f"  {section['not_run']} of {section['selected']} selected cases not run"
            + (" (budget spent)" if section["budget_exhausted"] else "")
        )
    for item in section["failed"][:20]:
        lines.append(f"  {item['status']:13} {item['case']}")
    if section["failed_total"] > 20:
        lines.append(f"  ... {section['failed_total'] - 20} more failed (result.json)")
    for note in section["notes"][:10]:
        lines.append(f"  note: {note}")
    lines.append(f"  QPA logs: {section['log_dir']}")
    return lines


def record(results_dir: str, section: dict[str, Any], log: Log) -> list[str]:
    """Write the section to cts.json, and into result.json as its `cts` key when there is one
    (atomically, re-read under the run lock: the last run's verdict and checks stay as they
    are). Returns the paths written."""
    from .files import os_error_text
    from .results import add_section, encode, result_path, write_atomic

    written = []
    path = os.path.join(results_dir, SECTION_FILE)
    try:
        write_atomic(path, encode({"cts": section}))
        written.append(path)
    except OSError as err:
        log(f"rocky-selftest cts: cannot write {path}: {os_error_text(err)}")
    if add_section(results_dir, "cts", section, log, "see " + path):
        written.append(result_path(results_dir))
    return written
