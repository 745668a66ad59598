"""Liger-Kernel's RoPE entry points on ropejit: `liger_rotary_pos_emb(q, k, cos, sin,
position_ids=None, unsqueeze_dim=1)` (liger_kernel.transformers.rope), `liger_rope` (its
functional form) and `LigerRopeFunction` (liger_kernel.ops, an autograd.Function whose apply
returns (q, k, cos, sin)). The Hugging Face semantics (q, k [batch, heads, seq, head_dim],
cos/sin [1 or batch, seq, head_dim]), so they are ropejit.dropin.hf.apply_rotary_pos_emb,
whose docstring lists the differences (fp32 math rounded once; cos/sin rows must repeat each
frequency). An odd head_dim (Liger rotates the first 2 * (head_dim // 2) elements in halves
and leaves the last) is refused: ropejit's kernels take an even head_dim."""

import torch

from ropejit.dropin import hf
from ropejit.ops import _dense  # a gradient ropejit can read


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Returns new (q_embed, k_embed); differentiable in q and k."""
    return hf.apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)


liger_rope = liger_rotary_pos_emb


class LigerRopeFunction(torch.autograd.Function):
    """LigerRopeFunction.apply(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) returns
    (q_embed, k_embed, cos, sin), as Liger's; the gradient flows to q and k."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        q_embed, k_embed = hf.rotate(q, k, cos, sin, unsqueeze_dim)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        return q_embed, k_embed, cos.view_as(cos), sin.view_as(sin)

    @staticmethod
    def backward(ctx, dq, dk, _grad_cos, _grad_sin):
        cos, sin = ctx.saved_tensors
        dq, dk = hf.rotate(_dense(dq), _dense(dk), cos, sin, ctx.unsqueeze_dim, backward=True)
        return dq, dk, None, None, None, None
