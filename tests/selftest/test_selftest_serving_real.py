"""The placement and serving steps against the real llama-bench and llama-server (lavapipe as the
Vulkan device, the tiny GGUF), with small prompt sizes from the config so CI stays fast; the
board's 2048/8192 sizes are the defaults. One llama process at a time.

Stand-in, said here: the stack checks (panthor, firmware, Vulkan device) need the board, so the
GPU checks the server's derivation reads are given as PASS in the document so far; the sweep in
it is a real one. The timings say nothing about the Mali-G610."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rocky_selftest.bench import Deadline, sweep
from rocky_selftest.placement import request_seconds
from rocky_selftest.placement_bench import placement
from rocky_selftest.serving import DECODE_RATIO_MIN, TTFT_RATIO_MAX, serving
from rocky_selftest.settings import load_settings
from rocky_selftest.stack import sha256_file

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.selftest import TINY_TEXT_ONLY, make_tiny_model, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.needs_llama_bin]

SIZES = [64, 256]
GENERATED = 16


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (the machine may run other llama tools)."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = (Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(entry))
    return alive


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """The settings, a real sweep and the real placement step."""
    tmp = tmp_path_factory.mktemp("serving")
    model = make_tiny_model(tmp_path_factory)
    device = vulkan_device()
    cfg = write_config(
        tmp / "config.json",
        model_path=str(model),
        model_sha256=sha256_file(str(model)),
        ubatch_sizes=[32],
        prompt_tokens=64,
        repetitions=2,
        run_timeout_s=600,
        deadline_s=1500,
        bin_dir=BIN_DIR,
        results_dir=str(tmp / "results"),
        gpu_name=device or "no Vulkan device on this host",
        env=VK_ENV,
        sweep_modes=["tuned"],
        serve_request_prompt_tokens=64,
        serve_request_generated_tokens=16,
        serve_context_tokens=512,
        serve_parallel=1,
        serving_prompt_tokens=SIZES,
        serving_generated_tokens=GENERATED,
        serving_logit_bias=TINY_TEXT_ONLY,
    )
    s = load_settings(str(cfg))
    deadline = Deadline(s.deadline_s)
    log: list[str] = []
    _, sweep_runs = sweep(s, deadline, log=log.append)
    checks = [{"name": n, "status": "PASS", "evidence": "stand-in: needs the board"}
              for n in ("gpu_driver", "vulkan_device", "output_match")]  # fmt: skip
    checks.append({"name": "sweep", "status": "PASS", "evidence": "real"})
    doc = {"checks": checks, "sweep": sweep_runs}
    check, doc["placement"] = placement(s, deadline, doc, log=log.append)
    doc["checks"].append(check.to_json())
    print("\n".join(log))
    print(f"{check.status} placement: {check.evidence}")
    return s, doc, check, device


@pytest.fixture(scope="module", params=["as measured", "gpu wins"])
def served(request, placed):
    """The real serving step after the placement, with the document so far. On lavapipe the CPU
    wins the placement, so the derived server is the CPU one; "gpu wins" keeps only the GPU
    mode's real measurement in the placement section (as when the GPU wins on the board), so the
    GPU-configured server really runs on the Vulkan device."""
    s, doc, _, device = placed
    if request.param == "gpu wins":
        if not device or doc["placement"]["modes"]["gpu"]["status"] != "PASS":
            pytest.skip("no measured GPU mode to serve on")
        place = doc["placement"]
        doc = {**doc, "placement": {**place, "modes": {"gpu": place["modes"]["gpu"]}}}
    if not (Path(s.bin_dir) / "llama-server").exists():
        pytest.skip(f"no llama-server in {s.bin_dir} (a build with LLAMA_BUILD_SERVER=ON has it)")
    log: list[str] = []
    check, data = serving(s, Deadline(s.deadline_s), doc, log=log.append)
    print("\n".join(log))
    print(f"{check.status} serving: {check.evidence}")
    json.dumps(data, allow_nan=False)  # strict JSON
    return {**doc, "serving": data}, check, device, request.param


def test_placement_measures_every_mode_and_chooses_the_least_time(placed):
    _, doc, check, device = placed
    p = doc["placement"]
    assert p["request"] == {"prompt_tokens": 64, "generated_tokens": 16}
    cpu = p["modes"]["cpu"]
    assert cpu["status"] == "PASS" and cpu["pp_tps"] > 0 and cpu["tg_tps"] > 0, cpu
    assert all(r["devices"] in ("none", None) and r["ubatch"] == 512 for r in cpu["runs"])
    if not device:
        # -dev Vulkan0 without the device exits 1; hybrid without it finds no GPU to name
        assert p["modes"]["gpu"]["status"] == "FAIL" and check.status == "FAIL"
        return
    for mode in ("gpu", "hybrid"):
        entry = p["modes"][mode]
        assert entry["status"] == "PASS", entry
        assert len(entry["runs"]) == 2 and all(r["ubatch"] == 32 for r in entry["runs"])
        assert all(device in r["gpu_info"] for r in entry["runs"])
    assert all(r["n_gpu_layers"] > 0 for r in p["modes"]["gpu"]["runs"])
    assert all(r["n_gpu_layers"] == 0 for r in p["modes"]["hybrid"]["runs"])
    times = {m: request_seconds(e["pp_tps"], e["tg_tps"], 64, 16) for m, e in p["modes"].items()}
    assert p["chosen"] == min(times, key=times.get) and check.status == "PASS", check
    assert p["chosen"] in check.evidence


def test_serving_measures_ttft_and_decode_through_the_real_api(served):
    doc, check, device, scenario = served
    sv = doc["serving"]
    assert sv["goal"] == {"ttft_ratio_max": TTFT_RATIO_MAX, "decode_ratio_min": DECODE_RATIO_MIN}
    cpu = [r for r in sv["runs"] if r["server"] == "cpu"]
    assert [r["prompt_tokens"] for r in cpu] == SIZES
    labels = ["gpu", "cpu"] if sv["plan"]["placement"] != "cpu" else ["cpu"]
    for r in [r for r in sv["runs"] if r["server"] in labels]:
        assert r["status"] == "PASS", r
        assert r["ttft_s"] > 0 and r["decode_tps"] > 0 and r["decode_tps_wall"] > 0
        assert r["timings"]["prompt_n"] == r["prompt_tokens"]
        assert r["timings"]["predicted_n"] == GENERATED
        assert r["prompt_tokens"] == r["requested_tokens"]
    for info in sv["servers"]:
        assert info["exit_code"] is not None and info["slot_context"] == 512
        assert "--host" in info["cmd"] and info["cmd"][info["cmd"].index("--host") + 1] == (
            "127.0.0.1"
        )
        assert "--ssl-key-file" not in info["cmd"]
        assert not _alive_in_group(info["pid"])  # stopped, nothing of its group left over
    if scenario == "gpu wins":
        gpu = [r for r in sv["runs"] if r["server"] == "gpu"]
        assert sv["plan"]["placement"] == "gpu" and len(gpu) == len(SIZES)
        cmd = sv["servers"][0]["cmd"]
        assert cmd[cmd.index("-dev") + 1] == "Vulkan0" and cmd[cmd.index("-ngl") + 1] == "99"
        assert cmd[cmd.index("--ubatch-size") + 1] == "32"  # the sweep's best
    if not device or sv["plan"]["placement"] == "cpu":
        assert check.status == "FAIL"
        return
    ok = sv["ttft_ratio"] <= TTFT_RATIO_MAX and sv["decode_ratio"] >= DECODE_RATIO_MIN
    assert (check.status == "PASS") == ok, check
    if scenario == "as measured":
        assert sv["plan"]["placement"] == doc["placement"]["chosen"]
