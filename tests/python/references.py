"""The peers' RoPE semantics written out in float64 torch, as their documentation and
reference code define them (no peer library needed): what the drop-ins are checked against.
Every function takes tensors of any dtype and returns float64 results. Also: running
transformers' own rotary modules in float64, and the float64 angles of ropejit's frequency
variants (from the library's host functions)."""

import contextlib

import torch

import ropejit


def rotate(x, cos, sin, interleaved):
    """x [..., D]; cos/sin [..., R/2] broadcastable over x's leading dims: rotates the first R
    dimensions (GPT-NeoX halves, or GPT-J pairs when interleaved), the rest passes through."""
    x = x.double()
    cos, sin = cos.double(), sin.double()
    r = 2 * cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb, with partial rotary as the models that have it
    (rotate cos.shape[-1] dimensions, pass the rest)."""
    cos, sin = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]

    def one(x):
        x = x.double()
        rot, rest = x[..., :r], x[..., r:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)

    return one(q), (None if k is None else one(k))


def flash_attn(x, cos, sin, interleaved=False, seqlen_offsets=0, cu_seqlens=None):
    """flash_attn.layers.rotary.apply_rotary_emb: x [b, s, h, d] or [t, h, d] with cu_seqlens;
    cos/sin [rows, R/2]; position = index in the sequence + seqlen_offsets (int or [b])."""
    if cu_seqlens is None:
        b, s = x.shape[:2]
        offsets = (seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor)
                   else torch.full((b,), seqlen_offsets))
        pos = torch.arange(s)[None, :] + offsets.cpu().long()[:, None]  # [b, s]
        return rotate(x, cos[pos.to(cos.device)][:, :, None], sin[pos.to(cos.device)][:, :, None],
                      interleaved)
    bounds = cu_seqlens.cpu().tolist()
    out = []
    for i in range(len(bounds) - 1):
        n = bounds[i + 1] - bounds[i]
        off = (int(seqlen_offsets[i]) if isinstance(seqlen_offsets, torch.Tensor)
               else seqlen_offsets)
        pos = (torch.arange(n) + off).to(cos.device)
        out.append(rotate(x[bounds[i]:bounds[i + 1]], cos[pos][:, None], sin[pos][:, None],
                          interleaved))
    return torch.cat(out)


def vllm(positions, query, key, head_size, cos_sin_cache, is_neox):
    """vLLM's rotary_embedding as new float64 tensors of query's/key's shapes."""
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[:, : rot // 2], cos_sin_cache[:, rot // 2:]
    pos = positions.long()

    def one(x):
        shape = x.shape
        heads = x.reshape(*pos.shape, -1, head_size)
        return rotate(heads, cos[pos][..., None, :], sin[pos][..., None, :],
                      not is_neox).reshape(shape)

    return one(query), (None if key is None else one(key))


def transformer_engine(t, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None,
                       start_positions=None):
    """TE's apply_rotary_pos_emb: freqs [rows, 1, 1, R] angles, [f, f] or interleaved."""
    angles = freqs.reshape(freqs.shape[0], freqs.shape[-1]).double()
    half = angles[:, 0::2] if interleaved else angles[:, : angles.shape[1] // 2]
    cos, sin = half.cos(), half.sin()
    if tensor_format == "thd":
        return flash_attn(t, cos, sin, interleaved, 0 if start_positions is None
                          else start_positions, cu_seqlens)
    x = t if tensor_format == "bshd" else t.transpose(0, 1)
    out = flash_attn(x, cos, sin, interleaved, 0 if start_positions is None else start_positions)
    return out if tensor_format == "bshd" else out.transpose(0, 1)


def tolerance(dtype):
    """(rtol, atol) for a result rounded once to `dtype` from fp32 math on inputs of order 1:
    half an ulp relative, plus fp32 arithmetic near zero."""
    rtol = {torch.float32: 2e-6, torch.float16: 2.0 ** -11 + 2e-6,
            torch.bfloat16: 2.0 ** -8 + 2e-6}[dtype]
    return rtol, 1e-5


def assert_close(out, ref, dtype=None):
    rtol, atol = tolerance(dtype or out.dtype)
    torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), rtol=rtol, atol=atol,
                               equal_nan=False)


@contextlib.contextmanager
def transformers_in_float64():
    """transformers' rotary modules and rope init functions name float32 at call time
    (torch.float, Tensor.float(), the default dtype): inside this context those names mean
    float64, so a module built and called inside computes in float64, as tools/hf_golden.py runs
    them. Nothing else should run inside (torch.float32 itself is rebound)."""
    saved = torch.float, torch.float32, torch.Tensor.float, torch.get_default_dtype()
    torch.float = torch.float32 = torch.float64
    torch.Tensor.float = lambda self, *args, **kwargs: self.double()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float = saved[:3]
        torch.set_default_dtype(saved[3])


def scaled_cos_sin(freqs, rotary_dim, base, scaling, seq_len, pos):
    """float64 cos/sin [..., R/2] at positions `pos` (any shape) of a frequency variant, times
    its attention factor: the library's own float64 frequencies (ropejit.inverse_frequencies),
    which tests/test_scaling.cpp checks against transformers'."""
    inv = torch.tensor(ropejit.inverse_frequencies(freqs, rotary_dim, base, scaling, seq_len),
                       dtype=torch.float64)
    factor = ropejit.attention_factor(freqs, rotary_dim, scaling, seq_len)
    angles = pos.cpu().double()[..., None] * inv
    return angles.cos() * factor, angles.sin() * factor
