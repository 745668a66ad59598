"""One call described by tensor views -> the C structs (ropejit_spec, ropejit_args), after every
check the C API cannot make (it sees pointers and strides, not dtypes, devices or extents), then
the launch. Shared by ropejit.apply (any tensor) and the torch ops (which also plan with fake
tensors while tracing, so that bad input fails at trace time)."""

import ctypes
import math
import struct

from ropejit import _capi, _model
from ropejit._cvalues import fill, flag, integer, shown
from ropejit._tensors import View, device_name
from ropejit.errors import InvalidArgument

ACTIVATION_DTYPES = ("f32", "f16", "bf16")
INDEX_DTYPES = ("i32", "i64")
# Axes (batch, seq, heads) of q in each dense layout; thd is (tokens, heads, head_dim).
DENSE_AXES = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}
# A KV cache's axes other than head_dim, by kv_layout: where (page, slot, head) are.
KV_AXES = {"NHD": (0, 1, 2), "HND": (0, 2, 1)}
_SHAPES = {"bshd": "[batch, seq, heads, head_dim]", "sbhd": "[seq, batch, heads, head_dim]",
           "bhsd": "[batch, heads, seq, head_dim]", "thd": "[tokens, heads, head_dim]"}


def _fail(message):
    raise InvalidArgument("ropejit: " + message)


def _choice(field, value, table):
    try:
        known = value in table
    except TypeError:  # unhashable
        known = False
    if not known:
        _fail(f"{field} ({shown(value)}) must be one of {', '.join(map(repr, table))}")
    return value


def _is_row_major(v):
    step = 1
    for n, s in zip(reversed(v.shape), reversed(v.strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def _numel(v):
    return math.prod(v.shape)


def _finite(x):
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond any double
        return False


class _Checker:
    """Device and dtype checks against q: every operand on q's device."""

    def __init__(self, q, allow_meta):
        self.device = q.device
        self.allow_meta = allow_meta
        self.device_of(q)

    def device_of(self, v):
        kind, index = v.device
        if kind == "meta" and self.allow_meta:
            return
        if kind != "cuda":
            _fail(f"{v.name} is on {device_name(v.device)}: ropejit needs CUDA device memory "
                  f"(move it with .cuda() / .to('cuda'))")
        if index is not None and self.device[1] is not None and index != self.device[1]:
            _fail(f"{v.name} is on {device_name(v.device)} but q is on "
                  f"{device_name(self.device)}: every tensor of a call must be on one device")

    def dtype_of(self, v, allowed, what):
        if v.dtype not in allowed:
            _fail(f"{v.name}.dtype ({v.dtype}) must be {' or '.join(allowed)} ({what})")


def _dims(v, layout):
    """(batch, seq, heads, head_dim) of an operand; batch is None for thd."""
    want = 3 if layout == "thd" else 4
    if v.ndim != want:
        _fail(f"{v.name} must be {want}-d {_SHAPES[layout]} for layout {layout!r}, got shape "
              f"{list(v.shape)}")
    if v.strides[-1] != 1 and v.shape[-1] != 1:
        _fail(f"{v.name} needs a contiguous last dimension (stride 1), got strides "
              f"{list(v.strides)} for shape {list(v.shape)}: call .contiguous() first")
    if layout == "thd":
        return None, v.shape[0], v.shape[1], v.shape[2]
    b, s, h = DENSE_AXES[layout]
    return v.shape[b], v.shape[s], v.shape[h], v.shape[3]


_INT64 = range(-(1 << 63), 1 << 63)


def tensor(name, data, heads, stride_batch, stride_seq, stride_head):
    """The ropejit_tensor of operand `name`, its values checked against the fields' C types."""
    if (type(data) is int and 0 <= data < (1 << 64) and type(heads) is int and heads in _INT64
            and type(stride_batch) is int and stride_batch in _INT64 and type(stride_seq) is int
            and stride_seq in _INT64 and type(stride_head) is int and stride_head in _INT64):
        # The common case (every planned call builds two to four of these), then fill's checks.
        return _capi.ropejit_tensor(data, heads, stride_batch, stride_seq, stride_head)
    return fill(_capi.ropejit_tensor(), f"{name}.", data=data, heads=heads,
                stride_batch=stride_batch, stride_seq=stride_seq, stride_head=stride_head)


def _operand(v, layout):
    if layout == "thd":
        return tensor(v.name, v.ptr, v.shape[1], 0, v.strides[0], v.strides[1])
    b, s, h = DENSE_AXES[layout]
    return tensor(v.name, v.ptr, v.shape[h], v.strides[b], v.strides[s], v.strides[h])


def _index_tensor(chk, v, count, what):
    chk.device_of(v)
    chk.dtype_of(v, INDEX_DTYPES, what)
    if _numel(v) != count or not _is_row_major(v):
        _fail(f"{v.name} must be contiguous with {count} elements ({what}), got shape "
              f"{list(v.shape)} strides {list(v.strides)}")


_SPECS = {}
_SCALINGS = {}


def _spec(layout, dtype, head_dim, rotary_dim, style, positions, index_type, freqs, width,
          table_dtype, backward, in_place):
    """The ropejit_spec for these axes, built once (a call's hot path is a dict lookup)."""
    key = (layout, dtype, head_dim, rotary_dim, style, positions, index_type, freqs, width,
           table_dtype, backward, in_place)
    s = _SPECS.get(key)
    if s is None:
        s = fill(_capi.default_spec(), layout=_capi.LAYOUTS[layout], dtype=_capi.DTYPES[dtype],
                 head_dim=head_dim, rotary_dim=rotary_dim, style=_capi.STYLES[style],
                 positions=_capi.POSITIONS[positions], index_type=_capi.INDEX_TYPES[index_type],
                 freqs=_capi.FREQS[freqs], table_dtype=_capi.DTYPES[table_dtype],
                 table_width=_capi.TABLE_WIDTHS[width],
                 direction=_capi.DIRECTIONS["backward" if backward else "forward"],
                 in_place=in_place)
        _SPECS[key] = s
    return s


def _scaling_struct(scaling):
    """The ropejit_scaling of a ropejit.Scaling (None: the defaults), built once per value; the
    factor arrays stay alive with it, and with every args struct it is assigned into."""
    s = _SCALINGS.get(scaling)
    if s is None:
        if len(_SCALINGS) >= 64:  # a model has one; bound what a caller making new ones costs
            _SCALINGS.clear()
        s = _SCALINGS[scaling] = _model.c_scaling(scaling)
    return s


def _check_mrope(section, interleaved, rotary_dim, build):
    if isinstance(section, (str, bytes)) or not hasattr(section, "__len__") or len(section) != 3:
        _fail(f"mrope_section ({shown(section)}) must be 3 ints: the rotary pairs taking the "
              f"temporal, height and width position rows")
    if not isinstance(interleaved, bool):
        _fail(f"mrope_interleaved ({shown(interleaved)}) must be True or False")
    if not build:
        return
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in section):
        _fail(f"mrope_section ({list(section)!r}) must be 3 ints >= 0")
    if sum(section) != rotary_dim // 2:
        _fail(f"mrope_section ({list(section)!r}) must sum to rotary_dim / 2 "
              f"({rotary_dim // 2})")


def _check_scaling_in_c(freqs, rotary_dim, scaling):
    """The library's own checks of the variant's parameters (ropejit_attention_factor runs
    them), for tracing, where no call reaches the C API until the graph runs."""
    _model.check_factors(freqs, rotary_dim, scaling)
    table = fill(_capi.new(_capi.ropejit_table_spec), freqs=_capi.FREQS[freqs],
                 scaling=_scaling_struct(scaling))
    out = ctypes.c_double()
    _capi.check(_capi.lib.ropejit_attention_factor(
        ctypes.byref(table), integer("rotary_dim", rotary_dim, ctypes.c_int32),
        ctypes.byref(out)))


def plan(q, k=None, q_out=None, k_out=None, *, cos=None, sin=None, position_ids=None,
         seq_offsets=None, cu_seqlens=None, layout="bshd", style="neox", rotary_dim=None,
         position_offset=0, base=10000.0, freqs=None, scaling=None, seq_len=None,
         mrope_section=None, mrope_interleaved=False, backward=False, allow_meta=False,
         build=True):
    """(ropejit_spec, ropejit_args without the stream) for views q, k, q_out, k_out (None when
    absent); out of place exactly when q_out is given. Raises InvalidArgument naming the
    argument and its value; the C API checks the rest (strides, overlaps, position range,
    the scaling parameters a variant reads). build=False only checks (torch's fake tensors,
    whose sizes may be symbolic): returns None.

    freqs: None (table with cos/sin, else computed), or a Freqs name; the scaled variants take
    `scaling` (a ropejit.Scaling) and dynamic_ntk / longrope `seq_len` (default: the last
    position + 1 with offset positions on a dense layout, else required). mrope_section (3
    ints): position_ids holds three rows [3, tokens] (mRoPE), pair i taking its section's row.
    """
    _choice("layout", layout, _capi.LAYOUTS)
    _choice("style", style, _capi.STYLES)
    flag("backward", backward)
    chk = _Checker(q, allow_meta)
    chk.dtype_of(q, ACTIVATION_DTYPES, "the activation dtype")
    batch, seq, _, head_dim = _dims(q, layout)
    if rotary_dim is None or rotary_dim == 0:
        rotary_dim = head_dim
    if ((build and not isinstance(rotary_dim, int)) or rotary_dim <= 0 or rotary_dim % 2
            or rotary_dim > head_dim):
        _fail(f"rotary_dim ({shown(rotary_dim)}) must be even and in [2, head_dim ({head_dim})]")

    def same_call(v, heads_may_differ=True):
        chk.device_of(v)
        if v.dtype != q.dtype:
            _fail(f"{v.name}.dtype ({v.dtype}) must equal q.dtype ({q.dtype})")
        vb, vs, vh, vd = _dims(v, layout)
        if (vb, vs, vd) != (batch, seq, head_dim):
            _fail(f"{v.name} has shape {list(v.shape)}, q has {list(q.shape)}: batch, seq and "
                  f"head_dim must match ({layout})")
        return vh

    if k is not None:
        same_call(k)
    in_place = q_out is None
    if not in_place:
        for src, out in ((q, q_out), (k, k_out)):
            if src is None:
                continue
            if out is None:
                _fail(f"{src.name}_out is missing: out of place needs an output for every input")
            same_call(out)
            if tuple(out.shape) != tuple(src.shape):
                _fail(f"{out.name} has shape {list(out.shape)}, {src.name} has "
                      f"{list(src.shape)}")
        if k is None and k_out is not None:
            _fail(f"{k_out.name} is given without k")

    tokens = seq if layout == "thd" else batch * seq
    if position_ids is not None and seq_offsets is not None:
        _fail("position_ids and seq_offsets are both given: pass one")
    if layout == "thd":
        if cu_seqlens is None:
            if position_ids is None:
                _fail("layout 'thd' needs cu_seqlens (or position_ids)")
            batch = 1
        else:
            chk.device_of(cu_seqlens)
            chk.dtype_of(cu_seqlens, ("i32",), "cu_seqlens")
            if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2 or cu_seqlens.strides[0] != 1:
                _fail(f"cu_seqlens must be contiguous 1-d [batch + 1], got shape "
                      f"{list(cu_seqlens.shape)} strides {list(cu_seqlens.strides)}")
            batch = cu_seqlens.shape[0] - 1
    elif cu_seqlens is not None:
        _fail(f"cu_seqlens is only for layout 'thd' (layout is {layout!r})")

    index_type = "i64"
    if mrope_section is not None:
        _check_mrope(mrope_section, mrope_interleaved, rotary_dim, build)
        if position_ids is None:
            _fail("mrope_section needs position_ids with three rows [3, tokens] (temporal, "
                  "height, width)")
        positions = "mrope"
        _index_tensor(chk, position_ids, 3 * tokens, "three rows of one position per token, "
                      "[3, tokens]")
        index_type = position_ids.dtype
    elif mrope_interleaved:
        _fail("mrope_interleaved is set but mrope_section is not")
    elif position_ids is not None:
        positions = "ids"
        _index_tensor(chk, position_ids, tokens, "one position per token")
        index_type = position_ids.dtype
    elif seq_offsets is not None:
        positions = "seq_offsets"
        _index_tensor(chk, seq_offsets, batch, "one offset per sequence")
        index_type = seq_offsets.dtype
    else:
        positions = "offset"
        if build and not isinstance(position_offset, int):
            _fail(f"position_offset ({shown(position_offset)}) must be an int")

    table = cos is not None or sin is not None
    if freqs is None:
        freqs = "table" if table else "computed"
    _choice("freqs", freqs, _capi.FREQS)
    if table and freqs != "table":
        _fail(f"cos/sin are given but freqs is {freqs!r}, which computes cos/sin in the kernel: "
              f"pass one or the other")
    if not table and freqs == "table":
        _fail("freqs 'table' needs cos and sin")
    scaled = freqs not in ("table", "computed")
    if scaling is not None and not isinstance(scaling, _model.Scaling):
        _fail(f"scaling ({shown(scaling)}) must be a ropejit.Scaling")
    if scaling is not None and not scaled:
        _fail(f"scaling is given but freqs is {freqs!r}, which reads none: name the variant "
              f"({', '.join(map(repr, _model.COMPUTED_FREQS[1:]))})")
    if freqs in _model.NEEDS_SEQ_LEN:
        if seq_len is None:
            if positions != "offset" or layout == "thd":
                _fail(f"freqs {freqs!r} picks its frequencies by the sequence length: pass "
                      f"seq_len (transformers uses max(position_ids) + 1) with {positions} "
                      f"positions" + (" on layout 'thd'" if positions == "offset" else ""))
            seq_len = position_offset + seq
        elif build and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0):
            _fail(f"seq_len ({shown(seq_len)}) must be an int >= 0")
    if scaled and not build and isinstance(rotary_dim, int):
        _check_scaling_in_c(freqs, rotary_dim, scaling)
    width, table_dtype = "half", "f32"
    if table:
        if cos is None or sin is None:
            _fail(f"{'cos' if cos is None else 'sin'} is missing: a table needs both cos and sin")
        for t in (cos, sin):
            chk.device_of(t)
            chk.dtype_of(t, ACTIVATION_DTYPES, "the table dtype")
            if t.ndim != 2 or (t.strides[1] != 1 and t.shape[1] != 1):
                _fail(f"{t.name} must be 2-d [rows, width] with contiguous rows, got shape "
                      f"{list(t.shape)} strides {list(t.strides)}")
        if (cos.shape, cos.strides, cos.dtype) != (sin.shape, sin.strides, sin.dtype):
            _fail(f"cos ({cos.dtype} {list(cos.shape)} strides {list(cos.strides)}) and sin "
                  f"({sin.dtype} {list(sin.shape)} strides {list(sin.strides)}) must match")
        if cos.shape[1] == rotary_dim // 2:
            width = "half"
        elif cos.shape[1] == rotary_dim:
            width = "full"
        else:
            _fail(f"cos has {cos.shape[1]} columns: a table row holds rotary_dim / 2 "
                  f"({rotary_dim // 2}, half width) or rotary_dim ({rotary_dim}, full width) "
                  f"values; pass rotary_dim for partial rotary")
        table_dtype = cos.dtype
    elif not isinstance(base, (int, float)) or not _finite(base) or base <= 1:
        _fail(f"base ({shown(base)}) must be a finite number > 1 (computed frequencies)")

    if not build:
        return None
    spec = _spec(layout, q.dtype, head_dim, rotary_dim, style, positions, index_type, freqs,
                 width, table_dtype, backward, in_place)
    a = _capi.ropejit_args.from_buffer_copy(_capi.DEFAULT_ARGS)
    a.q = _operand(q, layout)
    if k is not None:
        a.k = _operand(k, layout)
    if not in_place:
        a.q_out = _operand(q_out, layout)
        if k is not None:
            a.k_out = _operand(k_out, layout)
    fields = dict(batch=batch, seq_len=seq)  # filled at once, each checked for its C type
    if positions in ("ids", "mrope"):
        fields["position_ids"] = position_ids.ptr
    elif positions == "seq_offsets":
        fields["seq_offsets"] = seq_offsets.ptr
    else:
        fields["position_offset"] = position_offset
    if cu_seqlens is not None:
        fields["cu_seqlens"] = cu_seqlens.ptr
    if table:
        fields.update(cos=cos.ptr, sin=sin.ptr, table_stride=cos.strides[0],
                      table_rows=cos.shape[0])
    else:
        fields["base"] = base
    if scaled:
        _model.check_factors(freqs, rotary_dim, scaling)
        a.scaling = _scaling_struct(scaling)
        if freqs in _model.NEEDS_SEQ_LEN:
            fill(a.scaling, seq_len=seq_len)
    if positions == "mrope":
        fields.update(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    fill(a, **fields)
    return spec, a


# Plans of earlier calls, by entry point and everything its planning reads except the tensors'
# addresses (shapes, strides, dtypes, devices, the other arguments with their types): an eager
# loop repeats a few shapes, and planning (checks, structs) is a large part of a call's host
# time. An entry holds the spec, the args struct's bytes and where each tensor's address goes in
# them; the C API checks every call's addresses (alignment, overlap) whatever is remembered.
_PLANS = {}
_MAX_PLANS = 256
# The same plans keyed by torch's own objects (torch.Size, stride tuple, torch.dtype,
# torch.device) for calls made only of torch tensors: a repeated call then reads four
# attributes and the address of each tensor, and builds no View (fast_plan).
_TORCH_PLANS = {}


def _pointer_offsets(cls, base=0):
    """Byte offsets of every void* field of a ctypes struct, nested structs included."""
    out = []
    for name, typ in cls._fields_:
        at = base + getattr(cls, name).offset
        if typ is _capi._ptr:
            out.append(at)
        elif isinstance(typ, type) and issubclass(typ, ctypes.Structure):
            out += _pointer_offsets(typ, at)
    return out


_ARGS_POINTERS = _pointer_offsets(_capi.ropejit_args)
_STAND_IN_SHIFT = 44  # stand-in address of tensor i: (i + 1) << 44, never a real one


def _remember(key, tensors, plan_call):
    """Plans once more with stand-in addresses to find where each tensor's address lands in the
    args struct, and keeps the plan under `key`."""
    stand_ins = [None if v is None else View(v.name, (i + 1) << _STAND_IN_SHIFT, v.shape,
                                             v.strides, v.dtype, v.device, v.stream)
                 for i, v in enumerate(tensors)]
    spec, args = plan_call(stand_ins)
    raw = bytes(args)
    low = (1 << _STAND_IN_SHIFT) - 1
    patches = []
    for at in _ARGS_POINTERS:
        value = struct.unpack_from("<Q", raw, at)[0]
        slot = (value >> _STAND_IN_SHIFT) - 1
        if value and value & low == 0 and 0 <= slot < len(tensors):
            patches.append((at, slot))
    found = {slot for _, slot in patches}
    if any(v is not None and i not in found for i, v in enumerate(tensors)):
        return  # a tensor that planning uses other than by its address: not remembered
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
        _TORCH_PLANS.clear()
    _PLANS[key] = (spec, raw, tuple(patches))


def _remember_torch(torch_key, plan):
    if torch_key is None or plan is None:
        return
    if len(_TORCH_PLANS) >= _MAX_PLANS:
        _TORCH_PLANS.clear()
    _TORCH_PLANS[torch_key] = plan


def _filled(plan, addresses):
    """(spec, args) of a remembered plan with these tensors' addresses (by slot) written in."""
    spec, raw, patches = plan
    buf = bytearray(raw)
    for at, slot in patches:
        struct.pack_into("<Q", buf, at, addresses[slot])
    return spec, _capi.ropejit_args.from_buffer(buf)


def fast_plan(entry, tensors, opts, tensor_type):
    """For a call whose tensors are all torch tensors (`tensor_type`) or None: ((spec, args),
    key) when a call of entry point `entry` with the same shapes, strides, dtypes, devices and
    `opts` was planned before, else (None, key) to pass to cached_plan as `torch_key` (None
    when the call cannot take this path: another kind of tensor, an unhashable argument, a
    tensor without storage)."""
    addresses = []
    meta = []
    for t in tensors:
        if t is None:
            addresses.append(0)
            meta.append(None)
            continue
        if not isinstance(t, tensor_type):
            return None, None
        ptr = t.data_ptr()
        if not ptr:
            return None, None
        addresses.append(ptr)
        meta.append((t.shape, t.stride(), t.dtype, t.device))
    key = (entry, tuple((type(x), x) for x in opts.values()), tuple(meta))
    try:
        hit = _TORCH_PLANS.get(key)
    except TypeError:  # an argument that cannot be a key (a list)
        return None, None
    return (None if hit is None else _filled(hit, addresses)), key


def cached_plan(entry, tensors, opts, plan_call, torch_key=None):
    """(spec, args) of a call: from the plan of an earlier call of entry point `entry` with the
    same tensor shapes, strides, dtypes and devices and the same `opts` (values and types), with
    this call's addresses written in; else plan_call(tensors), which refuses bad input, then
    remembered (also under `torch_key`, fast_plan's key of the same call). `tensors`: Views or
    None in the entry point's fixed order; `opts`: a dict of the other arguments in a fixed
    order. Calls with frequency scaling parameters, unhashable arguments or fake tensors
    (address 0) are planned every time."""
    key = None
    if opts.get("scaling") is None and all(v is None or v.ptr for v in tensors):
        key = (entry, tuple((type(x), x) for x in opts.values()),
               tuple(None if v is None else (v.shape, v.strides, v.dtype, v.device)
                     for v in tensors))
        try:
            hit = _PLANS.get(key)
        except TypeError:  # an argument that cannot be a key (a list)
            key = hit = None
        if hit is not None:
            _remember_torch(torch_key, hit)
            return _filled(hit, [0 if v is None else v.ptr for v in tensors])
    spec, args = plan_call(tensors)
    if key is not None:
        _remember(key, tensors, plan_call)
        _remember_torch(torch_key, _PLANS.get(key))
    return spec, args


def launch(spec, args, stream):
    """One ropejit_apply on `stream` (a CUstream handle as an int; 0: the legacy default)."""
    args.stream = integer("stream", stream, ctypes.c_void_p)
    _capi.check(_capi.lib.ropejit_apply(ctypes.byref(spec), ctypes.byref(args)))
