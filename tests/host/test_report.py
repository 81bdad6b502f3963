"""`rocky-vulkan report`: table rows, the PNG, the verdict, and clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rocky_selftest.cli import run_selftest
from rocky_selftest.settings import Settings
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host.report import load_result, plot, sweep_series, table_rows

from tests.helpers.project import ROOT

pytestmark = pytest.mark.timeout(120)

REF = load_config(ROOT / "rocky-vulkan.yaml").selftest.reference


def _doc(crash_at: int | None = 1024) -> dict:
    """A result shaped like the self-test writes it; the numbers are test inputs, not results."""
    tps = {"tuned": 28.0, "stock": 5.8, "cpu": 22.0}
    sweep = []
    for ub in (64, 128, 256, 512, 1024):
        for mode, value in tps.items():
            if mode == "stock" and ub == crash_at:
                sweep.append(
                    {
                        "mode": mode,
                        "ubatch": ub,
                        "status": "FAIL",
                        "reason": "killed by SIGABRT; ErrorOutOfDeviceMemory in stderr",
                    }
                )
            else:
                sweep.append({"mode": mode, "ubatch": ub, "status": "PASS",
                              "avg_ts": value * (1 - 64 / (ub + 640))})  # fmt: skip
    ok = crash_at is None
    stack = ("gpu_driver", "csf_firmware", "no_vendor_driver", "vulkan_device", "model_sha256")
    checks = [{"name": name, "status": "PASS", "evidence": "..."} for name in stack]
    checks += [
        {"name": "sweep", "status": "PASS" if ok else "FAIL", "evidence": "..."},
        {"name": "ratio", "status": "PASS", "evidence": "tuned 28.00 = 4.83x stock"},
        {"name": "output_match", "status": "PASS", "evidence": "first 32 tokens identical"},
    ]
    return {
        "schema": "rocky-selftest-result", "schema_version": 1,
        "verdict": "PASS" if ok else "FAIL", "finished_at": "2026-12-02T15:00:00Z",
        "host": {"hostname": "rock-5-itx"}, "sweep": sweep, "checks": checks,
        "ratio": {"prompt_tokens": 512, "tuned_tps": 28.0, "stock_tps": 5.8, "cpu_tps": 22.0,
                  "ratio": 28.0 / 5.8, "required_ratio": 4.08},
    }  # fmt: skip


def _write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_rows_put_board_numbers_beside_the_reference():
    rows = {r[0]: r for r in table_rows(_doc(), REF)}
    assert rows["crash-free ub sweep"][1].startswith("14/15 runs ok")
    assert rows["crash-free ub sweep"][3] == "FAIL"
    assert rows["pp512 GPU tuned tiles"][1:3] == ("28.00 t/s", f"{REF.tuned_tps:.2f} t/s")
    assert rows["pp512 GPU stock tiles"][1:3] == ("5.80 t/s", f"{REF.stock_tps:.2f} t/s")
    assert rows["tuned / stock"][1] == "4.83x"
    assert rows["tuned / stock"][2].startswith(f"{REF.tuned_tps / REF.stock_tps:.2f}x")


def test_series_mark_the_crash_as_missing():
    series = sweep_series(_doc())
    assert [u for u, _, _ in series["stock"]] == [64, 128, 256, 512, 1024]
    assert series["stock"][-1][1] is None and "ErrorOutOfDeviceMemory" in series["stock"][-1][2]
    assert all(t is not None for _, t, _ in series["tuned"])


def test_plot_is_a_png(tmp_path):
    out = plot(_doc(), REF, tmp_path / "plot.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize(("crash", "rc", "word"), [(None, 0, "PASS"), (1024, 1, "FAIL")])
def test_cli_verdict_and_exit_code(tmp_path, capsys, crash, rc, word):
    path = _write(tmp_path, _doc(crash))
    cfg = str(ROOT / "rocky-vulkan.yaml")
    assert main(["--config", cfg, "report", str(path)]) == rc
    out = capsys.readouterr().out
    assert f"VERDICT: {word}" in out
    assert (tmp_path / "result.png").is_file()


@pytest.mark.parametrize(
    "change",
    [
        lambda checks: [],  # a PASS with no checks at all
        lambda checks: [dict(c, status="SKIP") for c in checks],  # every check skipped
        lambda checks: [c for c in checks if c["name"] != "output_match"],  # one left out
        lambda checks: [dict(c, status="SKIP") if c["name"] == "gpu_driver" else c for c in checks],
    ],
)
def test_a_pass_without_its_evidence_is_a_fail(tmp_path, capsys, change):
    doc = _doc(None)
    doc["checks"] = change(doc["checks"])
    cfg = str(ROOT / "rocky-vulkan.yaml")
    assert main(["--config", cfg, "report", str(_write(tmp_path, doc))]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "VERDICT: FAIL" in out and "says PASS without the evidence of" in out
    assert "VERDICT: PASS" not in out


def test_truncated_result_is_a_clear_error(tmp_path):
    text = json.dumps(_doc(), indent=2)
    path = _write(tmp_path, text[: len(text) // 2])
    with pytest.raises(UserError, match=r"not valid JSON at line \d+ .*truncated"):
        load_result(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not valid JSON"),
        ('{"schema": "something-else"}', "not a rocky-selftest result"),
        ('{"schema": "rocky-selftest-result", "schema_version": 9}', "schema_version 9"),
        ('{"schema": "rocky-selftest-result", "schema_version": 1}', "has no 'verdict'"),
    ],
)
def test_bad_results_are_clear_errors(tmp_path, content, message):
    with pytest.raises(UserError, match=message):
        load_result(_write(tmp_path, content))


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="copy /var/lib/rocky-selftest/result.json"):
        load_result(tmp_path / "nope.json")


def test_report_reads_what_the_self_test_writes(tmp_path):
    # A real (failing: nothing to run) self-test document goes through the report unchanged.
    s = Settings(
        model_path=str(tmp_path / "missing.gguf"), model_sha256=None, ubatch_sizes=(64,),
        sysroot=str(tmp_path), gpu_wait_s=0, vulkaninfo=str(tmp_path / "none"),
    )  # fmt: skip
    doc = run_selftest(s)
    path = _write(tmp_path, doc)
    loaded = load_result(path)
    rows = {r[0]: r for r in table_rows(loaded, REF)}
    assert rows["crash-free ub sweep"][1] == "not run"
    plot(loaded, REF, tmp_path / "p.png")


# Every field the report reads, broken in the ways a copied, edited or foreign file breaks it.
# Each one crashed 84bf78d (TypeError, KeyError, ValueError, AttributeError, MarkupError).
def _set(path: str, value):
    def apply(doc: dict) -> dict:
        *keys, last = path.split(".")
        obj = doc
        for key in keys:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        if isinstance(obj, list):
            obj[int(last)] = value
        elif value is _DELETE:
            del obj[last]
        else:
            obj[last] = value
        return doc

    return apply


_DELETE = object()
MALFORMED = [
    ("sweep.0.ubatch", "abc", "sweep[0].ubatch"),
    ("sweep.0.ubatch", None, "sweep[0]: no mode or no ubatch"),
    ("sweep.0.ubatch", True, "sweep[0].ubatch"),
    ("sweep.0.mode", ["tuned"], "sweep[0].mode"),
    ("sweep.0.mode", "gpu", "sweep[0].mode"),
    ("sweep.0.avg_ts", "fast", "sweep[0].avg_ts"),
    ("sweep.0.avg_ts", float("nan"), "sweep[0].avg_ts"),
    ("sweep.0.reason", {"x": 1}, "sweep[0].reason"),
    ("sweep.3", "garbage", "sweep[3]"),
    ("sweep", {"runs": []}, "sweep: "),
    ("checks.0.name", _DELETE, "checks[0]: no name or no status"),
    ("checks.1.status", 1, "checks[1].status"),
    ("checks.2.evidence", 5, "checks[2].evidence"),
    ("checks.0", None, "checks[0]"),
    ("ratio.tuned_tps", "fast", "ratio.tuned_tps"),
    ("ratio.ratio", float("inf"), "ratio.ratio"),
    ("ratio.required_ratio", "4", "ratio.required_ratio"),
    ("ratio.prompt_tokens", "512", "ratio.prompt_tokens"),
    ("ratio", [28.0], "ratio: "),
    ("host", "rock-5-itx", "host: "),
    ("host.hostname", 7, "host.hostname"),
    ("thresholds", {"prompt_tokens": "512"}, "thresholds.prompt_tokens"),
    ("finished_at", 1733230000, "finished_at"),
]


@pytest.mark.parametrize(("path", "value", "field"), MALFORMED)
def test_malformed_field_is_a_bad_row_not_a_crash(
    tmp_path, capsys, monkeypatch, path, value, field
):
    monkeypatch.setenv("COLUMNS", "250")
    doc = _set(path, value)(_doc(crash_at=None))
    result = _write(tmp_path, doc)
    rc = main(["--config", str(ROOT / "rocky-vulkan.yaml"), "report", str(result)])
    out = capsys.readouterr().out
    assert rc == 1  # a malformed result never reports PASS
    assert field in out and "BAD" in out and "malformed field" in out
    assert (tmp_path / "result.png").is_file()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("verdict", 1, "verdict is 1, not a string"),
        ("checks", {"sweep": "PASS"}, "checks is .*not a list"),
        ("schema_version", True, "schema_version true"),
    ],
)
def test_unusable_document_is_a_clear_error(tmp_path, path, value, message):
    result = _write(tmp_path, _set(path, value)(_doc()))
    with pytest.raises(UserError, match=message):
        load_result(result)


PANTHOR_LINES = [
    "panthor fb000000.gpu: [drm] CSF FW using interface v1.1.0, Features 0x0",
    "panthor fb000000.gpu: [drm] Firmware protected mode entered successfully [/drm] [bold]",
    "[red]not red[/red] [/] [link=file:///etc/shadow]x[/link] $\\frac{$",
]


@pytest.mark.parametrize("line", PANTHOR_LINES)
def test_board_text_is_printed_as_it_is(tmp_path, capsys, monkeypatch, line):
    # Kernel log lines carry "[drm]": rich markup must not eat it (or crash on "[/drm]").
    monkeypatch.setenv("COLUMNS", "250")
    doc = _doc(crash_at=None)
    next(c for c in doc["checks"] if c["name"] == "csf_firmware")["evidence"] = line
    doc["host"]["hostname"] = line  # reaches the plot title (no mathtext either)
    doc["finished_at"] = "[b]2026-12-02[/b]"
    assert (
        main(["--config", str(ROOT / "rocky-vulkan.yaml"), "report", str(_write(tmp_path, doc))])
        == 0
    )
    out = capsys.readouterr().out
    assert line in out and "[b]2026-12-02[/b]" in out


def _kept_figures(monkeypatch) -> list:
    """plot() closes its figure; keep it open to look at what was drawn."""
    import matplotlib.pyplot as plt

    kept: list = []
    monkeypatch.setattr(plt, "close", kept.append)
    return kept


def test_failures_at_one_ub_do_not_overprint_and_show_their_reasons(tmp_path, monkeypatch):
    from matplotlib.text import Text

    doc = _doc()  # stock crashes at ub 1024
    for run in doc["sweep"]:
        if run["ubatch"] == 1024 and run["mode"] in ("tuned", "cpu"):
            run.update(status="FAIL", reason=f"timed out after 600 s (killed) in {run['mode']}")
            run.pop("avg_ts")
    kept = _kept_figures(monkeypatch)
    plot(doc, REF, tmp_path / "p.png")
    (fig,) = kept
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    red = [t for t in texts if t.get_color() == "red"]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in red]
    assert len(boxes) >= 3
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1 :]:
            assert not box_a.overlaps(box_b), f"{a!r} overprints {b!r}"
    shown = "\n".join(t.get_text() for t in texts)
    assert "ErrorOutOfDeviceMemory" in shown  # the crash reason, not only the mode
    assert "timed out after 600 s (killed) in tuned" in shown
