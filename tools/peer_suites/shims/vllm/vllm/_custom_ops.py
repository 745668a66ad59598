"""vllm._custom_ops for the peer suite: vLLM's CUDA rotary_embedding op is ropejit's drop-in."""

from ropejit.dropin.vllm import rotary_embedding

__all__ = ["rotary_embedding"]
