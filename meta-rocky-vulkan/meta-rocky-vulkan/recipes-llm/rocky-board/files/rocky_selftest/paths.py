"""Where the self-test's files live on the board: the one home of these paths.

The layer's recipes install files there and the rendered config.json points there; the host
side (`rocky_vulkan.layer.board`) imports them from here, since this package cannot import it.
"""

BINDIR = "/usr/bin"
DATADIR = "/usr/share"
MODEL_SUBDIR = "rocky-models"  # under ${datadir}
MODEL_DIR = f"{DATADIR}/{MODEL_SUBDIR}"
LIBDIR = f"{DATADIR}/rocky-selftest"  # the package (rocky_selftest/) and its data
CONFIG = "/etc/rocky-selftest/config.json"
MOTD = "/etc/motd"
RESULTS_DIR = "/var/lib/rocky-selftest"  # the unit's StateDirectory=
STAMP = f"{RESULTS_DIR}/first-boot.stamp"
TUNE_STAMP = f"{RESULTS_DIR}/tune-done.stamp"
TILES_ENV_NAME = "tuned-tiles.env"  # the tuner's choice, read by rocky-tiles-env and login shells
TILES_ENV = f"{RESULTS_DIR}/{TILES_ENV_NAME}"
TILE_CANDIDATES = f"{LIBDIR}/tile_candidates.json"
CTS_DIR = "/usr/lib/vulkan-cts"  # meta-oe's vulkan-cts: deqp-vk, its data, mustpass/ (cts.py)
USER = "rocky-selftest"  # the unprivileged system user the checks run as

# The server (rocky-llm.service): its settings and why, and the per-board secrets.
LLM_USER = "rocky-llm"  # the unprivileged system user llama-server runs as
LLM_STATE_DIR = "/var/lib/rocky-llm"  # the unit's StateDirectory=
LLM_SETTINGS = f"{LLM_STATE_DIR}/settings.json"
# Models pulled at run time (model_store) and the router's preset file made from them.
LLM_MODELS_DIR = f"{LLM_STATE_DIR}/models"
LLM_PRESETS = f"{LLM_STATE_DIR}/models.ini"
CLUSTER_STATE_DIR = "/var/lib/rocky-cluster"  # root-owned: this board's WireGuard key, peers
LLM_KEY_DIR = "/var/lib/rocky-llm-keys"  # root-owned; LoadCredential= hands the files over
API_KEY_NAME = "api-key"
TLS_KEY_NAME = "tls.key"
TLS_CERT_NAME = "tls.crt"
