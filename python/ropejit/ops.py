"""PyTorch ops: ropejit's RoPE registered with torch.library, so that torch.compile traces it
(fake implementation: shapes, dtypes and the same argument checks as a real call, at trace
time), autograd differentiates it (the gradient of a rotation is the rotation by -angle: the
backward direction, one launch) and CUDA graphs capture it (a call allocates only the outputs
it returns and launches on torch's current stream; the kernel must have been used once before
a capture, as ropejit refuses to load a module during one).

    q2, k2 = ropejit.ops.rope(q, k, cos=cos, sin=sin, position_ids=ids)   # new tensors
    ropejit.ops.rope_(q, k, cos=cos, sin=sin, position_ids=ids)           # in place

Both take the arguments of ropejit.apply (frequency variants with `freqs`, `scaling` and
`seq_len`, mRoPE's three position rows with `mrope_section` too). Gradients flow to q and k
only: cos/sin tables and positions are constants, as in the peers' fused kernels. An eager
call that needs neither autograd nor tracing runs the same implementation without torch's
dispatcher, whose Python custom-op layer costs about 40 µs per call."""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ropejit import _apply, _call, _decode_ops, _fused_ops, _model, _tensors
from ropejit._cvalues import flag
from ropejit.errors import InvalidArgument

_NO_TENSOR = (None,) * 5


def _plan(q, k, q_out, k_out, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style,
          rotary_dim, position_offset, base, freqs, scaling, seq_len, mrope_section,
          mrope_interleaved, backward, fake):
    def view(name, t):
        return None if t is None else _tensors.from_torch(name, t, fake)

    return _call.plan(view("q", q), view("k", k), view("q_out", q_out), view("k_out", k_out),
                      cos=view("cos", cos), sin=view("sin", sin),
                      position_ids=view("position_ids", position_ids),
                      seq_offsets=view("seq_offsets", seq_offsets),
                      cu_seqlens=view("cu_seqlens", cu_seqlens), layout=layout, style=style,
                      rotary_dim=rotary_dim, position_offset=position_offset, base=base,
                      freqs=freqs, scaling=_model.Scaling.from_list(scaling) if scaling else None,
                      seq_len=seq_len, mrope_section=mrope_section,
                      mrope_interleaved=mrope_interleaved, backward=backward, allow_meta=fake,
                      build=not fake)


def _launch(q, planned):
    spec, args = planned
    guard = _apply.torch_device_guard(q)
    stream = _apply.torch_stream(q)
    if guard is None:
        _call.launch(spec, args, stream)
    else:
        with guard:
            _call.launch(spec, args, stream)


def _outputs(q, k):
    # empty_like keeps a dense tensor's strides (a transposed bhsd view stays so) and makes a
    # strided view (a slice of a packed QKV projection) contiguous; ropejit takes both.
    return torch.empty_like(q), (q.new_empty(0) if k is None else torch.empty_like(k))


# The op's schema has no struct type: a ropejit.Scaling travels as Scaling.to_list() (empty: none),
# mRoPE as its three sections (None: not mRoPE) and the interleaved flag.
_TENSOR_NAMES = ("q", "k", "q_out", "k_out", "cos", "sin", "position_ids", "seq_offsets",
                 "cu_seqlens")


def _cached(q, k, q_out, k_out, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style,
            rotary_dim, position_offset, base, freqs, scaling, seq_len, mrope_section,
            mrope_interleaved, backward):
    """(spec, args) of a real call, from the plan of an earlier call with the same shapes,
    strides, dtypes and arguments when there is one (every decode step of a model), else
    planned and remembered (_call's plan cache, as ropejit.apply's)."""
    tensors = (q, k, q_out, k_out, cos, sin, position_ids, seq_offsets, cu_seqlens)
    opts = dict(layout=layout, style=style, rotary_dim=rotary_dim,
                position_offset=position_offset, base=base, freqs=freqs,
                scaling=tuple(scaling) or None, seq_len=seq_len,
                mrope_section=None if mrope_section is None else tuple(mrope_section),
                mrope_interleaved=mrope_interleaved, backward=backward)
    planned, torch_key = _call.fast_plan("ops.rope", tensors, opts, torch.Tensor)
    if planned is not None:
        return planned
    views = [None if t is None else _tensors.from_torch(name, t, False)
             for name, t in zip(_TENSOR_NAMES, tensors)]
    return _call.cached_plan("ops.rope", views, opts, lambda ts: _call.plan(
        *ts[:4], cos=ts[4], sin=ts[5], position_ids=ts[6], seq_offsets=ts[7], cu_seqlens=ts[8],
        layout=layout, style=style, rotary_dim=rotary_dim, position_offset=position_offset,
        base=base, freqs=freqs, scaling=_model.Scaling.from_list(scaling) if scaling else None,
        seq_len=seq_len, mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
        backward=backward), torch_key)


def _rope_impl(q: Tensor, k: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
               position_ids: Optional[Tensor], seq_offsets: Optional[Tensor],
               cu_seqlens: Optional[Tensor], layout: str, style: str, rotary_dim: int,
               position_offset: int, base: float, freqs: Optional[str], scaling: List[float],
               seq_len: Optional[int], mrope_section: Optional[List[int]],
               mrope_interleaved: bool, backward: bool) -> Tuple[Tensor, Tensor]:
    q_out, k_out = _outputs(q, k)
    _launch(q, _cached(q, k, q_out, None if k is None else k_out, cos, sin, position_ids,
                       seq_offsets, cu_seqlens, layout, style, rotary_dim, position_offset,
                       base, freqs, scaling, seq_len, mrope_section, mrope_interleaved,
                       backward))
    return q_out, k_out


_rope = torch.library.custom_op("ropejit::rope", _rope_impl, mutates_args=())


@_rope.register_fake
def _rope_fake(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style, rotary_dim,
               position_offset, base, freqs, scaling, seq_len, mrope_section, mrope_interleaved,
               backward):
    q_out, k_out = _outputs(q, k)
    _plan(q, k, q_out, None if k is None else k_out, cos, sin, position_ids, seq_offsets,
          cu_seqlens, layout, style, rotary_dim, position_offset, base, freqs, scaling, seq_len,
          mrope_section, mrope_interleaved, backward, fake=True)
    return q_out, k_out


def _dense(g):
    """A gradient ropejit can read: autograd may hand over expanded (stride 0) or transposed
    gradients."""
    if g.stride(-1) == 1 and all(s != 0 or n == 1 for n, s in zip(g.shape, g.stride())):
        return g
    return g.contiguous()


def _setup_context(ctx, inputs, output):
    (q, k, cos, sin, position_ids, seq_offsets, cu_seqlens, *params) = inputs
    ctx.save_for_backward(cos, sin, position_ids, seq_offsets, cu_seqlens)
    ctx.params = params  # layout .. mrope_interleaved, backward
    ctx.has_k = k is not None


def _backward(ctx, grad_q, grad_k):
    cos, sin, position_ids, seq_offsets, cu_seqlens = ctx.saved_tensors
    *params, backward = ctx.params
    # d(R(θ)x)/dx applied to g is R(-θ)g: the other direction, with the same frequencies (the
    # attention factor of yarn and longrope included: it scales the forward's cos and sin, so
    # the transposed rotation carries it too); the copied tail (partial rotary) passes its
    # gradient through, as the kernel copies it.
    dq, dk = _rope(_dense(grad_q), _dense(grad_k) if ctx.has_k else None, cos, sin, position_ids,
                   seq_offsets, cu_seqlens, *params, not backward)
    return (dq, dk if ctx.has_k else None) + _NO_TENSOR + (None,) * len(ctx.params)


_rope.register_autograd(_backward, setup_context=_setup_context)


def _rope_inplace_impl(q: Tensor, k: Optional[Tensor], cos: Optional[Tensor],
                       sin: Optional[Tensor], position_ids: Optional[Tensor],
                       seq_offsets: Optional[Tensor], cu_seqlens: Optional[Tensor], layout: str,
                       style: str, rotary_dim: int, position_offset: int, base: float,
                       freqs: Optional[str], scaling: List[float], seq_len: Optional[int],
                       mrope_section: Optional[List[int]], mrope_interleaved: bool,
                       backward: bool) -> None:
    _launch(q, _cached(q, k, None, None, cos, sin, position_ids, seq_offsets, cu_seqlens, layout,
                       style, rotary_dim, position_offset, base, freqs, scaling, seq_len,
                       mrope_section, mrope_interleaved, backward))


_rope_inplace = torch.library.custom_op("ropejit::rope_", _rope_inplace_impl,
                                        mutates_args=("q", "k"))


@_rope_inplace.register_fake
def _rope_inplace_fake(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style,
                       rotary_dim, position_offset, base, freqs, scaling, seq_len, mrope_section,
                       mrope_interleaved, backward):
    _plan(q, k, None, None, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style,
          rotary_dim, position_offset, base, freqs, scaling, seq_len, mrope_section,
          mrope_interleaved, backward, fake=True)


def _probe(name):
    fn = getattr(torch._C, name, None)
    return fn if callable(fn) else (lambda: True)  # unknown torch: always the dispatcher


_dispatch_modes = _probe("_len_torch_dispatch_stack")
_functorch_active = _probe("_are_functorch_transforms_active")


def _direct(*tensors):
    """Whether an eager call may run the op's implementation without torch's dispatcher, which
    costs about 40 µs of Python per call (python_overhead.py): only plain tensors, no autograd,
    not while torch.compile, make_fx or a functorch transform traces, no dispatch mode active.
    The implementation is the same either way."""
    if torch.compiler.is_compiling() or _dispatch_modes() or _functorch_active():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        # A model's weights are Parameters: plain tensors to the op (autograd aside, which the
        # grad check covers); other subclasses (fake, distributed) need the dispatcher.
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _base(base, cos):
    # With tables the base is unused: a literal keeps torch.compile from lifting the default
    # float into a graph input (a tensor and an .item() per call).
    return 10000.0 if cos is not None else base


def _scaling_list(scaling):
    if scaling is None:
        return []
    if not isinstance(scaling, _model.Scaling):
        raise InvalidArgument(f"ropejit: scaling ({scaling!r}) must be a ropejit.Scaling")
    return scaling.to_list()


def _mrope(section):
    return None if section is None else list(section)


def rope(q, k=None, *, cos=None, sin=None, base=10000.0, layout="bshd", style="neox",
         rotary_dim=None, position_ids=None, seq_offsets=None, position_offset=0,
         cu_seqlens=None, freqs=None, scaling=None, seq_len=None, mrope_section=None,
         mrope_interleaved=False, backward=False):
    """Out of place: returns new (q_out, k_out) (k_out None without k), differentiable in q
    and k. Arguments as ropejit.apply."""
    op = _rope_impl if _direct(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens) else _rope
    q_out, k_out = op(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style,
                      rotary_dim or 0, position_offset, _base(base, cos), freqs,
                      _scaling_list(scaling), seq_len, _mrope(mrope_section),
                      flag("mrope_interleaved", mrope_interleaved), flag("backward", backward))
    return q_out, (None if k is None else k_out)


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def rope_(q, k=None, *, cos=None, sin=None, base=10000.0, layout="bshd", style="neox",
          rotary_dim=None, position_ids=None, seq_offsets=None, position_offset=0,
          cu_seqlens=None, freqs=None, scaling=None, seq_len=None, mrope_section=None,
          mrope_interleaved=False, backward=False):
    """In place: rotates q (and k) and returns them. Under autograd (an input requiring grad)
    this is the out-of-place op followed by copy_, so that the gradient is still exact."""
    if _needs_grad(q, k):
        q_out, k_out = rope(q, k, cos=cos, sin=sin, base=base, layout=layout, style=style,
                            rotary_dim=rotary_dim, position_ids=position_ids,
                            seq_offsets=seq_offsets, position_offset=position_offset,
                            cu_seqlens=cu_seqlens, freqs=freqs, scaling=scaling,
                            seq_len=seq_len, mrope_section=mrope_section,
                            mrope_interleaved=mrope_interleaved, backward=backward)
        q.copy_(q_out)
        if k is not None:
            k.copy_(k_out)
        return q, k
    direct = _direct(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens)
    op = _rope_inplace_impl if direct else _rope_inplace
    op(q, k, cos, sin, position_ids, seq_offsets, cu_seqlens, layout, style, rotary_dim or 0,
       position_offset, _base(base, cos), freqs, _scaling_list(scaling), seq_len,
       _mrope(mrope_section), flag("mrope_interleaved", mrope_interleaved),
       flag("backward", backward))
    return q, k


# The decode block (ropejit.decode) as torch ops: inference only (no autograd formula), traced by
# torch.compile through their fake implementations, captured by CUDA graphs once each key has
# run outside a capture. Eager calls that need no tracing skip the dispatcher, as rope does.

def rms_norm(x, weight, eps=1e-6, *, residual=None, norm="rms"):
    """RMSNorm over the last dimension, ropejit.decode.rms_norm as the op ``ropejit::rms_norm``
    (``ropejit::rms_norm_plain`` without ``residual``): returns a new tensor; with ``residual``,
    ``x + residual`` is written back into it first and normalized (the op declares ``residual``
    mutated)."""
    if residual is None:
        op = (_decode_ops._rms_norm_plain_impl if _direct(x, weight)
              else _decode_ops.rms_norm_plain_op)
        return op(x, weight, eps, norm)
    op = _decode_ops._rms_norm_impl if _direct(x, weight, residual) else _decode_ops.rms_norm_op
    return op(x, weight, residual, eps, norm)


def qkv_projection(x, weight, *, q_heads, kv_heads, head_dim=128, rotary_dim=None,
                   norm_weight=None, eps=1e-6, norm="rms", position_ids=None, position_offset=0,
                   cos=None, sin=None, base=10000.0, style="neox", path="auto",
                   weight_scale=None, k_cache=None, v_cache=None, slot_mapping=None,
                   kv_indptr=None, kv_indices=None, kv_last_page_len=None, cache_seqlens=None,
                   k_scale=1.0, v_scale=1.0, skipped=None, write_kv=True, cu_seqlens=None,
                   k_cache_scales=None, v_cache_scales=None, kv_layout="NHD", bias=None):
    """ropejit.decode.qkv_projection as the op ``ropejit::qkv_projection`` (the KV cache, its
    scales and ``skipped`` declared mutated): returns (q, k, v), views of one new
    ``[tokens, q_heads + 2 kv_heads, head_dim]`` tensor ((q, None, None) with
    ``write_kv=False``)."""
    inputs = (x, weight, norm_weight, weight_scale, position_ids, cos, sin)
    cache = (k_cache, v_cache, slot_mapping, kv_indptr, kv_indices, kv_last_page_len,
             cache_seqlens, cu_seqlens, skipped, k_cache_scales, v_cache_scales)
    direct = _direct(*inputs, *cache, bias)
    shape = (q_heads, kv_heads, head_dim, rotary_dim or 0, norm, eps, position_offset,
             _base(base, cos), style, path)
    if all(t is None for t in cache) and write_kv is True and (k_scale, v_scale) == (1.0, 1.0):
        op = (_decode_ops._qkv_projection_plain_impl if direct
              else _decode_ops.qkv_projection_plain_op)
        out = op(*inputs, *shape, bias)
    else:
        op = _decode_ops._qkv_projection_impl if direct else _decode_ops.qkv_projection_op
        out = op(*inputs, *cache, *shape, k_scale, v_scale, flag("write_kv", write_kv),
                 kv_layout, bias)
    if not write_kv:
        return out, None, None
    q, k, v = out.split([q_heads, kv_heads, kv_heads], dim=1)
    return q, k, v


def ffn_gate_up(x, weight=None, *, intermediate=None, gate_weight=None, up_weight=None,
                norm_weight=None, eps=1e-6, norm="rms", act="silu", path="auto",
                weight_scale=None, gate_scale=None, up_scale=None):
    """ropejit.decode.ffn_gate_up as the op ``ropejit::ffn_gate_up``: ``act(RMSNorm(x) @ gate.T)
    * (RMSNorm(x) @ up.T)``, a new ``[tokens, intermediate]`` tensor. The merged ``weight``
    (and ``weight_scale``) are split into gate and up views here."""
    if weight is not None:
        if gate_weight is not None or up_weight is not None or gate_scale is not None \
                or up_scale is not None:
            raise InvalidArgument("ropejit: give weight (and weight_scale), or gate_weight and "
                                  "up_weight (and gate_scale, up_scale), not both")
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] % 2:
            raise InvalidArgument(f"ropejit: weight must be [2 * intermediate, hidden], got "
                                  f"shape {tuple(getattr(weight, 'shape', ()))}")
        half = weight.shape[0] // 2
        if intermediate is not None and half != intermediate:
            raise InvalidArgument(f"ropejit: weight.shape[0] ({weight.shape[0]}) must be "
                                  f"2 x intermediate ({2 * intermediate})")
        gate_weight, up_weight = weight[:half], weight[half:]
        if weight_scale is not None:
            gate_scale, up_scale = weight_scale[:half], weight_scale[half:]
    elif weight_scale is not None:
        raise InvalidArgument("ropejit: weight_scale goes with the merged weight; give "
                              "gate_scale and up_scale")
    if intermediate is not None and gate_weight is not None and \
            gate_weight.shape[0] != intermediate:
        raise InvalidArgument(f"ropejit: gate_weight.shape[0] ({gate_weight.shape[0]}) must be "
                              f"intermediate ({intermediate})")
    tensors = (x, gate_weight, up_weight, norm_weight, gate_scale, up_scale)
    op = _decode_ops._ffn_gate_up_impl if _direct(*tensors) else _decode_ops.ffn_gate_up_op
    return op(*tensors, eps, norm, act, path)


def qk_norm_rope(q, k=None, v=None, *, cos=None, sin=None, base=10000.0, layout="thd",
                 style="neox", rotary_dim=None, position_ids=None, seq_offsets=None,
                 position_offset=0, cu_seqlens=None, freqs=None, scaling=None, seq_len=None,
                 mrope_section=None, mrope_interleaved=False, norm=None, q_norm_weight=None,
                 k_norm_weight=None, norm_eps=1e-6, q_out=None, k_out=None, out_scale=1.0,
                 write_k=True, k_cache=None, v_cache=None, kv_layout="NHD", kv_indptr=None,
                 kv_indices=None, kv_last_page_len=None, slot_mapping=None, cache_seqlens=None,
                 k_scale=1.0, v_scale=1.0, skipped=None, q_out_scale=None, k_out_scale=None,
                 k_cache_scales=None, v_cache_scales=None):
    """ropejit.fused.qk_norm_rope as the op ``ropejit::qk_norm_rope`` (torch tensors, torch's
    current stream): the same arguments and the same written ``(q, k)`` (``q_out`` / ``k_out``
    when given; k None when ``write_k`` is False)."""
    given = dict(
        q=q, k=k, v=v, cos=cos, sin=sin, base=base, layout=layout, style=style,
        rotary_dim=rotary_dim, position_ids=position_ids, seq_offsets=seq_offsets,
        position_offset=position_offset, cu_seqlens=cu_seqlens, freqs=freqs, scaling=scaling,
        seq_len=seq_len, mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
        norm=norm, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, norm_eps=norm_eps,
        q_out=q_out, k_out=k_out, out_scale=out_scale, write_k=write_k, k_cache=k_cache,
        v_cache=v_cache, kv_layout=kv_layout, kv_indptr=kv_indptr, kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len, slot_mapping=slot_mapping,
        cache_seqlens=cache_seqlens, k_scale=k_scale, v_scale=v_scale, skipped=skipped,
        q_out_scale=q_out_scale, k_out_scale=k_out_scale, k_cache_scales=k_cache_scales,
        v_cache_scales=v_cache_scales)
    tensors = [given[name] for name in _fused_ops.TENSORS]
    if _direct(*tensors):
        # Outside a trace the fused call itself, with its plan cache and no dispatcher.
        from ropejit import fused
        fused.qk_norm_rope(**given)
    else:
        opts = {name: given[name] for name in _fused_ops.OPTIONS}
        opts.update(rotary_dim=rotary_dim or 0, scaling=_scaling_list(scaling),
                    mrope_section=_mrope(mrope_section), base=_base(base, cos),
                    write_k=flag("write_k", write_k),
                    mrope_interleaved=flag("mrope_interleaved", mrope_interleaved))
        _fused_ops.op(*tensors, *opts.values())
    written_q = q if q_out is None else q_out
    return written_q, (None if not write_k else (k if q_out is None else k_out))
