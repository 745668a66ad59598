"""MLA (multi-head latent attention: DeepSeek-V2/V3, Kimi K2) around RoPE in one launch, per
token t at position positions[t] (docs/mla.md):

    cache[slots[t]] = [ RMSNorm(kv_c[t]) * norm_weight  |  rope(k_pe[t]) ]
    q_pe[t, h] = rope(q_pe[t, h])                                   (no q_out: in place)
    q_out[t, h] = [ q_nope[t, h]  |  rope(q_pe[t, h]) ]              (the decode query)

``prepare`` is the call; ``mla_prepare_op`` (``torch.ops.ropejit.mla_prepare``) the same as a
torch.library op whose cache, q_pe, q_out and skipped are mutated arguments, so
torch.compile(fullgraph=True) traces it and CUDA graphs replay it. A cache or q_out of
``torch.float8_e4m3fn`` stores the e4m3 codes of value / scale (``cache_scale`` / ``q_scale``:
float32 tensors of one element, vLLM's convention). ``tables`` builds the cos/sin tables of an
MLA model from its config.json (YaRN for DeepSeek and Kimi K2)."""

import ctypes
from typing import Optional

import torch
from torch import Tensor

from ropejit import _capi
from ropejit._cvalues import choice, fill, real
from ropejit.decode import _addresses, _plan_key, _planned, _remember_plan

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
_TABLE_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_FP8 = getattr(torch, "float8_e4m3fn", None)
# The tests run the binding on CPU tensors through a host emulation of the kernel.
_require_cuda = True

# Where each tensor argument's address goes in ropejit_mla_args, in prepare's argument order. A
# call with the shapes, strides, dtypes and devices of an earlier one (and the same eps and
# style) repeats its plan (decode.py's plan cache): the structs with this call's addresses (a
# field the plan's call does not use is ignored by C), then C, which checks them again.
_MLA_POINTERS = ("position_ids", "cos", "sin", "kv_c", "k_pe", "cache", "slots", "norm_weight",
                 "q_pe", "q_nope", "q_out", "cache_scale", "q_scale", "skipped", "k_pe_out",
                 "cache_pe", "kv_indices", "kv_indptr", "batch_indices", "page_positions",
                 "q_out_pe")
_PAGE_TABLE = ("kv_indices", "kv_indptr", "batch_indices", "page_positions")


def _fail(message):
    from ropejit.errors import InvalidArgument
    raise InvalidArgument(f"ropejit: {message}")


def _tensor(name, t, dims, dtypes=None, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch tensor, got {type(t).__name__}")
    if t.dim() != dims:
        _fail(f"{name} must be {dims}-d, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        _fail(f"{name}.dtype ({t.dtype}) must be one of {', '.join(map(str, dtypes))}")
    if device is not None and t.device != device:
        _fail(f"{name} is on {t.device}, the call on {device}")
    if t.numel() and t.stride(-1) != 1:
        _fail(f"{name} must have a contiguous last dimension, got strides {t.stride()}")
    return t


def _store(name, t, dtype, scale, scale_name):
    """"same" or "e4m3" for an output tensor, checking its scale."""
    if t.dtype == dtype:
        if scale is not None:
            _fail(f"{scale_name} is given but {name} is {t.dtype}: a scale goes with an e4m3 "
                  f"{name}")
        return "same"
    if _FP8 is not None and t.dtype == _FP8:
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or \
                scale.numel() != 1 or scale.device != t.device:
            _fail(f"{name} is float8_e4m3fn: {scale_name} must be a float32 tensor of one "
                  f"element on {t.device}")
        return "e4m3"
    _fail(f"{name}.dtype ({t.dtype}) must be {dtype} or float8_e4m3fn")


def _cache_layout(name, cache):
    """(slots, row stride, block size, block stride) of a cache: rows one stride apart ([slots,
    row] or vLLM's [blocks, block_size, row] with contiguous blocks: block size 0), or a 3-d
    [blocks, block_size, row] whose blocks are a stride of their own apart (a per-layer view of
    a cache allocated for all layers)."""
    if cache.numel() and cache.stride(-1) != 1:
        _fail(f"{name} must have a contiguous last dimension, got strides {cache.stride()}")
    try:
        rows = cache.view(-1, cache.shape[-1])
        return rows.shape[0], rows.stride(0) if rows.shape[0] > 1 else rows.shape[1], 0, 0
    except RuntimeError:
        pass
    if cache.dim() == 3 and cache.stride(2) == 1:
        return (cache.shape[0] * cache.shape[1],
                cache.stride(1) if cache.shape[1] > 1 else cache.shape[2], cache.shape[1],
                cache.stride(0))
    _fail(f"{name} of shape {tuple(cache.shape)} and strides {cache.stride()} is neither rows "
          f"one stride apart nor [blocks, block_size, row] blocks of such rows")


def tables(model, rows: Optional[int] = None, *, device=None, dtype=torch.float32):
    """cos and sin [rows, rope_dim / 2] for an MLA model, as ``prepare`` takes them: the model's
    inverse frequencies (DeepSeek's and Kimi K2's YaRN) at positions 0 .. rows - 1, times its
    attention factor, computed in float64 and rounded once to ``dtype``. ``model``: a
    ``ropejit.ModelRope`` or what ``ropejit.model_from_hf_config`` reads (a config.json path,
    its dict, a transformers config). ``rows`` defaults to max_position_embeddings."""
    from ropejit._model import ModelRope, model_from_hf_config
    if not isinstance(model, ModelRope):
        model = model_from_hf_config(model)
    if model.kv_lora_rank <= 0:
        _fail("tables: the model is not an MLA model (its config has no kv_lora_rank)")
    if model.needs_seq_len:
        _fail(f"tables: {model.freqs} frequencies depend on the sequence length; build the table "
              f"per length with ropejit.inverse_frequencies")
    if rows is None:
        rows = model.max_positions
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows > (1 << 31) - 1:
        _fail(f"tables: rows ({rows!r}) must be an int in [1, 2^31 - 1] (max_position_embeddings "
              f"when the config gives it)")
    if dtype not in _TABLE_DTYPES:
        _fail(f"tables: dtype ({dtype}) must be float32, bfloat16 or float16")
    inv = torch.tensor(model.inverse_frequencies(), dtype=torch.float64)
    factor = model.attention_factor()
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv[None, :]
    return ((angles.cos() * factor).to(dtype).to(device),
            (angles.sin() * factor).to(dtype).to(device))


def prepare(positions: Tensor, cos: Tensor, sin: Tensor, *, kv_c: Optional[Tensor] = None,
            k_pe: Optional[Tensor] = None, cache: Optional[Tensor] = None,
            slots: Optional[Tensor] = None, norm_weight: Optional[Tensor] = None,
            eps: float = 1e-6, q_pe: Optional[Tensor] = None, q_nope: Optional[Tensor] = None,
            q_out: Optional[Tensor] = None, cache_scale: Optional[Tensor] = None,
            q_scale: Optional[Tensor] = None, skipped: Optional[Tensor] = None,
            style: str = "gptj", k_pe_out: Optional[Tensor] = None, rotate_k_pe: bool = False,
            cache_pe: Optional[Tensor] = None, scale_multiplies: bool = False,
            rows_by_token: bool = False, kv_indices: Optional[Tensor] = None,
            kv_indptr: Optional[Tensor] = None, batch_indices: Optional[Tensor] = None,
            page_positions: Optional[Tensor] = None, page_size: int = 0,
            q_out_pe: Optional[Tensor] = None, _fake: bool = False) -> None:
    """positions [tokens] int32/int64; cos, sin [rows, rope_dim / 2] (f32, bf16 or f16);
    kv_c [tokens, kv_rank] and k_pe [tokens, rope_dim] (or [tokens, 1, rope_dim]) with cache
    [..., kv_rank + rope_dim] and slots [tokens] int64 (-1: padding); norm_weight [kv_rank]
    (None: no RMSNorm); q_pe [tokens, heads, rope_dim] (a view of q is fine), rotated in place,
    or with q_nope [tokens, heads, kv_rank] written into q_out [tokens, heads, kv_rank +
    rope_dim]; skipped: an int32 tensor of one element that counts slots outside the cache.
    bf16 or fp16 activations on a CUDA device; ``style`` "gptj" (DeepSeek's pairs) or "neox".

    With the cache: ``k_pe_out`` [tokens, rope_dim] receives rope(k_pe) for every token
    (``rotate_k_pe=True``: k_pe itself, in place, vLLM's fused op); ``cache_pe`` [...,
    rope_dim] holds the rows' rope part (FlashInfer's kpe_cache; ``cache`` is then [...,
    kv_rank]); ``scale_multiplies`` stores e4m3 codes of value * scale (FlashInfer's
    quant_scale). Rows are found by ``slots``, or by token (``rows_by_token``: row t for token
    t), or by FlashInfer's page table: int32 ``kv_indices``, ``kv_indptr`` [batch + 1],
    ``batch_indices`` and ``page_positions`` [tokens], ``page_size``. ``q_out_pe`` [tokens,
    heads, rope_dim] takes the assembled query's rope part (FlashInfer's q_rope_out; q_out is
    then [tokens, heads, kv_rank])."""
    if rotate_k_pe:
        if k_pe_out is not None:
            _fail("k_pe_out is given with rotate_k_pe=True: rotate_k_pe writes k_pe itself")
        if k_pe is not None and k_pe.dim() == 3 and k_pe.shape[1] == 1:
            k_pe = k_pe[:, 0]
        k_pe_out = k_pe
    tensors = (positions, cos, sin, kv_c, k_pe, cache, slots, norm_weight, q_pe, q_nope, q_out,
               cache_scale, q_scale, skipped, k_pe_out, cache_pe, kv_indices, kv_indptr,
               batch_indices, page_positions, q_out_pe)
    key = None if _fake else _plan_key(
        "mla", tensors, (eps, style, rotate_k_pe, scale_multiplies, rows_by_token, page_size))
    plan = None if key is None else _planned(key)
    if plan is not None:
        spec, a = plan[0], _capi.ropejit_mla_args.from_buffer_copy(plan[1])
        _addresses(a, _MLA_POINTERS, tensors)
        _launch(spec, a, positions.device)
        return
    first = q_pe if q_pe is not None else kv_c
    if first is None:
        _fail("prepare needs kv_c (with k_pe, cache and slots) or q_pe")
    device = first.device
    if _require_cuda and device.type != "cuda":
        _fail(f"{'q_pe' if q_pe is not None else 'kv_c'} is on {device}: MLA runs on a CUDA "
              f"device")
    dtype = first.dtype
    if dtype not in _DTYPES:
        _fail(f"the activations' dtype ({dtype}) must be bfloat16 or float16")
    _tensor("positions", positions, 1, (torch.int32, torch.int64), device)
    tokens = positions.shape[0]
    _tensor("cos", cos, 2, tuple(_TABLE_DTYPES), device)
    _tensor("sin", sin, 2, (cos.dtype,), device)
    if sin.shape != cos.shape or sin.stride() != cos.stride():
        _fail(f"sin {tuple(sin.shape)} strides {sin.stride()} must match cos "
              f"{tuple(cos.shape)} strides {cos.stride()}")
    rope_dim = 2 * cos.shape[1]

    def ptr(t):  # fake tensors (torch.compile's tracing) have no storage
        return None if _fake else t.data_ptr()

    spec = _capi.new(_capi.ropejit_mla_spec)
    a = _capi.new(_capi.ropejit_mla_args)
    fill(a, tokens=tokens, position_ids=ptr(positions), cos=ptr(cos),
         sin=ptr(sin), table_rows=cos.shape[0],
         table_stride=cos.stride(0) if cos.shape[0] > 1 else cos.shape[1])
    kv_rank = None
    fill(spec, dtype=_capi.DTYPES[_DTYPES[dtype]], rope_dim=rope_dim,
         style=choice("style", style, _capi.STYLES),
         index_type=_capi.INDEX_TYPES["i64" if positions.dtype == torch.int64 else "i32"],
         table_dtype=_capi.DTYPES[_TABLE_DTYPES[cos.dtype]],
         norm=_capi.NORMS["none" if norm_weight is None else "rms"])
    if not isinstance(scale_multiplies, bool):
        _fail(f"scale_multiplies ({scale_multiplies!r}) must be a bool")
    fill(spec, scale_multiplies=int(scale_multiplies))
    if cache is None:
        for name, t in (("k_pe_out", k_pe_out), ("cache_pe", cache_pe), ("slots", slots)) + \
                tuple(zip(_PAGE_TABLE, (kv_indices, kv_indptr, batch_indices, page_positions))):
            if t is not None:
                _fail(f"{name} is given but cache is not")
        if rows_by_token:
            _fail("rows_by_token is set but cache is not given")
    else:
        for name, t in (("kv_c", kv_c), ("k_pe", k_pe)):
            if t is None:
                _fail(f"cache is given but {name} is not")
        if k_pe.dim() == 3 and k_pe.shape[1] == 1:
            k_pe = k_pe[:, 0]
        _tensor("kv_c", kv_c, 2, (dtype,), device)
        _tensor("k_pe", k_pe, 2, (dtype,), device)
        kv_rank = kv_c.shape[1]
        if kv_c.shape[0] != tokens or k_pe.shape[0] != tokens:
            _fail(f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} must have positions' "
                  f"{tokens} tokens")
        if k_pe.shape[1] != rope_dim:
            _fail(f"k_pe has {k_pe.shape[1]} rotary elements, cos/sin {rope_dim // 2} pairs")
        row = kv_rank if cache_pe is not None else kv_rank + rope_dim
        if cache.dim() < 2 or cache.shape[-1] != row or cache.device != device:
            what = "kv_rank, the rope part in cache_pe" if cache_pe is not None else \
                "kv_rank + rope_dim"
            _fail(f"cache must be [..., {what} = {row}] on {device}, got shape "
                  f"{tuple(cache.shape)} on {cache.device}")
        store = _store("cache", cache, dtype, cache_scale, "cache_scale")
        slots_n, stride, block, block_stride = _cache_layout("cache", cache)
        fill(spec, cache_store=_capi.STORES[store])
        fill(a, kv_c=ptr(kv_c), kv_c_stride=kv_c.stride(0) if tokens > 1 else kv_rank,
             k_pe=ptr(k_pe), k_pe_stride=k_pe.stride(0) if tokens > 1 else rope_dim,
             cache=ptr(cache), cache_slots=slots_n, cache_stride=stride,
             cache_block_size=block, cache_block_stride=block_stride,
             cache_scale=ptr(cache_scale) if store == "e4m3" else None)
        _cache_rows(a, ptr, tokens, device, slots, rows_by_token,
                    (kv_indices, kv_indptr, batch_indices, page_positions), page_size)
        if cache_pe is not None:
            if cache_pe.dtype != cache.dtype or cache_pe.device != device or \
                    cache_pe.dim() < 2 or cache_pe.shape[-1] != rope_dim:
                _fail(f"cache_pe must be [..., rope_dim = {rope_dim}] of cache's dtype "
                      f"({cache.dtype}) on {device}, got shape {tuple(cache_pe.shape)}, "
                      f"{cache_pe.dtype} on {cache_pe.device}")
            pe_n, pe_stride, pe_block, pe_block_stride = _cache_layout("cache_pe", cache_pe)
            if pe_n != slots_n or (pe_block and block and pe_block != block):
                _fail(f"cache_pe {tuple(cache_pe.shape)} and cache {tuple(cache.shape)} must "
                      f"have the same rows in blocks of the same size")
            # One block size for both: rows one stride apart make blocks as well.
            if block and not pe_block:
                pe_block_stride = block * pe_stride
            elif pe_block and not block:
                fill(a, cache_block_size=pe_block, cache_block_stride=pe_block * stride)
            fill(a, cache_pe=ptr(cache_pe), cache_pe_stride=pe_stride,
                 cache_pe_block_stride=pe_block_stride)
        if k_pe_out is not None:
            _tensor("k_pe_out", k_pe_out, 2, (dtype,), device)
            if tuple(k_pe_out.shape) != tuple(k_pe.shape):
                _fail(f"k_pe_out {tuple(k_pe_out.shape)} must be k_pe's shape "
                      f"{tuple(k_pe.shape)}")
            fill(a, k_pe_out=ptr(k_pe_out),
                 k_pe_out_stride=k_pe_out.stride(0) if tokens > 1 else rope_dim)
        if norm_weight is not None:
            _tensor("norm_weight", norm_weight, 1, (dtype,), device)
            if norm_weight.shape[0] != kv_rank:
                _fail(f"norm_weight has {norm_weight.shape[0]} elements, kv_c {kv_rank}")
            fill(a, norm_weight=ptr(norm_weight))
            a.norm_eps = real("eps", eps)
        if skipped is not None:
            _tensor("skipped", skipped, 1, (torch.int32,), device)
            fill(a, skipped=ptr(skipped))
    if q_pe is not None:
        _tensor("q_pe", q_pe, 3, (dtype,), device)
        if q_pe.shape[0] != tokens or q_pe.shape[2] != rope_dim:
            _fail(f"q_pe must be [tokens = {tokens}, heads, rope_dim = {rope_dim}], got shape "
                  f"{tuple(q_pe.shape)}")
        heads = q_pe.shape[1]
        fill(a, heads=heads, q_pe=ptr(q_pe), q_pe_token_stride=q_pe.stride(0),
             q_pe_head_stride=q_pe.stride(1))
        if q_out is not None:
            if q_nope is None:
                _fail("q_out is given but q_nope is not: the decode query is [q_nope | rope(q_pe)]")
            _tensor("q_nope", q_nope, 3, (dtype,), device)
            rank = q_nope.shape[2]
            if kv_rank is not None and rank != kv_rank:
                _fail(f"q_nope has {rank} elements a head, kv_c {kv_rank}")
            kv_rank = rank
            _tensor("q_out", q_out, 3, None, device)
            width = kv_rank if q_out_pe is not None else kv_rank + rope_dim
            if q_nope.shape[:2] != q_pe.shape[:2] or tuple(q_out.shape) != (tokens, heads, width):
                _fail(f"q_nope {tuple(q_nope.shape)} and q_out {tuple(q_out.shape)} must be "
                      f"[{tokens}, {heads}, kv_rank] and [{tokens}, {heads}, "
                      f"{'kv_rank' if q_out_pe is not None else f'kv_rank + {rope_dim}'}]")
            q_store = _store("q_out", q_out, dtype, q_scale, "q_scale")
            if q_out_pe is not None:
                _tensor("q_out_pe", q_out_pe, 3, (q_out.dtype,), device)
                if tuple(q_out_pe.shape) != (tokens, heads, rope_dim):
                    _fail(f"q_out_pe {tuple(q_out_pe.shape)} must be [{tokens}, {heads}, "
                          f"{rope_dim}]")
                fill(a, q_out_pe=ptr(q_out_pe), q_out_pe_token_stride=q_out_pe.stride(0),
                     q_out_pe_head_stride=q_out_pe.stride(1))
            fill(spec, query=_capi.MLA_QUERIES["assemble"], q_store=_capi.STORES[q_store])
            fill(a, q_nope=ptr(q_nope), q_nope_token_stride=q_nope.stride(0),
                 q_nope_head_stride=q_nope.stride(1), q_out=ptr(q_out),
                 q_out_token_stride=q_out.stride(0), q_out_head_stride=q_out.stride(1),
                 q_scale=ptr(q_scale) if q_store == "e4m3" else None)
        elif q_nope is not None:
            _fail("q_nope is given but q_out is not")
        elif q_out_pe is not None:
            _fail("q_out_pe is given but q_out is not")
    if kv_rank is None:
        kv_rank = 512  # the query alone in place: the rank shapes no operand of the call
    fill(spec, kv_rank=kv_rank)
    if _fake or tokens == 0:
        return
    _launch(spec, a, device)
    _remember_plan(key, (spec, bytes(a)))


def _cache_rows(a, ptr, tokens, device, slots, rows_by_token, table, page_size):
    """How the call finds each token's cache row: slots, its own index, or a page table."""
    given = [t is not None for t in table]
    ways = (slots is not None) + bool(rows_by_token) + any(given)
    if ways != 1:
        _fail(f"slots, rows_by_token and the page table ({', '.join(_PAGE_TABLE)}) are three "
              f"ways to find the cache rows: give exactly one, not {ways}")
    if slots is not None:
        _tensor("slots", slots, 1, (torch.int64,), device)
        if slots.shape[0] != tokens:
            _fail(f"slots {tuple(slots.shape)} must have positions' {tokens} tokens")
        fill(a, slots=ptr(slots))
    elif rows_by_token:
        fill(a, rows_by_token=1)
    else:
        if not all(given):
            _fail(f"the page table needs all of {', '.join(_PAGE_TABLE)}; "
                  f"{_PAGE_TABLE[given.index(False)]} is missing")
        for name, t in zip(_PAGE_TABLE, table):
            _tensor(name, t, 1, (torch.int32,), device)
        if table[2].shape[0] != tokens or table[3].shape[0] != tokens:
            _fail(f"batch_indices {tuple(table[2].shape)} and page_positions "
                  f"{tuple(table[3].shape)} must have positions' {tokens} tokens")
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            _fail(f"page_size ({page_size!r}) must be an int")
        fill(a, kv_indices=ptr(table[0]), kv_indptr=ptr(table[1]), batch_indices=ptr(table[2]),
             page_positions=ptr(table[3]), batch=table[1].shape[0] - 1,
             num_indices=table[0].shape[0], page_size=page_size)


def _launch(spec, args, device):
    with torch.cuda.device(device):
        fill(args, stream=torch.cuda.current_stream(device).cuda_stream)
        _capi.check(_capi.lib.ropejit_mla_prepare(ctypes.byref(spec), ctypes.byref(args)))


def key(dtype="bf16", kv_rank=512, rope_dim=64, style="gptj", index_type="i64",
        table_dtype="f32", norm="rms", cache_store="same", query="in_place", q_store="same",
        scale_multiplies=False):
    """The key string of an MLA kernel (no GPU needed)."""
    s = fill(_capi.new(_capi.ropejit_mla_spec), kv_rank=kv_rank, rope_dim=rope_dim,
             scale_multiplies=int(bool(scale_multiplies)))
    fill(s, **{name: choice(name, value, table) for name, (value, table) in dict(
        dtype=(dtype, _capi.DTYPES), style=(style, _capi.STYLES),
        index_type=(index_type, _capi.INDEX_TYPES), table_dtype=(table_dtype, _capi.DTYPES),
        norm=(norm, _capi.NORMS), cache_store=(cache_store, _capi.STORES),
        query=(query, _capi.MLA_QUERIES), q_store=(q_store, _capi.STORES)).items()})
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_mla_key(ctypes.byref(s), buf, len(buf)))
    return buf.value.decode()


def _op_impl(positions: Tensor, cos: Tensor, sin: Tensor, kv_c: Optional[Tensor],
             k_pe: Optional[Tensor], cache: Optional[Tensor], slots: Optional[Tensor],
             norm_weight: Optional[Tensor], eps: float, q_pe: Optional[Tensor],
             q_nope: Optional[Tensor], q_out: Optional[Tensor], cache_scale: Optional[Tensor],
             q_scale: Optional[Tensor], skipped: Optional[Tensor], style: str) -> None:
    prepare(positions, cos, sin, kv_c=kv_c, k_pe=k_pe, cache=cache, slots=slots,
            norm_weight=norm_weight, eps=eps, q_pe=q_pe, q_nope=q_nope, q_out=q_out,
            cache_scale=cache_scale, q_scale=q_scale, skipped=skipped, style=style)


# The op takes prepare's arguments up to style. Its schema stays as it is: PyTorch 2.11's
# functionalization fails on mutated arguments that a call leaves to their defaults, so the
# outputs prepare gained later (k_pe_out, cache_pe, q_out_pe) are not optional arguments here.
mla_prepare_op = torch.library.custom_op("ropejit::mla_prepare", _op_impl,
                                         mutates_args=("cache", "q_pe", "q_out", "skipped"))


@mla_prepare_op.register_fake
def _op_fake(positions, cos, sin, kv_c, k_pe, cache, slots, norm_weight, eps, q_pe, q_nope,
             q_out, cache_scale, q_scale, skipped, style):
    prepare(positions, cos, sin, kv_c=kv_c, k_pe=k_pe, cache=cache, slots=slots,
            norm_weight=norm_weight, eps=eps, q_pe=q_pe, q_nope=q_nope, q_out=q_out,
            cache_scale=cache_scale, q_scale=q_scale, skipped=skipped, style=style, _fake=True)
