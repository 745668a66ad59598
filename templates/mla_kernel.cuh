// MLA's step around RoPE (multi-head latent attention, DeepSeek-V2/V3), one block per token:
//   the latent cache row  [ RMSNorm(kv_c) · w ‖ rope(k_pe) ]  at the token's slot, and
//   the query: rope(q_pe) in place, or  q_out = [ q_nope ‖ rope(q_pe) ]  for every head.
// fp32 arithmetic, each output rounded once (to the dtype, or to e4m3 after dividing by the
// store's scale). kv_c's row is held in registers (kVecs 16-byte vectors a thread) between its
// statistics and its output, so it is read once.
#pragma once
#include "mla_params.cuh"
#include "rope_types.cuh"

namespace ropejit_dev {

template <class Cfg>
struct MlaKernel {
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  typedef typename Elem<Cfg::kTableDType>::Raw TableRaw;
  enum : int {
    kPer = 16 / int(sizeof(Raw)),  // elements of a 16-byte vector
    kVectors = Cfg::kRank / kPer,
    kVecs = (kVectors + Cfg::kThreads - 1) / Cfg::kThreads,
    kHalf = Cfg::kRope / 2,
    kRow = Cfg::kRank + Cfg::kRope
  };
  typedef Pack<Cfg::kDType, kPer> Vec;
  static_assert(sizeof(Raw) == 2, "MLA's activations are bf16 or f16");

  // Element indices of rotary pair i: GPT-J's neighbours, or GPT-NeoX's halves.
  static __device__ __forceinline__ int first(int i) { return Cfg::kGptj ? 2 * i : i; }
  static __device__ __forceinline__ int second(int i) { return Cfg::kGptj ? 2 * i + 1 : i + kHalf; }

  static __device__ __forceinline__ float table(const void* t, long long at) {
    return Elem<Cfg::kTableDType>::load(static_cast<const TableRaw*>(t)[at]);
  }

  static __device__ __forceinline__ float load(const void* base, long long at) {
    return Elem<Cfg::kDType>::load(static_cast<const Raw*>(base)[at]);
  }

  // One value into a dtype or e4m3 store (the code of value / scale).
  template <bool kE4m3>
  static __device__ __forceinline__ void put(void* base, long long at, float v, float scale) {
    if (kE4m3)
      static_cast<unsigned char*>(base)[at] = Elem<kE4M3>::store(v / scale);
    else
      static_cast<Raw*>(base)[at] = Elem<Cfg::kDType>::store(v);
  }

  // A vector of 8 values into a dtype store (16 bytes) or an e4m3 one (8 bytes).
  template <bool kE4m3>
  static __device__ __forceinline__ void put_vec(void* base, long long at, const float (&v)[kPer],
                                                 float scale) {
    if (kE4m3) {
      u32 words[2];
#pragma unroll
      for (int j = 0; j < 2; ++j)
        words[j] = e4m3x2(v[4 * j] / scale, v[4 * j + 1] / scale) |
                   (e4m3x2(v[4 * j + 2] / scale, v[4 * j + 3] / scale) << 16);
      *reinterpret_cast<uint2*>(static_cast<unsigned char*>(base) + at) =
          make_uint2(words[0], words[1]);
    } else {
      Vec o;
#pragma unroll
      for (int e = 0; e < kPer; ++e) o.set(e, v[e]);
      o.store(static_cast<Raw*>(base) + at);
    }
  }

  // NaN in a dtype or e4m3 store (a position outside the table).
  template <bool kE4m3>
  static __device__ __forceinline__ void put_nan(void* base, long long at) {
    if (kE4m3)
      static_cast<unsigned char*>(base)[at] = 0x7f;
    else
      static_cast<Raw*>(base)[at] = Elem<Cfg::kDType>::nan();
  }

  static __device__ void run(const MlaParams& p) {
    __shared__ float warp_sums[32];
    __shared__ float total;
    const long long t = blockIdx.x;
    const int tid = int(threadIdx.x);
    const long long pos = Cfg::kIds64 ? static_cast<const long long*>(p.ids)[t]
                                      : (long long)static_cast<const int*>(p.ids)[t];
    const bool in_table = pos >= 0 && pos < p.table_rows;
    const long long trow = in_table ? pos * p.table_stride : 0;

    // The latent cache row (a uniform branch: every thread of the block sees the same slot).
    const long long slot = p.cache ? p.slots[t] : -1;
    if (p.cache && (slot >= p.cache_slots || slot < -1)) {
      if (tid == 0 && p.skipped) atomicAdd(p.skipped, 1);
    } else if (p.cache && slot >= 0) {
      const float cscale = Cfg::kCacheE4m3 ? *p.cache_scale : 1.0f;
      char* row = static_cast<char*>(p.cache) +
                  slot * p.cache_stride * (Cfg::kCacheE4m3 ? 1LL : (long long)sizeof(Raw));
      const char* xr =
          static_cast<const char*>(p.kv_c) + t * p.kv_c_stride * (long long)sizeof(Raw);
      Vec v[kVecs];
      float sumsq = 0.0f;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int at = i * Cfg::kThreads + tid;
        if (at >= kVectors) continue;
        v[i].load(xr + (long long)at * 16);
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const float f = v[i].get(e);
          sumsq = fmaf(f, f, sumsq);
        }
      }
      float rstd = 1.0f;
      if (Cfg::kNorm) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sumsq += __shfl_xor_sync(0xffffffffu, sumsq, o);
        if ((tid & 31) == 0) warp_sums[tid >> 5] = sumsq;
        __syncthreads();
        if (tid < 32) {
          float s = tid < (Cfg::kThreads + 31) / 32 ? warp_sums[tid] : 0.0f;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          if (tid == 0) total = s;
        }
        __syncthreads();
        rstd = 1.0f / sqrtf(total / float(Cfg::kRank) + p.eps);
      }
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int at = i * Cfg::kThreads + tid;
        if (at >= kVectors) continue;
        float out[kPer];
        if (Cfg::kNorm) {
          Vec w;
          w.load_ro(static_cast<const char*>(p.w) + (long long)at * 16);
#pragma unroll
          for (int e = 0; e < kPer; ++e) out[e] = (v[i].get(e) * rstd) * w.get(e);
        } else {
#pragma unroll
          for (int e = 0; e < kPer; ++e) out[e] = v[i].get(e);
        }
        put_vec<Cfg::kCacheE4m3>(row, (long long)at * kPer, out, cscale);
      }
      // rope(k_pe) after kv_c in the row.
      const void* kp =
          static_cast<const char*>(p.k_pe) + t * p.k_pe_stride * (long long)sizeof(Raw);
      for (int i = tid; i < kHalf; i += Cfg::kThreads) {
        const int a = first(i), b = second(i);
        if (!in_table) {
          put_nan<Cfg::kCacheE4m3>(row, Cfg::kRank + a);
          put_nan<Cfg::kCacheE4m3>(row, Cfg::kRank + b);
          continue;
        }
        const float c = table(p.cos, trow + i), s = table(p.sin, trow + i);
        const float xa = load(kp, a), xb = load(kp, b);
        put<Cfg::kCacheE4m3>(row, Cfg::kRank + a, xa * c - xb * s, cscale);
        put<Cfg::kCacheE4m3>(row, Cfg::kRank + b, xb * c + xa * s, cscale);
      }
    }

    // The query: every head's q_pe rotated, in place or after q_nope in q_out.
    if (p.heads == 0) return;
    const float qscale = Cfg::kQE4m3 ? *p.q_scale : 1.0f;
    const long long pairs = p.heads * kHalf;
    for (long long j = tid; j < pairs; j += Cfg::kThreads) {
      const long long h = j / kHalf;
      const int i = int(j - h * kHalf);
      const int a = first(i), b = second(i);
      Raw* q = static_cast<Raw*>(p.q_pe) + t * p.q_pe_token_stride + h * p.q_pe_head_stride;
      void* out = Cfg::kAssemble ? p.q_out : static_cast<void*>(q);
      const long long at =
          Cfg::kAssemble ? t * p.q_out_token_stride + h * p.q_out_head_stride + Cfg::kRank : 0;
      if (!in_table) {
        put_nan<Cfg::kQE4m3>(out, at + a);
        put_nan<Cfg::kQE4m3>(out, at + b);
        continue;
      }
      const float c = table(p.cos, trow + i), s = table(p.sin, trow + i);
      const float xa = Elem<Cfg::kDType>::load(q[a]), xb = Elem<Cfg::kDType>::load(q[b]);
      put<Cfg::kQE4m3>(out, at + a, xa * c - xb * s, qscale);
      put<Cfg::kQE4m3>(out, at + b, xb * c + xa * s, qscale);
    }
    if (!Cfg::kAssemble) return;
    const long long vectors = p.heads * kVectors;
    for (long long j = tid; j < vectors; j += Cfg::kThreads) {
      const long long h = j / kVectors;
      const int c = int(j - h * kVectors);
      Vec v;
      v.load(static_cast<const Raw*>(p.q_nope) + t * p.q_nope_token_stride +
             h * p.q_nope_head_stride + (long long)c * kPer);
      float out[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) out[e] = v.get(e);
      put_vec<Cfg::kQE4m3>(p.q_out,
                           t * p.q_out_token_stride + h * p.q_out_head_stride + (long long)c * kPer,
                           out, qscale);
    }
  }
};

}  // namespace ropejit_dev
