"""flash_attn.ops.triton.rotary for the peer suite: flash-attn's Triton kernel is left out, so
that every rotation in the suite, through whichever of flash-attn's wrappers, is ropejit's."""

from ropejit.dropin.flash_attn import apply_rotary

__all__ = ["apply_rotary"]
