"""Where decode-sized RoPE time goes: hand-written minimal kernels (CuPy, NVRTC) with different
thread mappings, next to ropejit and Liger, all under the same CUDA-graph harness as
bench/compare_peers.py (20 calls per graph, warm L2, µs per call).

Every probe rotates bf16 q [T, 32, 128] and k [T, 8, 128] in place (neox) with per-token f32
half-width cos/sin rows (the `rows` mode of compare_peers.py), with 32-bit index math and no
bounds checks beyond the head count: the floor a generated kernel could reach per mapping.

    python3 bench/decode_probe.py --lib build-gpu/libropejit.so
"""

import argparse
import ctypes
import pathlib
import re
import subprocess
import warnings
import os
import sys

import cupy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import (GRAPH_CALLS, Inputs, graph_us_per_call,  # noqa: E402
                           implementations, import_ropejit, profile)

# bf16 helpers shared by both kernel sources.
COMMON = r"""
typedef unsigned short bf16;
__device__ __forceinline__ float up(unsigned short x) { return __uint_as_float(unsigned(x) << 16); }
__device__ __forceinline__ unsigned short down(float f) {
  unsigned u = __float_as_uint(f);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
struct alignas(16) V8 { unsigned short e[8]; };
"""
SOURCE = COMMON + r"""
template <bool kLdg>
__device__ __forceinline__ float4 table4(const float* p) {
  return kLdg ? __ldg(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
}
// 8 consecutive floats of a table row, two 16-byte loads.
template <bool kLdg>
__device__ __forceinline__ void table8(const float* p, float* out) {
  float4 a = table4<kLdg>(p), b = table4<kLdg>(p + 4);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// One 8-pair chunk of one head: lo at col, hi at col + 64; kLdg: the table through __ldg.
template <bool kLdg = false>
__device__ __forceinline__ void rotate_chunk(bf16* head, const float* cs, const float* sn, int c) {
  V8 lo = *reinterpret_cast<const V8*>(head + c * 8);
  V8 hi = *reinterpret_cast<const V8*>(head + 64 + c * 8);
  float cc[8], ss[8];
  table8<kLdg>(cs + 8 * c, cc);
  table8<kLdg>(sn + 8 * c, ss);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float a = up(lo.e[j]), b = up(hi.e[j]);
    lo.e[j] = down(fmaf(a, cc[j], -b * ss[j]));
    hi.e[j] = down(fmaf(b, cc[j], a * ss[j]));
  }
  *reinterpret_cast<V8*>(head + c * 8) = lo;
  *reinterpret_cast<V8*>(head + 64 + c * 8) = hi;
}

// ropejit's decode mapping: block (8 chunks, 40 head rows), one token per block.
extern "C" __global__ void __launch_bounds__(320) head_per_row(bf16* q, bf16* k, const float* cos,
                                                               const float* sin) {
  int t = blockIdx.x, h = threadIdx.y, c = threadIdx.x;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  rotate_chunk(head, cos + t * 64, sin + t * 64, c);
}

// The same, heads split over `blockDim.y`-row blocks: grid (T, 40 / rows).
extern "C" __global__ void __launch_bounds__(320) heads_split(bf16* q, bf16* k, const float* cos,
                                                              const float* sin) {
  int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, c = threadIdx.x;
  if (h >= 40) return;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  rotate_chunk(head, cos + t * 64, sin + t * 64, c);
}

// heads_split with cos/sin read through the non-coherent path (__ldg), as ropejit reads tables.
extern "C" __global__ void __launch_bounds__(320) heads_split_ldg(bf16* q, bf16* k,
                                                                  const float* __restrict__ cos,
                                                                  const float* __restrict__ sin) {
  int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, c = threadIdx.x;
  if (h >= 40) return;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  rotate_chunk<true>(head, cos + t * 64, sin + t * 64, c);
}

// Liger's shape: 128 threads per token, each walking chunks i, i + 128, ... (320 in all),
// every load of the thread issued before the first store.
extern "C" __global__ void __launch_bounds__(128) token_per_block(bf16* q, bf16* k,
                                                                  const float* cos,
                                                                  const float* sin) {
  int t = blockIdx.x;
  const float* cs = cos + t * 64;
  const float* sn = sin + t * 64;
  for (int i = threadIdx.x; i < 320; i += 128) {
    int h = i >> 3, c = i & 7;
    bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
    rotate_chunk(head, cs, sn, c);
  }
}

// Liger's sharing: one block per token, each thread one 8-pair chunk of heads y and y + 20
// (block 8 x 20), every load of both heads and the chunk's cos/sin issued before any store.
extern "C" __global__ void __launch_bounds__(160) two_heads(bf16* q, bf16* k, const float* cos,
                                                           const float* sin) {
  int t = blockIdx.x, c = threadIdx.x;
  bf16* h0 = q + (t * 32 + threadIdx.y) * 128 + 8 * c;
  int h = threadIdx.y + 20;
  bf16* h1 = h < 32 ? q + (t * 32 + h) * 128 + 8 * c : k + (t * 8 + h - 32) * 128 + 8 * c;
  V8 a0 = *reinterpret_cast<const V8*>(h0), b0 = *reinterpret_cast<const V8*>(h0 + 64);
  V8 a1 = *reinterpret_cast<const V8*>(h1), b1 = *reinterpret_cast<const V8*>(h1 + 64);
  const float* cs = cos + t * 64 + 8 * c;
  const float* sn = sin + t * 64 + 8 * c;
  float cc[8], ss[8];
  table8<false>(cs, cc);
  table8<false>(sn, ss);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float x = up(a0.e[j]), y = up(b0.e[j]);
    a0.e[j] = down(fmaf(x, cc[j], -y * ss[j]));
    b0.e[j] = down(fmaf(y, cc[j], x * ss[j]));
    x = up(a1.e[j]), y = up(b1.e[j]);
    a1.e[j] = down(fmaf(x, cc[j], -y * ss[j]));
    b1.e[j] = down(fmaf(y, cc[j], x * ss[j]));
  }
  *reinterpret_cast<V8*>(h0) = a0;
  *reinterpret_cast<V8*>(h0 + 64) = b0;
  *reinterpret_cast<V8*>(h1) = a1;
  *reinterpret_cast<V8*>(h1 + 64) = b1;
}

// heads_split doing Liger's arithmetic: bf16 cos/sin (HF's full-width rows, first half) and
// packed bf16x2 fma, no conversion to fp32 (Liger computes in the table's dtype).
__device__ __forceinline__ unsigned fma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
extern "C" __global__ void __launch_bounds__(320) heads_split_bf16math(bf16* q, bf16* k,
                                                                       const bf16* cos,
                                                                       const bf16* sin) {
  int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, c = threadIdx.x;
  if (h >= 40) return;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  uint4 lo = *reinterpret_cast<const uint4*>(head + c * 8);
  uint4 hi = *reinterpret_cast<const uint4*>(head + 64 + c * 8);
  uint4 cs = *reinterpret_cast<const uint4*>(cos + t * 128 + c * 8);
  uint4 sn = *reinterpret_cast<const uint4*>(sin + t * 128 + c * 8);
  unsigned* l = &lo.x; unsigned* u = &hi.x; const unsigned* cc = &cs.x; const unsigned* ss = &sn.x;
  const unsigned nz = 0x80008000u;  // (-0, -0)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    unsigned bs = fma2(u[j], ss[j], nz), as = fma2(l[j], ss[j], nz);
    unsigned a = l[j], b = u[j];
    l[j] = fma2(a, cc[j], bs ^ nz);
    u[j] = fma2(b, cc[j], as);
  }
  *reinterpret_cast<uint4*>(head + c * 8) = lo;
  *reinterpret_cast<uint4*>(head + 64 + c * 8) = hi;
}

// head_per_row with as many parameter bytes as ropejit's block (232): 25 unused 8-byte ones.
extern "C" __global__ void __launch_bounds__(320) big_params(bf16* q, bf16* k, const float* cos,
                                                             const float* sin, PAD_PARAMS) {
  int t = blockIdx.x, h = threadIdx.y, c = threadIdx.x;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  rotate_chunk(head, cos + t * 64, sin + t * 64, c);
}
""".replace("PAD_PARAMS", ", ".join(f"long long pad{i}" for i in range(25)))
BISECT_SOURCE = COMMON + r"""
// ropejit's parameter block (templates/rope_params.cuh), 232 bytes.
struct HeadOperand {
  const void* in; void* out;
  long long stride_batch, stride_seq, stride_head, out_stride_batch, out_stride_seq,
      out_stride_head;
  int heads, pad_;
};
struct Params {
  HeadOperand q, k;
  long long tokens, seq_len, batch, pos_offset;
  const void* positions; const int* cu_seqlens; const void* cos; const void* sin;
  long long table_stride, table_rows;
  double log2_base;
};

__device__ __forceinline__ void rot(char* head, const float* cs, const float* sn, bool nan) {
  V8 lo = *reinterpret_cast<const V8*>(head);
  V8 hi = *reinterpret_cast<const V8*>(head + 128);
  float4 c0 = __ldg(reinterpret_cast<const float4*>(cs)), c1 = __ldg(reinterpret_cast<const float4*>(cs) + 1);
  float4 s0 = __ldg(reinterpret_cast<const float4*>(sn)), s1 = __ldg(reinterpret_cast<const float4*>(sn) + 1);
  float cc[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  float ss[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
  if (nan) {
#pragma unroll
    for (int j = 0; j < 8; ++j) cc[j] = ss[j] = __int_as_float(0x7fc00000);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float a = up(lo.e[j]), b = up(hi.e[j]);
    lo.e[j] = down(fmaf(a, cc[j], -b * ss[j]));
    hi.e[j] = down(fmaf(b, cc[j], a * ss[j]));
  }
  *reinterpret_cast<V8*>(head) = lo;
  *reinterpret_cast<V8*>(head + 128) = hi;
}

// S1: the probe with every pointer and stride from the block (64-bit strides).
extern "C" __global__ void __launch_bounds__(320) s1_struct(const __grid_constant__ Params p) {
  int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, c = threadIdx.x;
  if (h >= 40) return;
  char* head = h < 32 ? (char*)p.q.in + 2 * (t * p.q.stride_seq + h * p.q.stride_head)
                      : (char*)p.k.in + 2 * (t * p.k.stride_seq + (h - 32) * p.k.stride_head);
  const float* cs = (const float*)p.cos + t * p.table_stride + 8 * c;
  const float* sn = (const float*)p.sin + t * p.table_stride + 8 * c;
  rot(head + 16 * c, cs, sn, false);
}

// S2: S1 plus ropejit's checks: token bound, one-sequence / one-token-sequence places, head
// count from the block, position offset, table bound with NaN poisoning.
// The checks and the token's place, as ropejit's kernel made them before the change (three
// dependent branches on parameters); false: nothing to do for this thread.
struct Place { long long b, s, row; bool inside; int h, c; };
__device__ __forceinline__ bool place(const Params& p, Place& w) {
  long long t = blockIdx.x;
  w.h = blockIdx.y * blockDim.y + threadIdx.y;
  w.c = threadIdx.x;
  if (t >= p.tokens || w.h >= p.q.heads + p.k.heads) return false;
  if (p.batch == 1) { w.b = 0; w.s = t; }
  else if (p.seq_len == 1) { w.b = t; w.s = 0; }
  else { w.b = unsigned(t) / unsigned(p.seq_len); w.s = t - w.b * p.seq_len; }
  long long pos = w.s + p.pos_offset;
  w.inside = pos >= 0 && pos < p.table_rows;
  w.row = (w.inside ? pos : 0) * p.table_stride;
  return true;
}
extern "C" __global__ void __launch_bounds__(320) s2_checks(const __grid_constant__ Params p) {
  Place w;
  if (!place(p, w)) return;
  const long long b = w.b, s = w.s, row = w.row;
  const int h = w.h, c = w.c;
  const bool inside = w.inside;
  char* head = h < p.q.heads
      ? (char*)p.q.in + 2 * (b * p.q.stride_batch + s * p.q.stride_seq + h * p.q.stride_head)
      : (char*)p.k.in + 2 * (b * p.k.stride_batch + s * p.k.stride_seq +
                             (h - p.q.heads) * p.k.stride_head);
  rot(head + 16 * c, (const float*)p.cos + row + 8 * c, (const float*)p.sin + row + 8 * c,
      !inside);
}

// S3: S2 with the operand chosen first (is_k ? p.k : p.q), as ropejit's one-head path does.
template <int kBound>
__device__ __forceinline__ void s3_body(const Params& p) {
  Place w;
  if (!place(p, w)) return;
  const long long b = w.b, s = w.s, row = w.row;
  const int h = w.h, c = w.c;
  const bool inside = w.inside;
  const bool is_k = h >= p.q.heads;
  const HeadOperand& o = is_k ? p.k : p.q;
  unsigned hh = unsigned(is_k ? h - p.q.heads : h);
  char* head = (char*)o.in + 2 * (b * o.stride_batch + s * o.stride_seq + (long long)hh * o.stride_head);
  rot(head + 16 * c, (const float*)p.cos + row + 8 * c, (const float*)p.sin + row + 8 * c,
      !inside);
}
extern "C" __global__ void __launch_bounds__(320) s3_select(const __grid_constant__ Params p) {
  s3_body<320>(p);
}
// S4: S3 compiled with ropejit's launch bounds.
extern "C" __global__ void __launch_bounds__(512, 1) s4_bounds(const __grid_constant__ Params p) {
  s3_body<512>(p);
}

// S5: everything the decode path reads in one compact 64-byte block: byte strides and counts
// in 32 bits, the place of a token decided on the host (token stride and position step), no
// branch on a parameter before the loads. kPad: bytes before it, so that it starts at the
// parameter space's offset 0x210 (kPad 0: the block straddles two 64-byte lines) or at 0x240
// (kPad 48: one line).
struct Hot {
  const char* q; const char* k; const float* cos; const float* sin;
  int q_tok, q_head, k_tok, k_head;
  int tokens; short q_heads, heads; int pos_offset; int table_rows;
};
template <int kPad> struct HotBlock { char pad[kPad]; Hot h; };
template <> struct HotBlock<0> { Hot h; };
template <int kPad>
__device__ __forceinline__ void s5_body(const Hot& p) {
  int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, c = threadIdx.x;
  if (t >= p.tokens || h >= p.heads) return;
  int pos = t + p.pos_offset;
  bool inside = pos >= 0 && pos < p.table_rows;
  long long row = (long long)(inside ? pos : 0) * 64;
  const bool is_k = h >= p.q_heads;
  const char* base = is_k ? p.k : p.q;
  long long off = is_k ? (long long)t * p.k_tok + (long long)(h - p.q_heads) * p.k_head
                       : (long long)t * p.q_tok + (long long)h * p.q_head;
  rot((char*)base + off + 16 * c, p.cos + row + 8 * c, p.sin + row + 8 * c, !inside);
}
extern "C" __global__ void __launch_bounds__(512, 1) s5_hot0(const __grid_constant__ HotBlock<0> b) {
  s5_body<0>(b.h);
}
extern "C" __global__ void __launch_bounds__(512, 1) s5_hot48(const __grid_constant__ HotBlock<48> b) {
  s5_body<48>(b.h);
}
"""


class _Operand(ctypes.Structure):
    _fields_ = [("inp", ctypes.c_void_p), ("out", ctypes.c_void_p)] + [
        (n, ctypes.c_longlong) for n in ("stride_batch", "stride_seq", "stride_head",
                                         "out_stride_batch", "out_stride_seq",
                                         "out_stride_head")] + [
        ("heads", ctypes.c_int), ("pad_", ctypes.c_int)]


class _Params(ctypes.Structure):
    _fields_ = [("q", _Operand), ("k", _Operand)] + [
        (n, ctypes.c_longlong) for n in ("tokens", "seq_len", "batch", "pos_offset")] + [
        (n, ctypes.c_void_p) for n in ("positions", "cu_seqlens", "cos", "sin")] + [
        ("table_stride", ctypes.c_longlong), ("table_rows", ctypes.c_longlong),
        ("log2_base", ctypes.c_double)]


assert ctypes.sizeof(_Params) == 232


class _Hot(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "cos", "sin")] + [
        (n, ctypes.c_int) for n in ("q_tok", "q_head", "k_tok", "k_head", "tokens")] + [
        ("q_heads", ctypes.c_short), ("heads", ctypes.c_short),
        ("pos_offset", ctypes.c_int), ("table_rows", ctypes.c_int)]


class _Hot48(ctypes.Structure):
    _fields_ = [("pad", ctypes.c_char * 48), ("h", _Hot)]


def _hot(q, k, x):
    return _Hot(q.data_ptr(), k.data_ptr(), x.row_cos32.data_ptr(), x.row_sin32.data_ptr(),
                2 * q.stride(0), 2 * q.stride(1), 2 * k.stride(0), 2 * k.stride(1), x.tokens,
                q.shape[1], q.shape[1] + k.shape[1], 0, x.tokens)


def _params(q, k, x):
    """ropejit's block for an in-place bshd call [1, T, H, D] with per-token f32 rows."""
    def operand(t):
        o = _Operand(t.data_ptr(), t.data_ptr(), t.numel(), t.stride(0), t.stride(1),
                     t.numel(), t.stride(0), t.stride(1), t.shape[1], 0)
        return o
    return _Params(operand(q), operand(k), x.tokens, x.tokens, 1, 0, None, None,
                   x.row_cos32.data_ptr(), x.row_sin32.data_ptr(), x.row_cos32.stride(0),
                   x.tokens, 0.0)


def bisect_probes(ropejit_cli):
    """The hand-written 4-blocks-per-token probe morphed towards ropejit's kernel one step at a
    time (S1..S4), and ropejit's own generated source (R) launched the same way: which step
    costs the decode time ropejit trails the probe by."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    module = cupy.RawModule(code=BISECT_SOURCE, options=("-std=c++17",))
    kernels = {n: module.get_function(n).kernel.ptr for n in ("s1_struct", "s2_checks", "s3_select",
                                                         "s4_bounds", "s5_hot0", "s5_hot48")}
    templates = str(pathlib.Path(__file__).resolve().parent.parent / "templates")
    key = "rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip"
    generated = subprocess.check_output([ropejit_cli, "source", key], text=True)
    generated = re.sub(r"kHeadsPerThread = \d", "kHeadsPerThread = 1", generated)
    entry = re.search(r"\n(rope_\w+)\(const __grid_constant__", generated).group(1)
    rmod = cupy.RawModule(code=generated, name_expressions=None,
                          options=("-std=c++17", "-I" + templates, "--fmad=true", "-lineinfo",
                                   "--device-as-default-execution-space"))
    kernels["ropejit source"] = rmod.get_function(entry).kernel.ptr

    def launch(name, x):
        f = kernels[name]

        def fn(q, k):
            if name == "s5_hot0":
                block = _hot(q, k, x)
            elif name == "s5_hot48":
                block = _Hot48(b"", _hot(q, k, x))
            else:
                block = _params(q, k, x)
            args = (ctypes.c_void_p * 1)(ctypes.addressof(block))
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = libcuda.cuLaunchKernel(ctypes.c_void_p(f), x.tokens, 4, 1, 8, 10, 1, 0, stream,
                                        args, None)
            if rc:
                raise RuntimeError(f"cuLaunchKernel {rc}")
        return fn

    return {f"bisect {n} (8x10, 4 blocks/token)": (lambda n: lambda x: launch(n, x))(n)
            for n in kernels}


def probes():
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    kernels = {n: module.get_function(n) for n in
               ("head_per_row", "heads_split", "heads_split_ldg", "token_per_block",
                "two_heads", "heads_split_bf16math", "big_params")}

    def launch(name, grid, block, x, big=False, hf=False):
        kernel = kernels[name]
        cos, sin = (x.row_cos_hf, x.row_sin_hf) if hf else (x.row_cos32, x.row_sin32)

        def fn(q, k):
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
            args = [cupy.uint64(p) for p in
                    (q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr())]
            if big:
                args += [cupy.int64(0)] * 25
            kernel(grid(x.tokens), block, tuple(args), stream=stream)
        return fn

    return {
        "probe head_per_row (8x40)": lambda x: launch("head_per_row", lambda t: (t,), (8, 40), x),
        "probe heads_split 8x8 (5 blocks/token)":
            lambda x: launch("heads_split", lambda t: (t, 5), (8, 8), x),
        "probe heads_split 8x10 (4 blocks/token)":
            lambda x: launch("heads_split", lambda t: (t, 4), (8, 10), x),
        "probe heads_split_ldg 8x10 (4 blocks/token, __ldg table)":
            lambda x: launch("heads_split_ldg", lambda t: (t, 4), (8, 10), x),
        "probe heads_split 8x20 (2 blocks/token)":
            lambda x: launch("heads_split", lambda t: (t, 2), (8, 20), x),
        "probe heads_split 8x10, Liger's arithmetic (bf16 table, bf16x2 fma)":
            lambda x: launch("heads_split_bf16math", lambda t: (t, 4), (8, 10), x, hf=True),
        "probe two_heads (8x20, heads y and y + 20, one block per token)":
            lambda x: launch("two_heads", lambda t: (t,), (8, 20), x),
        "probe token_per_block (128)":
            lambda x: launch("token_per_block", lambda t: (t,), (128,), x),
        "probe big_params (8x40, 232 B)":
            lambda x: launch("big_params", lambda t: (t,), (8, 40), x, big=True),
    }


def main():
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # cupy.cuda.ExternalStream
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bisect", metavar="ROPEJIT_CLI",
                    help="also the S1..S4 steps from the probe towards ropejit's kernel, and the "
                         "generated source launched the same way (needs the `ropejit` CLI)")
    ap.add_argument("--profile", type=int, metavar="TOKENS",
                    help="only a few eager calls of each at this many tokens (for ncu)")
    a = ap.parse_args()
    ropejit = import_ropejit(a.lib)
    peers = implementations(ropejit)
    impls = {name: factory for name, (_, factory) in peers.items()}
    impls.update(probes())
    if a.bisect:
        impls.update(bisect_probes(a.bisect))
    if a.profile:
        profile(a.profile, impls)
        return
    tokens = (1, 16, 64, 256)
    results = {}
    for rnd in range(a.rounds):
        for t in tokens:
            x = Inputs(t, decode=True)
            q_dst, k_dst = torch.empty_like(x.q0), torch.empty_like(x.k0)

            def copies():
                q_dst.copy_(x.q0)
                k_dst.copy_(x.k0)
            results.setdefault("two copies", {}).setdefault(t, []).append(
                graph_us_per_call(copies, a.reps))
            ref = x.reference()
            for name, factory in impls.items():
                try:
                    fn = factory(x)
                    q, k = x.q0.clone(), x.k0.clone()
                    fn(q, k)
                    torch.cuda.synchronize()
                    err = max(((o.double() - r).norm() / r.norm()).item()
                              for o, r in zip((q, k), ref))
                    if err > 1e-2:
                        print(f"{name} t{t}: WRONG, rel L2 {err:.2e}")
                    us = graph_us_per_call(lambda: fn(q, k), a.reps)
                    results.setdefault(name, {}).setdefault(t, []).append(us)
                except Exception as e:
                    print(f"{name} t{t}: {type(e).__name__}: {str(e).splitlines()[0]}")
    print(f"| implementation (µs per call, graph of {GRAPH_CALLS}, best of {a.rounds} medians) | "
          + " | ".join(f"{t} tok" for t in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    for name, by in results.items():
        print(f"| {name} | " + " | ".join(f"{min(by[t]):.2f}" if t in by else "n/a"
                                          for t in tokens) + " |")


if __name__ == "__main__":
    main()
