"""flash_attn.ops for the peer suite: only the rotary op."""
