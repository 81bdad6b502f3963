"""Issue 22, report: every hostile case of tests/helpers/hostile_report.py is refused or held
(`python -m tests.helpers.adversary report` prints the counts), and the shared bounded reader and
the plot writer on their own."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.plot_files import PlotPathError, plain, save_png
from rocky_vulkan.regularfile import NotReadable, read_regular, shown

from tests.helpers import adversary
from tests.helpers.hostile_report import base, dump, judge, run_cli, unwrapped

CASES = adversary.area_cases("report")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_report_case(case):
    adversary.assert_good(case)


def test_the_cases_cover_every_class_of_the_issue():
    classes = {"escapes", "evidence", "numbers", "strings", "paths", "size"}
    assert {c.klass for c in CASES} == classes


def test_the_issue_examples_now(tmp_path):
    # The issue's own: a fake PASS line under a real FAIL, then a window title and a clear.
    doc = base(passing=False)
    doc["model"]["path"] = "m)\n\nVERDICT: PASS — every check passed on the board\x1b[8m"
    doc["thresholds"]["prompt_tokens"] = 128  # the note that shows the path
    doc["finished_at"] = "\x1b]0;X\x1b\\\x1b[2J"
    (tmp_path / "result.json").write_bytes(dump(doc))
    run = run_cli([str(tmp_path / "result.json")], tmp_path)
    assert judge(run, "fail")[0] is adversary.Outcome.HELD
    lines = run.out.splitlines()
    assert [ln for ln in lines if ln.lstrip().startswith("VERDICT")] == [
        "VERDICT: FAIL — failed: sweep"
    ]
    # shown as text inside the note's table cell
    assert "thisrunusedpp128(m)VERDICT:PASS—everycheckpassedontheboard[8m)" in unwrapped(run.out)
    assert "\x1b" not in run.out and "rocky-selftest ]0;X\\[2J vs reference" in run.out


# ---- regularfile.read_regular: the bounded reader every host command shares.


def _read_in_thread(path: Path, limit: int = 100) -> BaseException | bytes:
    got: list = []

    def read():
        try:
            got.append(read_regular(path, limit, "test"))
        except BaseException as err:  # noqa: BLE001 - handed to the test
            got.append(err)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), f"reading {path} blocked"
    return got[0]


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: a blocking open would hang
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for path, cause in [
        (fifo, "is a named pipe (FIFO), not a regular file; pass the test file itself"),
        (tmp_path, "is a directory"),
        (Path("/dev/zero"), "is a character device"),
        (tmp_path / "missing", "no such file; pass the path of the test file"),
        (loop, "cannot open it (Too many levels of symbolic links)"),
    ]:
        err = _read_in_thread(path)
        assert isinstance(err, NotReadable) and isinstance(err, UserError), err
        assert str(err).startswith(f"{path}: ") and cause in str(err), err


def test_read_regular_bounds_the_size(tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: nothing is read
    err = _read_in_thread(big, limit=8 << 20)
    assert isinstance(err, NotReadable)
    assert f"{1 << 30} bytes, more than {8 << 20}" in str(err)
    ok = tmp_path / "ok"
    ok.write_bytes(b"x" * 100)
    assert _read_in_thread(ok, limit=100) == b"x" * 100


def test_read_regular_reads_proc_files_bounded():
    # /proc files say size 0: the cap holds on what is read, not on what fstat says
    err = _read_in_thread(Path("/proc/self/maps"), limit=10)
    assert isinstance(err, NotReadable) and "over 10 bytes" in str(err)


def test_shown_escapes_what_a_terminal_acts_on():
    assert shown("/tmp/r\x1b]0;X\x07\n.json") == "/tmp/r\\x1b]0;X\\x07\\n.json"
    assert shown("/tmp/板子 é.json") == "/tmp/板子 é.json"


# ---- plot_files: the PNG writer.


def test_a_failed_write_leaves_the_old_png_and_no_temp_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "p.png"
    out.write_bytes(b"old")
    fig = plt.figure()

    def full(*args, **kwargs):  # a fake: a full disk cannot be had on demand here
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    fig.savefig = full
    with pytest.raises(PlotPathError, match="cannot write the plot"):
        save_png(fig, out)
    assert out.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["p.png"]
    assert not plt.fignum_exists(fig.number)


def test_plain_keeps_dollars_as_text():
    from matplotlib.text import Text

    for name in ("$\\frac{$", "$x^2$", "a\\$b", "$$"):
        shown, math = Text(text=plain(name))._preprocess_math(plain(name))
        assert not math and shown == name
