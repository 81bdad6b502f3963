"""The adversarial runs of issue 22: hostile inputs for every tool that reads a file, a URL, a
device list or a tool's output, counted by area and class.

Each area module (AREAS) has `cases() -> Iterator[Case]`. A case runs one hostile input through
the real code and says what happened:
- REFUSED: a clear message naming the cause and the fix, nothing half-written;
- HELD: accepted and handled correctly (shown as text, range-checked, the right verdict);
- TRACEBACK: an exception escaped (or the tool printed "Traceback");
- HANG: it ran past the case's time bound;
- WRONG: it finished quietly with a wrong result (a PASS not earned, bytes pinned that are not
  the file, markup or control characters that reached the terminal, a file written where it
  must not be).
- NOT_RUN: this host cannot stage the case (no read-only folder, no tmpfs): neither good nor a
  finding; its test is skipped with the reason, never passed.
Only REFUSED and HELD are good; the tests parametrize over the same cases.

`python -m tests.helpers.adversary [AREA ...]` (repo root, in the venv) prints the counts per
area and class; docs/verification/hostile-inputs.md records its output. Exit 1 on a finding."""

from __future__ import annotations

import enum
import importlib
import signal
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

AREAS = {
    "report": "tests.helpers.hostile_report",
    "selftest": "tests.helpers.hostile_selftest",
    "model-fetch": "tests.helpers.hostile_fetch",
    "config": "tests.helpers.hostile_files",
    "flash": "tests.helpers.hostile_flash",
}


class Outcome(enum.Enum):
    REFUSED = "refused"
    HELD = "held"
    TRACEBACK = "traceback"
    HANG = "hang"
    WRONG = "silently wrong"
    NOT_RUN = "not run"

    @property
    def good(self) -> bool:
        return self in (Outcome.REFUSED, Outcome.HELD)


@dataclass(frozen=True)
class Case:
    """One hostile input. `run` returns the outcome and a short detail (shown on a finding)."""

    area: str
    klass: str  # e.g. "escapes", "numbers", "paths", "size", "signals"
    name: str
    run: Callable[[], tuple[Outcome, str]]
    timeout_s: float = 60.0

    @property
    def id(self) -> str:
        return f"{self.area}:{self.klass}:{self.name}"


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise _Timeout


def run_case(case: Case) -> tuple[Outcome, str]:
    """The case's outcome; an exception is a TRACEBACK, running past timeout_s a HANG."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout_s)
    try:
        return case.run()
    except _Timeout:
        return Outcome.HANG, f"still running after {case.timeout_s:g} s"
    except BaseException as err:  # noqa: BLE001 - a finding, whatever it is
        if isinstance(err, KeyboardInterrupt) and case.klass != "signals":
            raise
        tb = traceback.format_exception_only(type(err), err)[-1].strip()
        return Outcome.TRACEBACK, tb[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)  # (area, klass, outcome) -> n
    findings: list[str] = field(default_factory=list)

    def add(self, case: Case, outcome: Outcome, detail: str) -> None:
        self.counts[(case.area, case.klass, outcome)] += 1
        if not outcome.good and outcome is not Outcome.NOT_RUN:
            self.findings.append(f"{case.id}: {outcome.value}: {detail}")


def area_cases(area: str) -> list[Case]:
    return list(importlib.import_module(AREAS[area]).cases())


def run_areas(areas: list[str]) -> Tally:
    tally = Tally()
    for area in areas:
        for case in area_cases(area):
            tally.add(case, *run_case(case))
    return tally


def table(tally: Tally) -> list[str]:
    head = [
        "area",
        "class",
        "tried",
        "refused",
        "held",
        "tracebacks",
        "hangs",
        "silently wrong",
        "not run",
    ]
    rows = [head]
    keys = sorted({(a, k) for a, k, _ in tally.counts})
    for area, klass in keys:
        n = {o: tally.counts[(area, klass, o)] for o in Outcome}
        tried = sum(n.values())
        rows.append([area, klass, str(tried)] + [str(n[o]) for o in Outcome])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]


def assert_good(case: Case) -> None:
    """For the area tests: the case is refused or held, else the finding is the message."""
    outcome, detail = run_case(case)
    if outcome is Outcome.NOT_RUN:
        import pytest

        pytest.skip(f"{case.id}: {detail}")
    assert outcome.good, f"{case.id}: {outcome.value}: {detail}"


def main(argv: list[str]) -> int:
    areas = argv or list(AREAS)
    unknown = [a for a in areas if a not in AREAS]
    if unknown:
        print(f"unknown area(s) {unknown}; choose from {list(AREAS)}", file=sys.stderr)
        return 2
    tally = run_areas(areas)
    for line in table(tally):
        print(line)
    total = sum(tally.counts.values())
    bad = len(tally.findings)
    print(f"total: {total} cases, {bad} findings")
    for finding in tally.findings[:50]:
        print("  " + finding)
    return 1 if bad else 0


if __name__ == "__main__":
    # The imported module's main: run as __main__, this file's Outcome is a second class that the
    # area modules' outcomes (imported from tests.helpers.adversary) would not be counted under.
    from tests.helpers import adversary

    sys.exit(adversary.main(sys.argv[1:]))
