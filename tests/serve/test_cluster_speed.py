"""The split of whole layers by each device's own decode rate (rocky_selftest.cluster_speed):
the devices in llama.cpp's order and the shares from hand-made rates; the real runs:
test_cluster_real.py."""

from __future__ import annotations

from rocky_selftest.cluster_speed import SPLIT_RE, devices, split
from rocky_selftest.settings import Settings


def _s(gpu: str) -> Settings:
    return Settings(model_path="/m/ref.gguf", model_sha256=None, ubatch_sizes=(64,),
                    gpu_device=gpu)  # fmt: skip


def test_the_workers_come_first_then_this_board_s_gpu():
    workers = ["10.77.0.2:50052", "10.77.0.3:50052"]
    assert devices(_s("Vulkan0"), workers) == ["RPC0", "RPC1", "Vulkan0"]
    assert devices(_s("none"), workers) == ["RPC0", "RPC1"]  # the tests' head without a GPU


def _run(device: str, tg: float | None, reason: str = "llama-bench exited 1") -> dict:
    if tg is None:
        return {"device": device, "status": "FAIL", "reason": reason}
    return {"device": device, "status": "PASS", "tg_tps": tg}


def test_each_share_is_the_device_s_part_of_the_summed_rates():
    shares, why = split([_run("RPC0", 6.0), _run("RPC1", 3.0), _run("Vulkan0", 3.0)])
    assert shares == "0.500/0.250/0.250" and SPLIT_RE.fullmatch(shares)
    assert (
        why == "decode alone on the reference model: RPC0 6.00 t/s, RPC1 3.00 t/s, Vulkan0 3.00 t/s"
    )


def test_a_share_never_rounds_to_nothing_or_to_all():
    shares, _ = split([_run("RPC0", 10000.0), _run("Vulkan0", 1.0)])
    assert shares == "0.999/0.001" and SPLIT_RE.fullmatch(shares)


def test_no_split_without_every_device_s_rate():
    shares, why = split([_run("RPC0", 6.0), _run("RPC1", None, "model does not fit")])
    assert shares is None and why == "no split by speed (RPC1: model does not fit)"
    shares, why = split([_run("RPC0", 6.0)])
    assert shares is None and "fewer than 2 devices" in why
