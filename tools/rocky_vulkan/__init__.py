"""rocky-vulkan: one config to a Yocto image that runs llama.cpp prefill on the RK3588 GPU."""

__version__ = "0.1.0"
