"""ropejit.apply: RoPE on any CUDA tensors (torch, or __cuda_array_interface__ / DLPack objects
such as CuPy and JAX arrays) on the caller's stream. The torch ops (ropejit.ops) plan the same
way but allocate their outputs and go through torch.library."""

import sys

from ropejit import _call, _tensors
from ropejit._cvalues import shown
from ropejit.errors import InvalidArgument


def stream_handle(stream):
    """A CUstream as an int from an int, a torch.cuda.Stream (.cuda_stream), a CuPy stream
    (.ptr) or None (0: the legacy default stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return handle
    raise InvalidArgument(f"ropejit: stream ({shown(stream)}) must be a CUstream handle (int), a "
                          f"torch.cuda.Stream or a CuPy stream")


def torch_stream(q):
    """torch's current stream on q's device, as a CUstream handle (an int)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton reads: ~0.3 µs
    if raw is not None:
        return raw(q.device.index)
    return torch.cuda.current_stream(q.device).cuda_stream  # ~6 µs


def torch_device_guard(q):
    """A context that makes q's device current when it is not (ropejit launches in the
    current CUDA context), else None: switching costs microseconds, so only when needed."""
    torch = sys.modules["torch"]
    index = q.device.index
    if index is None or index == torch.cuda.current_device():
        return None
    return torch.cuda.device(index)


def apply(q, k=None, *, cos=None, sin=None, base=10000.0, layout="bshd", style="neox",
          rotary_dim=None, position_ids=None, seq_offsets=None, position_offset=0,
          cu_seqlens=None, freqs=None, scaling=None, seq_len=None, mrope_section=None,
          mrope_interleaved=False, backward=False, q_out=None, k_out=None, stream=None):
    """Rotates q (and k, whose head count may differ) in one launch.

    Shapes follow `layout`: bshd [batch, seq, heads, head_dim], sbhd [seq, batch, ...],
    bhsd [batch, heads, seq, head_dim] (any strides, last dimension contiguous), or thd
    [tokens, heads, head_dim] with `cu_seqlens` (int32 [batch + 1]). Frequencies come from
    `cos`/`sin` tables ([rows, rotary_dim / 2] or [rows, rotary_dim], f32/f16/bf16, any row
    stride) or, without tables, are computed from `base` in the kernel: `freqs` "computed"
    (base^(-2i/R), the default) or a scaling variant, "linear", "dynamic_ntk", "llama3", "yarn"
    or "longrope", with its parameters in `scaling` (a ropejit.Scaling; yarn and longrope also
    scale cos and sin by their attention factor). dynamic_ntk and longrope pick their
    frequencies by `seq_len` (transformers: max(position_ids) + 1; default with offset positions
    on a dense layout: position_offset + seq, else required). Positions: `position_ids`
    (int32/int64, one per token), `seq_offsets` (int32/int64, one per sequence, added to the
    index in the sequence), else the index in the sequence plus `position_offset`. mRoPE:
    `mrope_section` (t, h, w) with `position_ids` of three rows [3, tokens] (temporal, height,
    width): pair i takes its section's row (`mrope_interleaved`: Qwen3-VL's T H W cycle).
    `style`: "neox" (pairs
    i, i + R/2) or "gptj" (pairs 2i, 2i + 1). `backward=True` rotates by -angle (the
    gradient). In place, unless `q_out` (and `k_out`) are given; returns the written (q, k).

    `stream`: default torch's current stream for torch tensors; for other tensors, the stream
    their __cuda_array_interface__ names, else the legacy default stream (DLPack producers
    order their pending work before it). The tensors must be on the current CUDA device's
    context for non-torch tensors (torch tensors: q's device is made current)."""
    is_torch = _tensors.is_torch_tensor(q)
    handle = None if stream is None else stream_handle(stream)
    opts = dict(layout=layout, style=style, rotary_dim=rotary_dim,
                position_offset=position_offset, base=base, freqs=freqs, scaling=scaling,
                seq_len=seq_len, mrope_section=mrope_section,
                mrope_interleaved=mrope_interleaved, backward=backward)
    given = (("k", k), ("q_out", q_out), ("k_out", k_out), ("cos", cos), ("sin", sin),
             ("position_ids", position_ids), ("seq_offsets", seq_offsets),
             ("cu_seqlens", cu_seqlens))
    planned, torch_key = (_call.fast_plan("apply", (q, *(t for _, t in given)), opts,
                                          sys.modules["torch"].Tensor)
                          if is_torch else (None, None))
    if planned is not None:  # a repeat of a planned call: CUDA torch tensors
        spec, args = planned
        if handle is None:
            handle = torch_stream(q)
    else:
        view = _tensors.view
        qv = view("q", q, handle)
        if handle is None:
            if is_torch and qv.device[0] == "cuda":
                handle = torch_stream(q)
            else:
                handle = qv.stream or 0
        tensors = (qv, *(None if t is None else view(name, t, handle) for name, t in given))
        spec, args = _call.cached_plan("apply", tensors, opts, lambda ts: _call.plan(
            *ts[:4], cos=ts[4], sin=ts[5], position_ids=ts[6], seq_offsets=ts[7],
            cu_seqlens=ts[8], **opts), torch_key)
    guard = torch_device_guard(q) if is_torch else None
    if guard is None:
        _call.launch(spec, args, handle)
    else:
        with guard:
            _call.launch(spec, args, handle)
    return (q, k) if q_out is None else (q_out, k_out)
