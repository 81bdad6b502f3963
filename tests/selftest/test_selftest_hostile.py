"""Issue 22, the self-test's adversarial cases (tests/helpers/hostile_selftest.py): each one is
refused with a clear message or held (the right verdict, shown clean), never a traceback, a hang
or a quiet wrong answer. `python -m tests.helpers.adversary selftest` prints the counts."""

from __future__ import annotations

import pytest

from tests.helpers import adversary

CASES = adversary.area_cases("selftest")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_selftest_input(case):
    adversary.assert_good(case)
