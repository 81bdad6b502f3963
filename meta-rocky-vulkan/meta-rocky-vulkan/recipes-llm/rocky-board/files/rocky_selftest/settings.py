"""The self-test's config: a small JSON file the layer renders from rocky-vulkan.yaml."""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field, fields

from . import CONFIG_SCHEMA_VERSION, paths
from .checks import CHECK_ORDER
from .cluster import problem as cluster_problem
from .cts import DEFAULT_CASES, MAX_PATTERNS, pattern_problem
from .files import UnreadableFile, read_json

DEFAULT_CONFIG = paths.CONFIG
SHA256 = re.compile(r"[0-9a-f]{64}")


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
    # A draft model for speculative decoding (same vocabulary as the served model, much
    # smaller); empty: only the draft-free n-gram modes are measured.
    spec_draft_model_path: str = ""
    # Models pulled at run time (`rocky-llm pull`), the router's preset file made from them, and
    # the Ollama-compatible API's port (Ollama's own), which follows serve_listen.
    models_dir: str = paths.LLM_MODELS_DIR
    router_presets: str = paths.LLM_PRESETS
    ollama_port: int = 11434
    # The self-test's `serving` step: streamed requests to the real llama-server, one per prompt
    # size (the first size decides the goal), each generating this many tokens.
    serving_prompt_tokens: tuple[int, ...] = (2048, 8192)
    serving_generated_tokens: int = 128
    # Token id -> logit bias for those requests; the board leaves it empty. Tests with the random
    # tiny model ban its byte tokens: a lone byte makes b9101's output parser fail the request.
    serving_logit_bias: dict[str, float] = field(default_factory=dict)
    # `rocky-selftest cts` (dEQP-VK, installed by kas/vulkan-cts.yml): where it is, the case
    # patterns, seconds of runs in all, cases per deqp-vk process, and how long one case may
    # write nothing to its log before it counts as a Timeout.
    cts_dir: str = paths.CTS_DIR
    cts_cases: tuple[str, ...] = DEFAULT_CASES
    cts_budget_s: int = 1800
    cts_chunk_cases: int = 250
    cts_case_timeout_s: int = 300
    # Several boards serving one model (cluster.py): head, workers, subnet; empty: one board.
    cluster: dict = field(default_factory=dict)
    # This board's name in `cluster` (empty: its hostname).
    hostname: str = ""

    def tool(self, name: str) -> str:
        return os.path.join(self.bin_dir, name)

    @property
    def served_model(self) -> str:
        return self.serve_model_path or self.model_path

    @property
    def board_name(self) -> str:
        return self.hostname or socket.gethostname().split(".")[0]


CONFIG_MAX_BYTES = 1 << 20
MAX_TEXT = 4096  # characters in any string of the config
MAX_ENV = 64  # variables in env / stock_env
MAX_UBATCHES = 64
MODES = ("tuned", "stock", "cpu")
# Whole numbers: (lowest, highest). As wide as rocky-vulkan.yaml's schema allows and a little
# more (tests run with second-long timeouts); anything outside is a broken config, not a wish.
INT_RANGES = {
    "prompt_tokens": (1, 131072),
    "repetitions": (1, 20),
    "match_tokens": (1, 4096),
    "run_timeout_s": (1, 86400),
    "deadline_s": (1, 604800),
    "gpu_wait_s": (0, 3600),
    "tune_budget_s": (0, 86400),
    "tune_top": (0, 100),
    "tune_repeats": (0, 100),
    "serve_port": (1024, 65535),
    "ollama_port": (1024, 65535),
    "serve_request_prompt_tokens": (1, 131072),
    "serve_request_generated_tokens": (1, 32768),
    "serve_context_tokens": (512, 131072),
    "serve_parallel": (1, 16),
    "serving_generated_tokens": (2, 32768),
    "cts_budget_s": (1, 604800),
    "cts_chunk_cases": (1, 100000),
    "cts_case_timeout_s": (1, 86400),
}
# Numbers, finite: (lowest, highest, whether each bound itself is allowed).
FLOAT_RANGES = {
    "tuned_vs_stock_ratio": (0.0, 1e6, False, True),
    "ratio_tolerance": (0.0, 1.0, True, False),
    "kld_max_mean": (0.0, 1.0, False, True),
    "kld_min_same_top_p": (0.0, 100.0, True, True),
}
# Strings that may be empty: no motd, the self-test's model, llama-server in bin_dir, no draft,
# the board's own hostname.
EMPTY_OK = {"motd_path", "serve_model_path", "llama_server", "spec_draft_model_path", "hostname"}
CHOICES = {"serve_listen": ("lan", "localhost", "off")}
REQUIRED = ("model_path", "model_sha256", "ubatch_sizes")
FIX = "fix it in rocky-vulkan.yaml and render again, or correct the file"


def load_settings(path: str) -> Settings:
    """Read the JSON config at `path`: every key known, every value of its type and in its
    range, so a broken config is refused here, naming the key, and never half-runs."""
    try:
        data = read_json(path, CONFIG_MAX_BYTES, allow_nan=True)  # _problem names the key
    except FileNotFoundError:
        raise SettingsError(f"{path}: not found; pass --config PATH") from None
    except UnreadableFile as err:
        raise SettingsError(f"cannot read JSON config: {err}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a JSON object; {FIX}")
    version = data.pop("schema_version", None)
    if type(version) is not int or version != CONFIG_SCHEMA_VERSION:
        raise SettingsError(
            f"{path}: schema_version {_show(version)} is not {CONFIG_SCHEMA_VERSION}; "
            "re-render the config with this rocky-selftest version"
        )
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        first = str(unknown[0])
        close = [k for k in sorted(known) if k[:5] == first[:5]][:1]  # a typo, as a rule
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        shown = ", ".join(_show(k) for k in unknown[:5])
        raise SettingsError(f"{path}: unknown keys [{shown}]{hint}; {FIX}")
    for key in REQUIRED:
        if key not in data:
            raise SettingsError(f"{path}: missing key {key!r}")
    values = {}
    for key, value in data.items():
        problem = _problem(key, str(known[key].type), value)
        if problem:
            raise SettingsError(f"{path}: {key} must be {problem}, not {_show(value)}; {FIX}")
        values[key] = tuple(value) if isinstance(value, list) else value
    return Settings(**values)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _number(value: object, low: float, high: float, low_ok=True, high_ok=True) -> bool:
    if type(value) not in (int, float) or not math.isfinite(value):
        return False
    return (low <= value if low_ok else low < value) and (
        value <= high if high_ok else value < high
    )


def _text(value: object, empty_ok: bool = False) -> bool:
    return (
        isinstance(value, str)
        and (empty_ok or value != "")
        and len(value) <= MAX_TEXT
        and value.isprintable()
    )


def _env(value: object) -> bool:
    """Environment variables: names without '=', values without NUL, all printable."""
    return (
        isinstance(value, dict)
        and len(value) <= MAX_ENV
        and all(_text(k) and "=" not in k and _text(v, empty_ok=True) for k, v in value.items())
    )


def _problem(key: str, kind: str, value: object) -> str | None:
    """What `value` must be for `key` when it is not that, else None."""
    if key in INT_RANGES:
        low, high = INT_RANGES[key]
        return None if _whole(value, low, high) else f"a whole number {low}..{high}"
    if key in FLOAT_RANGES:
        low, high, low_ok, high_ok = FLOAT_RANGES[key]
        if _number(value, low, high, low_ok, high_ok):
            return None
        return (
            f"a number {'from' if low_ok else 'above'} {low:g} "
            f"{'up to' if high_ok else 'below'} {high:g}"
        )
    if key in CHOICES:
        return None if value in CHOICES[key] else f"one of {', '.join(CHOICES[key])}"
    if key == "cluster":
        why = cluster_problem(value)
        return None if why is None else why
    if key == "model_sha256":
        ok = value is None or (isinstance(value, str) and SHA256.fullmatch(value) is not None)
        return None if ok else "null or 64 lowercase hex digits"
    if kind == "bool":
        return None if isinstance(value, bool) else "true or false"
    if kind == "str":
        ok = _text(value, key in EMPTY_OK)
        return None if ok else f"printable text of at most {MAX_TEXT} characters"
    if kind == "dict[str, str]":
        return None if _env(value) else f"at most {MAX_ENV} NAME: value strings (no '=' in NAME)"
    return _list_problem(key, value)


def _list_problem(key: str, value: object) -> str | None:
    if key == "ubatch_sizes":
        ok = (
            isinstance(value, list)
            and 1 <= len(value) <= MAX_UBATCHES
            and all(_whole(n, 1, 8192) for n in value)
            and len(set(value)) == len(value)
        )
        return None if ok else f"1 to {MAX_UBATCHES} distinct whole numbers 1..8192"
    if key == "serving_prompt_tokens":
        ok = isinstance(value, list) and 1 <= len(value) <= 8
        ok = ok and all(_whole(n, 1, 131072) for n in value) and len(set(value)) == len(value)
        return None if ok else "1 to 8 distinct whole numbers 1..131072"
    if key == "sweep_modes":
        ok = isinstance(value, list) and value and all(m in MODES for m in value)
        ok = ok and len(set(value)) == len(value)
        return None if ok else f"a list of distinct modes from {', '.join(MODES)}"
    if key == "skip_checks":
        ok = isinstance(value, list) and all(c in CHECK_ORDER for c in value)
        return None if ok else f"a list of check names from {', '.join(CHECK_ORDER)}"
    if key == "cts_cases":
        ok = isinstance(value, list) and 1 <= len(value) <= MAX_PATTERNS
        ok = ok and all(pattern_problem(p) is None for p in value)
        return None if ok else f"1 to {MAX_PATTERNS} dEQP-VK case patterns like dEQP-VK.compute.*"
    if key == "serving_logit_bias":
        ok = isinstance(value, dict) and len(value) <= 100_000
        ok = ok and all(
            isinstance(k, str) and k.isascii() and k.isdigit() and _number(v, -1e9, 1e9)
            for k, v in value.items()
        )
        return None if ok else "a map of token ids to numbers"
    raise AssertionError(f"no rule for the config key {key}")  # a new field needs its rule


def fallback_paths(path: str) -> tuple[str, str]:
    """results_dir and motd_path for a config that cannot be loaded: the file's own values where
    they are sound, else the board's defaults; so an ERROR verdict still goes where the verdict
    is looked for."""
    try:
        data = read_json(path, CONFIG_MAX_BYTES)
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    results = data.get("results_dir")
    motd = data.get("motd_path")
    return (
        results if _text(results) else paths.RESULTS_DIR,
        motd if _text(motd, empty_ok=True) else paths.MOTD,
    )
