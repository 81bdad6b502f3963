"""The simulated Mali-G610 (rocky_vulkan.sim).

Fast tests check the parsers and the input checks. Slow tests run real programs in a Debian root
made by `rocky-vulkan sim setup`; they need:
  ROCKY_SIM_ROOT   the root folder (e.g. /var/cache/rocky-vulkan/sim/root); unset: skipped
  ROCKY_SIM_MODEL  a small GGUF for the llama-bench test (e.g. written by testmodel); unset:
                   that test is skipped
  ROCKY_SIM_BIG_MODEL  testmodel's qwen2.5-3b-shape preset with 36 layers (Q8_0, 3 GB); unset:
                   the private-VA exhaustion test is skipped
  ROCKY_VKCHECK_GLSLC, ROCKY_VULKAN_INCLUDE  a glslc and Vulkan headers for rocky-vkcheck's
                   arm64 build in the root (.ci/sim.sh: trixie's, from .ci/llama.sh); unset:
                   that test is skipped
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rocky_vulkan.errors import UserError
from rocky_vulkan.sim import pins
from rocky_vulkan.sim.guest import (
    G610_GPU_ID,
    guest_argv,
    guest_env,
    parse_vacount,
    resolve_driver,
)
from rocky_vulkan.sim.root import VACOUNT_LIB, SimRoot
from rocky_vulkan.sim.stats import compare_table, parse_stats, stats_table
from rocky_vulkan.sim.sweep import first_error, run_one

# ggml-vulkan's output format (ggml_vk_create_pipeline) with panvk's statistic names, as seen on
# the simulated G610 (two pipelines, one line of unrelated output between them).
STATS_SAMPLE = """\
ggml_vulkan: pipeline stats for matmul_q4_k_q8_1_2:
ggml_vulkan:   Spills: 604
ggml_vulkan:   Fills: 714
ggml_vulkan:   Registers used: 64
ggml_vulkan:   Threads: 1
ggml_vulkan:   Spill cost: 38520
llama_model_loader: loaded meta data
ggml_vulkan: pipeline stats for matmul_f16_f32_f16acc_aligned_2:
ggml_vulkan:   Spills: 543
ggml_vulkan:   Fills: 1289
"""


def test_parse_stats_keeps_pipelines_apart():
    rows = parse_stats(STATS_SAMPLE)
    assert [r["pipeline"] for r in rows] == [
        "matmul_q4_k_q8_1_2",
        "matmul_f16_f32_f16acc_aligned_2",
    ]
    assert rows[0]["Spills"] == "604" and rows[0]["Spill cost"] == "38520"
    assert "Registers used" not in rows[1]
    table = stats_table(rows)
    assert "| matmul_q4_k_q8_1_2 | 604 | 714 | 64 | 1 | 38520 |" in table


def test_compare_table_pairs_pipelines_by_name():
    stock = parse_stats(STATS_SAMPLE)
    tuned = [
        {"pipeline": "matmul_q4_k_q8_1_2", "Spills": "0", "Fills": "0", "Registers used": "64"}
    ]
    table = compare_table(stock, tuned, "stock", "mali")
    assert "| matmul_q4_k_q8_1_2 | 604 -> 0 | 714 -> 0 | 64 -> 64 | 1 -> - | 38520 -> - |" in table
    assert "| matmul_f16_f32_f16acc_aligned_2 | 543 -> - |" in table


def test_parse_vacount_reads_fixed_width_fields():
    text = "priv_va_peak=00000000001645876736 priv_va_now=00000000000013096448 maps=000000000147\n"
    assert parse_vacount(text) == {
        "priv_va_peak": 1645876736,
        "priv_va_now": 13096448,
        "maps": 147,
    }


def test_first_error_prefers_the_exception_text():
    stderr = (
        "ggml_vulkan: 0 = Mali-G610 MC4 (panvk)\n"
        "terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'\n"
        "  what():  vk::CommandBuffer::end: ErrorOutOfDeviceMemory\n"
    )
    err = first_error(stderr)
    assert "vk::OutOfDeviceMemoryError" in err and "ErrorOutOfDeviceMemory" in err
    assert first_error("all fine\n") == ""


def test_first_error_names_a_heap_abort_and_the_signal():
    stderr = (
        "load_backend: loaded CPU backend\n"
        "free(): double free detected in tcache 2\n"
        "qemu: uncaught target signal 6 (Aborted) - core dumped\n"
    )
    assert first_error(stderr) == (
        "free(): double free detected in tcache 2; qemu: uncaught target signal 6 (Aborted)"
    )


def test_pinned_specs_name_every_package_with_its_version():
    specs = pins.install_specs(pinned=True)
    assert "mesa-vulkan-drivers:arm64=" + pins.GUEST_PACKAGES["mesa-vulkan-drivers"] in specs
    assert all("=" in s for s in specs)
    assert all("=" not in s for s in pins.install_specs(pinned=False))


def test_guest_env_goes_through_qemu_not_the_host(tmp_path):
    driver = resolve_driver(SimRoot(tmp_path), "stock")
    env = guest_env(driver, "/tmp/va.txt", {"X": "1"})
    assert env["PAN_GPU_ID"] == G610_GPU_ID
    assert env["LD_PRELOAD"].split(":") == [VACOUNT_LIB, driver.shim]
    argv = guest_argv("/usr/bin/llama-bench", ["-h"], env)
    assert argv[argv.index("-cpu") + 1] == "cortex-a76"
    assert f"LD_PRELOAD={env['LD_PRELOAD']}" in argv and argv[-2:] == ["/usr/bin/llama-bench", "-h"]


def test_driver_built_for_the_host_is_refused(tmp_path):
    # A real amd64 ELF (/bin/true) stands in for an amd64 panvk build.
    drv = tmp_path / "drv"
    drv.mkdir()
    shutil.copy(os.path.realpath("/bin/true"), drv / "libvulkan_panfrost.so")
    with pytest.raises(UserError, match="not an arm64 library"):
        resolve_driver(SimRoot(tmp_path / "root"), str(drv))
    with pytest.raises(UserError, match="unknown driver"):
        resolve_driver(SimRoot(tmp_path / "root"), "no-such-driver")


def test_missing_root_names_the_fix(tmp_path):
    with pytest.raises(UserError, match="sim setup"):
        SimRoot(tmp_path).require()


# ---- slow: a real Debian root ----

ROOT_ENV = os.environ.get("ROCKY_SIM_ROOT")
MODEL_ENV = os.environ.get("ROCKY_SIM_MODEL")


@pytest.fixture(scope="module")
def root() -> SimRoot:
    r = SimRoot(Path(ROOT_ENV))
    r.require()
    return r


@pytest.mark.slow
@pytest.mark.needs_debian_root
def test_root_has_the_pinned_versions(root):
    stamp = root.stamp()
    installed = root.installed_versions(pins.query_names())
    for name, version in pins.GUEST_PACKAGES.items():
        got = installed[f"{name}:{pins.GUEST_ARCH}"]
        assert got, f"{name} not installed"
        if stamp["pinned"]:
            assert got == version


def _run_cli(root: SimRoot, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rocky_vulkan.sim", "--root", str(root.path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.needs_debian_root
def test_vulkaninfo_shows_the_simulated_g610(root):
    proc = _run_cli(root, "run", "--", "vulkaninfo", "--summary")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deviceName         = Mali-G610 MC4" in proc.stdout
    assert "driverName         = panvk" in proc.stdout
    # vulkaninfo creates a device, so panvk maps its private ring buffers: the counter sees them.
    assert "rocky-vacount:" in proc.stderr, proc.stderr[-2000:]
    assert parse_vacount(proc.stderr.split("rocky-vacount:")[-1])["priv_va_peak"] > 0


@pytest.mark.slow
@pytest.mark.needs_debian_root
def test_stock_driver_without_the_shim_finds_no_g610(root):
    # Control: without the shim there is no G610, so the test above depends on the rig.
    proc = _run_cli(root, "run", "-e", "LD_PRELOAD=", "--", "vulkaninfo", "--summary")
    assert "Mali-G610" not in proc.stdout


@pytest.mark.slow
@pytest.mark.needs_debian_root
@pytest.mark.needs_sim_model
def test_llama_bench_ub64_runs_on_the_simulated_g610(root, tmp_path):
    driver = resolve_driver(root, "stock")
    result = run_one(root, driver, Path(MODEL_ENV), 64, tmp_path, prompt=64, timeout=1500)
    stderr = (tmp_path / "bench-ub64.stderr").read_text()
    assert "Mali-G610 MC4 (panvk)" in stderr
    assert result.ok, result.error
    rows = json.loads((tmp_path / "bench-ub64.json").read_text())
    assert rows[0]["n_ubatch"] == 64 and "Mali-G610" in rows[0]["gpu_info"]
    assert result.priv_va_peak_mib and result.priv_va_peak_mib > 0


_WRAPPER = """#!/bin/sh
# {tool} on the simulated G610; the self-test's tile switch crosses into the guest.
extra=
[ -n "${{GGML_VK_MALI_WARPTILE+x}}" ] && extra="-e GGML_VK_MALI_WARPTILE=$GGML_VK_MALI_WARPTILE"
exec {python} -m rocky_vulkan.sim --root {root} run $extra --bind {models}:{models} -- {tool} "$@"
"""


@pytest.mark.slow
@pytest.mark.needs_debian_root
@pytest.mark.needs_sim_model
def test_selftest_accepts_the_simulated_g610(root, tmp_path):
    # The board's self-test against real panvk output (vulkaninfo, llama-bench's JSON and
    # device lines). The shim executes nothing, so t/s, the ratio and the output match mean
    # nothing here and are left out, as are the kernel-side checks (no panthor on this host).
    from rocky_selftest.cli import main as selftest_main
    from rocky_selftest.stack import sha256_file

    model = Path(MODEL_ENV).resolve()
    assert not str(model).startswith("/tmp/"), "the root mounts its own /tmp over the model"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("llama-bench", "vulkaninfo"):
        wrapper = bin_dir / tool
        wrapper.write_text(
            _WRAPPER.format(tool=tool, python=sys.executable, root=root.path, models=model.parent)
        )
        wrapper.chmod(0o755)
    config = {
        "schema_version": 1,
        "model_path": str(model),
        "model_sha256": sha256_file(str(model)),
        "ubatch_sizes": [64],
        "prompt_tokens": 64,
        "repetitions": 1,
        "run_timeout_s": 1500,
        "bin_dir": str(bin_dir),
        "vulkaninfo": str(bin_dir / "vulkaninfo"),
        "results_dir": str(tmp_path / "results"),
        "motd_path": str(tmp_path / "motd"),
        "skip_checks": [
            "gpu_driver",
            "csf_firmware",
            "no_vendor_driver",
            "ratio",
            "output_match",
            "placement",
            "serving",
            "speculative",
        ],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))

    rc = selftest_main(["--config", str(tmp_path / "config.json"), "run"])

    doc = json.loads((tmp_path / "results/result.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["vulkan_device"]["status"] == "PASS", checks["vulkan_device"]
    assert "Mali-G610 MC4" in checks["vulkan_device"]["evidence"]
    runs = {r["mode"]: r for r in doc["sweep"]}
    assert sorted(runs) == ["cpu", "stock", "tuned"]
    for mode in ("tuned", "stock"):
        assert runs[mode]["status"] == "PASS", runs[mode]
        assert runs[mode]["devices"] == "Vulkan0" and "Mali-G610" in runs[mode]["gpu_info"]
    assert runs["cpu"]["status"] == "PASS" and runs["cpu"]["devices"] in ("none", None)
    assert checks["sweep"]["status"] == "PASS" and doc["verdict"] == "PASS" and rc == 0


BIG_MODEL_ENV = os.environ.get("ROCKY_SIM_BIG_MODEL")


@pytest.mark.slow
@pytest.mark.needs_debian_root
@pytest.mark.needs_sim_big_model
def test_stock_panvk_runs_out_of_private_va_on_a_3b_shape(root, tmp_path):
    # The reference failure, from registry packages only: Debian's llama.cpp + panvk, 36 layers
    # of Qwen2.5-3B's shapes, ub 512. It must fail in vkEndCommandBuffer, not in the shim.
    driver = resolve_driver(root, "stock")
    result = run_one(root, driver, Path(BIG_MODEL_ENV), 512, tmp_path, timeout=1500)
    assert not result.ok
    assert "vk::CommandBuffer::end: ErrorOutOfDeviceMemory" in result.error, result.error
    # The private heap is [user_va_start, 4 GiB): it was nearly full when the map failed.
    assert result.priv_va_peak_mib is not None and result.priv_va_peak_mib > 3500


# rocky-vkcheck (issue 24 part 2) on the simulated G610: built for arm64 in the root with its
# cross compiler; its shaders need a glslc and the Vulkan headers, which .ci/llama.sh unpacks
# (trixie's) before this stage runs.
VKCHECK_SOURCES = Path(__file__).resolve().parents[2] / "tools/rocky_vkcheck"
GLSLC_ENV = os.environ.get("ROCKY_VKCHECK_GLSLC")
VULKAN_INCLUDE_ENV = os.environ.get("ROCKY_VULKAN_INCLUDE")


@pytest.mark.slow
@pytest.mark.needs_debian_root
def test_rocky_vkcheck_records_and_submits_on_the_simulated_g610(root, tmp_path):
    """Recording only: the drm-shim executes nothing, so every result keeps the host's sentinel
    and the checks must all report mismatches, cleanly (exit 1, a valid document, no Vulkan error,
    no hang); what it shows is that panvk records, submits and signals every fence the program
    uses, on both of its queues."""
    from rocky_selftest.driver import parse_document

    if not GLSLC_ENV or not VULKAN_INCLUDE_ENV:
        pytest.skip("ROCKY_VKCHECK_GLSLC / ROCKY_VULKAN_INCLUDE unset (.ci/sim.sh sets them)")
    inside = f"/opt/rocky/vkcheck-test-{os.getpid()}"
    build = root.host_path(inside)
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(VKCHECK_SOURCES, build, ignore=shutil.ignore_patterns("rocky-vkcheck", "*.inc"))
    try:
        shaders = ["spill.spv.inc", "wls.spv.inc"]
        subprocess.run(["make", "-s", "-C", str(build), f"GLSLC={GLSLC_ENV}", *shaders], check=True)
        shutil.copytree(VULKAN_INCLUDE_ENV, build / "inc")
        root.run(
            ["aarch64-linux-gnu-gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2",
             f"-I{inside}/inc", "-o", f"{inside}/rocky-vkcheck", f"{inside}/rocky-vkcheck.c",
             "/usr/lib/aarch64-linux-gnu/libvulkan.so.1"],
            capture=True,
        )  # fmt: skip
        proc = _run_cli(root, "run", "--", f"{inside}/rocky-vkcheck", "--timeout-s", "20")
    finally:
        shutil.rmtree(build, ignore_errors=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = parse_document(proc.stdout, proc.returncode)
    dev = doc["device"]
    assert (dev["name"], dev["driver_name"], dev["subgroup_size"]) == ("Mali-G610 MC4", "panvk", 16)
    assert doc["queues"] == 2 and doc["error"] is None
    assert [c["status"] for c in doc["checks"]] == ["fail"] * 5
    assert all(c["cases"] > 0 and c["passed"] == 0 for c in doc["checks"])
    assert "rocky-vacount:" in proc.stderr
