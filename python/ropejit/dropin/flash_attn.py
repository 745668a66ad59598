"""flash-attn's rotary functions (flash_attn.layers.rotary and flash_attn.ops.triton.rotary) on
ropejit, with their signatures and semantics:

- ``apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
  cu_seqlens=None, max_seqlen=None)`` (also ``apply_rotary_emb_func``), differentiable, in place
  too under autograd (an ``autograd.Function`` as flash-attn's: the input is rotated inside it
  and returned, the gradient rotated back, in place when the forward was);
- ``apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False,
  seqlen_offsets=0, num_heads_q=None)``: q and k of a packed ``[b, s, 3, h, d]`` or
  ``[b, s, hq + 2 hk, d]`` tensor in place, in one launch (two with ``cos_k``/``sin_k``);
- ``apply_rotary_emb_kv_(kv, cos, sin, interleaved=False, seqlen_offsets=0)``: k of a packed
  ``[b, s, 2, h, d]`` tensor in place;
- ``apply_rotary(x, cos, sin, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None,
  interleaved=False, inplace=False, conjugate=False)``: the op without autograd; ``conjugate``
  rotates by -angle (the backward direction).

Differences from flash-attn's:
- a position beyond cos's rows gives NaN for that token (flash-attn's kernel masks the load
  and leaves the token unrotated); an int `seqlen_offsets` that runs past the table is refused,
  as flash-attn asserts.
- cos/sin may be f32, f16 or bf16 whatever x's dtype (flash-attn requires x's dtype).
- max_seqlen is not needed (accepted and unused).
- math in fp32 with one rounding (as flash-attn's Triton kernel)."""

import torch

from ropejit import ops
from ropejit.ops import _dense  # a gradient ropejit can read


def _rotation(cos, sin, interleaved, seqlen_offsets, cu_seqlens, conjugate):
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    return dict(cos=cos, sin=sin, layout="bshd" if cu_seqlens is None else "thd",
                style="gptj" if interleaved else "neox", rotary_dim=2 * cos.shape[-1],
                seq_offsets=offsets, cu_seqlens=cu_seqlens,
                position_offset=0 if offsets is not None else seqlen_offsets,
                backward=conjugate)


def apply_rotary(x, cos, sin, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None,
                 interleaved=False, inplace=False, conjugate=False):
    """x: [batch, seq, heads, head_dim], or [tokens, heads, head_dim] with cu_seqlens (int32
    [batch + 1]); cos/sin: [rows, rotary_dim / 2]; rotary_dim <= head_dim, the rest passes
    through. interleaved: GPT-J pairs (2i, 2i+1), else GPT-NeoX halves. seqlen_offsets: an int,
    or an int32/int64 tensor [batch], added to each position. Returns the rotated x (x itself
    when inplace). No autograd: apply_rotary_emb is the differentiable form."""
    kwargs = _rotation(cos, sin, interleaved, seqlen_offsets, cu_seqlens, conjugate)
    if inplace:
        ops.rope_(x, **kwargs)
        return x
    return ops.rope(x, **kwargs)[0]



class _ApplyRotaryEmb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens):
        out = apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, None, interleaved, inplace)
        tensor_offsets = isinstance(seqlen_offsets, torch.Tensor)
        ctx.save_for_backward(cos, sin, cu_seqlens, seqlen_offsets if tensor_offsets else None)
        ctx.seqlen_offsets = None if tensor_offsets else seqlen_offsets
        ctx.interleaved, ctx.inplace = interleaved, inplace
        return out

    @staticmethod
    def backward(ctx, grad):
        cos, sin, cu_seqlens, tensor_offsets = ctx.saved_tensors
        offsets = tensor_offsets if ctx.seqlen_offsets is None else ctx.seqlen_offsets
        # In place when the forward was, as flash-attn's backward.
        dx = apply_rotary(_dense(grad), cos, sin, offsets, cu_seqlens, None, ctx.interleaved,
                          ctx.inplace, conjugate=True)
        return dx, None, None, None, None, None, None


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """flash-attn's apply_rotary_emb (arguments as apply_rotary): returns the rotated x (x itself
    when inplace), differentiable in x."""
    if not _needs_grad(x):
        return apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen, interleaved,
                            inplace)
    return _ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens)


apply_rotary_emb_func = apply_rotary_emb


def _q_and_k(qkv, num_heads_q):
    """Views of q and k in a packed qkv: [b, s, 3, h, d], or [b, s, hq + 2 hk, d] with
    num_heads_q."""
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv must be [batch, seq, 3, heads, head_dim], got shape "
                             f"{tuple(qkv.shape)}")
        return qkv[:, :, 0], qkv[:, :, 1]
    if qkv.dim() != 4 or num_heads_q is None:
        raise ValueError(f"qkv must be [batch, seq, 3, heads, head_dim], or [batch, seq, "
                         f"q_heads + 2 kv_heads, head_dim] with num_heads_q; got shape "
                         f"{tuple(qkv.shape)}, num_heads_q {num_heads_q}")
    kv_heads = (qkv.shape[2] - num_heads_q) // 2
    if kv_heads < 1 or qkv.shape[2] != num_heads_q + 2 * kv_heads:
        raise ValueError(f"qkv.shape[2] ({qkv.shape[2]}) must be num_heads_q ({num_heads_q}) + "
                         f"2 x kv_heads")
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + kv_heads]


def _qk_heads(qkv, num_heads_q):
    """q's and k's heads as one view [b, s, hq + hk, d] of a packed qkv: one tensor for one
    launch (two views of one base, passed as two mutated arguments, are not kept apart by
    torch.compile's functionalization)."""
    q, k = _q_and_k(qkv, num_heads_q)
    if qkv.dim() == 4:
        return qkv[:, :, :q.shape[2] + k.shape[2]]
    try:
        return qkv[:, :, :2].view(qkv.shape[0], qkv.shape[1], 2 * qkv.shape[3], qkv.shape[4])
    except RuntimeError:  # q's heads not at one stride from k's: two launches
        return None


def _rotate_qk(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q,
               conjugate):
    heads = _qk_heads(qkv, num_heads_q) if cos_k is None and sin_k is None else None
    if heads is not None:  # q and k in one launch
        ops.rope_(heads, **_rotation(cos, sin, interleaved, seqlen_offsets, None, conjugate))
        return
    q, k = _q_and_k(qkv, num_heads_q)
    ops.rope_(q, **_rotation(cos, sin, interleaved, seqlen_offsets, None, conjugate))
    ops.rope_(k, **_rotation(cos if cos_k is None else cos_k, sin if sin_k is None else sin_k,
                             interleaved, seqlen_offsets, None, conjugate))


class _ApplyRotaryEmbQKV_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q):
        _rotate_qk(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q, False)
        tensor_offsets = isinstance(seqlen_offsets, torch.Tensor)
        ctx.save_for_backward(cos, sin, cos_k, sin_k,
                              seqlen_offsets if tensor_offsets else None)
        ctx.seqlen_offsets = None if tensor_offsets else seqlen_offsets
        ctx.interleaved, ctx.num_heads_q = interleaved, num_heads_q
        return qkv

    @staticmethod
    def backward(ctx, grad):
        cos, sin, cos_k, sin_k, tensor_offsets = ctx.saved_tensors
        offsets = tensor_offsets if ctx.seqlen_offsets is None else ctx.seqlen_offsets
        grad = _dense(grad)  # rotated back in place, as flash-attn's backward
        _rotate_qk(grad, cos, sin, cos_k, sin_k, ctx.interleaved, offsets, ctx.num_heads_q,
                   True)
        return grad, None, None, None, None, None, None, None


def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False,
                          seqlen_offsets=0, num_heads_q=None):
    """Rotates q and k of a packed qkv in place (v untouched) and returns qkv; cos_k / sin_k
    give k its own tables. Differentiable in qkv."""
    if _needs_grad(qkv):
        return _ApplyRotaryEmbQKV_.apply(qkv, cos, sin, cos_k, sin_k, interleaved,
                                         seqlen_offsets, num_heads_q)
    _rotate_qk(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q, False)
    return qkv


def _rotate_k(kv, cos, sin, interleaved, seqlen_offsets, conjugate):
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be [batch, seq, 2, heads, head_dim], got shape "
                         f"{tuple(kv.shape)}")
    ops.rope_(kv[:, :, 0], **_rotation(cos, sin, interleaved, seqlen_offsets, None, conjugate))


class _ApplyRotaryEmbKV_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kv, cos, sin, interleaved, seqlen_offsets):
        _rotate_k(kv, cos, sin, interleaved, seqlen_offsets, False)
        tensor_offsets = isinstance(seqlen_offsets, torch.Tensor)
        ctx.save_for_backward(cos, sin, seqlen_offsets if tensor_offsets else None)
        ctx.seqlen_offsets = None if tensor_offsets else seqlen_offsets
        ctx.interleaved = interleaved
        return kv

    @staticmethod
    def backward(ctx, grad):
        cos, sin, tensor_offsets = ctx.saved_tensors
        offsets = tensor_offsets if ctx.seqlen_offsets is None else ctx.seqlen_offsets
        grad = _dense(grad)
        _rotate_k(grad, cos, sin, ctx.interleaved, offsets, True)
        return grad, None, None, None, None


def apply_rotary_emb_kv_(kv, cos, sin, interleaved=False, seqlen_offsets=0):
    """Rotates k of a packed kv [batch, seq, 2, heads, head_dim] in place (v untouched) and
    returns kv. Differentiable in kv."""
    if _needs_grad(kv):
        return _ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets)
    _rotate_k(kv, cos, sin, interleaved, seqlen_offsets, False)
    return kv
