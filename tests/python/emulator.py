"""A float64 host emulation of ropejit_apply over the C structs the package builds: it reads
q, k, tables and positions through the pointers and strides in ropejit_args, exactly as the
kernel does, and writes the results back. With CPU tensors standing in for CUDA ones it checks,
without a GPU, that the binding fills every struct field right (pointers, strides, heads,
table stride and width, positions, mRoPE rows and sections, base and scaling parameters,
direction, outputs); the GPU tests check the kernels. The scaled variants' frequencies and
attention factor come from the library's own host functions (ropejit_inverse_frequencies,
ropejit_attention_factor, given the struct the call carries), so that each variant keeps one
definition; mRoPE's pair rows are written out here from docs/scaling.md's description."""

import ctypes

import numpy as np

from ropejit import _capi

_ELEM = {0: (np.float32, 4), 1: (np.float16, 2), 2: ("bf16", 2)}
_INDEX = {0: (np.int32, 4), 1: (np.int64, 8)}


def _read(ptr, dtype, count):
    np_type, size = _ELEM[dtype]
    raw = (ctypes.c_uint8 * (count * size)).from_address(ptr)
    if np_type == "bf16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return np.frombuffer(raw, dtype=np_type).astype(np.float64)


def _write(ptr, dtype, values):
    np_type, size = _ELEM[dtype]
    raw = (ctypes.c_uint8 * (len(values) * size)).from_address(ptr)
    if np_type == "bf16":
        bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        # round to nearest even on the upper 16 bits (NaN stays NaN: its mantissa is non-zero)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = np.where(np.isnan(values), 0x7FC0, rounded).astype(np.uint16)
        np.frombuffer(raw, dtype=np.uint16)[:] = rounded
    else:
        np.frombuffer(raw, dtype=np_type)[:] = values.astype(np_type)


def _index(ptr, index_type, i):
    np_type, size = _INDEX[index_type]
    return int(np.frombuffer((ctypes.c_uint8 * size).from_address(ptr + i * size),
                             dtype=np_type)[0])


def frequencies(spec, args):
    """(inverse frequencies [R/2], attention factor) of a computed-frequency call: base^(-2i/R)
    and 1, or the scaled variant's from the library, read from args.base and args.scaling."""
    pairs = spec.rotary_dim // 2
    if spec.freqs == _capi.FREQS["computed"]:
        return args.base ** (-2.0 * np.arange(pairs) / spec.rotary_dim), 1.0
    table = _capi.new(_capi.ropejit_table_spec)
    table.freqs, table.base, table.scaling = spec.freqs, args.base, args.scaling
    inv = (ctypes.c_double * pairs)()
    _capi.check(_capi.lib.ropejit_inverse_frequencies(ctypes.byref(table), spec.rotary_dim, inv,
                                                      pairs))
    factor = ctypes.c_double()
    _capi.check(_capi.lib.ropejit_attention_factor(ctypes.byref(table), spec.rotary_dim,
                                                   ctypes.byref(factor)))
    return np.array(inv[:]), factor.value


def mrope_pair_rows(rotary_dim, section, interleaved):
    """The position row (0 temporal, 1 height, 2 width) of each rotary pair: sections in order,
    or (interleaved, Qwen3-VL) pair i takes row i % 3 while that row's section lasts, else the
    temporal row."""
    rows = np.zeros(rotary_dim // 2, dtype=np.int64)
    for i in range(len(rows)):
        if interleaved:
            r = i % 3
            rows[i] = r if r and i < 3 * section[r] else 0
        else:
            rows[i] = 0 if i < section[0] else 1 if i < section[0] + section[1] else 2
    return rows


def _table_row(spec, args, pos):
    """(cos, sin) of the R/2 pairs in table row `pos`; NaN outside the table."""
    pairs = spec.rotary_dim // 2
    if not 0 <= pos < args.table_rows:
        return np.full(pairs, np.nan), np.full(pairs, np.nan)
    full = spec.table_width == _capi.TABLE_WIDTHS["full"]
    width = spec.rotary_dim if full else pairs
    stride = args.table_stride or width
    size = _ELEM[spec.table_dtype][1]
    cos = _read(args.cos + pos * stride * size, spec.table_dtype, width)
    sin = _read(args.sin + pos * stride * size, spec.table_dtype, width)
    if full and spec.style == _capi.STYLES["gptj"]:
        return cos[0::2], sin[0::2]
    return cos[:pairs], sin[:pairs]


def _angles(spec, args, pos, freqs):
    """(cos, sin) of the R/2 pairs at per-pair positions `pos`, float64; NaN outside a table.
    `freqs`: frequencies() for computed calls, None for tables."""
    if freqs is not None:
        inv, factor = freqs
        return np.cos(pos * inv) * factor, np.sin(pos * inv) * factor
    cos, sin = np.empty(len(pos)), np.empty(len(pos))
    for p in np.unique(pos):
        c, s = _table_row(spec, args, int(p))
        cos[pos == p], sin[pos == p] = c[pos == p], s[pos == p]
    return cos, sin


def _rotate(x, cos, sin, spec):
    r = spec.rotary_dim
    if spec.direction == _capi.DIRECTIONS["backward"]:
        sin = -sin
    out = x.copy()
    if spec.style == _capi.STYLES["neox"]:
        x1, x2 = x[: r // 2], x[r // 2: r]
        out[: r // 2], out[r // 2: r] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = x[0:r:2], x[1:r:2]
        out[0:r:2], out[1:r:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


def _tokens(spec, args):
    """(batch index, index in sequence, token index) of every token."""
    if spec.layout == _capi.LAYOUTS["thd"] and args.cu_seqlens:
        for b in range(args.batch):
            start = _index(args.cu_seqlens, 0, b)
            end = _index(args.cu_seqlens, 0, b + 1)
            for t in range(start, end):
                yield b, t - start, t
    elif spec.layout == _capi.LAYOUTS["thd"]:
        for t in range(args.seq_len):
            yield 0, t, t
    else:
        for b in range(args.batch):
            for s in range(args.seq_len):
                yield b, s, b * args.seq_len + s


def _positions(spec, args, b, s, t, rows):
    """The position of each rotary pair of token t: one for all pairs, or (mRoPE) its row's of
    the [3][tokens] ids."""
    if spec.positions == _capi.POSITIONS["mrope"]:
        tokens = args.seq_len if spec.layout == _capi.LAYOUTS["thd"] else args.batch * args.seq_len
        three = [_index(args.position_ids, spec.index_type, r * tokens + t) for r in range(3)]
        return np.array(three, dtype=np.int64)[rows]
    if spec.positions == _capi.POSITIONS["ids"]:
        p = _index(args.position_ids, spec.index_type, t)
    elif spec.positions == _capi.POSITIONS["seq_offsets"]:
        p = s + _index(args.seq_offsets, spec.index_type, b)
    else:
        p = s + args.position_offset
    return np.full(len(rows), p, dtype=np.int64)


def _address(tensor, b, s, t, h, thd, size):
    token = (t * tensor.stride_seq if thd else b * tensor.stride_batch + s * tensor.stride_seq)
    return tensor.data + (token + h * tensor.stride_head) * size


def emulate(spec, args, stream=None):
    """ropejit_apply on host memory. Assumes the call is valid (the C API's checks are not
    emulated); asserts that the pointers it needs are set."""
    assert args.q.data, "q.data is null"
    size = _ELEM[spec.dtype][1]
    thd = spec.layout == _capi.LAYOUTS["thd"]
    operands = [(args.q, args.q_out)]
    if args.k.data:
        operands.append((args.k, args.k_out))
    freqs = None if spec.freqs == _capi.FREQS["table"] else frequencies(spec, args)
    rows = np.zeros(spec.rotary_dim // 2, dtype=np.int64)
    if spec.positions == _capi.POSITIONS["mrope"]:
        rows = mrope_pair_rows(spec.rotary_dim, list(args.mrope_section), args.mrope_interleaved)
    for b, s, t in _tokens(spec, args):
        cos, sin = _angles(spec, args, _positions(spec, args, b, s, t, rows), freqs)
        for src, out in operands:
            dst = src if spec.in_place else out
            assert dst.data, "an output pointer is null"
            for h in range(src.heads):
                x = _read(_address(src, b, s, t, h, thd, size), spec.dtype, spec.head_dim)
                y = _rotate(x, cos, sin, spec)
                _write(_address(dst, b, s, t, h, thd, size), spec.dtype, y)


def _write_e4m3(ptr, values):
    """e4m3 codes of `values` (already divided by the scale), saturating at 448 as the kernels
    do, NaN kept."""
    import torch
    codes = torch.from_numpy(np.clip(values, -448.0, 448.0)).to(torch.float8_e4m3fn)
    raw = (ctypes.c_uint8 * len(values)).from_address(ptr)
    np.frombuffer(raw, dtype=np.uint8)[:] = codes.view(torch.uint8).numpy()


def _scalar(ptr, np_type):
    return float(np.frombuffer((ctypes.c_uint8 * 4).from_address(ptr), dtype=np_type)[0])


def emulate_mla(spec, args):
    """ropejit_mla_prepare in float64 through the struct's pointers and strides (docs/mla.md):
    the cache rows of the tokens' slots, and q_pe in place or q_out."""
    R, P, half = spec.kv_rank, spec.rope_dim, spec.rope_dim // 2
    e = _ELEM[spec.dtype][1]
    te = _ELEM[spec.table_dtype][1]
    gptj = spec.style == _capi.STYLES["gptj"]
    first = np.arange(half) * 2 if gptj else np.arange(half)
    second = first + 1 if gptj else first + half

    def rotate(x, pos):
        if pos < 0 or pos >= args.table_rows:
            return np.full(P, np.nan)
        c = _read(args.cos + pos * args.table_stride * te, spec.table_dtype, half)
        s = _read(args.sin + pos * args.table_stride * te, spec.table_dtype, half)
        out = x.copy()
        out[first] = x[first] * c - x[second] * s
        out[second] = x[second] * c + x[first] * s
        return out

    def store(ptr, values, fp8, scale):
        if fp8:
            _write_e4m3(ptr, values * scale if spec.scale_multiplies else values / scale)
        else:
            _write(ptr, spec.dtype, values)

    def slot_of(t):
        """The token's cache row; -1 padding, -2 skipped (the kernel's cache_slot)."""
        if args.slots:
            slot = _index(args.slots, 1, t)
            if slot == -1:
                return -1
        elif args.rows_by_token:
            slot = t
        else:
            b = _index(args.batch_indices, 0, t)
            if b < 0 or b >= args.batch:
                return -1
            p = _index(args.page_positions, 0, t)
            start, end = _index(args.kv_indptr, 0, b), _index(args.kv_indptr, 0, b + 1)
            if p < 0:
                return -2
            page = p // args.page_size
            if page >= end - start or not 0 <= start + page < args.num_indices:
                return -2
            slot = _index(args.kv_indices, 0, start + page) * args.page_size + p % args.page_size
        return slot if 0 <= slot < args.cache_slots else -2

    skipped = 0
    for t in range(args.tokens):
        pos = _index(args.position_ids, spec.index_type, t)
        if args.cache:
            slot = slot_of(t)
            k = rotate(_read(args.k_pe + t * args.k_pe_stride * e, spec.dtype, P), pos)
            if slot == -2:
                skipped += 1
            elif slot >= 0:
                fp8 = spec.cache_store == _capi.STORES["e4m3"]
                scale = _scalar(args.cache_scale, np.float32) if fp8 else 1.0
                x = _read(args.kv_c + t * args.kv_c_stride * e, spec.dtype, R)
                if spec.norm == _capi.NORMS["rms"]:
                    w = _read(args.norm_weight, spec.dtype, R)
                    x = x / np.sqrt(np.mean(x * x) + np.float32(args.norm_eps)) * w
                ce = 1 if fp8 else e
                bs = args.cache_block_size

                def row_at(stride, block_stride):
                    return (slot // bs * block_stride + slot % bs * stride) if bs else \
                        slot * stride
                row = args.cache + row_at(args.cache_stride, args.cache_block_stride) * ce
                if args.cache_pe:
                    store(row, x, fp8, scale)
                    store(args.cache_pe + row_at(args.cache_pe_stride,
                                                 args.cache_pe_block_stride) * ce, k, fp8, scale)
                else:
                    store(row, np.concatenate([x, k]), fp8, scale)
            if args.k_pe_out:
                _write(args.k_pe_out + t * args.k_pe_out_stride * e, spec.dtype, k)
        for h in range(args.heads):
            at = args.q_pe + (t * args.q_pe_token_stride + h * args.q_pe_head_stride) * e
            q = rotate(_read(at, spec.dtype, P), pos)
            if spec.query == _capi.MLA_QUERIES["in_place"]:
                _write(at, spec.dtype, q)
                continue
            fp8 = spec.q_store == _capi.STORES["e4m3"]
            scale = _scalar(args.q_scale, np.float32) if fp8 else 1.0
            nope = _read(args.q_nope + (t * args.q_nope_token_stride +
                                        h * args.q_nope_head_stride) * e, spec.dtype, R)
            oe = 1 if fp8 else e
            out = args.q_out + (t * args.q_out_token_stride + h * args.q_out_head_stride) * oe
            if args.q_out_pe:
                store(out, nope, fp8, scale)
                store(args.q_out_pe + (t * args.q_out_pe_token_stride +
                                       h * args.q_out_pe_head_stride) * oe, q, fp8, scale)
            else:
                store(out, np.concatenate([nope, q]), fp8, scale)
    if args.skipped and skipped:
        counter = np.frombuffer((ctypes.c_uint8 * 4).from_address(args.skipped), dtype=np.int32)
        counter[0] += skipped
