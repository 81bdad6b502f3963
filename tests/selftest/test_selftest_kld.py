"""The GPU-vs-CPU output check as llama.cpp measures it (issue 13, item 1): llama-perplexity's
KL divergence over a fixed text, with thresholds from the config; greedy text as information.

Fast tests cover the command lines, the parser, the thresholds and the shipped text. Where a tool
must misbehave on demand (NaN statistics, a silent early exit) a fake `llama-perplexity` script is
used, and says so. The slow tests at the end run the real llama-perplexity (ROCKY_LLAMA_BIN_DIR)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rocky_selftest import kld
from rocky_selftest.bench import Deadline
from rocky_selftest.match import output_match
from rocky_selftest.settings import Settings, load_settings
from rocky_vulkan.config import ConfigError, load_config

from tests.helpers.llama_bin import BIN_DIR, VK_ENV, vulkan_device
from tests.helpers.project import ROOT
from tests.helpers.selftest import make_tiny_model

pytestmark = pytest.mark.timeout(600)
LAYER_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-selftest/files"
BOARD_FILES = ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board/files"


def _settings(**kw) -> Settings:
    return Settings(model_path="/m.gguf", model_sha256=None, ubatch_sizes=(64,), **kw)


# ---- command lines, text, thresholds ---------------------------------------------------------


def test_cpu_base_and_gpu_runs_use_the_right_switches(monkeypatch):
    s = _settings(stock_env={"GGML_VK_MALI_WARPTILE": "0"})
    cpu, cpu_env = kld.perplexity_command(s, "/t/base.kld", gpu=False)
    gpu, gpu_env = kld.perplexity_command(s, "/t/base.kld", gpu=True)
    for cmd in (cpu, gpu):
        assert cmd[0] == "/usr/bin/llama-perplexity" and cmd[cmd.index("-f") + 1] == kld.TEXT_PATH
        assert cmd[cmd.index("-c") + 1] == cmd[cmd.index("-b") + 1] == str(kld.KLD_CTX)
        assert cmd[cmd.index("--kl-divergence-base") + 1] == "/t/base.kld"
    assert "-dev none" in " ".join(cpu) and "-ngl 0" in " ".join(cpu)
    assert "--kl-divergence" not in cpu  # the base run saves the CPU's logits
    assert "-dev Vulkan0" in " ".join(gpu) and "--kl-divergence" in gpu
    assert gpu_env["GGML_VK_MALI_WARPTILE"] is None  # the product's tiles, whatever the shell set
    assert kld.KLD_CTX >= 128 and kld.KLD_CTX * kld.KLD_CHUNKS >= 512  # issue 13's floor


def test_the_text_ships_in_the_layer_and_is_long_enough():
    text = Path(kld.TEXT_PATH).read_text(encoding="utf-8")
    assert (BOARD_FILES / "rocky_selftest/kld_text.txt").read_text(encoding="utf-8") == text
    recipe = next(
        (ROOT / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/rocky-board").glob("*.bb")
    ).read_text()
    assert "file://rocky_selftest/kld_text.txt" in recipe and "rocky_selftest/*.txt" in recipe
    # llama-perplexity needs KLD_CTX x KLD_CHUNKS tokens. English prose runs at about 4-5
    # characters per token in Qwen2.5's BPE; demand 1.4x the need at 4.5 characters per token.
    # (The real tokenizer is checked by the slow test on the testmodel vocab, and on the board.)
    need = kld.KLD_CTX * kld.KLD_CHUNKS
    assert len(text) >= 1.4 * 4.5 * need, len(text)
    assert text.isascii() and "\x00" not in text


def test_rendered_board_config_carries_the_kld_thresholds():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    s = load_settings(str(BOARD_FILES / "config.json"))
    assert s.kld_max_mean == cfg.selftest.kld_max_mean
    assert s.kld_min_same_top_p == cfg.selftest.kld_min_same_top_p


@pytest.mark.parametrize(
    ("line", "bad", "says"),
    [
        ("  kld_max_mean: ", "0", "above 0 and at most 1"),
        ("  kld_max_mean: ", "1.5", "above 0 and at most 1"),
        ("  kld_max_mean: ", "'0.01'", "above 0 and at most 1"),
        ("  kld_min_same_top_p: ", "101", "percent, 0 to 100"),
        ("  kld_min_same_top_p: ", ".nan", "percent, 0 to 100"),
        ("  kld_max_mean: ", ".inf", "above 0 and at most 1"),
    ],
)
def test_kld_thresholds_are_validated(project, line, bad, says):
    path = project / "rocky-vulkan.yaml"
    text = path.read_text()
    new, n = re.subn(rf"(?m)^{re.escape(line)}\S+$", line + bad, text)
    assert n == 1
    path.write_text(new)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    field = line.strip().rstrip(":")
    assert f"selftest.{field}" in str(err.value) and says in str(err.value)


# ---- parsing and the verdict -----------------------------------------------------------------

SUMMARY = """
====== KL divergence statistics ======
Mean    KLD:   {kld} ±   0.000010
Maximum KLD:   0.004000
99.9%   KLD:   0.003000

====== Token probability statistics ======
Same top p: {top} ± 0.200 %
"""


def test_parser_reads_mean_kld_and_same_top_p():
    stats, why = kld.parse_kld(SUMMARY.format(kld="0.000321", top="98.431"))
    assert why is None
    assert stats["mean_kld"] == pytest.approx(0.000321) and stats["same_top_p"] == 98.431
    assert stats["max_kld"] == 0.004


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (SUMMARY.format(kld="nan", top="98.4"), "not a finite number"),
        (SUMMARY.format(kld="0.1", top="-nan"), "not a finite number"),
        (SUMMARY.format(kld="0.1", top="140.0"), "implausible"),
        ("perplexity: calculating ...\n[1]12.3,[2]11.9,\n", "no mean_kld / same_top_p line"),
    ],
)
def test_parser_refuses_what_is_not_a_measurement(text, says):
    stats, why = kld.parse_kld(text)
    assert stats is None and says in why


def test_verdict_applies_both_thresholds():
    s = _settings(kld_max_mean=0.01, kld_min_same_top_p=90.0)
    assert kld.verdict(s, {"mean_kld": 0.0099, "same_top_p": 90.0})[0]
    assert not kld.verdict(s, {"mean_kld": 0.0101, "same_top_p": 99.0})[0]
    assert not kld.verdict(s, {"mean_kld": 0.001, "same_top_p": 89.9})[0]


def test_tiles_come_from_the_runs_stderr():
    assert kld.tiles_used("ggml_vulkan: Found 1 Vulkan devices:\nusing Mali matmul warptiles") == (
        "mali"
    )
    # llama-bench prints the device list, then silences ggml's log: no proof of stock tiles.
    assert kld.tiles_used("ggml_vulkan: Found 1 Vulkan devices:\n") == "unknown"
    assert kld.tiles_used("") == "unknown"  # the tool silenced ggml's log: no claim either way
    # llama-perplexity -lv 4: llama's debug lines prove ggml-vulkan's info line would be there.
    assert kld.tiles_used("create_tensor: loading tensor blk.0.attn_q.weight\n") == "stock"
    assert kld.tiles_used("llama_context: constructing llama_context\n") == "unknown"


def test_gpu_run_is_verbose_before_the_device_is_set_up():
    """The tile line is logged while -dev is parsed: -lv 4 after -dev would come too late."""
    gpu, _ = kld.perplexity_command(_settings(), "/t/base.kld", gpu=True)
    cpu, _ = kld.perplexity_command(_settings(), "/t/base.kld", gpu=False)
    assert gpu[1:3] == ["-lv", "4"] and gpu.index("-lv") < gpu.index("-dev")
    assert "-lv" not in cpu


# ---- the check end to end with a misbehaving tool (fakes) -------------------------------------


def _fake_perplexity(tmp: Path, gpu_output: str) -> Path:
    """FAKE llama-perplexity: the CPU base run writes a file; the GPU run prints `gpu_output`
    and the log lines a real GPU run prints. Only to produce output the real tool won't on
    demand (NaN statistics, an exit 0 without statistics)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp / "gpu.out").write_text(gpu_output)
    script = bin_dir / "llama-perplexity"
    script.write_text(
        "#!/bin/sh\n"
        'base=; gpu=0; prev=\n'
        'for a in "$@"; do [ "$prev" = "--kl-divergence-base" ] && base=$a; '
        '[ "$a" = "--kl-divergence" ] && gpu=1; prev=$a; done\n'
        'if [ $gpu = 0 ]; then echo x > "$base"\n'
        '  echo "load_tensors: offloaded 0/3 layers to GPU" >&2; exit 0; fi\n'
        'echo "load_tensors: offloaded 3/3 layers to GPU" >&2\n'
        'echo "llama_model_load_from_file_impl: using device Vulkan0 (Mali-G610 MC4)" >&2\n'
        f'cat {tmp / "gpu.out"}\n'
    )  # fmt: skip
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("output", "says"),
    [
        (SUMMARY.format(kld="nan", top="99.0"), "not a finite number"),
        # llama-perplexity returns 0 without statistics when it scored < 100 tokens.
        ("chunk  PPL  ln(PPL(Q)/PPL(base))  KL Divergence\n", "no mean_kld / same_top_p line"),
    ],
)
def test_gpu_run_without_valid_statistics_fails_the_check(tmp_path, output, says):
    s = _settings(bin_dir=str(_fake_perplexity(tmp_path, output)), gpu_name="Mali-G610")
    s = replace(s, model_path=str(tmp_path / "m.gguf"))
    check, doc = output_match(s, Deadline(60), log=lambda _: None)
    assert check.status == "FAIL" and says in check.evidence, check
    assert doc["kld"]["gpu"]["reason"] and "mean_kld" not in doc["kld"]["gpu"]
    assert "greedy" in doc  # still recorded, as information


def test_passing_statistics_pass_and_greedy_failure_does_not_decide(tmp_path):
    s = _settings(
        bin_dir=str(_fake_perplexity(tmp_path, SUMMARY.format(kld="0.000500", top="97.0"))),
        gpu_name="Mali-G610",
    )
    check, doc = output_match(s, Deadline(60), log=lambda _: None)
    assert check.status == "PASS", check
    assert "not compared" in doc["greedy"]["summary"]  # no llama-simple here: information only
    assert doc["kld"]["gpu"]["tiles"] == "unknown" and "tiles unknown" in check.evidence
    assert not list(Path("/tmp").glob("rocky-kld-*/cpu-logits.kld"))


# ---- the real llama-perplexity ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory)


def _real(model: Path, **kw) -> Settings:
    if not (Path(BIN_DIR) / "llama-perplexity").exists():
        pytest.skip(f"no llama-perplexity in {BIN_DIR} (build the llama-perplexity target)")
    device = vulkan_device()
    if not device:
        pytest.skip("no Vulkan device (lavapipe) in this llama.cpp build")
    return replace(
        _settings(bin_dir=BIN_DIR, env=VK_ENV, gpu_name=device, run_timeout_s=900),
        model_path=str(model),
        **kw,
    )


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_real_kld_gpu_vs_cpu_on_lavapipe_passes_and_records_tiles(tiny):
    s = _real(tiny)
    check, doc = output_match(s, Deadline(1800), log=print)
    cpu, gpu = doc["kld"]["cpu"], doc["kld"]["gpu"]
    assert "reason" not in cpu and cpu["base_bytes"] > 0, cpu
    assert "reason" not in gpu, gpu
    print(json.dumps({k: gpu[k] for k in gpu if k not in ("cmd", "stderr_tail")}, indent=1))
    assert gpu["tiles"] in ("mali", "stock")  # ggml-vulkan's log is visible in llama-perplexity
    assert 0 <= gpu["mean_kld"] <= s.kld_max_mean and gpu["same_top_p"] >= s.kld_min_same_top_p
    assert check.status == "PASS", check


@pytest.mark.slow
@pytest.mark.needs_llama_bin
def test_real_kld_catches_a_gpu_that_computes_something_else(tiny, tmp_path_factory):
    """The check can fail: the GPU run is given a different model (another seed) than the CPU
    base run, as a GPU with wrong kernels would produce different distributions."""
    from rocky_vulkan.llama.testmodel import write_preset

    other = write_preset("tiny", tmp_path_factory.mktemp("other") / "other.gguf", seed=2)
    s = _real(tiny)
    work = tmp_path_factory.mktemp("kld")
    base = str(work / "base.kld")
    cpu = kld._run(s, base, False, 900)
    assert "reason" not in cpu, cpu
    gpu = kld._run(replace(s, model_path=str(other)), base, True, 900)
    assert "reason" not in gpu, gpu
    ok, text = kld.verdict(s, gpu)
    assert not ok and gpu["mean_kld"] > 10 * s.kld_max_mean, text
