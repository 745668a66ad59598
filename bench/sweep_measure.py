"""Measuring one row of the shape sweep (bench/sweep.py) on the GPU: its tensors, the float64
check, ropejit's in-place call, the same-run copy of the same bytes and the optional peers
(torch.compile of the HF formula, Liger-Kernel), each timed as compare_torch.py times."""

import ctypes
import types
import zlib

import torch

from compare_torch import first_line, rotate_half, time_copy, time_us
from sweep_grid import DECODE_CONTEXT, DECODE_MAX_TOKENS

BASE = 10000.0
DEVICE = "cuda"  # the CPU tests run the row's code on host tensors through ropejit's emulator
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# Relative L2 error against float64 that one rounding to the output dtype stays well under.
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
# The peers compute in the model dtype (HF's tables are cast to it): bf16 costs ~4e-3.
PEER_TOLERANCE = 1e-2
# The float64 reference is computed this many bytes of one operand at a time, so that the
# check of a large row needs no float64 copy of q and k.
REF_CHUNK_BYTES = 64 << 20


class Unsupported(Exception):
    """A peer that has no form of this row (its reason is the message)."""


def layout_shape(row, heads):
    if row.layout == "bshd":
        return (row.batch, row.seq, heads, row.head_dim)
    if row.layout == "sbhd":
        return (row.seq, row.batch, heads, row.head_dim)
    return (row.tokens, heads, row.head_dim)


def make_inputs(row):
    """q and k in the row's layout, int64 position ids ([batch * seq], sequence-major as
    ropejit reads them), the positions of tokens in memory order, and the angles' tables."""
    dev = torch.device(DEVICE)
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(row.id.encode()))
    dtype = TORCH_DTYPE[row.dtype]
    x = types.SimpleNamespace()
    x.q0 = torch.randn(layout_shape(row, row.q_heads), dtype=dtype, device=dev, generator=gen)
    x.k0 = torch.randn(layout_shape(row, row.k_heads), dtype=dtype, device=dev, generator=gen)
    if row.tokens <= DECODE_MAX_TOKENS:
        x.ids = torch.randint(0, DECODE_CONTEXT, (row.tokens,), dtype=torch.int64, device=dev,
                              generator=gen)
    else:
        x.ids = torch.arange(row.seq, dtype=torch.int64, device=dev).repeat(row.batch)
    # sbhd memory holds token (s, b) at s * batch + b; the ids are indexed b * seq + s.
    x.pos_mem = (x.ids.view(row.batch, row.seq).t().reshape(-1) if row.layout == "sbhd"
                 else x.ids)
    inv_freq = BASE ** (-torch.arange(0, row.rotary_dim, 2, dtype=torch.float64, device=dev)
                        / row.rotary_dim)
    angles = torch.arange(row.table_rows, dtype=torch.float64, device=dev)[:, None] * inv_freq
    x.cos64, x.sin64 = angles.cos(), angles.sin()
    x.cos32, x.sin32 = x.cos64.float(), x.sin64.float()
    return x


def rotate64(x, cos, sin, style):
    """x [n, heads, D] rotated in float64 over its first 2 * cos.shape[-1] dimensions."""
    x = x.double()
    cos, sin = cos[:, None, :], sin[:, None, :]
    r = 2 * cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    if style == "gptj":
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :r // 2], rot[..., r // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1)


def rel_l2(row, x, outs):
    """The larger relative L2 error of the two outputs (any layout-shaped or [tokens, heads, D]
    tensors) against the float64 rotation of the originals, in token chunks."""
    worst = 0.0
    for src, out in zip((x.q0, x.k0), outs):
        src = src.reshape(row.tokens, -1, row.head_dim)
        out = out.reshape(row.tokens, -1, row.head_dim)
        chunk = max(1, REF_CHUNK_BYTES // (src.shape[1] * row.head_dim * 8))
        err2 = ref2 = 0.0
        for t in range(0, row.tokens, chunk):
            pos = x.pos_mem[t:t + chunk]
            ref = rotate64(src[t:t + chunk], x.cos64[pos], x.sin64[pos], row.style)
            err2 += (out[t:t + chunk].double() - ref).square().sum().item()
            ref2 += ref.square().sum().item()
        worst = max(worst, (err2 / ref2) ** 0.5)
    return worst


def ropejit_call(ropejit, row, x):
    kwargs = dict(layout=row.layout, style=row.style, rotary_dim=row.rotary_dim,
                  position_ids=x.ids)
    if row.freqs == "table":
        kwargs.update(cos=x.cos32, sin=x.sin32)
    else:
        kwargs.update(base=BASE)

    def fn(q, k):
        return ropejit.apply(q, k, **kwargs)
    return fn


def ropejit_key(ropejit, row):
    """The kernel key the row's call uses (also its tuning entry's name), or None."""
    spec = ropejit.Spec(layout=row.layout, dtype=row.dtype, head_dim=row.head_dim,
                        rotary_dim=row.rotary_dim, style=row.style, positions="ids",
                        index_type="i64", freqs=row.freqs, in_place=True)
    try:
        return ropejit.key(spec)
    except Exception:  # the call itself reports what is wrong with the row
        return None


def checked_time(fn, row, x, tolerance, timing):
    """{rel_l2, check_ok, us}: fn(q, k) -> outputs on copies of the originals, checked against
    float64, then timed on the same copies (an in-place call rotates them again each time);
    no time when the check fails."""
    q, k = x.q0.clone(), x.k0.clone()
    outs = fn(q, k)
    torch.cuda.synchronize()
    result = {"rel_l2": rel_l2(row, x, outs)}
    result["check_ok"] = result["rel_l2"] < tolerance  # False for NaN
    del outs
    if result["check_ok"]:
        result["us"] = time_us(lambda: fn(q, k), *timing)
    return result


def measure_ropejit(ropejit, row, x, timing):
    """{us, rel_l2, check_ok} of the heuristic's (or the tuning file's) launch, or {error}."""
    try:
        return checked_time(ropejit_call(ropejit, row, x), row, x, TOLERANCE[row.dtype], timing)
    except Exception as e:  # ropejit.Error included: report it in the row
        return {"error": first_line(e)}


def copy_us(row, timing):
    """A device-to-device copy of half the row's bytes (it reads and writes them)."""
    flush, warmup, reps = timing
    return time_copy(row.bytes_moved // 2, flush, warmup, reps)


class _Memcpy2D(ctypes.Structure):
    """The driver's CUDA_MEMCPY2D (cuda.h)."""
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
                ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
                ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
                ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
                ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


_MEMORY_DEVICE = 2  # CU_MEMORYTYPE_DEVICE


def _driver_copy_2d(pieces):
    """fn() copying each (src, dst) head-row piece set with the driver's cuMemcpy2DAsync on
    torch's stream: rows of the rotary width at the head's pitch."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    memcpy2d = libcuda.cuMemcpy2DAsync_v2
    memcpy2d.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
    descs = []
    for src, dst in pieces:
        rows = src.numel() // src.shape[-1]
        d = _Memcpy2D()
        d.srcMemoryType = d.dstMemoryType = _MEMORY_DEVICE
        d.srcDevice, d.dstDevice = src.data_ptr(), dst.data_ptr()
        d.srcPitch = d.dstPitch = src.stride(-2) * src.element_size()
        d.WidthInBytes, d.Height = src.shape[-1] * src.element_size(), rows
        descs.append(d)

    def fn():
        stream = torch.cuda.current_stream().cuda_stream
        for d in descs:
            status = memcpy2d(ctypes.byref(d), ctypes.c_void_p(stream))
            if status != 0:
                raise RuntimeError(f"cuMemcpy2DAsync failed with CUresult {status}")
    return fn


def pattern_pieces(row, x):
    """(source, scratch) views of the rotary part of every head of q and k: [rows, rotary_dim]
    at the head's pitch."""
    pieces = []
    for t in (x.q0, x.k0):
        flat = t.view(-1, row.head_dim)
        pieces.append((flat[:, :row.rotary_dim], torch.empty_like(flat)[:, :row.rotary_dim]))
    return pieces


def pattern_copy(row, x, timing):
    """With partial rotary an in-place call moves only the first rotary_dim elements of each
    head, pieces of a few dozen bytes at the head's pitch: the same-run copy of exactly those
    pieces of q and k into scratch tensors shows what the memory system gives for that access
    pattern. The faster of torch's strided copy and the driver's 2D copy: {us, by}, or None for
    full rotary (the contiguous copy is the pattern)."""
    if row.rotary_dim == row.head_dim:
        return None
    flush, warmup, reps = timing
    pieces = pattern_pieces(row, x)

    def torch_copy():
        for src, dst in pieces:
            dst.copy_(src)
    best = {"us": time_us(torch_copy, flush, warmup, reps), "by": "torch"}
    try:
        us = time_us(_driver_copy_2d(pieces), flush, warmup, reps)
        if us < best["us"]:
            best = {"us": us, "by": "cuMemcpy2DAsync"}
    except (OSError, AttributeError, RuntimeError) as e:
        best["driver_error"] = first_line(e)
    return best


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def hf_rope(q, k, cos_full, sin_full, positions, gptj):
    """transformers' apply_rotary_pos_emb (rotate_every_two for gptj, the first R dimensions
    for partial rotary) on q and k as [tokens, heads, D], with the gather of full-width rows
    by position that its rotary module does; returns new tensors."""
    cos, sin = cos_full[positions].unsqueeze(1), sin_full[positions].unsqueeze(1)
    r = cos.shape[-1]

    def one(x):
        x = x.flatten(0, -3)
        rot = x[..., :r]
        rot = rot * cos + (rotate_every_two(rot) if gptj else rotate_half(rot)) * sin
        return torch.cat((rot, x[..., r:]), dim=-1) if r < x.shape[-1] else rot
    return one(q), one(k)


def full_width(row, table):
    """HF's table: each frequency twice (halves for neox, pairs for gptj), in the model dtype."""
    doubled = (table.repeat_interleave(2, dim=-1) if row.style == "gptj"
               else torch.cat((table, table), dim=-1))
    return doubled.to(TORCH_DTYPE[row.dtype])


def compile_peer(row, x):
    cos_full, sin_full = full_width(row, x.cos64), full_width(row, x.sin64)
    # A fresh cache and static shapes per row: one graph per shape, never a recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(hf_rope, dynamic=False)
    gptj = row.style == "gptj"
    return lambda q, k: compiled(q, k, cos_full, sin_full, x.pos_mem, gptj)


def liger_peer(row, x):
    if row.style != "neox":
        raise Unsupported("Liger's kernel is neox only")
    if row.rotary_dim != row.head_dim:
        raise Unsupported("Liger rotates whole heads (no partial rotary)")
    if row.layout == "sbhd":
        raise Unsupported("Liger takes [batch, heads, seq, D] views of bshd memory")
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    b, s = (1, row.tokens) if row.layout == "thd" else (row.batch, row.seq)
    # The rows HF's rotary module hands every layer: gathered once per forward pass, untimed.
    cos = full_width(row, x.cos64)[x.ids].view(b, s, row.head_dim)
    sin = full_width(row, x.sin64)[x.ids].view(b, s, row.head_dim)

    def fn(q, k):
        q_out, k_out = liger_rotary_pos_emb(q.view(b, s, row.q_heads, -1).transpose(1, 2),
                                            k.view(b, s, row.k_heads, -1).transpose(1, 2),
                                            cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return fn


PEERS = {"torch.compile": compile_peer, "liger": liger_peer}


def measure_peer(make, row, x, timing, copy):
    """{us, pct_copy, rel_l2, check_ok}, {unsupported} or {error}: a peer never stops the
    row."""
    try:
        result = checked_time(make(row, x), row, x, PEER_TOLERANCE, timing)
    except Unsupported as e:
        return {"unsupported": str(e)}
    except Exception as e:  # not installed, refused the shape, ran out of memory: say so
        return {"error": first_line(e)}
    if "us" in result:
        result["pct_copy"] = 100.0 * copy / result["us"]
    return result


def measure_row(ropejit, row, timing, peers):
    """The row's measured fields: key, copy_us, ropejit_us, pct_copy, rel_l2, check_ok,
    status (ok, wrong: failed the check, error: raised; then a reason), and the peers'
    entries."""
    out = {"key": ropejit_key(ropejit, row)}
    try:
        _measure(ropejit, row, timing, peers, out)
    except Exception as e:  # the row's own buffers or copy failed (out of memory, say)
        out.update(status="error", reason=first_line(e))
    torch.cuda.empty_cache()  # the next row may need one large block
    return out


def _measure(ropejit, row, timing, peers, out):
    x = make_inputs(row)
    out["copy_us"] = copy_us(row, timing)
    result = measure_ropejit(ropejit, row, x, timing)
    out["ropejit_us"] = result.get("us")
    out["rel_l2"] = result.get("rel_l2")
    out["check_ok"] = result.get("check_ok", False)
    out["status"] = "error" if "error" in result else "ok" if out["check_ok"] else "wrong"
    if "error" in result:
        out["reason"] = result["error"]
    if out["ropejit_us"]:
        out["pct_copy"] = 100.0 * out["copy_us"] / out["ropejit_us"]
    pattern = pattern_copy(row, x, timing)
    if pattern:
        out["pattern_copy_us"], out["pattern_copy_by"] = pattern["us"], pattern["by"]
        if "driver_error" in pattern:
            out["pattern_copy_driver_error"] = pattern["driver_error"]
        if out["ropejit_us"]:
            out["pct_pattern_copy"] = 100.0 * pattern["us"] / out["ropejit_us"]
    if peers:
        out["peers"] = {name: measure_peer(make, row, x, timing, out["copy_us"])
                        for name, make in PEERS.items()}
