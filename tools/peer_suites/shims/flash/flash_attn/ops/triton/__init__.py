"""flash_attn.ops.triton for the peer suite: only the rotary op."""
