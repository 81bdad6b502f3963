"""The self-test's config: a small JSON file the layer renders from rocky-vulkan.yaml."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields

from . import CONFIG_SCHEMA_VERSION, paths

DEFAULT_CONFIG = paths.CONFIG


class SettingsError(Exception):
    """The config file is missing or malformed; the message says which key and what to do."""


@dataclass(frozen=True)
class Settings:
    model_path: str
    model_sha256: str | None
    ubatch_sizes: tuple[int, ...]
    prompt_tokens: int = 512
    repetitions: int = 3
    tuned_vs_stock_ratio: float = 4.8
    ratio_tolerance: float = 0.15
    match_tokens: int = 32
    # GPU vs CPU (llama-perplexity --kl-divergence): pass when the mean KLD is at most this and
    # the top token agrees at least this often (percent); rocky-vulkan.yaml says where from.
    kld_max_mean: float = 0.005
    kld_min_same_top_p: float = 90.0
    run_timeout_s: int = 900
    # The whole run stops starting new benchmarks after this many seconds.
    deadline_s: int = 7200
    bin_dir: str = paths.BINDIR
    vulkaninfo: str = "vulkaninfo"
    results_dir: str = paths.RESULTS_DIR
    motd_path: str = paths.MOTD
    sysroot: str = "/"
    gpu_driver: str = "panthor"
    gpu_name: str = "Mali-G610"
    vulkan_driver: str = "panvk"
    gpu_device: str = "Vulkan0"
    firmware: str = "arm/mali/arch10.8/mali_csffw.bin"
    vendor_device: str = "/dev/mali0"
    # How long to wait for the GPU's render node at boot (the module may still be probing).
    gpu_wait_s: int = 60
    # Environment that selects the stock tiles in the patched llama.cpp (same binary).
    stock_env: dict[str, str] = field(default_factory=lambda: {"GGML_VK_MALI_WARPTILE": "0"})
    # Extra environment for every llama.cpp run (tests use it for lavapipe).
    env: dict[str, str] = field(default_factory=dict)
    sweep_modes: tuple[str, ...] = ("tuned", "stock", "cpu")
    # Checks to leave out; the rendered board config leaves none out.
    skip_checks: tuple[str, ...] = ()
    # `rocky-selftest tune`: seconds of llama-bench time in all (across reboots), whether the
    # first boot tunes after the self-test, the shipped candidates, how many of the best are
    # run tune_repeats more times.
    tune_budget_s: int = 1200
    tune_at_first_boot: bool = False
    tune_candidates: str = paths.TILE_CANDIDATES
    tune_top: int = 3
    tune_repeats: int = 2
    # The server (rocky-llm): who may reach it, what it loads, a typical request (the placement
    # measurement times it) and the upper bounds of its context per slot and its slots.
    serve_listen: str = "lan"
    serve_port: int = 8443
    serve_model_path: str = ""  # empty: the self-test's model
    serve_model_name: str = "reference"
    serve_request_prompt_tokens: int = 2048
    serve_request_generated_tokens: int = 256
    serve_context_tokens: int = 8192
    serve_parallel: int = 2
    llama_server: str = ""  # empty: llama-server in bin_dir
    # The self-test's `serving` step: streamed requests to the real llama-server, one per prompt
    # size (the first size decides the goal), each generating this many tokens.
    serving_prompt_tokens: tuple[int, ...] = (2048, 8192)
    serving_generated_tokens: int = 128
    # Token id -> logit bias for those requests; the board leaves it empty. Tests with the random
    # tiny model ban its byte tokens: a lone byte makes b9101's output parser fail the request.
    serving_logit_bias: dict[str, float] = field(default_factory=dict)

    def tool(self, name: str) -> str:
        return os.path.join(self.bin_dir, name)

    @property
    def served_model(self) -> str:
        return self.serve_model_path or self.model_path


_TUPLES = {"ubatch_sizes", "sweep_modes", "skip_checks", "serving_prompt_tokens"}


def load_settings(path: str) -> Settings:
    """Read the JSON config at `path`; unknown keys are errors so typos do not pass silently."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise SettingsError(f"{path}: not found; pass --config PATH") from None
    except (OSError, ValueError) as err:
        raise SettingsError(f"{path}: cannot read JSON config: {err}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a JSON object")
    version = data.pop("schema_version", None)
    if version != CONFIG_SCHEMA_VERSION:
        raise SettingsError(
            f"{path}: schema_version {version!r} is not {CONFIG_SCHEMA_VERSION}; "
            "re-render the config with this rocky-selftest version"
        )
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"{path}: unknown keys {unknown}; known keys: {sorted(known)}")
    for key in ("model_path", "model_sha256", "ubatch_sizes"):
        if key not in data:
            raise SettingsError(f"{path}: missing key {key!r}")
    for key in _TUPLES & set(data):
        if not isinstance(data[key], list):
            raise SettingsError(f"{path}: {key} must be a list, not {data[key]!r}")
        data[key] = tuple(data[key])
    try:
        settings = Settings(**data)
    except TypeError as err:
        raise SettingsError(f"{path}: {err}") from None
    if not isinstance(settings.tune_at_first_boot, bool):
        raise SettingsError(f"{path}: tune_at_first_boot must be true or false")
    for key in ("tune_budget_s", "tune_top", "tune_repeats"):
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SettingsError(f"{path}: {key} must be a whole number >= 0, not {value!r}")
    _check_serve(path, settings)
    bad_modes = set(settings.sweep_modes) - {"tuned", "stock", "cpu"}
    if bad_modes or not settings.ubatch_sizes:
        raise SettingsError(
            f"{path}: sweep_modes must be tuned/stock/cpu and ubatch_sizes must not be empty"
        )
    return settings


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -1e9 < value < 1e9


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_serve(path: str, s: Settings) -> None:
    """The serve_* keys: exact values and ranges, as rocky-vulkan.yaml's schema has them."""
    if s.serve_listen not in ("lan", "localhost", "off"):
        raise SettingsError(f"{path}: serve_listen must be lan, localhost or off")
    bounds = {
        "serve_port": (1024, 65535),
        "serve_request_prompt_tokens": (1, 131072),
        "serve_request_generated_tokens": (1, 32768),
        "serve_context_tokens": (512, 131072),
        "serve_parallel": (1, 16),
    }
    for key, (low, high) in bounds.items():
        value = getattr(s, key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SettingsError(
                f"{path}: {key} must be a whole number {low}..{high}, not {value!r}"
            )
    sizes = s.serving_prompt_tokens
    if not sizes or len(sizes) > 8 or not all(_whole(n, 1, 131072) for n in sizes):
        raise SettingsError(
            f"{path}: serving_prompt_tokens must be 1 to 8 whole numbers 1..131072, not {sizes!r}"
        )
    if not _whole(s.serving_generated_tokens, 2, 32768):
        raise SettingsError(
            f"{path}: serving_generated_tokens must be a whole number 2..32768, "
            f"not {s.serving_generated_tokens!r}"
        )
    bias = s.serving_logit_bias
    if (
        not isinstance(bias, dict)
        or len(bias) > 100_000
        or not all(
            isinstance(k, str) and k.isdigit() and k.isascii() and _number(v)
            for k, v in bias.items()
        )
    ):
        raise SettingsError(f"{path}: serving_logit_bias must map token ids to numbers")
    for key in ("serve_model_path", "serve_model_name", "llama_server"):
        value = getattr(s, key)
        if not isinstance(value, str) or not value.isprintable() or len(value) > 4096:
            raise SettingsError(f"{path}: {key} must be a printable string")
