"""rocky-vkcheck on lavapipe (issue 24, part 2): the real program on a real Vulkan driver.

lavapipe executes everything, at warp 8 and (LP_NATIVE_VECTOR_WIDTH=512) at the Mali-G610's
subgroup size 16, so every check must pass there: that proves the program and its CPU reference
agree. `--inject-mismatch CHECK` (test only) corrupts one result of CHECK after the GPU wrote it:
the comparison must then report exactly that check, which proves the checker can fail. And
`rocky-selftest driver` end to end against the real binary. .ci/llama.sh builds the binary
(ROCKY_VKCHECK_BIN) and unpacks bookworm-backports' lavapipe (ROCKY_LAVAPIPE_ICD/LIB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rocky_selftest import driver

from tests.helpers.project import ROOT
from tests.helpers.selftest import OLD_PASS, write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_vkcheck_bin,
    pytest.mark.needs_lavapipe,
]
WARPS = {8: "256", 16: "512"}
# Cases per check on one queue (lavapipe has one): the program's plan.
MIN_CASES = {"tls_growth": 20, "wls_no_barrier": 48, "secondaries": 15, "reset_rerecord": 18,
             "simultaneous_use": 3}  # fmt: skip


def _env(warp: int) -> dict[str, str]:
    lib = os.environ["ROCKY_LAVAPIPE_LIB"]
    return {
        "VK_DRIVER_FILES": os.environ["ROCKY_LAVAPIPE_ICD"],
        "LD_LIBRARY_PATH": lib + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
        "LP_NATIVE_VECTOR_WIDTH": WARPS[warp],
    }


def _vkcheck(warp: int, *args: str) -> tuple[int, dict, str]:
    out = subprocess.run([os.environ["ROCKY_VKCHECK_BIN"], *args], capture_output=True,
                         text=True, env={**os.environ, **_env(warp)}, timeout=300)  # fmt: skip
    return out.returncode, driver.parse_document(out.stdout, out.returncode), out.stderr


@pytest.mark.parametrize("warp", sorted(WARPS))
def test_every_check_passes_on_lavapipe(warp: int):
    rc, doc, err = _vkcheck(warp)
    print(err)
    assert rc == 0, err
    dev = doc["device"]
    assert dev["driver_name"] == "llvmpipe" and dev["subgroup_size"] == warp, dev
    for check in doc["checks"]:
        assert check["status"] == "pass", check
        assert check["cases"] >= MIN_CASES[check["name"]], check


@pytest.mark.parametrize("name", driver.CHECK_NAMES)
def test_an_injected_mismatch_is_reported(name: str):
    rc, doc, err = _vkcheck(16, "--inject-mismatch", name)
    assert rc == 1, err
    by_name = {c["name"]: c for c in doc["checks"]}
    assert by_name[name]["status"] == "fail" and by_name[name]["failed"] == 1
    mm = by_name[name]["first_mismatch"]
    assert mm["got"] == mm["expected"] ^ 1, mm
    assert all(c["status"] == "pass" for n, c in by_name.items() if n != name)


def test_no_driver_is_exit_2_with_a_document():
    env = {**os.environ, "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    out = subprocess.run([os.environ["ROCKY_VKCHECK_BIN"]], capture_output=True, text=True,
                         env=env, timeout=60)  # fmt: skip
    assert out.returncode == 2
    doc = driver.parse_document(out.stdout, 2)
    assert doc["error"]["result"] == "VK_ERROR_INCOMPATIBLE_DRIVER", doc


@pytest.mark.parametrize("args", [["--timeout-s", "0"], ["--device"], ["--bogus"],
                                  ["--inject-mismatch", "all"]])  # fmt: skip
def test_usage_errors_are_exit_2_without_a_document(args: list[str]):
    out = subprocess.run([os.environ["ROCKY_VKCHECK_BIN"], *args], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and out.stdout == "" and "usage:" in out.stderr


def _selftest(tmp: Path, warp: int, *extra: str) -> subprocess.CompletedProcess:
    results = tmp / "results"
    results.mkdir(exist_ok=True)
    (results / "result.json").write_text(json.dumps(OLD_PASS))
    bin_dir = Path(os.environ["ROCKY_VKCHECK_BIN"]).parent
    config = write_config(tmp / "config.json", model_path=str(tmp / "m.gguf"),
                          bin_dir=str(bin_dir), results_dir=str(results), motd_path="",
                          env=_env(warp))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    return subprocess.run(
        [sys.executable, "-m", "rocky_selftest", "--config", str(config), "driver",
         "--budget", "240", *extra], capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("warp", sorted(WARPS))
def test_selftest_driver_end_to_end(tmp_path: Path, warp: int):
    out = _selftest(tmp_path, warp)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("rocky-selftest driver PASS")
    doc = json.loads((tmp_path / "results/result.json").read_text())
    assert {k: v for k, v in doc.items() if k != "driver"} == OLD_PASS
    section = doc["driver"]
    assert section["status"] == "PASS" and section["device"]["subgroup_size"] == warp
    assert [c["status"] for c in section["checks"]] == ["pass"] * len(driver.CHECK_NAMES)


def test_selftest_driver_reports_a_mismatch(tmp_path: Path):
    wrapper = tmp_path / "rocky-vkcheck-inject"
    wrapper.write_text(
        f'#!/bin/sh\nexec {os.environ["ROCKY_VKCHECK_BIN"]} --inject-mismatch wls_no_barrier "$@"\n'
    )
    wrapper.chmod(0o755)
    out = _selftest(tmp_path, 16, "--binary", str(wrapper))
    assert out.returncode == 1, out.stdout + out.stderr
    section = json.loads((tmp_path / "results/result.json").read_text())["driver"]
    assert section["status"] == "FAIL"
    assert "wls_no_barrier 1 of " in section["reason"], section["reason"]
