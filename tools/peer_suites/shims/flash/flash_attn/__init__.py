"""flash_attn for the peer suite: the real package root imports the compiled attention kernels."""
