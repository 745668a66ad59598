"""The decode block on torch CUDA tensors. ``qkv_projection`` (C++ ``ropejit::qkv_projection``):
RMSNorm -> packed QKV
projection -> RoPE on torch CUDA tensors: one fused kernel for decode-sized calls, and for more
tokens (where a tensor-core GEMM wins) the unfused path, RMSNorm key -> cuBLASLt GEMM -> RoPE
key, chosen per token count by the tuning file (``ropejit tune --key qkvproj_...``) or the
heuristic.

    import ropejit.decode
    q, k, v = ropejit.decode.qkv_projection(
        hidden, layer.self_attn.qkv_proj.weight, q_heads=32, kv_heads=8, head_dim=128,
        norm_weight=layer.input_layernorm.weight, eps=1e-5, position_ids=ids, cos=cos, sin=sin)

``weight`` is torch's Linear weight of the packed projection, ``[(q_heads + 2 kv_heads) *
head_dim, hidden]`` (q's rows, then k's, then v's); ``x`` is ``[tokens, hidden]``. q and k come
back rotated, ``[tokens, heads, head_dim]``; v as projected. ``cos``/``sin`` are tables
``[rows, rotary_dim / 2]`` (or full width) indexed by position; without them the frequencies
are computed from ``base``. Needs a GPU of compute capability 8.0 or newer; bf16 or fp16.
``path`` is ``"auto"`` (the default), ``"fused"`` or ``"unfused"``; the unfused path's workspace
comes from torch's caching allocator. Like torch's own sequence, the unfused path rounds the
normalized activation and the projection to the dtype before the next step; the fused kernel
rounds only ``x * w`` and its outputs.

``ffn_gate_up`` (C++ ``ropejit::ffn_gate_up``) is the FFN's first half with the same prologue,
``act(RMSNorm(x) @ gate.T) * (RMSNorm(x) @ up.T)`` (SwiGLU with ``act="silu"``, GeGLU with
``"gelu_tanh"``), fused for few tokens and RMSNorm -> cuBLASLt -> GLU kernel beyond:

    h = ropejit.decode.ffn_gate_up(hidden, gate_up_weight, intermediate=14336,
                                   norm_weight=layer.post_attention_layernorm.weight, eps=1e-5)

``weight`` is vLLM's merged ``gate_up_proj`` ``[2 * intermediate, hidden]`` (gate rows, then up
rows), or pass ``gate_weight`` and ``up_weight`` ``[intermediate, hidden]`` separately (HF's
``gate_proj`` / ``up_proj``).

The KV cache: ``qkv_projection`` can also append k (rotated) and v to ``k_cache`` and
``v_cache`` ``[pages, page_size, kv_heads, head_dim]`` (vLLM's flash layout, FlashInfer's NHD)
in x's dtype or ``torch.float8_e4m3fn`` (stored ``value * k_scale`` / ``* v_scale``), addressed
by vLLM's ``slot_mapping`` (int64 ``[tokens]``: page ``slot // page_size``, row
``slot % page_size``; a negative slot is not written), by FlashInfer's ``kv_indptr``,
``kv_indices`` and ``kv_last_page_len`` (int32; token t is the newest of sequence t: the
sequence's last page, row ``kv_last_page_len[t] - 1``), or by ``cache_seqlens`` (int32, the
tokens sequence t held before; page t of a contiguous cache). For a prefill chunk,
``cu_seqlens`` (int32 ``[sequences + 1]``) groups the tokens into sequences: the paged and
contiguous arrays then have an entry per sequence, and sequence b's tokens take its last
positions after the append (paged) or the rows from ``cache_seqlens[b]`` on. A row outside the
cache is not written and is counted in ``skipped`` (an int32 tensor of one element). Both paths
append (the unfused one after its GEMM, with the fused RoPE key). ``write_kv=False`` returns
``(q, None, None)`` and writes k and v only to the cache (fused path). A float8_e4m3fn cache with
``k_cache_scales`` and ``v_cache_scales`` (float32 ``[pages, page_size, kv_heads]``, instead of
``k_scale`` / ``v_scale``) gets a scale per cached row and head, ``amax / 448`` of the row's
head, computed by the unfused path's RoPE step: such calls take the unfused path at every
token count (the fused kernel's blocks each hold part of a head).

FP8 weights: both calls take ``torch.float8_e4m3fn`` weights with a float32 scale per weight
row (``weight_scale`` ``[rows]``; for the FFN's separate weights ``gate_scale`` and
``up_scale``), as FP8 checkpoints store them (W = code x scale). The kernel widens the codes to
x's dtype exactly and multiplies each row's fp32 sum by its scale; ``hidden`` must be a multiple
of 16. The unfused path (more tokens) first dequantizes the weight chunk by chunk into its
workspace as torch does, ``(w.float() * scale[:, None]).to(x.dtype)``, then runs the same GEMM;
``path="auto"`` keeps such weights fused up to 64 tokens (the H100's crossover at Llama-3-8B's
shapes), unless the tuning file chooses otherwise; ``path="unfused"`` forces that path.
"""

import ctypes

from ropejit import _apply, _call, _capi
from ropejit._cvalues import choice, fill, flag, integer, real

_NORMS = {"none": 0, "rms": 1, "rms_one_plus": 2}
_RMS_NORMS = {"rms": 1, "rms_one_plus": 2}  # RMSNorm alone: a norm to compute

# The path an automatic call takes, per (spec, token bucket, hidden, heads, device): asked of the
# library once, so that a decode step costs no extra C call.
_paths = {}

# Plans of earlier calls: the spec and args structs, the path and workspace size of a call with
# the same tensor shapes, strides, dtypes and devices and the same other arguments. A repeat
# (every decode step of a model) writes its tensors' addresses into a copy and calls C, which
# checks the addresses again; the Python checks above ran for the first call of that shape.
_PLANNED = {}
_MAX_PLANNED = 512

# Where each tensor argument's address goes in the args struct, by the entry's argument order.
_QKV_POINTERS = ("x", "weight", "norm_weight", "weight_scale", "position_ids", "cos", "sin",
                 "cache.k", "cache.v", "cache.slot_mapping", "cache.indptr", "cache.indices",
                 "cache.last_page_len", "cache.seq_lens", "cache.skipped", "cu_seqlens",
                 "cache.k_scales", "cache.v_scales", "bias")
_FFN_POINTERS = ("x", "gate_weight", "up_weight", "gate_scale", "up_scale", "norm_weight")


def _plan_key(entry, tensors, values):
    """The plan cache's key for a call, or None when it cannot be kept (a tensor that is not a
    CUDA torch tensor)."""
    import torch
    meta = []
    for t in tensors:
        if t is None:
            meta.append(None)
        elif type(t) not in (torch.Tensor, torch.nn.Parameter) or not t.is_cuda:
            return None
        else:
            meta.append((t.shape, t.stride(), t.dtype, t.device))
    return entry, tuple(meta), tuple((type(v), v) for v in values)


def _planned(key):
    """The plan kept under `key`, or None (also for a key that cannot be hashed: an unhashable
    argument, which is then never kept)."""
    try:
        return _PLANNED.get(key)
    except TypeError:
        return None


def _remember_plan(key, plan):
    if key is None:
        return
    try:
        hash(key)
    except TypeError:
        return
    if len(_PLANNED) >= _MAX_PLANNED:
        _PLANNED.clear()
    _PLANNED[key] = plan


def _addresses(a, fields, tensors):
    """Writes each given tensor's address into its field ("cache.k": a nested struct's)."""
    for field, t in zip(fields, tensors):
        if t is not None:
            owner, _, name = field.rpartition(".")
            setattr(getattr(a, owner) if owner else a, name, t.data_ptr())


def _launch_planned(x, plan, a, call):
    """Runs a remembered plan's C call on torch's current stream, with a fresh workspace for the
    unfused path; x's device is made current only when it is not."""
    guard = _apply.torch_device_guard(x)
    if guard is not None:
        with guard:
            return _launch_planned(x, plan, a, call)
    import torch
    spec, _, taken, size = plan
    a.stream = _apply.torch_stream(x)
    workspace = None
    if taken == "unfused":
        workspace = torch.empty(size, dtype=torch.uint8, device=x.device)
        a.workspace, a.workspace_bytes = workspace.data_ptr(), size
    _capi.check(call(ctypes.byref(spec), ctypes.byref(a)))
    del workspace  # the caching allocator keeps it for this stream's queued work
    return None


def qkv_replay(plan, x, position_ids, k_cache, v_cache, cache_seqlens, q_heads, kv_heads,
               head_dim):
    """The packed [tokens, q_heads + 2 kv_heads, head_dim] output of a contiguous-cache (or
    cache-less) projection repeated from `plan` (one that qkv_projection handed to its
    ``_plans`` list) with new activations, positions and cache: the caller guarantees the shapes,
    strides and dtypes the plan was made for (C checks the addresses again). The patched
    transformers layer's eager decode step, which spares the checks and the plan cache's key."""
    import torch
    a = _capi.ropejit_qkv_proj_args.from_buffer_copy(plan[1])
    a.x = x.data_ptr()
    a.position_ids = position_ids.data_ptr()
    if k_cache is not None:
        a.cache.k, a.cache.v = k_cache.data_ptr(), v_cache.data_ptr()
        a.cache.seq_lens = cache_seqlens.data_ptr()
    out = torch.empty(x.shape[0], q_heads + 2 * kv_heads, head_dim, dtype=x.dtype,
                      device=x.device)
    a.q.data = out.data_ptr()
    step = head_dim * out.element_size()
    a.k.data, a.v.data = a.q.data + q_heads * step, a.q.data + (q_heads + kv_heads) * step
    _launch_planned(x, plan, a, _capi.lib.ropejit_qkv_projection)
    return out


def ffn_replay(plan, x, intermediate):
    """ffn_gate_up's output repeated from `plan` (see qkv_replay) for a new x."""
    import torch
    a = _capi.ropejit_ffn_args.from_buffer_copy(plan[1])
    a.x = x.data_ptr()
    out = torch.empty(x.shape[0], intermediate, dtype=x.dtype, device=x.device)
    a.out = out.data_ptr()
    _launch_planned(x, plan, a, _capi.lib.ropejit_ffn_gate_up)
    return out


def _fail(message):
    from ropejit.errors import InvalidArgument
    raise InvalidArgument(f"ropejit: {message}")


def _weights(x, rows, pairs):
    """"same" or "e4m3" for weight tensors and their scales, ``pairs`` as ((name, weight),
    (scale name, scale)); checks the scale against the weight's kind."""
    import torch
    fp8 = getattr(torch, "float8_e4m3fn", None)
    kinds = set()
    for (name, w), (scale_name, scale) in pairs:
        if w.dtype == x.dtype:
            if scale is not None:
                _fail(f"{scale_name} is for float8_e4m3fn weights; {name} is {w.dtype}")
            kinds.add("same")
            continue
        if fp8 is None or w.dtype != fp8:
            _fail(f"{name}.dtype ({w.dtype}) must be x's dtype ({x.dtype}) or "
                  f"torch.float8_e4m3fn")
        if scale is None:
            _fail(f"{name} is float8_e4m3fn: give {scale_name}, a float32 scale per row")
        if (not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32
                or scale.device != x.device or scale.dim() != 1 or not scale.is_contiguous()
                or scale.numel() != rows):
            _fail(f"{scale_name} must be a contiguous float32 [{rows}] tensor on x's device, got "
                  f"{getattr(scale, 'dtype', type(scale))} of shape "
                  f"{tuple(getattr(scale, 'shape', ()))}")
        kinds.add("e4m3")
    if len(kinds) != 1:
        _fail("the weights must all be float8_e4m3fn or all be x's dtype")
    return kinds.pop()


def _spec(x, head_dim, rotary_dim, style, positions, index_type, cos, norm):
    import torch
    dtypes = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    s = _capi.new(_capi.ropejit_qkv_proj_spec)
    if x.dtype not in dtypes:
        _fail(f"x.dtype ({x.dtype}) must be torch.bfloat16 or torch.float16")
    fill(s, dtype=_capi.DTYPES[dtypes[x.dtype]], head_dim=head_dim, rotary_dim=rotary_dim or 0,
         style=choice("style", style, _capi.STYLES), positions=_capi.POSITIONS[positions],
         index_type=_capi.INDEX_TYPES[index_type], norm=choice("norm", norm, _NORMS))
    if cos is None:
        s.freqs = _capi.FREQS["computed"]
    else:
        s.freqs = _capi.FREQS["table"]
        if cos.dtype not in dtypes:
            _fail(f"cos.dtype ({cos.dtype}) must be float32, bfloat16 or float16")
        s.table_dtype = _capi.DTYPES[dtypes[cos.dtype]]
        rot = rotary_dim or head_dim
        if cos.shape[-1] not in (rot // 2, rot):
            _fail(f"cos.shape[-1] ({cos.shape[-1]}) must be rotary_dim / 2 ({rot // 2}, half "
                  f"width) or rotary_dim ({rot}, full width)")
        s.table_width = _capi.TABLE_WIDTHS["half" if cos.shape[-1] == rot // 2 else "full"]
    return s


def qkv_projection(x, weight, *, q_heads, kv_heads, head_dim=128, rotary_dim=None,
                   norm_weight=None, eps=1e-6, norm="rms", position_ids=None, position_offset=0,
                   cos=None, sin=None, base=10000.0, style="neox", path="auto",
                   weight_scale=None, k_cache=None, v_cache=None, slot_mapping=None,
                   kv_indptr=None, kv_indices=None, kv_last_page_len=None, cache_seqlens=None,
                   k_scale=1.0, v_scale=1.0, skipped=None, write_kv=True, cu_seqlens=None,
                   k_cache_scales=None, v_cache_scales=None, kv_layout="NHD", bias=None,
                   _packed=False, _fake=False, _plans=None):
    """Returns (q, k, v), new tensors ``[tokens, heads, head_dim]``; see the module docstring.
    ``norm="none"`` skips RMSNorm; ``"rms_one_plus"`` is Gemma's ``(1 + w)``; float8_e4m3fn
    weights take ``weight_scale``, a float32 scale per weight row. ``cu_seqlens`` (int32,
    ``[sequences + 1]``) groups the tokens into sequences for a paged or contiguous cache (a
    prefill chunk); without it token t is sequence t's one new token. ``bias`` (Qwen2's q/k/v
    biases packed as the weight's rows are, ``[(q_heads + 2 kv_heads) * head_dim]`` in x's
    dtype) is added before RoPE; a call with it runs the fused kernel."""
    import torch
    tensors = (x, weight, norm_weight, weight_scale, position_ids, cos, sin, k_cache, v_cache,
               slot_mapping, kv_indptr, kv_indices, kv_last_page_len, cache_seqlens, skipped,
               cu_seqlens, k_cache_scales, v_cache_scales, bias)
    key = None if _fake else _plan_key(
        "qkv", tensors, (q_heads, kv_heads, head_dim, rotary_dim, eps, norm, base, style, path,
                         k_scale, v_scale, write_kv, kv_layout))
    plan = None if key is None else _planned(key)
    if plan is not None:
        a = _capi.ropejit_qkv_proj_args.from_buffer_copy(plan[1])
        _addresses(a, _QKV_POINTERS, tensors)
        a.position_offset = integer("position_offset", position_offset)
        out = torch.empty(x.shape[0], q_heads + (2 * kv_heads if write_kv else 0), head_dim,
                          dtype=x.dtype, device=x.device)
        a.q.data = out.data_ptr()
        if write_kv:
            step = head_dim * out.element_size()
            a.k.data, a.v.data = a.q.data + q_heads * step, a.q.data + (q_heads + kv_heads) * step
        _launch_planned(x, plan, a, _capi.lib.ropejit_qkv_projection)
        if _plans is not None:  # the plan with this call's addresses (the kept one has another's)
            _plans.append((plan[0], bytes(a), plan[2], plan[3]))
        if _packed:
            return out
        return tuple(out.split([q_heads, kv_heads, kv_heads], dim=1)) if write_kv else (
            out, None, None)
    choice("path", path, _capi.PROJ_PATHS)
    # Checked first: the shape checks below compute with them.
    q_heads, kv_heads = integer("q_heads", q_heads), integer("kv_heads", kv_heads)
    head_dim = integer("head_dim", head_dim, ctypes.c_int32)
    if rotary_dim is not None:
        rotary_dim = integer("rotary_dim", rotary_dim, ctypes.c_int32)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        _fail("x and weight must be torch tensors")
    if not x.is_cuda:
        _fail(f"x is on {x.device}: the projection runs on a CUDA device")
    if x.dim() != 2 or x.stride(-1) != 1:
        _fail(f"x must be [tokens, hidden] with a contiguous last dimension, got shape "
              f"{tuple(x.shape)} and strides {x.stride()}")
    if weight.dim() != 2 or weight.stride(-1) != 1:
        _fail(f"weight must be [columns, hidden] with a contiguous last dimension, "
              f"got shape {tuple(weight.shape)}, dtype {weight.dtype}")
    if weight.device != x.device:
        _fail(f"weight is on {weight.device} but x is on {x.device}")
    weights = _weights(x, weight.shape[0], ((("weight", weight), ("weight_scale", weight_scale)),))
    if weight.shape[1] != x.shape[1]:
        _fail(f"weight.shape[1] ({weight.shape[1]}) must equal x.shape[1] ({x.shape[1]})")
    if weight.shape[0] != (q_heads + 2 * kv_heads) * head_dim:
        _fail(f"weight.shape[0] ({weight.shape[0]}) must be (q_heads + 2 kv_heads) x head_dim "
              f"= {(q_heads + 2 * kv_heads) * head_dim}")
    if (cos is None) != (sin is None):
        _fail("cos and sin go together (or neither: frequencies computed from base)")
    if norm != "none" and norm_weight is None:
        _fail(f"norm ({norm!r}) needs norm_weight")
    for name, t in (("weight", weight), ("norm_weight", norm_weight), ("cos", cos), ("sin", sin),
                    ("position_ids", position_ids), ("bias", bias)):
        if t is not None and t.device != x.device:
            _fail(f"{name} is on {t.device} but x is on {x.device}")
    if bias is not None and (bias.dtype != x.dtype or bias.dim() != 1 or bias.stride(0) != 1
                             or bias.numel() != weight.shape[0]):
        _fail(f"bias must be a contiguous [{weight.shape[0]}] tensor in x's dtype ({x.dtype}): "
              f"one per weight row, got shape {tuple(bias.shape)}, dtype {bias.dtype}")
    if bias is not None and path == "unfused":
        _fail("bias is given with path='unfused': the unfused path's GEMM takes no bias (the "
              "fused kernel adds it)")
    if norm_weight is not None and (norm_weight.dtype != x.dtype or not norm_weight.is_contiguous()
                                    or norm_weight.dim() != 1
                                    or norm_weight.numel() != x.shape[1]):
        _fail(f"norm_weight must be a contiguous [{x.shape[1]}] tensor in x's dtype ({x.dtype}), "
              f"got shape {tuple(norm_weight.shape)}, dtype {norm_weight.dtype}")
    for name, t in (("x", x), ("weight", weight), ("cos", cos)):
        if t is not None and t.shape[0] > 1 and t.stride(0) == 0:
            _fail(f"{name} has stride 0 over its rows (an expanded tensor): pass "
                  f"{name}.contiguous()")
    if cos is not None and (cos.dim() != 2 or cos.stride(-1) != 1 or sin.shape != cos.shape
                            or sin.stride() != cos.stride() or sin.dtype != cos.dtype):
        _fail("cos and sin must be [rows, width] tables of one shape, strides and dtype")
    positions, index_type = "offset", "i64"
    if position_ids is not None:
        if position_ids.dtype not in (torch.int32, torch.int64) or not position_ids.is_contiguous():
            _fail(f"position_ids must be contiguous int32 or int64, got {position_ids.dtype}")
        if position_ids.numel() != x.shape[0]:
            _fail(f"position_ids has {position_ids.numel()} entries for {x.shape[0]} tokens")
        positions = "ids"
        index_type = "i64" if position_ids.dtype == torch.int64 else "i32"
    spec = _spec(x, head_dim, rotary_dim, style, positions, index_type, cos, norm)
    spec.weights = _capi.WEIGHTS[weights]
    addressing = {"slots": (slot_mapping,), "paged": (kv_indptr, kv_indices, kv_last_page_len),
                  "contiguous": (cache_seqlens,)}
    sequences = x.shape[0]
    if cu_seqlens is not None:
        if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32
                or cu_seqlens.device != x.device or not cu_seqlens.is_contiguous()
                or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2):
            _fail("cu_seqlens must be a contiguous 1-d torch.int32 tensor of sequences + 1 >= 2 "
                  "entries on x's device")
        if kv_indptr is None and cache_seqlens is None:
            _fail("cu_seqlens places a chunk's tokens in a paged (kv_indptr, ...) or contiguous "
                  "(cache_seqlens) cache; it is not used otherwise")
        sequences = cu_seqlens.numel() - 1
    cache = _cache(x, kv_heads, head_dim, k_cache, v_cache, addressing, k_scale, v_scale,
                   skipped, write_kv, sequences, (k_cache_scales, v_cache_scales), kv_layout,
                   _fake)
    if cache is not None:
        spec.cache, spec.cache_store = _capi.KV_CACHES[cache[2]], cache[1]
    tokens = x.shape[0]
    out = torch.empty(tokens, q_heads + (2 * kv_heads if write_kv else 0), head_dim,
                      dtype=x.dtype, device=x.device)
    if write_kv:
        q, k, v = out.split([q_heads, kv_heads, kv_heads], dim=1)
    else:
        q, k, v = out, None, None
    # The torch op (ropejit.ops) returns the one tensor q, k and v are views of, and traces
    # with the checks above alone.
    result = out if _packed else (q, k, v)
    if _fake:
        return result
    a = _capi.new(_capi.ropejit_qkv_proj_args)
    # A stride of 0 means "the row length" to the C API; a single row's stride is irrelevant.
    fill(a, tokens=tokens, hidden=x.shape[1], q_heads=q_heads, kv_heads=kv_heads,
         x=x.data_ptr(), x_stride=x.stride(0) if x.shape[0] > 1 else x.shape[1],
         weight=weight.data_ptr(), weight_stride=weight.stride(0),
         position_offset=position_offset, base=base, path=_capi.PROJ_PATHS[path])
    a.norm_eps = real("eps", eps)
    if weight_scale is not None:
        fill(a, weight_scale=weight_scale.data_ptr())
    if norm_weight is not None:
        fill(a, norm_weight=norm_weight.data_ptr())
    if bias is not None:
        fill(a, bias=bias.data_ptr())
    for field, t, heads in (("q", q, q_heads), ("k", k, kv_heads), ("v", v, kv_heads)):
        if t is not None:
            setattr(a, field, _call.tensor(field, t.data_ptr(), heads, 0, t.stride(0),
                                           t.stride(1)))
    if cache is not None:
        a.cache = cache[0]
    if cu_seqlens is not None:
        fill(a, cu_seqlens=cu_seqlens.data_ptr(), batch=sequences)
    if position_ids is not None:
        fill(a, position_ids=position_ids.data_ptr())
    if cos is not None:
        fill(a, cos=cos.data_ptr(), sin=sin.data_ptr(),
             table_stride=cos.stride(0) if cos.shape[0] > 1 else cos.shape[1],
             table_rows=cos.shape[0])
    if tokens == 0:
        return result
    with torch.cuda.device(x.device):
        fill(a, stream=torch.cuda.current_stream(x.device).cuda_stream)
        taken = path
        if path == "auto":
            slot = (bytes(spec), 1 << (tokens - 1).bit_length(), a.hidden, q_heads, kv_heads,
                    x.device.index, cu_seqlens is None, bias is None)
            taken = _paths.get(slot)
            if taken is None:
                code = ctypes.c_int32()
                _capi.check(_capi.lib.ropejit_qkv_projection_path(
                    ctypes.byref(spec), ctypes.byref(a), ctypes.byref(code)))
                taken = _paths[slot] = "unfused" if code.value == 2 else "fused"
        size = ctypes.c_size_t()
        if taken == "unfused":
            _capi.check(_capi.lib.ropejit_qkv_projection_workspace_bytes(
                ctypes.byref(spec), ctypes.byref(a), ctypes.byref(size)))
            workspace = torch.empty(size.value, dtype=torch.uint8, device=x.device)
            fill(a, workspace=workspace.data_ptr(), workspace_bytes=size.value)
        _capi.check(_capi.lib.ropejit_qkv_projection(ctypes.byref(spec), ctypes.byref(a)))
    plan = (spec, bytes(a), taken, size.value)
    _remember_plan(key, plan)
    if _plans is not None:
        _plans.append(plan)
    return result


# The cache's shape as an error message spells it, by kv_layout (its axes: _call.KV_AXES).
_KV_SHAPES = {"NHD": "[pages, page_size, kv_heads", "HND": "[pages, kv_heads, page_size"}


def _cache(x, kv_heads, head_dim, k_cache, v_cache, addressing, k_scale, v_scale, skipped,
           write_kv, sequences, scales=(None, None), kv_layout="NHD", fake=False):
    """(ropejit_kv_cache, cache_store code, mode) for the projection's KV cache, or None.
    `addressing` maps each mode to its tensors (slot_mapping; kv_indptr, kv_indices,
    kv_last_page_len; cache_seqlens); `sequences`: the paged / contiguous arrays' sequences;
    `scales`: (k_cache_scales, v_cache_scales) for a dynamic FP8 cache; `kv_layout`: "NHD"
    [pages, page_size, kv_heads, head_dim] or "HND" [pages, kv_heads, page_size, head_dim]."""
    import torch
    if kv_layout not in _call.KV_AXES:
        _fail(f"kv_layout ({kv_layout!r}) must be one of {', '.join(_call.KV_AXES)}")
    axes, dims = _call.KV_AXES[kv_layout], _KV_SHAPES[kv_layout]
    given = [mode for mode, ts in addressing.items() if any(t is not None for t in ts)]
    if k_cache is None:
        if v_cache is not None or given or skipped is not None or any(
                t is not None for t in scales):
            _fail("v_cache, the cache's addressing, skipped and the cache's scales go with "
                  "k_cache")
        if not write_kv:
            _fail("write_kv=False writes k and v only to the KV cache, but k_cache is not given")
        return None
    if v_cache is None:
        _fail("k_cache needs v_cache (the projection appends k and v)")
    if len(given) != 1 or any(t is None for t in addressing[given[0]]):
        _fail("k_cache needs one addressing: slot_mapping (slots), kv_indptr + kv_indices + "
              "kv_last_page_len (paged) or cache_seqlens (contiguous)")
    mode = given[0]
    fp8 = getattr(torch, "float8_e4m3fn", None)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.device != x.device:
            _fail(f"{name} must be a torch tensor on x's device ({x.device})")
        if t.dtype not in (x.dtype, fp8):
            _fail(f"{name}.dtype ({t.dtype}) must be x's ({x.dtype}) or torch.float8_e4m3fn")
        if t.dim() != 4 or t.shape[axes[2]] != kv_heads or t.shape[3] != head_dim or \
                t.stride(3) != 1:
            _fail(f"{name} must be {kv_layout} {dims} ({kv_heads}), head_dim ({head_dim})] with "
                  f"a contiguous last dimension, got shape {tuple(t.shape)} and strides "
                  f"{t.stride()}")
    if (k_cache.dtype, tuple(k_cache.shape), k_cache.stride()) != \
            (v_cache.dtype, tuple(v_cache.shape), v_cache.stride()):
        _fail("k_cache and v_cache must have one dtype, shape and strides")
    tokens = x.shape[0]
    names = {"slots": (("slot_mapping", torch.int64, tokens),),
             "paged": (("kv_indptr", torch.int32, sequences + 1),
                       ("kv_indices", torch.int32, None),
                       ("kv_last_page_len", torch.int32, sequences)),
             "contiguous": (("cache_seqlens", torch.int32, sequences),)}[mode]
    for (name, dtype, count), t in zip(names, addressing[mode]):
        if (not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != x.device
                or not t.is_contiguous() or t.dim() != 1
                or (count is not None and t.numel() != count)):
            _fail(f"{name} must be a contiguous 1-d {dtype} tensor"
                  f"{'' if count is None else f' of {count} entries'} on x's device")
    if skipped is not None and (not isinstance(skipped, torch.Tensor) or skipped.dtype !=
                                torch.int32 or skipped.numel() != 1 or skipped.device != x.device):
        _fail("skipped must be an int32 tensor of one element on x's device")
    k_quant = real("k_scale", k_scale, ctypes.c_float)
    v_quant = real("v_scale", v_scale, ctypes.c_float)
    store = "e4m3" if k_cache.dtype == fp8 else "same"
    if any(t is not None for t in scales):
        # A dynamic FP8 cache: a float32 scale per cached row and head, computed by the unfused
        # path's RoPE step (such calls take that path at every size).
        if any(t is None for t in scales):
            _fail("k_cache_scales and v_cache_scales go together")
        if k_cache.dtype != fp8:
            _fail(f"k_cache_scales is given but k_cache.dtype is {k_cache.dtype}: dynamic scales "
                  "are for a float8_e4m3fn cache")
        if (k_scale, v_scale) != (1.0, 1.0):
            _fail(f"k_scale ({k_scale!r}) / v_scale ({v_scale!r}) and k_cache_scales are both "
                  "given: k_cache_scales asks for a scale per token and head, computed in the "
                  "kernel")
        want = tuple(k_cache.shape[:3])
        for name, t in (("k_cache_scales", scales[0]), ("v_cache_scales", scales[1])):
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32
                    or t.device != x.device or tuple(t.shape) != want):
                _fail(f"{name} must be a float32 tensor {list(want)} ({kv_layout} "
                      f"{dims}]) on x's device")
        if scales[0].stride() != scales[1].stride():
            _fail(f"v_cache_scales (strides {scales[1].stride()}) must match k_cache_scales "
                  f"(strides {scales[0].stride()})")
        store = "e4m3_dynamic"
    if fake:  # a trace (the torch op's fake tensors): no addresses, and shapes may be symbolic
        return None, _capi.STORES[store], mode
    c = fill(_capi.ropejit_kv_cache(), "cache.", k=k_cache.data_ptr(), v=v_cache.data_ptr(),
             pages=k_cache.shape[0], page_size=k_cache.shape[axes[1]],
             **dict(zip(("stride_page", "stride_slot", "stride_head"),
                        (k_cache.stride(i) for i in axes))))
    if mode == "slots":
        fill(c, "cache.", slot_mapping=addressing[mode][0].data_ptr())
    elif mode == "paged":
        indptr, indices, last = addressing[mode]
        fill(c, "cache.", indptr=indptr.data_ptr(), indices=indices.data_ptr(),
             last_page_len=last.data_ptr(), num_indices=indices.numel())
    else:
        fill(c, "cache.", seq_lens=addressing[mode][0].data_ptr())
    c.k_quant_scale, c.v_quant_scale = k_quant, v_quant
    if skipped is not None:
        fill(c, "cache.", skipped=skipped.data_ptr())
    if store == "e4m3_dynamic":
        fill(c, "cache.", k_scales=scales[0].data_ptr(), v_scales=scales[1].data_ptr(),
             **dict(zip(("scale_stride_page", "scale_stride_slot", "scale_stride_head"),
                        (scales[0].stride(i) for i in axes))))
    return c, _capi.STORES[store], mode


def _choices(**named):
    """{argument: its enum code} for arguments given as (value, table)."""
    return {name: choice(name, value, table) for name, (value, table) in named.items()}


def qkv_projection_key(dtype="bf16", head_dim=128, rotary_dim=None, style="neox",
                       positions="ids", index_type="i64", freqs="table", table_dtype="f32",
                       table_width="half", norm="rms", weights="same", cache="none",
                       cache_store="same"):
    """The key string of a projection kernel (no GPU needed); ``weights="e4m3"`` for FP8
    weights, ``cache="slots"`` (``cache_store="e4m3"``) for a KV cache."""
    s = fill(_capi.new(_capi.ropejit_qkv_proj_spec), head_dim=head_dim,
             rotary_dim=rotary_dim or 0, **_choices(
                 dtype=(dtype, _capi.DTYPES), style=(style, _capi.STYLES),
                 positions=(positions, _capi.POSITIONS),
                 index_type=(index_type, _capi.INDEX_TYPES), freqs=(freqs, _capi.FREQS),
                 table_dtype=(table_dtype, _capi.DTYPES),
                 table_width=(table_width, _capi.TABLE_WIDTHS), norm=(norm, _NORMS),
                 weights=(weights, _capi.WEIGHTS), cache=(cache, _capi.KV_CACHES),
                 cache_store=(cache_store, _capi.STORES)))
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_qkv_proj_key(ctypes.byref(s), buf, len(buf)))
    return buf.value.decode()


def _workspace(x, size_fn, spec, a):
    import torch
    size = ctypes.c_size_t()
    _capi.check(size_fn(ctypes.byref(spec), ctypes.byref(a), ctypes.byref(size)))
    workspace = torch.empty(size.value, dtype=torch.uint8, device=x.device)
    fill(a, workspace=workspace.data_ptr(), workspace_bytes=size.value)
    return workspace


def ffn_gate_up(x, weight=None, *, intermediate=None, gate_weight=None, up_weight=None,
                norm_weight=None, eps=1e-6, norm="rms", act="silu", path="auto",
                weight_scale=None, gate_scale=None, up_scale=None, _fake=False, _plans=None):
    """Returns ``act(RMSNorm(x) @ gate.T) * (RMSNorm(x) @ up.T)``, a new ``[tokens,
    intermediate]`` tensor; see the module docstring. ``norm="none"`` skips RMSNorm;
    ``"rms_one_plus"`` is Gemma's ``(1 + w)``. float8_e4m3fn weights take float32 scales per row:
    ``weight_scale`` ``[2 * intermediate]`` with the merged weight, ``gate_scale`` and
    ``up_scale`` ``[intermediate]`` with separate ones."""
    import torch
    key = None if _fake else _plan_key(
        "ffn", (x, weight, gate_weight, up_weight, weight_scale, gate_scale, up_scale,
                norm_weight), (intermediate, eps, norm, act, path))
    plan = None if key is None else _planned(key)
    if plan is not None:
        if weight is not None:  # the merged weight's halves, as the first call split it
            half = weight.shape[0] // 2
            gate_weight, up_weight = weight[:half], weight[half:]
            if weight_scale is not None:
                gate_scale, up_scale = weight_scale[:half], weight_scale[half:]
        a = _capi.ropejit_ffn_args.from_buffer_copy(plan[1])
        _addresses(a, _FFN_POINTERS, (x, gate_weight, up_weight, gate_scale, up_scale,
                                      norm_weight))
        out = torch.empty(x.shape[0], gate_weight.shape[0], dtype=x.dtype, device=x.device)
        a.out = out.data_ptr()
        _launch_planned(x, plan, a, _capi.lib.ropejit_ffn_gate_up)
        if _plans is not None:  # the plan with this call's addresses (the kept one has another's)
            _plans.append((plan[0], bytes(a), plan[2], plan[3]))
        return out
    _choices(path=(path, _capi.PROJ_PATHS), act=(act, _capi.ACTIVATIONS), norm=(norm, _NORMS))
    if intermediate is not None:  # checked first: the shape checks below compute with it
        intermediate = integer("intermediate", intermediate)
    if (weight is None) == (gate_weight is None and up_weight is None):
        _fail("give weight (the merged [2 * intermediate, hidden] gate_up) or gate_weight and "
              "up_weight, not both")
    if weight is None and (gate_weight is None or up_weight is None):
        _fail("gate_weight and up_weight go together")
    if not isinstance(x, torch.Tensor):
        _fail("x must be a torch tensor")
    if not x.is_cuda:
        _fail(f"x is on {x.device}: the FFN runs on a CUDA device")
    if x.dim() != 2 or x.stride(-1) != 1:
        _fail(f"x must be [tokens, hidden] with a contiguous last dimension, got shape "
              f"{tuple(x.shape)} and strides {x.stride()}")
    if weight is not None:
        if gate_scale is not None or up_scale is not None:
            _fail("with the merged weight give weight_scale ([2 * intermediate]), not "
                  "gate_scale / up_scale")
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] % 2:
            _fail(f"weight must be [2 * intermediate, hidden], got shape "
                  f"{tuple(getattr(weight, 'shape', ()))}")
        if intermediate is not None and weight.shape[0] != 2 * intermediate:
            _fail(f"weight.shape[0] ({weight.shape[0]}) must be 2 x intermediate "
                  f"({2 * intermediate})")
        if weight.device != x.device:
            _fail(f"weight is on {weight.device} but x is on {x.device}")
        kind = _weights(x, weight.shape[0], ((("weight", weight), ("weight_scale", weight_scale)),))
        intermediate = weight.shape[0] // 2
        gate_weight, up_weight = weight[:intermediate], weight[intermediate:]
        if kind == "e4m3":
            gate_scale, up_scale = weight_scale[:intermediate], weight_scale[intermediate:]
    elif weight_scale is not None:
        _fail("weight_scale goes with the merged weight; give gate_scale and up_scale")
    for name, w in (("gate_weight", gate_weight), ("up_weight", up_weight)):
        if (not isinstance(w, torch.Tensor) or w.dim() != 2 or w.stride(-1) != 1
                or w.device != x.device):
            _fail(f"{name} must be a [intermediate, hidden] CUDA tensor on x's device with a "
                  f"contiguous last dimension")
        if w.shape[1] != x.shape[1]:
            _fail(f"{name}.shape[1] ({w.shape[1]}) must equal x.shape[1] ({x.shape[1]})")
        if w.shape[0] > 1 and w.stride(0) == 0:
            _fail(f"{name} has stride 0 over its rows (an expanded tensor)")
    if gate_weight.shape != up_weight.shape or gate_weight.stride() != up_weight.stride():
        _fail("gate_weight and up_weight must have one shape and one row stride")
    if intermediate is not None and gate_weight.shape[0] != intermediate:
        _fail(f"gate_weight.shape[0] ({gate_weight.shape[0]}) must be intermediate "
              f"({intermediate})")
    intermediate = gate_weight.shape[0]
    weights = _weights(x, intermediate, ((("gate_weight", gate_weight), ("gate_scale", gate_scale)),
                                         (("up_weight", up_weight), ("up_scale", up_scale))))
    if norm != "none":
        if norm_weight is None:
            _fail(f"norm ({norm!r}) needs norm_weight")
        if (norm_weight.dtype != x.dtype or not norm_weight.is_contiguous()
                or norm_weight.dim() != 1 or norm_weight.numel() != x.shape[1]
                or norm_weight.device != x.device):
            _fail(f"norm_weight must be a contiguous [{x.shape[1]}] tensor in x's dtype on x's "
                  f"device, got shape {tuple(norm_weight.shape)}, dtype {norm_weight.dtype}")
    dtypes = {torch.bfloat16: "bf16", torch.float16: "f16"}
    if x.dtype not in dtypes:
        _fail(f"x.dtype ({x.dtype}) must be torch.bfloat16 or torch.float16")
    spec = _capi.new(_capi.ropejit_ffn_spec)
    spec.dtype, spec.norm = _capi.DTYPES[dtypes[x.dtype]], _NORMS[norm]
    spec.act = _capi.ACTIVATIONS[act]
    spec.weights = _capi.WEIGHTS[weights]
    tokens = x.shape[0]
    out = torch.empty(tokens, intermediate, dtype=x.dtype, device=x.device)
    if _fake:  # the torch op's trace: the checks above, and the output's shape
        return out
    a = fill(_capi.new(_capi.ropejit_ffn_args), tokens=tokens, hidden=x.shape[1],
             intermediate=intermediate, x=x.data_ptr(),
             x_stride=x.stride(0) if tokens > 1 else x.shape[1],
             gate_weight=gate_weight.data_ptr(), up_weight=up_weight.data_ptr(),
             weight_stride=gate_weight.stride(0) if intermediate > 1 else x.shape[1],
             out=out.data_ptr(), out_stride=intermediate, path=_capi.PROJ_PATHS[path])
    a.norm_eps = real("eps", eps)
    if weights == "e4m3":
        fill(a, gate_scale=gate_scale.data_ptr(), up_scale=up_scale.data_ptr())
    if norm_weight is not None:
        fill(a, norm_weight=norm_weight.data_ptr())
    if tokens == 0:
        return out
    with torch.cuda.device(x.device):
        fill(a, stream=torch.cuda.current_stream(x.device).cuda_stream)
        taken = path
        if path == "auto":
            slot = ("ffn", bytes(spec), 1 << (tokens - 1).bit_length(), a.hidden, intermediate,
                    x.device.index)
            taken = _paths.get(slot)
            if taken is None:
                code = ctypes.c_int32()
                _capi.check(_capi.lib.ropejit_ffn_gate_up_path(
                    ctypes.byref(spec), ctypes.byref(a), ctypes.byref(code)))
                taken = _paths[slot] = "unfused" if code.value == 2 else "fused"
        workspace = None
        if taken == "unfused":
            workspace = _workspace(x, _capi.lib.ropejit_ffn_gate_up_workspace_bytes, spec, a)
        _capi.check(_capi.lib.ropejit_ffn_gate_up(ctypes.byref(spec), ctypes.byref(a)))
        plan = (spec, bytes(a), taken, 0 if workspace is None else workspace.numel())
        _remember_plan(key, plan)
        if _plans is not None:
            _plans.append(plan)
        del workspace  # the caching allocator keeps it for this stream's queued work
    return out


def rms_norm(x, weight, eps=1e-6, *, residual=None, norm="rms", out=None, _fake=False):
    """RMSNorm over the last dimension (C++ ``ropejit::rms_norm``): ``x / sqrt(mean(x**2) + eps)
    * weight`` (``norm="rms_one_plus"``: ``* (1 + weight)``, Gemma), in fp32, rounded once to x's
    dtype. ``x`` is ``[..., hidden]`` with rows a uniform stride apart (a 2-d view, or any
    contiguous tensor); ``weight`` ``[hidden]`` in x's dtype. With ``residual`` (x's shape),
    ``x + residual`` is formed first (rounded once), written back into ``residual`` and
    normalized: vLLM's ``fused_add_rms_norm``, transformers' ``h = h + attn; norm(h)`` in one
    launch. Returns ``out`` (a new tensor unless given; it may be x itself). bf16, fp16 or fp32
    on a CUDA device; ``hidden`` a multiple of 16 bytes' elements."""
    import torch
    choice("norm", norm, _RMS_NORMS)
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        _fail("x and weight must be torch tensors")
    if not x.is_cuda:
        _fail(f"x is on {x.device}: RMSNorm runs on a CUDA device")
    dtypes = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    if x.dtype not in dtypes:
        _fail(f"x.dtype ({x.dtype}) must be bfloat16, float16 or float32")
    if x.dim() < 1 or x.shape[-1] < 1:
        _fail(f"x must have a last dimension (hidden), got shape {tuple(x.shape)}")
    hidden = x.shape[-1]

    def rows_of(name, t):
        """[rows, hidden] view of t and its row stride."""
        if t.shape != x.shape:
            _fail(f"{name} has shape {tuple(t.shape)}, x {tuple(x.shape)}: they must match")
        if t.dtype != x.dtype or t.device != x.device:
            _fail(f"{name} must be {x.dtype} on {x.device}, got {t.dtype} on {t.device}")
        if t.dim() == 2 and t.stride(1) == 1:
            return t
        if not t.is_contiguous():
            _fail(f"{name} must be contiguous or a 2-d [rows, hidden] view with a contiguous "
                  f"last dimension, got strides {t.stride()}")
        return t.view(-1, hidden)

    x2 = rows_of("x", x)
    if (weight.dtype != x.dtype or weight.device != x.device or weight.dim() != 1
            or weight.numel() != hidden or not weight.is_contiguous()):
        _fail(f"weight must be a contiguous [{hidden}] tensor of {x.dtype} on {x.device}, got "
              f"{weight.dtype} of shape {tuple(weight.shape)} on {weight.device}")
    r2 = None if residual is None else rows_of("residual", residual)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    o2 = rows_of("out", out)
    if _fake or x2.shape[0] == 0:
        return out
    spec = _capi.new(_capi.ropejit_rms_norm_spec)
    fill(spec, dtype=_capi.DTYPES[dtypes[x.dtype]], norm=_NORMS[norm], residual=int(r2 is not None))

    def stride(t):
        return t.stride(0) if t.shape[0] > 1 else hidden

    a = fill(_capi.new(_capi.ropejit_rms_norm_args), rows=x2.shape[0], hidden=hidden,
             x=x2.data_ptr(), x_stride=stride(x2), weight=weight.data_ptr(),
             out=o2.data_ptr(), out_stride=stride(o2))
    a.norm_eps = real("eps", eps)
    if r2 is not None:
        fill(a, residual=r2.data_ptr(), residual_stride=stride(r2))
    with torch.cuda.device(x.device):
        fill(a, stream=torch.cuda.current_stream(x.device).cuda_stream)
        _capi.check(_capi.lib.ropejit_rms_norm(ctypes.byref(spec), ctypes.byref(a)))
    return out


def rms_norm_key(dtype="bf16", norm="rms", residual=False):
    """The key string of an RMSNorm kernel (no GPU needed)."""
    s = fill(_capi.new(_capi.ropejit_rms_norm_spec), residual=int(flag("residual", residual)),
             **_choices(dtype=(dtype, _capi.DTYPES), norm=(norm, _RMS_NORMS)))
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_rms_norm_key(ctypes.byref(s), buf, len(buf)))
    return buf.value.decode()


def ffn_key(dtype="bf16", norm="rms", act="silu", weights="same"):
    """The key string of an FFN gate/up kernel (no GPU needed); ``weights="e4m3"`` for FP8
    weights."""
    s = fill(_capi.new(_capi.ropejit_ffn_spec), **_choices(
        dtype=(dtype, _capi.DTYPES), norm=(norm, _NORMS), act=(act, _capi.ACTIVATIONS),
        weights=(weights, _capi.WEIGHTS)))
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_ffn_key(ctypes.byref(s), buf, len(buf)))
    return buf.value.decode()

