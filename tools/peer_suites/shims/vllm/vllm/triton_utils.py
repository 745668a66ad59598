"""vllm.triton_utils for the peer suite: Triton itself (vLLM's module adds placeholders for hosts
without it)."""

import triton
import triton.language as tl

__all__ = ["tl", "triton"]
