"""The pinned llama.cpp: its sources assembled from registries, and small GGUF test models."""
