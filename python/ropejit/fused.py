"""The fused keys (docs/fusions.md) from Python: a serving step's QK-norm, RoPE, FP8 q and
KV-cache append in one launch, on torch tensors or any CUDA arrays ``ropejit.apply`` takes.

    import ropejit.fused
    # Qwen3-style decode step: q, k, v are views of the packed QKV projection output
    # [tokens, heads, head_dim]; k and v go into an FP8 paged cache, q out as FP8.
    ropejit.fused.qk_norm_rope(
        q, k, v, layout="thd", cu_seqlens=cu_seqlens, position_ids=ids, cos=cos, sin=sin,
        norm="rms", q_norm_weight=q_norm.weight, k_norm_weight=k_norm.weight, norm_eps=1e-6,
        q_out=q_fp8, out_scale=1 / q_scale, write_k=False,
        k_cache=k_pages, v_cache=v_pages, kv_indptr=indptr, kv_indices=indices,
        kv_last_page_len=last_page_len, k_scale=1 / k_scale, v_scale=1 / v_scale)

Every RoPE argument is ``ropejit.apply``'s (layouts, styles, partial rotary, positions, tables
or computed and scaled frequencies, mRoPE). The fused stages:

- ``norm``: ``"rms"`` (each head over head_dim with ``q_norm_weight`` / ``k_norm_weight``
  ``[head_dim]``: Qwen3), ``"rms_one_plus"`` (weights applied as ``1 + w``: Gemma 3),
  ``"rms_all_heads"`` (over all q (all k) heads of a token, weights ``[heads * head_dim]``:
  OLMo 2), or None. fp32, before RoPE, over the whole head.
- outputs: in place unless ``q_out`` (and ``k_out``) are given; ``q_out`` of dtype
  ``torch.float8_e4m3fn`` stores ``value * out_scale`` as FP8 e4m3 (round to nearest even,
  saturating). ``write_k=False``: k goes only to the cache.
- dynamic FP8 (a scale per token and head, computed in the kernel): give ``q_out_scale`` (and
  ``k_out_scale`` with ``k_out``), float32 shaped like ``q_out`` without head_dim (thd:
  ``[tokens, heads]``), instead of ``out_scale``; ``k_cache_scales`` (and ``v_cache_scales``)
  shaped like the cache without head_dim (NHD ``[pages, page_size, kv_heads]``, HND
  ``[pages, kv_heads, page_size]``) instead of ``k_scale`` / ``v_scale``. Each head is stored
  as ``value * 448 / a`` with ``a = max(amax, 2**-9)`` over the head after norm and RoPE, and
  ``a / 448`` is written to its scale element: ``fp8.float() * scale`` gives the value back.
- the KV cache: ``k_cache`` (and ``v_cache``, with ``v``) in the activation dtype or
  ``torch.float8_e4m3fn`` (stored ``value * k_scale`` / ``* v_scale``), 4-d: ``kv_layout``
  ``"NHD"`` ``[pages, page_size, kv_heads, head_dim]`` or ``"HND"``
  ``[pages, kv_heads, page_size, head_dim]``, any page stride. Addressing, by the arguments
  given: a page table ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` (int32, FlashInfer's;
  lengths after this call's append), a flat ``slot_mapping`` (int64, vLLM's, indexed like
  position ids; negative: not written), or ``cache_seqlens`` (int32, tokens each sequence held
  before the call; the cache is ``[batch, max_seq, kv_heads, head_dim]``). Slots and pages read
  from device memory that fall outside the cache are never written: such a token is skipped
  and counted in ``skipped`` (an int32 tensor of one element, when given).

Launches on torch's current stream (``stream`` to override), CUDA-graph safe once the key has been
used outside a capture. A call with the shapes, strides, dtypes and arguments of an earlier one
reuses its plan (the checks and structs; the C API still checks every call's addresses). Returns
the written ``(q, k)`` (``q_out``/``k_out`` when given; k is None when ``write_k`` is False). Bad
input raises ``ropejit.InvalidArgument`` naming the argument; nothing is written then.
"""

import ctypes
import sys

from ropejit import _apply, _call, _capi, _tensors
from ropejit._call import _fail, _is_row_major, _numel, _operand
from ropejit._cvalues import fill, real, shown

NORMS = ("rms", "rms_one_plus", "rms_all_heads")
KV_LAYOUTS = tuple(_call.KV_AXES)
_FP8 = "e4m3"


def _index_vector(chk, v, count, dtype, what):
    chk.device_of(v)
    chk.dtype_of(v, (dtype,), what)
    if v.ndim != 1 or (count is not None and v.shape[0] != count) or not _is_row_major(v):
        want = "" if count is None else f" of {count} elements"
        _fail(f"{v.name} must be a contiguous 1-d tensor{want} ({what}), got shape "
              f"{list(v.shape)} strides {list(v.strides)}")


def _same_as(chk, v, dtype, dtype_of, like):
    """v on the call's device, of `dtype` (the dtype of argument `dtype_of`), shaped like
    `like`."""
    chk.device_of(v)
    if v.dtype != dtype:
        _fail(f"{v.name}.dtype ({v.dtype}) must equal {dtype_of}.dtype ({dtype})")
    if tuple(v.shape) != tuple(like.shape):
        _fail(f"{v.name} has shape {list(v.shape)}, {like.name} has {list(like.shape)}")


def _cache_layout(v, kv_layout):
    """(pages, page_size, heads, head_dim, stride_page, stride_slot, stride_head) of a cache."""
    if v.ndim != 4:
        dims = ("[pages, page_size, kv_heads, head_dim]" if kv_layout == "NHD"
                else "[pages, kv_heads, page_size, head_dim]")
        _fail(f"{v.name} must be 4-d, {kv_layout} {dims}, got shape {list(v.shape)}")
    if v.strides[3] != 1 and v.shape[3] != 1:
        _fail(f"{v.name} needs a contiguous last dimension (stride 1), got strides "
              f"{list(v.strides)}")
    page, slot, head = _call.KV_AXES[kv_layout]
    n, s = v.shape, v.strides
    return n[page], n[slot], n[head], n[3], s[page], s[slot], s[head]


def _scale_view(chk, s, like, where=""):
    """Checks a dynamic FP8 scale tensor: float32 on the call's device, shaped like the tensor
    it scales (`like`) without head_dim."""
    chk.device_of(s)
    if s.dtype != "f32":
        _fail(f"{s.name}.dtype ({s.dtype}) must be float32")
    if tuple(s.shape) != tuple(like.shape[:-1]):
        _fail(f"{s.name} has shape {list(s.shape)}; it must be {like.name}'s without head_dim "
              f"{list(like.shape[:-1])}{where}")


def _scales(chk, s, out, layout):
    """The ropejit_tensor of a dynamic output's scales (any strides): an operand's axes without
    head_dim, which _operand does not read."""
    _scale_view(chk, s, out)
    return _operand(s, layout)


def _cache_scales(chk, s, cache, kv_layout):
    """(pointer, stride_page, stride_slot, stride_head) of a dynamic cache's scales (any
    strides)."""
    _scale_view(chk, s, cache, f" ({kv_layout})")
    return (s.ptr, *(s.strides[axis] for axis in _call.KV_AXES[kv_layout]))


def plan(qv, kv, vv, views, *, layout, style, rotary_dim, position_offset, base, freqs,
         scaling, seq_len, mrope_section, mrope_interleaved, norm, norm_eps, out_scale,
         write_k, kv_layout, k_scale, v_scale):
    # Optional views also read here: q_out_scale, k_out_scale, k_cache_scales, v_cache_scales.
    """(ropejit_spec, ropejit_args) of a fused call from its Views (`views`: the optional ones
    by argument name, None when absent). Raises InvalidArgument naming the argument."""
    spec0, a = _call.plan(qv, kv, cos=views["cos"], sin=views["sin"],
                          position_ids=views["position_ids"], seq_offsets=views["seq_offsets"],
                          cu_seqlens=views["cu_seqlens"], layout=layout, style=style,
                          rotary_dim=rotary_dim, position_offset=position_offset, base=base,
                          freqs=freqs, scaling=scaling, seq_len=seq_len,
                          mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    spec = _capi.ropejit_spec.from_buffer_copy(spec0)  # _call's specs are shared: a copy
    chk = _call._Checker(qv, False)
    _, _, q_heads, head_dim = _call._dims(qv, layout)
    k_heads = 0 if kv is None else _call._dims(kv, layout)[2]

    # v: the k heads' shape, in the activation dtype.
    if vv is not None:
        if kv is None:
            _fail("v is given without k")
        _same_as(chk, vv, qv.dtype, "q", kv)
        _call._dims(vv, layout)
        a.v = _operand(vv, layout)

    # QK-norm.
    if norm is not None:
        _call._choice("norm", norm, NORMS)
        spec.norm = _capi.NORMS[norm]
        if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or \
                not 0 <= norm_eps < float("inf"):
            _fail(f"norm_eps ({shown(norm_eps)}) must be a finite number >= 0")
        fill(a, norm_eps=norm_eps)
        for name, heads in (("q_norm_weight", q_heads), ("k_norm_weight", k_heads)):
            w = views[name]
            if heads == 0:
                if w is not None:
                    _fail(f"{name} is given but there are no k heads")
                continue
            if w is None:
                _fail(f"norm {norm!r} needs {name}")
            count = head_dim * (heads if norm == "rms_all_heads" else 1)
            chk.device_of(w)
            if w.dtype != qv.dtype:
                _fail(f"{name}.dtype ({w.dtype}) must equal q.dtype ({qv.dtype})")
            if _numel(w) != count or not _is_row_major(w):
                _fail(f"{name} must be contiguous with {count} elements "
                      f"({'heads * head_dim' if norm == 'rms_all_heads' else 'head_dim'}), got "
                      f"shape {list(w.shape)}")
            fill(a, **{name: w.ptr})
    else:
        for name in ("q_norm_weight", "k_norm_weight"):
            if views[name] is not None:
                _fail(f"{name} is given but norm is None: name the norm ({', '.join(NORMS)})")

    # Outputs: in place, to q_out/k_out in the activation dtype, or FP8.
    q_out, k_out = views["q_out"], views["k_out"]
    if not isinstance(write_k, bool):
        _fail(f"write_k ({shown(write_k)}) must be True or False")
    if q_out is not None:
        spec.in_place = 0
        chk.device_of(q_out)
        if q_out.dtype not in (qv.dtype, _FP8):
            _fail(f"q_out.dtype ({q_out.dtype}) must be q's ({qv.dtype}) or float8_e4m3fn")
        if tuple(q_out.shape) != tuple(qv.shape):
            _fail(f"q_out has shape {list(q_out.shape)}, q has {list(qv.shape)}")
        _call._dims(q_out, layout)
        a.q_out = _operand(q_out, layout)
        dynamic = views["q_out_scale"] is not None
        if q_out.dtype == _FP8:
            spec.out_store = 2 if dynamic else 1
            if isinstance(out_scale, bool) or not isinstance(out_scale, (int, float)):
                _fail(f"out_scale ({shown(out_scale)}) must be a number")
            if dynamic and out_scale != 1.0:
                _fail(f"out_scale ({shown(out_scale)}) and q_out_scale are both given: q_out_scale "
                      "asks for a scale per token and head, computed by the kernel")
            a.out_quant_scale = real("out_scale", out_scale, ctypes.c_float)
        elif dynamic:
            _fail(f"q_out_scale is given but q_out.dtype is {q_out.dtype}: dynamic scales are "
                  "for float8_e4m3fn outputs")
        if kv is not None and write_k:
            if k_out is None:
                _fail("k_out is missing: out of place needs an output for k (or write_k=False)")
            _same_as(chk, k_out, q_out.dtype, "q_out", kv)
            a.k_out = _operand(k_out, layout)
        elif k_out is not None:
            _fail("k_out is given but k is not written (write_k=False or no k)")
        if dynamic:
            a.q_out_scale = _scales(chk, views["q_out_scale"], q_out, layout)
            if k_out is not None:
                if views["k_out_scale"] is None:
                    _fail("k_out_scale is missing: q_out_scale asks for dynamic scales, and k "
                          "is written to k_out")
                a.k_out_scale = _scales(chk, views["k_out_scale"], k_out, layout)
            elif views["k_out_scale"] is not None:
                _fail("k_out_scale is given but k is not written out (no k_out)")
        elif views["k_out_scale"] is not None:
            _fail("k_out_scale is given without q_out_scale")
    elif k_out is not None:
        _fail("k_out is given without q_out: out of place needs q_out")
    elif views["q_out_scale"] is not None or views["k_out_scale"] is not None:
        _fail("q_out_scale / k_out_scale are given without q_out: scales go with FP8 outputs")

    # The KV cache.
    k_cache, v_cache = views["k_cache"], views["v_cache"]
    modes = [m for m, names in (("paged", ("kv_indptr", "kv_indices", "kv_last_page_len")),
                                ("slots", ("slot_mapping",)), ("contiguous", ("cache_seqlens",)))
             if any(views[n] is not None for n in names)]
    cache_scales = views["k_cache_scales"], views["v_cache_scales"]
    if k_cache is None:
        if any(s is not None for s in cache_scales):
            _fail("k_cache_scales / v_cache_scales are given without k_cache")
        if v_cache is not None or modes:
            _fail("v_cache or a cache's addressing (kv_indptr, slot_mapping, cache_seqlens) is "
                  "given without k_cache")
        if not write_k:
            _fail("write_k=False writes k only into the KV cache, but k_cache is not given")
    else:
        if kv is None:
            _fail("k_cache is given without k")
        if len(modes) != 1:
            _fail("k_cache needs one addressing: kv_indptr + kv_indices + kv_last_page_len "
                  "(paged), slot_mapping (slots) or cache_seqlens (contiguous)"
                  + (f"; got {' and '.join(modes)}" if modes else ""))
        mode = modes[0]
        _call._choice("kv_layout", kv_layout, KV_LAYOUTS)
        chk.device_of(k_cache)
        if k_cache.dtype not in (qv.dtype, _FP8):
            _fail(f"k_cache.dtype ({k_cache.dtype}) must be q's ({qv.dtype}) or float8_e4m3fn")
        pages, page_size, heads, dim, s_page, s_slot, s_head = _cache_layout(k_cache, kv_layout)
        if (heads, dim) != (k_heads, head_dim):
            _fail(f"k_cache has shape {list(k_cache.shape)} ({kv_layout}): {heads} heads of "
                  f"{dim}, k has {k_heads} of {head_dim}")
        if v_cache is not None:
            if vv is None:
                _fail("v_cache is given without v")
            chk.device_of(v_cache)
            if (v_cache.dtype, tuple(v_cache.shape), tuple(v_cache.strides)) != (
                    k_cache.dtype, tuple(k_cache.shape), tuple(k_cache.strides)):
                _fail(f"v_cache ({v_cache.dtype} {list(v_cache.shape)} strides "
                      f"{list(v_cache.strides)}) must match k_cache ({k_cache.dtype} "
                      f"{list(k_cache.shape)} strides {list(k_cache.strides)})")
        elif vv is not None:
            _fail("v is given without v_cache: v is only appended to the cache")
        spec.cache = {"contiguous": 1, "paged": 2, "slots": 3}[mode]
        c = fill(a.cache, "cache.", k=k_cache.ptr, v=None if v_cache is None else v_cache.ptr,
                 pages=pages, page_size=page_size, stride_page=s_page, stride_slot=s_slot,
                 stride_head=s_head)
        dynamic_cache = cache_scales[0] is not None
        if k_cache.dtype == _FP8:
            spec.cache_store = 2 if dynamic_cache else 1
            for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    _fail(f"{name} ({shown(value)}) must be a number")
                if dynamic_cache and value != 1.0:
                    _fail(f"{name} ({shown(value)}) and k_cache_scales are both given: "
                          "k_cache_scales asks for a scale per token and head, computed by "
                          "the kernel")
            c.k_quant_scale = real("k_scale", k_scale, ctypes.c_float)
            c.v_quant_scale = real("v_scale", v_scale, ctypes.c_float)
        elif dynamic_cache:
            _fail(f"k_cache_scales is given but k_cache.dtype is {k_cache.dtype}: dynamic "
                  "scales are for a float8_e4m3fn cache")
        if dynamic_cache:
            fill(c, "cache.", **dict(zip(
                ("k_scales", "scale_stride_page", "scale_stride_slot", "scale_stride_head"),
                _cache_scales(chk, cache_scales[0], k_cache, kv_layout))))
            if v_cache is not None:
                if cache_scales[1] is None:
                    _fail("v_cache_scales is missing: k_cache_scales asks for dynamic scales, "
                          "and v is cached")
                v_scales = _cache_scales(chk, cache_scales[1], v_cache, kv_layout)
                if v_scales[1:] != (c.scale_stride_page, c.scale_stride_slot,
                                    c.scale_stride_head):
                    _fail(f"v_cache_scales (strides {list(cache_scales[1].strides)}) must match "
                          f"k_cache_scales (strides {list(cache_scales[0].strides)})")
                fill(c, "cache.", v_scales=v_scales[0])
            elif cache_scales[1] is not None:
                _fail("v_cache_scales is given but v_cache is not")
        elif cache_scales[1] is not None:
            _fail("v_cache_scales is given without k_cache_scales")
        batch = a.batch
        if mode == "paged":
            for name in ("kv_indptr", "kv_indices", "kv_last_page_len"):
                if views[name] is None:
                    _fail(f"a paged cache needs kv_indptr, kv_indices and kv_last_page_len; "
                          f"{name} is missing")
            _index_vector(chk, views["kv_indptr"], batch + 1, "i32", "batch + 1 page offsets")
            _index_vector(chk, views["kv_indices"], None, "i32", "page numbers")
            _index_vector(chk, views["kv_last_page_len"], batch, "i32",
                          "tokens in each sequence's last page, after the append")
            fill(c, "cache.", indptr=views["kv_indptr"].ptr, indices=views["kv_indices"].ptr,
                 num_indices=views["kv_indices"].shape[0],
                 last_page_len=views["kv_last_page_len"].ptr)
        elif mode == "slots":
            tokens = _numel(qv) // (q_heads * head_dim) if q_heads * head_dim else 0
            _index_vector(chk, views["slot_mapping"], tokens, "i64", "one slot per token")
            fill(c, "cache.", slot_mapping=views["slot_mapping"].ptr)
        else:
            _index_vector(chk, views["cache_seqlens"], batch, "i32",
                          "tokens each sequence held before the call")
            fill(c, "cache.", seq_lens=views["cache_seqlens"].ptr)
        if views["skipped"] is not None:
            _index_vector(chk, views["skipped"], 1, "i32", "a counter of skipped tokens")
            fill(c, "cache.", skipped=views["skipped"].ptr)
    if k_cache is None and views["skipped"] is not None:
        _fail("skipped counts tokens the cache append skips, but k_cache is not given")
    if not write_k:
        spec.fusion = 1
    return spec, a


def _planned(qv, views, opts, torch_key=None):
    """(spec, args) for the call, from the plan cache (_call.cached_plan) or plan()."""
    return _call.cached_plan("fused", (qv, *views.values()), opts, lambda ts: plan(
        ts[0], ts[1], ts[2], dict(zip(views, ts[1:])), **opts), torch_key)


def qk_norm_rope(q, k=None, v=None, *, cos=None, sin=None, base=10000.0, layout="thd",
                 style="neox", rotary_dim=None, position_ids=None, seq_offsets=None,
                 position_offset=0, cu_seqlens=None, freqs=None, scaling=None, seq_len=None,
                 mrope_section=None, mrope_interleaved=False, norm=None, q_norm_weight=None,
                 k_norm_weight=None, norm_eps=1e-6, q_out=None, k_out=None, out_scale=1.0,
                 write_k=True, k_cache=None, v_cache=None, kv_layout="NHD", kv_indptr=None,
                 kv_indices=None, kv_last_page_len=None, slot_mapping=None, cache_seqlens=None,
                 k_scale=1.0, v_scale=1.0, skipped=None, q_out_scale=None, k_out_scale=None,
                 k_cache_scales=None, v_cache_scales=None, stream=None):
    """One fused launch: QK-norm, RoPE, q (and k) stored, k and v appended to the KV cache.
    The module docstring lists the arguments."""
    is_torch = _tensors.is_torch_tensor(q)
    handle = None if stream is None else _apply.stream_handle(stream)
    given = {"k": k, "v": v, "cos": cos, "sin": sin, "position_ids": position_ids,
             "seq_offsets": seq_offsets, "cu_seqlens": cu_seqlens, "q_norm_weight": q_norm_weight,
             "k_norm_weight": k_norm_weight, "q_out": q_out, "k_out": k_out, "k_cache": k_cache,
             "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
             "kv_last_page_len": kv_last_page_len, "slot_mapping": slot_mapping,
             "cache_seqlens": cache_seqlens, "skipped": skipped, "q_out_scale": q_out_scale,
             "k_out_scale": k_out_scale, "k_cache_scales": k_cache_scales,
             "v_cache_scales": v_cache_scales}
    opts = dict(
        layout=layout, style=style, rotary_dim=rotary_dim, position_offset=position_offset,
        base=base, freqs=freqs, scaling=scaling, seq_len=seq_len, mrope_section=mrope_section,
        mrope_interleaved=mrope_interleaved, norm=norm, norm_eps=norm_eps, out_scale=out_scale,
        write_k=write_k, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    planned, torch_key = (_call.fast_plan("fused", (q, *given.values()), opts,
                                          sys.modules["torch"].Tensor)
                          if is_torch else (None, None))
    if planned is not None:  # a repeat of a planned call: CUDA torch tensors
        spec, args = planned
        if handle is None:
            handle = _apply.torch_stream(q)
    else:
        qv = _tensors.view("q", q, handle)
        if handle is None:
            handle = _apply.torch_stream(q) if is_torch and qv.device[0] == "cuda" else (
                qv.stream or 0)
        views = {name: None if t is None else _tensors.view(name, t, handle)
                 for name, t in given.items()}
        spec, args = _planned(qv, views, opts, torch_key)
    guard = _apply.torch_device_guard(q) if is_torch else None
    if guard is None:
        _call.launch(spec, args, handle)
    else:
        with guard:
            _call.launch(spec, args, handle)
    written_q = q if q_out is None else q_out
    written_k = None if not write_k else (k if q_out is None else k_out)
    return written_q, written_k
