"""Matmul warptiles: read from ggml-vulkan, the tuner's candidate space, pruning on the simulated
G610, and the tuning in the report."""

from pathlib import Path

# The tuner's candidate list (written by `tiles prune --out`, shipped in the image by render).
CANDIDATES_PATH = Path(__file__).resolve().parent / "tile_candidates.json"
# Our llama.cpp patch that carries the built-in Mali tiles (one of rocky-vulkan.yaml's
# llama_cpp.patches).
WARPTILE_PATCH = "llama.cpp-0003-vulkan-mali-panvk-warptiles.patch"
