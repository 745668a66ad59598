"""Hugging Face transformers' `apply_rotary_pos_emb(q, k, cos, sin, position_ids=None,
unsqueeze_dim=1)` (modeling_llama and the models copied from it), on ropejit.

Differences from transformers':
- cos/sin are read as tables whose rows repeat each frequency ([f, f], what every HF rotary
  module builds): ropejit reads the first half of a row. Arbitrary cos/sin values whose halves
  differ would give another result.
- cos.shape[-1] < head_dim rotates the first cos.shape[-1] dimensions and passes the rest
  through (models with partial rotary); transformers' Llama function would fail to broadcast.
- k may be None (returns (q_embed, None)).
- cos/sin that differ per sequence ([batch, seq, R], batch > 1) cost one small int32 tensor of
  row offsets per call; shared ones ([1, seq, R], transformers' usual case) cost nothing.
- math in fp32 with one rounding (transformers multiplies and adds in the activation dtype).
- position_ids is ignored, as transformers has done since it became deprecated."""

import torch

from ropejit import ops
from ropejit.errors import InvalidArgument

# unsqueeze_dim -> the layout of q and k: it names cos's broadcast axis, the heads axis.
_LAYOUTS = {1: "bhsd", -3: "bhsd", 2: "bshd", -2: "bshd"}


def tables(cos, sin, batch, seq):
    """cos/sin of shape [b or 1, seq, R] (or [seq, R]) as 2-d tables plus the per-sequence row
    offsets (None when every sequence shares rows 0..seq-1)."""
    if cos.shape != sin.shape or cos.dim() not in (2, 3):
        raise InvalidArgument(f"ropejit: cos {list(cos.shape)} and sin {list(sin.shape)} must have "
                              f"one shape, [batch, seq, rotary_dim] or [seq, rotary_dim]")
    # The kernels read a table's row as contiguous columns: a transposed one (GPT-OSS's) is
    # copied, rows * rotary_dim elements.
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    if cos.dim() == 2:
        return cos, sin, None
    rows = cos.shape[0]
    if rows == 1 or (cos.stride(0) == 0 and sin.stride(0) == 0):
        return cos[0], sin[0], None
    if rows != batch:
        raise InvalidArgument(f"ropejit: cos has batch {rows}, q has {batch}: cos/sin must be "
                              f"[1 or batch, seq, rotary_dim]")
    # One table of batch * seq rows; sequence i starts at row i * seq.
    offsets = torch.arange(0, batch * seq, seq, dtype=torch.int32, device=cos.device)
    return cos.reshape(batch * seq, -1), sin.reshape(batch * seq, -1), offsets


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Rotates q and k ([batch, heads, seq, head_dim] with unsqueeze_dim=1, [batch, seq, heads,
    head_dim] with 2) by cos/sin ([batch or 1, seq, rotary_dim], rotate_half layout); returns
    new (q_embed, k_embed)."""
    return rotate(q, k, cos, sin, unsqueeze_dim)


def layout_and_tables(q, cos, sin, unsqueeze_dim):
    """(layout, cos table, sin table, per-sequence row offsets) of a call with q 4-d and cos's
    broadcast axis `unsqueeze_dim`."""
    layout = _LAYOUTS.get(unsqueeze_dim)
    if layout is None:
        raise InvalidArgument(f"ropejit: unsqueeze_dim ({unsqueeze_dim!r}) must be 1 (q is "
                              f"[batch, heads, seq, head_dim]) or 2 ([batch, seq, heads, "
                              f"head_dim])")
    if q.dim() != 4:
        raise InvalidArgument(f"ropejit: q must be 4-d, got shape {list(q.shape)}")
    seq = q.shape[2] if layout == "bhsd" else q.shape[1]
    return (layout, *tables(cos, sin, q.shape[0], seq))


def rotate(q, k, cos, sin, unsqueeze_dim=1, backward=False):
    """apply_rotary_pos_emb's rotation; backward=True rotates by -angle (the gradient's)."""
    layout, cos2, sin2, offsets = layout_and_tables(q, cos, sin, unsqueeze_dim)
    return ops.rope(q, k, cos=cos2, sin=sin2, layout=layout, style="neox",
                    rotary_dim=cos.shape[-1], seq_offsets=offsets, backward=backward)
