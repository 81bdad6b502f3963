"""The board as the layer lays it out, and the self-test's config.json for it.

The paths have one home, `rocky_selftest.paths` (the on-board package reads them too and cannot
import this one).
"""

from __future__ import annotations

from rocky_selftest import CONFIG_SCHEMA_VERSION, paths

from rocky_vulkan.config import Config

# The same paths as a recipe installs them: under oe-core's directory variables.
_BB_DIRS = (
    ("/usr/bin", "${bindir}"),
    ("/usr/share", "${datadir}"),
    ("/etc", "${sysconfdir}"),
    ("/var", "${localstatedir}"),
)


def bb_path(path: str) -> str:
    """'/usr/share/rocky-selftest' -> '${datadir}/rocky-selftest' (a Jinja filter too)."""
    for prefix, variable in _BB_DIRS:
        if path == prefix or path.startswith(prefix + "/"):
            return variable + path[len(prefix) :]
    raise ValueError(f"{path}: not under a directory a recipe installs to")


def selftest_board_config(cfg: Config) -> dict:
    """The board's /etc/rocky-selftest/config.json (read by rocky_selftest.settings)."""
    st = cfg.selftest
    return {
        "schema_version": CONFIG_SCHEMA_VERSION,
        "model_path": f"{paths.MODEL_DIR}/{cfg.model.filename}",
        "model_sha256": cfg.model.sha256,
        "ubatch_sizes": list(st.ubatch_sizes),
        "prompt_tokens": st.prompt_tokens,
        "repetitions": st.repetitions,
        "tuned_vs_stock_ratio": st.tuned_vs_stock_ratio,
        "ratio_tolerance": st.ratio_tolerance,
        "match_tokens": st.match_tokens,
        "kld_max_mean": st.kld_max_mean,
        "kld_min_same_top_p": st.kld_min_same_top_p,
        "run_timeout_s": st.run_timeout_s,
        "deadline_s": st.deadline_s,
        "tune_budget_s": st.tune_budget_s,
        "tune_at_first_boot": st.tune_at_first_boot,
        "tune_candidates": paths.TILE_CANDIDATES,
        "bin_dir": paths.BINDIR,
        "vulkaninfo": f"{paths.BINDIR}/vulkaninfo",
        "results_dir": paths.RESULTS_DIR,
        "motd_path": paths.MOTD,
        "sysroot": "/",
        "serve_listen": cfg.serve.listen,
        "serve_port": cfg.serve.port,
        # The self-test keeps model_path (the reference model) for its comparison; the server
        # loads the model serve.model names, which the image installs beside it.
        "serve_model_path": f"{paths.MODEL_DIR}/{cfg.served_filename}",
        "serve_model_name": cfg.serve.model,
        "serve_request_prompt_tokens": cfg.serve.request_prompt_tokens,
        "serve_request_generated_tokens": cfg.serve.request_generated_tokens,
        "serve_context_tokens": cfg.serve.context_tokens,
        "serve_parallel": cfg.serve.parallel,
        "spec_draft_model_path": f"{paths.MODEL_DIR}/{cfg.draft.filename}" if cfg.draft else "",
        "cluster": dict(cfg.cluster or {}),
    }
