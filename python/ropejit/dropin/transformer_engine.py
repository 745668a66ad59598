"""TransformerEngine's `apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=False,
fused=True, cu_seqlens=None, cp_size=1, cp_rank=0)` (transformer_engine.pytorch) on ropejit.

Differences from TransformerEngine's:
- freqs holds angles, so each call computes their cos/sin (two small fp32 tables, as TE's
  unfused path does); a model that keeps its own tables saves that with ropejit.ops.rope.
- context parallelism (cp_size > 1) is not supported yet: NotImplementedError.
- start_positions (newer TE, per-sequence offsets) is keyword-only here, since the older
  signature above has interleaved in its place.
- `fused` is accepted and unused: every call is one fused launch.
- a position beyond freqs' rows gives NaN for that token."""

import torch

from ropejit import ops
from ropejit.errors import InvalidArgument


def apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=False, fused=True,
                         cu_seqlens=None, cp_size=1, cp_rank=0, *, start_positions=None):
    """t: [seq, batch, heads, head_dim] (sbhd), [batch, seq, ...] (bshd) or [tokens, heads,
    head_dim] (thd, with cu_seqlens int32 [batch + 1]); freqs: [rows, 1, 1, rotary_dim] angles
    (TE's RotaryPositionEmbedding output: [f, f], or f0 f0 f1 f1 ... when interleaved);
    rotary_dim <= head_dim, the rest passes through. Returns a new tensor; differentiable in t."""
    if cp_size != 1:
        raise NotImplementedError(f"ropejit: cp_size ({cp_size}) > 1 (context parallelism) is "
                                  f"not supported yet")
    if tensor_format not in ("sbhd", "bshd", "thd"):
        raise InvalidArgument(f"ropejit: tensor_format ({tensor_format!r}) must be 'sbhd', "
                              f"'bshd' or 'thd'")
    if tensor_format == "thd" and cu_seqlens is None:
        raise InvalidArgument("ropejit: tensor_format 'thd' needs cu_seqlens")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise InvalidArgument(f"ropejit: freqs must be [rows, 1, 1, rotary_dim], got shape "
                              f"{list(freqs.shape)}")
    angles = freqs.reshape(freqs.shape[0], freqs.shape[3]).float()
    out, _ = ops.rope(t, cos=torch.cos(angles), sin=torch.sin(angles), layout=tensor_format,
                      style="gptj" if interleaved else "neox", rotary_dim=freqs.shape[3],
                      seq_offsets=start_positions, cu_seqlens=cu_seqlens)
    return out
