"""Where decode-sized RoPE time goes: hand-written minimal kernels (CuPy, NVRTC) with different
thread mappings, next to ropejit and Liger, all under the same CUDA-graph harness as
bench/compare_peers.py (20 calls per graph, warm L2, µs per call).

Every probe rotates bf16 q [T, 32, 128] and k [T, 8, 128] in place (neox) with per-token f32
half-width cos/sin rows (the `rows` mode of compare_peers.py), with 32-bit index math and no
bounds checks beyond the head count: the floor a generated kernel could reach per mapping.

    python3 bench/decode_probe.py --lib build-gpu/libropejit.so
"""

import argparse
import warnings
import os
import sys

import cupy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import (GRAPH_CALLS, Inputs, graph_us_per_call,  # noqa: E402
                           implementations, import_ropejit, profile)

SOURCE = r"""
typedef unsigned short bf16;
__device__ __forceinline__ float up(unsigned short x) { return __uint_as_float(unsigned(x) << 16); }
__device__ __forceinline__ unsigned short down(float f) {
  unsigned u = __float_as_uint(f);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
struct alignas(16) V8 { unsigned short e[8]; };

template <bool kLdg>
__device__ __forceinline__ float4 table4(const float* p) {
  return kLdg ? __ldg(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
}

// One 8-pair chunk of one head: lo at col, hi at col + 64; kLdg: the table through __ldg.
template <bool kLdg = false>
__device__ __forceinline__ void rotate_chunk(bf16* head, const float* cs, const float* sn, int c) {
  V8 lo = *reinterpret_cast<const V8*>(head + c * 8);
  V8 hi = *reinterpret_cast<const V8*>(head + 64 + c * 8);
  float4 c0 = table4<kLdg>(cs + 8 * c), c1 = table4<kLdg>(cs + 8 * c + 4);
  float4 s0 = table4<kLdg>(sn + 8 * c), s1 = table4<kLdg>(sn + 8 * c + 4);
  float cc[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  float ss[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
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

// head_per_row with as many parameter bytes as ropejit's block (232): 25 unused 8-byte ones.
extern "C" __global__ void __launch_bounds__(320) big_params(bf16* q, bf16* k, const float* cos,
                                                             const float* sin, PAD_PARAMS) {
  int t = blockIdx.x, h = threadIdx.y, c = threadIdx.x;
  bf16* head = h < 32 ? q + (t * 32 + h) * 128 : k + (t * 8 + h - 32) * 128;
  rotate_chunk(head, cos + t * 64, sin + t * 64, c);
}
""".replace("PAD_PARAMS", ", ".join(f"long long pad{i}" for i in range(25)))


def probes():
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    kernels = {n: module.get_function(n) for n in
               ("head_per_row", "heads_split", "heads_split_ldg", "token_per_block",
                "big_params")}

    def launch(name, grid, block, x, big=False):
        kernel = kernels[name]
        cos, sin = x.row_cos32, x.row_sin32

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
    ap.add_argument("--profile", type=int, metavar="TOKENS",
                    help="only a few eager calls of each at this many tokens (for ncu)")
    a = ap.parse_args()
    ropejit = import_ropejit(a.lib)
    peers = implementations(ropejit)
    impls = {name: factory for name, (_, factory) in peers.items()}
    impls.update(probes())
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
