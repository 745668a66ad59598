"""flash-attn's `apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False,
seqlen_offsets=0, cu_seqlens=None, max_seqlen=None)` (flash_attn.layers.rotary) on ropejit.

Differences from flash-attn's:
- a position beyond cos's rows gives NaN for that token (flash-attn's kernel masks the load
  and leaves the token unrotated); an int `seqlen_offsets` that runs past the table is refused,
  as flash-attn asserts.
- cos/sin may be f32, f16 or bf16 whatever x's dtype (flash-attn requires x's dtype).
- max_seqlen is not needed (accepted and unused).
- math in fp32 with one rounding (as flash-attn's Triton kernel)."""

import torch

from ropejit import ops


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x: [batch, seq, heads, head_dim], or [tokens, heads, head_dim] with cu_seqlens (int32
    [batch + 1]); cos/sin: [rows, rotary_dim / 2]; rotary_dim <= head_dim, the rest passes
    through. interleaved: GPT-J pairs (2i, 2i+1), else GPT-NeoX halves. seqlen_offsets: an int,
    or an int32/int64 tensor [batch], added to each position. Returns the rotated x (x itself
    when inplace)."""
    layout = "bshd" if cu_seqlens is None else "thd"
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    kwargs = dict(cos=cos, sin=sin, layout=layout, style="gptj" if interleaved else "neox",
                  rotary_dim=2 * cos.shape[-1], seq_offsets=offsets, cu_seqlens=cu_seqlens,
                  position_offset=0 if offsets is not None else seqlen_offsets)
    if inplace:
        ops.rope_(x, **kwargs)
        return x
    return ops.rope(x, **kwargs)[0]
