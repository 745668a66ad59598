"""Liger-Kernel's RoPE entry points on ropejit: `liger_rotary_pos_emb(q, k, cos, sin,
position_ids=None, unsqueeze_dim=1)` (liger_kernel.transformers.rope), `liger_rope` (its
functional form) and `LigerRopeFunction` (liger_kernel.ops, an autograd.Function whose apply
returns (q, k, cos, sin)). The Hugging Face semantics (q, k [batch, heads, seq, head_dim],
cos/sin [1 or batch, seq, head_dim]), so an even head_dim is
ropejit.dropin.hf.apply_rotary_pos_emb, whose docstring lists the differences (fp32 math
rounded once; cos/sin rows must repeat each frequency).

An odd head_dim follows Liger's kernel: with h = head_dim // 2, element i < h pairs with
element i + h, rotated by the first h columns of cos/sin (whatever their width; transformers
gives head_dim + 1), and the last element is passed through unchanged, in the output and in
the gradient. ropejit's kernels take an even head_dim, so this path copies q and k once and
rotates the copy's first 2h elements in place."""

import torch

from ropejit import ops
from ropejit.dropin import hf
from ropejit.errors import InvalidArgument
from ropejit.ops import _dense  # a gradient ropejit can read


def _rotate_even_prefix_(q, k, cos, sin, unsqueeze_dim, backward):
    """Liger's rotation of an odd head_dim, in place on q and k (fresh tensors)."""
    half = q.shape[-1] // 2
    layout, cos2, sin2, offsets = hf.layout_and_tables(q, cos, sin, unsqueeze_dim)
    if cos2.shape[-1] < half:
        raise InvalidArgument(f"ropejit: cos has {cos2.shape[-1]} columns; head_dim "
                              f"{q.shape[-1]} rotates head_dim // 2 = {half} pairs, one column "
                              f"each")
    if half == 0:
        return
    even = slice(0, 2 * half)
    ops.rope_(q[..., even], None if k is None else k[..., even], cos=cos2[:, :half],
              sin=sin2[:, :half], layout=layout, style="neox", rotary_dim=2 * half,
              seq_offsets=offsets, backward=backward)


def _rotate(q, k, cos, sin, unsqueeze_dim, backward=False):
    """New (q, k) rotated as Liger's kernel does, for any head_dim; no autograd."""
    if q.shape[-1] % 2 == 0:
        return hf.rotate(q, k, cos, sin, unsqueeze_dim, backward=backward)
    q_out = q.clone()
    k_out = None if k is None else k.clone()
    _rotate_even_prefix_(q_out, k_out, cos, sin, unsqueeze_dim, backward)
    return q_out, k_out


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Returns new (q_embed, k_embed); differentiable in q and k."""
    if q.shape[-1] % 2 == 0:
        return hf.apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)
    q_embed, k_embed, _, _ = LigerRopeFunction.apply(q, k, cos, sin, position_ids,
                                                     unsqueeze_dim)
    return q_embed, k_embed


liger_rope = liger_rotary_pos_emb


class LigerRopeFunction(torch.autograd.Function):
    """LigerRopeFunction.apply(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) returns
    (q_embed, k_embed, cos, sin), as Liger's; the gradient flows to q and k."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        q_embed, k_embed = _rotate(q, k, cos, sin, unsqueeze_dim)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        return q_embed, k_embed, cos.view_as(cos), sin.view_as(sin)

    @staticmethod
    def backward(ctx, dq, dk, _grad_cos, _grad_sin):
        cos, sin = ctx.saved_tensors
        dq, dk = _rotate(_dense(dq), None if dk is None else _dense(dk), cos, sin,
                         ctx.unsqueeze_dim, backward=True)
        return dq, dk, None, None, None, None
