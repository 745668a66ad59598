"""FlashInfer's MLA RoPE + FP8 functions (flashinfer.rope) on ropejit's MLA kernel, one launch
each, same signatures and returns:

    mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, ...)
    rope_quantize_fp8(...)                            its MLA form (k_rope 2-d)
    rope_quantize_fp8_append_paged_kv_cache(...)      its MLA form: (ckv_cache, kpe_cache)

Per token, rope(q_rope) and rope(k_rope) by the float32 cos_sin_cache row at pos_ids (cos in
the first half, sin in the second; is_neox: GPT-NeoX halves, else interleaved pairs), then
every part as e4m3 codes of value * quant_scale (q's scale for the query, kv's for the key).
The key goes to k_rope_out / k_nope_out, or to the paged cache through FlashInfer's page table
(kv_indices, kv_indptr, batch_indices, positions, page_size).

Differences from FlashInfer's:
- the GQA/MHA forms (k_rope 3-d) and e5m2 outputs are refused: ropejit.fused covers GQA with
  e4m3; q_nope and k_nope are required (kv_rank a multiple of 8);
- a position outside cos_sin_cache gives NaN codes for that token's rotated parts, and a
  token whose page lies past its request's own kv_indices entries is not written (FlashInfer
  would write into the next request's page); a batch index outside the batch is padding;
- quant scales may also be float32 device tensors of one element (graph-safe scales);
- the rotation is fp32 with one rounding before the scale, so codes agree with FlashInfer's
  except where its intermediate rounding lands on the other side of an e4m3 boundary."""

import torch

from ropejit.errors import InvalidArgument

_FP8 = getattr(torch, "float8_e4m3fn", None)


def _fail(message):
    raise InvalidArgument(f"ropejit: {message}")


# (device, value) -> a float32 device tensor of one element: a Python float scale made once.
_SCALES = {}


def _scale(name, value, device):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype != torch.float32 or value.device != device:
            _fail(f"{name} as a tensor must be float32 with one element on {device}, got "
                  f"{value.dtype} {tuple(value.shape)} on {value.device}")
        return value.reshape(1)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(f"{name} ({value!r}) must be a float or a float32 tensor of one element")
    key = (device, float(value))
    have = _SCALES.get(key)
    if have is not None:
        return have
    made = torch.tensor([float(value)], dtype=torch.float32, device=device)
    # Tensors made while a CUDA graph is captured are filled only when it replays: not kept.
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        _SCALES[key] = made
    return made


def _same_shapes(pairs):
    """Each given output has its input's shape (a row a token, a head a head)."""
    for name, out, like in pairs:
        if tuple(out.shape) != tuple(like.shape):
            _fail(f"{name} has shape {tuple(out.shape)}, its input {tuple(like.shape)}")


def _mla_inputs(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, quantize_dtype, outputs):
    """Checks the MLA form's inputs; returns (cos, sin, the outputs' dtype: e4m3)."""
    if k_rope.dim() != 2:
        _fail(f"k_rope has shape {tuple(k_rope.shape)}: ropejit's FlashInfer drop-in takes the "
              f"MLA form (k_rope [nnz, rope_dim]); for GQA/MHA use ropejit.fused")
    if q_nope is None or k_nope is None:
        _fail("q_nope and k_nope are required (the MLA form with a latent part)")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2:
        _fail(f"cos_sin_cache must be float32 [max_seq_len, rope_dim], got "
              f"{cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)}")
    if q_rope.dim() != 3 or q_nope.dim() != 3 or k_nope.dim() != 2:
        _fail(f"q_rope {tuple(q_rope.shape)}, q_nope {tuple(q_nope.shape)} and k_nope "
              f"{tuple(k_nope.shape)} must be [nnz, heads, rope_dim], [nnz, heads, no_rope_dim] "
              f"and [nnz, no_rope_dim]")
    if q_nope.shape[2] != k_nope.shape[1]:
        _fail(f"q_nope has {q_nope.shape[2]} latent elements a head, k_nope {k_nope.shape[1]}")
    if cos_sin_cache.shape[1] != q_rope.shape[2] or k_rope.shape[1] != q_rope.shape[2]:
        _fail(f"cos_sin_cache {tuple(cos_sin_cache.shape)}, q_rope {tuple(q_rope.shape)} and "
              f"k_rope {tuple(k_rope.shape)} must share rope_dim")
    if quantize_dtype is None:
        quantize_dtype = next((o.dtype for o in outputs if o is not None), _FP8)
    if _FP8 is None or quantize_dtype != _FP8:
        _fail(f"quantize_dtype ({quantize_dtype}) must be torch.float8_e4m3fn")
    half = cos_sin_cache.shape[1] // 2
    return cos_sin_cache[:, :half], cos_sin_cache[:, half:], quantize_dtype


def mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True,
                          quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0,
                          q_rope_out=None, k_rope_out=None, q_nope_out=None, k_nope_out=None,
                          enable_pdl=False):
    """flashinfer.rope.mla_rope_quantize_fp8: returns (q_rope_out, k_rope_out, q_nope_out,
    k_nope_out), allocating the ones not given. One launch: the key's parts are written as
    cache rows of one token each, the query assembled into its two outputs. enable_pdl is
    accepted; ropejit decides programmatic launches itself (ROPEJIT_PDL)."""
    from ropejit import mla
    cos, sin, qdt = _mla_inputs(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, quantize_dtype,
                                (q_rope_out, k_rope_out, q_nope_out, k_nope_out))
    q_rope_out = torch.empty_like(q_rope, dtype=qdt) if q_rope_out is None else q_rope_out
    k_rope_out = torch.empty_like(k_rope, dtype=qdt) if k_rope_out is None else k_rope_out
    q_nope_out = torch.empty_like(q_nope, dtype=qdt) if q_nope_out is None else q_nope_out
    k_nope_out = torch.empty_like(k_nope, dtype=qdt) if k_nope_out is None else k_nope_out
    _same_shapes((("q_rope_out", q_rope_out, q_rope), ("k_rope_out", k_rope_out, k_rope),
                  ("q_nope_out", q_nope_out, q_nope), ("k_nope_out", k_nope_out, k_nope)))
    device = q_rope.device
    mla.prepare(pos_ids, cos, sin, kv_c=k_nope, k_pe=k_rope, cache=k_nope_out,
                cache_pe=k_rope_out, rows_by_token=True,
                cache_scale=_scale("quant_scale_kv", quant_scale_kv, device),
                q_pe=q_rope, q_nope=q_nope, q_out=q_nope_out, q_out_pe=q_rope_out,
                q_scale=_scale("quant_scale_q", quant_scale_q, device),
                style="neox" if is_neox else "gptj", scale_multiplies=True)
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out


def rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True,
                      quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0,
                      q_rope_out=None, k_rope_out=None, q_nope_out=None, k_nope_out=None,
                      enable_pdl=False, backend="cuda"):
    """flashinfer.rope.rope_quantize_fp8 in its MLA form (k_rope [nnz, rope_dim]): as
    mla_rope_quantize_fp8. `backend` is accepted and ignored."""
    return mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids,
                                 is_neox, quantize_dtype, quant_scale_q, quant_scale_kv,
                                 q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl)


def rope_quantize_fp8_append_paged_kv_cache(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache,
                                            pos_ids, paged_kv_cache, kv_indices, kv_indptr,
                                            batch_indices, positions, is_neox=True,
                                            quantize_dtype=None, quant_scale_q=1.0,
                                            quant_scale_kv=1.0, page_size=16, kv_layout="NHD",
                                            q_rope_out=None, q_nope_out=None, enable_pdl=False):
    """flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache in its MLA form: the key's
    [k_nope | rope(k_rope)] as e4m3 into paged_kv_cache = (ckv_cache [pages, page_size,
    no_rope_dim], kpe_cache [pages, page_size, rope_dim]) at the page of positions[t] in
    request batch_indices[t]; returns (q_rope_out, q_nope_out). One launch; int32 page-table
    tensors (others are converted, as FlashInfer does). kv_layout is ignored, as for MLA in
    FlashInfer."""
    from ropejit import mla
    if v is not None:
        _fail("v must be None in the MLA form (k_nope is the compressed KV)")
    cos, sin, qdt = _mla_inputs(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, quantize_dtype,
                                (q_rope_out, q_nope_out))
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        _fail("paged_kv_cache must be a tuple (ckv_cache, kpe_cache)")
    ckv, kpe = paged_kv_cache
    for name, t, width in (("ckv_cache", ckv, k_nope.shape[1]), ("kpe_cache", kpe,
                                                                   k_rope.shape[1])):
        if t.dtype != qdt or t.dim() != 3 or t.shape[1] != page_size or t.shape[2] != width:
            _fail(f"{name} must be {qdt} [pages, page_size = {page_size}, {width}], got "
                  f"{t.dtype} {tuple(t.shape)}")
    if q_rope_out is None:
        q_rope_out = torch.empty_like(q_rope, dtype=qdt)
    if q_nope_out is None:
        q_nope_out = torch.empty_like(q_nope, dtype=qdt)
    _same_shapes((("q_rope_out", q_rope_out, q_rope), ("q_nope_out", q_nope_out, q_nope)))
    device = q_rope.device
    table = [t if t.dtype == torch.int32 else t.int()
             for t in (kv_indices, kv_indptr, batch_indices, positions)]
    mla.prepare(pos_ids, cos, sin, kv_c=k_nope, k_pe=k_rope, cache=ckv, cache_pe=kpe,
                kv_indices=table[0], kv_indptr=table[1], batch_indices=table[2],
                page_positions=table[3], page_size=page_size,
                cache_scale=_scale("quant_scale_kv", quant_scale_kv, device),
                q_pe=q_rope, q_nope=q_nope, q_out=q_nope_out, q_out_pe=q_rope_out,
                q_scale=_scale("quant_scale_q", quant_scale_q, device),
                style="neox" if is_neox else "gptj", scale_multiplies=True)
    return q_rope_out, q_nope_out
