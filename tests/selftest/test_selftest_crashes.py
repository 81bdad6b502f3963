"""The sweep survives crashes. llama-bench cannot be made to crash on demand, so these tests put
a wrapper named llama-bench first that really crashes (SIGSEGV, SIGABRT, exit 134 with the OOM
message, a lone `[`, a hang); where a run should succeed it execs the real llama-bench
(ROCKY_LLAMA_BIN_DIR), and such tests skip without it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from rocky_selftest.bench import Deadline, parse_bench_json, sweep
from rocky_selftest.cli import main
from rocky_selftest.settings import Settings

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.selftest import make_tiny_model, write_config

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory)


WRAPPER = """#!/bin/sh
# Fault injection: crash the way the GPU stack does, chosen by the -ub argument.
ub=default
prev=
for a in "$@"; do [ "$prev" = "-ub" ] && ub=$a; prev=$a; done
case "$ub" in
  64) kill -SEGV $$ ;;
  128) echo 'terminate called after throwing an instance of vk::OutOfDeviceMemoryError' >&2
       echo '  what():  vk::CommandBuffer::end: ErrorOutOfDeviceMemory' >&2
       exit 134 ;;
  256) printf '[\\n' ; exit 1 ;;
  512) kill -ABRT $$ ;;
  1024) sleep 30 ;;
esac
exec "$REAL_BENCH" "$@"
"""


def _wrapper_dir(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    script = bin_dir / "llama-bench"
    script.write_text(WRAPPER)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _settings(tmp: Path, ubs, **kw) -> Settings:
    model = tmp / "model.gguf"
    model.write_bytes(b"not a model: every run below crashes before reading it")
    return Settings(
        model_path=str(model),
        model_sha256=None,
        ubatch_sizes=tuple(ubs),
        bin_dir=str(_wrapper_dir(tmp)),
        run_timeout_s=3,
        sweep_modes=("tuned",),
        **kw,
    )


def test_every_crash_kind_is_recorded_and_the_sweep_goes_on(tmp_path):
    s = _settings(tmp_path, [64, 128, 256, 512, 1024])
    check, runs = sweep(s, Deadline(60), log=lambda _: None)
    assert check.status == "FAIL"
    assert [r["ubatch"] for r in runs] == [64, 128, 256, 512, 1024]  # none skipped
    reasons = {r["ubatch"]: r["reason"] for r in runs}
    assert all(r["status"] == "FAIL" for r in runs)
    assert reasons[64] == "killed by SIGSEGV"
    assert "exit 134" in reasons[128] and "ErrorOutOfDeviceMemory" in reasons[128]
    assert "ErrorOutOfDeviceMemory" in runs[1]["stderr_tail"]
    assert reasons[256] == "exit status 1"
    assert reasons[512] == "killed by SIGABRT"
    assert "timed out" in reasons[1024]
    assert runs[4]["elapsed_s"] < 10  # the hang was killed at the 3 s run timeout


def test_lone_bracket_with_exit_0_is_invalid_json():
    entry, reason = parse_bench_json("[\n")
    assert entry is None and "invalid JSON" in reason


def test_deadline_stops_new_runs_but_records_them(tmp_path):
    s = _settings(tmp_path, [64, 1024, 128])
    check, runs = sweep(s, Deadline(2), log=lambda _: None)
    assert runs[0]["reason"] == "killed by SIGSEGV"
    assert "timed out" in runs[1]["reason"]
    assert runs[2]["reason"].startswith("not run: the self-test's deadline passed")


def test_cli_run_writes_result_motd_and_stamp_even_when_everything_fails(tmp_path):
    s = _settings(tmp_path, [64, 128])
    motd = tmp_path / "motd"
    motd.write_text("Welcome to rocky-vulkan\n")
    cfg = write_config(
        tmp_path / "config.json",
        model_path=s.model_path,
        ubatch_sizes=[64, 128],
        bin_dir=s.bin_dir,
        run_timeout_s=3,
        results_dir=str(tmp_path / "results"),
        motd_path=str(motd),
        sysroot=str(tmp_path / "noroot"),
        gpu_wait_s=0,
        vulkaninfo=str(tmp_path / "no-vulkaninfo"),
        sweep_modes=["tuned"],
        repetitions=1,
    )
    stamp = tmp_path / "results" / "first-boot.stamp"
    rc = main(["--config", str(cfg), "run", "--stamp", str(stamp)])
    assert rc == 1
    doc = json.loads((tmp_path / "results/result.json").read_text())
    assert doc["schema"] == "rocky-selftest-result" and doc["schema_version"] == 1
    assert doc["verdict"] == "FAIL"
    names = [c["name"] for c in doc["checks"]]
    assert names == [
        "gpu_driver", "csf_firmware", "no_vendor_driver", "vulkan_device", "model_sha256",
        "sweep", "ratio", "output_match", "placement", "serving", "speculative", "cluster",
    ]  # fmt: skip
    assert [r["reason"] for r in doc["sweep"]][:1] == ["killed by SIGSEGV"]
    assert stamp.read_text().startswith("FAIL ")  # written once the verdict was saved
    text = motd.read_text()
    assert text.startswith("Welcome to rocky-vulkan\n") and "rocky-selftest FAIL" in text
    # A second run replaces the block instead of stacking a new one.
    main(["--config", str(cfg), "run"])
    assert motd.read_text().count("rocky-selftest FAIL") == 1
    assert main(["--config", str(cfg), "status"]) == 1
    assert not [p for p in (tmp_path / "results").iterdir() if p.name.startswith(".")]


def test_status_without_a_result_says_so(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.json", model_path="/x", results_dir=str(tmp_path / "r"))
    assert main(["--config", str(cfg), "status"]) == 2
    assert "no result yet" in capsys.readouterr().out


def test_bad_config_is_a_clear_error(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.json", model_path="/x", ubatch_size=[64])
    assert main(["--config", str(cfg), "status"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("rocky-selftest ERROR")  # the board as configured has no verdict
    assert "unknown keys ['ubatch_size'] (did you mean 'ubatch_sizes'?)" in out


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_crash_at_one_ub_real_runs_at_the_others(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv("REAL_BENCH", str(Path(BIN_DIR) / "llama-bench"))
    s = _settings(tmp_path, [32, 64, 16])
    s = Settings(**{**s.__dict__, "model_path": str(tiny_model), "prompt_tokens": 64,
                    "sweep_modes": ("cpu",), "run_timeout_s": 300})  # fmt: skip
    check, runs = sweep(s, Deadline(900), log=lambda _: None)
    by_ub = {r["ubatch"]: r for r in runs}
    assert by_ub[64]["reason"] == "killed by SIGSEGV"
    for ub in (32, 16):  # before and after the crash: real measurements
        assert by_ub[ub]["status"] == "PASS", by_ub[ub]
        assert by_ub[ub]["avg_ts"] > 0 and by_ub[ub]["n_ubatch"] == ub
    assert check.status == "FAIL"


def test_modes_get_the_right_switches_even_with_a_stale_shell_variable(tmp_path, monkeypatch):
    # The wrapper logs what it was given, then crashes: no llama-bench needed to see the switches.
    monkeypatch.setenv("GGML_VK_MALI_WARPTILE", "0")  # left over in the caller's environment
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "llama-bench"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "${{GGML_VK_MALI_WARPTILE-unset}} $GGML_NO_BACKTRACE $*" >> {log}\n'
        "kill -SEGV $$\n"
    )
    script.chmod(0o755)
    s = Settings(model_path="/m.gguf", model_sha256=None, ubatch_sizes=(128,),
                 bin_dir=str(bin_dir), run_timeout_s=5)  # fmt: skip
    sweep(s, Deadline(60), log=lambda _: None)
    tuned, stock, cpu = log.read_text().splitlines()
    assert tuned.startswith("unset 1 ") and "-ngl 99 -dev Vulkan0 -v -ub 128" in tuned
    assert stock.startswith("0 1 ") and "-dev Vulkan0" in stock
    assert "-ngl 0 -dev none -ub 128" in cpu
    assert all("-p 512 -n 0" in line and line.endswith("-r 1 -o json") for line in (tuned, cpu))
