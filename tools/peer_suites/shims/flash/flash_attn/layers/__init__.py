"""flash_attn.layers for the peer suite; rotary.py beside it is flash-attn's own."""
