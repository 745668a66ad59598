"""Liger-Kernel's `liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`
on ropejit: the Hugging Face semantics (q, k [batch, heads, seq, head_dim], cos/sin
[1 or batch, seq, head_dim]), so it is ropejit.dropin.hf.apply_rotary_pos_emb; its docstring
lists the differences (fp32 math rounded once; cos/sin rows must repeat each frequency)."""

from ropejit.dropin import hf


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Returns new (q_embed, k_embed); differentiable in q and k."""
    return hf.apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)
