"""Liger-Kernel's RoPE entry points on ropejit: `liger_rotary_pos_emb(q, k, cos, sin,
position_ids=None, unsqueeze_dim=1, rotary_dim=None)` (liger_kernel.transformers.rope), `liger_rope` (its
functional form) and `LigerRopeFunction` (liger_kernel.ops, an autograd.Function whose apply
returns (q, k)), as Liger-Kernel 0.8 has them. The Hugging Face semantics (q, k [batch, heads, seq, head_dim],
cos/sin [1 or batch, seq, head_dim]), so an even head_dim is
ropejit.dropin.hf.apply_rotary_pos_emb, whose docstring lists the differences (fp32 math
rounded once; cos/sin rows must repeat each frequency).

An odd head_dim follows Liger's kernel: with h = head_dim // 2, element i < h pairs with
element i + h, rotated by the first h columns of cos/sin (whatever their width; transformers
gives head_dim + 1), and the last element is passed through unchanged, in the output and in
the gradient. ropejit's kernels take an even head_dim, so this path copies q and k once and
rotates the copy's first 2h elements in place. So does an explicit rotary_dim (Liger's, for
cos/sin that hold each frequency once, rotary_dim / 2 columns, as GPT-OSS's): h = rotary_dim / 2,
the rest of the head passed through."""

import torch

from ropejit import ops
from ropejit.dropin import hf
from ropejit.errors import InvalidArgument
from ropejit.ops import _dense  # a gradient ropejit can read


def _resolve_rotary_dim(cos, head_dim, rotary_dim):
    """Liger's rule: the width of cos/sin (at most head_dim) unless rotary_dim is given (even,
    at most head_dim, cos/sin at least rotary_dim / 2 wide)."""
    if rotary_dim is None:
        return min(cos.shape[-1], head_dim)
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim % 2 \
            or not 0 < rotary_dim <= head_dim:
        raise InvalidArgument(f"ropejit: rotary_dim ({rotary_dim!r}) must be an even int in "
                              f"(0, head_dim={head_dim}]")
    if cos.shape[-1] < rotary_dim // 2:
        raise InvalidArgument(f"ropejit: cos has {cos.shape[-1]} columns; rotary_dim "
                              f"{rotary_dim} needs rotary_dim / 2 = {rotary_dim // 2}")
    return rotary_dim


def _hf_form(q, cos, rotary_dim):
    """Whether the call is transformers' rotation (duplicated cos/sin of an even width up to
    head_dim, which is then the rotated width): ropejit's out-of-place path, no copy."""
    width = cos.shape[-1]
    return rotary_dim is None and width % 2 == 0 and width <= q.shape[-1]


def _rotate_prefix_(q, k, cos, sin, unsqueeze_dim, backward, rotary_dim):
    """Liger's rotation, in place on q and k (fresh tensors): with h = rotary_dim // 2, element
    i < h pairs with i + h, rotated by the first h columns of cos/sin; the rest of the head (an
    odd head_dim's last element, the part past rotary_dim) passes through."""
    half = rotary_dim // 2
    layout, cos2, sin2, offsets = hf.layout_and_tables(q, cos, sin, unsqueeze_dim)
    if half == 0:
        return
    rotated = slice(0, 2 * half)
    ops.rope_(q[..., rotated], None if k is None else k[..., rotated], cos=cos2[:, :half],
              sin=sin2[:, :half], layout=layout, style="neox", rotary_dim=2 * half,
              seq_offsets=offsets, backward=backward)


def _rotate(q, k, cos, sin, unsqueeze_dim, backward=False, rotary_dim=None):
    """New (q, k) rotated as Liger's kernel does, for any head_dim and rotary_dim; no
    autograd."""
    if _hf_form(q, cos, rotary_dim):
        return hf.rotate(q, k, cos, sin, unsqueeze_dim, backward=backward)
    rotary_dim = _resolve_rotary_dim(cos, q.shape[-1], rotary_dim)
    q_out = q.clone()
    k_out = None if k is None else k.clone()
    _rotate_prefix_(q_out, k_out, cos, sin, unsqueeze_dim, backward, rotary_dim)
    return q_out, k_out


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    """Returns new (q_embed, k_embed); differentiable in q and k. rotary_dim as Liger's: the
    rotated width when cos/sin hold each frequency once (rotary_dim / 2 columns, GPT-OSS)."""
    if _hf_form(q, cos, rotary_dim):
        return hf.apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)
    return LigerRopeFunction.apply(q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)


liger_rope = liger_rotary_pos_emb


class LigerRopeFunction(torch.autograd.Function):
    """LigerRopeFunction.apply(q, k, cos, sin, position_ids=None, unsqueeze_dim=1,
    rotary_dim=None) returns (q_embed, k_embed), as Liger's; the gradient flows to q and k."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
        q_embed, k_embed = _rotate(q, k, cos, sin, unsqueeze_dim, rotary_dim=rotary_dim)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        ctx.rotary_dim = rotary_dim
        return q_embed, k_embed

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = _rotate(_dense(dq), None if dk is None else _dense(dk), cos, sin,
                         ctx.unsqueeze_dim, backward=True, rotary_dim=ctx.rotary_dim)
        return dq, dk, None, None, None, None, None
