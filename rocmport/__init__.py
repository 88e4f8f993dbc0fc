"""rocmport: keep Megatron-LM and Megatron-Bridge running on AMD GPUs (ROCm)."""

__version__ = "0.1.0"
