"""vllm._aiter_ops for the peer suite: ROCm's AITER kernels, absent on CUDA."""

from types import SimpleNamespace

rocm_aiter_ops = SimpleNamespace(is_triton_rotary_embed_enabled=lambda: False)
