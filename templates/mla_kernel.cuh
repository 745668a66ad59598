// MLA's step around RoPE (multi-head latent attention, DeepSeek-V2/V3), per token:
//   the latent cache row  [ RMSNorm(kv_c) · w ‖ rope(k_pe) ]  at the token's slot (a warp), and
//   the query: rope(q_pe) in place, or  q_out = [ q_nope ‖ rope(q_pe) ]  (blocks of tokens and
//   heads).
// fp32 arithmetic, each output rounded once (to the dtype, or to e4m3 after dividing by the
// store's scale, or multiplying by it: kScaleMultiplies). kv_c's row is held in registers (16-byte
// vectors across a warp) between its statistics and its output, so it is read once.
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
    kHalf = Cfg::kRope / 2,
    kRow = Cfg::kRank + Cfg::kRope
  };
  // Whether q_pe's rotary part splits into 16-byte vectors (GPT-J: whole vectors of pairs;
  // NeoX: each half); the call's alignment is p.q_pe_vectors.
  static constexpr bool kQVectors =
      Cfg::kGptj ? Cfg::kRope % kPer == 0 : (Cfg::kRope / 2) % kPer == 0;
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

  // What an e4m3 store encodes: value / scale (vLLM's scales), or value × scale (FlashInfer's).
  static __device__ __forceinline__ float scaled(float v, float scale) {
    return Cfg::kScaleMultiplies ? v * scale : v / scale;
  }

  // One value into a dtype or e4m3 store (the code of the scaled value).
  template <bool kE4m3>
  static __device__ __forceinline__ void put(void* base, long long at, float v, float scale) {
    if (kE4m3)
      static_cast<unsigned char*>(base)[at] = Elem<kE4M3>::store(scaled(v, scale));
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
        words[j] = e4m3x2(scaled(v[4 * j], scale), scaled(v[4 * j + 1], scale)) |
                   (e4m3x2(scaled(v[4 * j + 2], scale), scaled(v[4 * j + 3], scale)) << 16);
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

  static __device__ __forceinline__ long long position(const MlaParams& p, long long t) {
    return Cfg::kIds64 ? static_cast<const long long*>(p.ids)[t]
                       : (long long)static_cast<const int*>(p.ids)[t];
  }

  // NaN in kPer consecutive elements of a dtype or e4m3 store.
  template <bool kE4m3>
  static __device__ __forceinline__ void put_nan_vec(void* base, long long at) {
    if (kE4m3) {
      *reinterpret_cast<uint2*>(static_cast<unsigned char*>(base) + at) =
          make_uint2(0x7f7f7f7fu, 0x7f7f7f7fu);
    } else {
      Vec n;
      n.poison();
      n.store(static_cast<Raw*>(base) + at);
    }
  }

  // Token t's cache row: its slot, its own index, or the page table's; -1 for padding, -2 for
  // a row outside the cache or past its request's pages (skipped and counted).
  static __device__ __forceinline__ long long cache_slot(const MlaParams& p, long long t) {
    long long slot = t;
    if (p.addressing == kMlaSlots) {
      slot = p.slots[t];
      if (slot == -1) return -1;
    } else if (p.addressing == kMlaPageTable) {
      const long long b = p.batch_indices[t];
      if (b < 0 || b >= p.batch) return -1;
      const long long pos = p.page_positions[t];
      const long long start = p.kv_indptr[b], end = p.kv_indptr[b + 1];
      if (pos < 0) return -2;
      const long long page = pos / p.page_size;
      if (page >= end - start || start + page < 0 || start + page >= p.num_indices) return -2;
      slot = (long long)p.kv_indices[start + page] * p.page_size + pos % p.page_size;
    }
    return slot >= 0 && slot < p.cache_slots ? slot : -2;
  }

  // Elements from a cache's start to slot's row: blocks of rows, or rows one stride apart.
  static __device__ __forceinline__ long long row_at(const MlaParams& p, long long slot,
                                                     long long stride, long long block_stride) {
    if (p.cache_block_size == 0) return slot * stride;
    return slot / p.cache_block_size * block_stride + slot % p.cache_block_size * stride;
  }

  // The latent cache rows, a warp per token: [ RMSNorm(kv_c) · w ‖ rope(k_pe) ] at the token's
  // row (the rope part in cache_pe when it is set), and rope(k_pe) into k_pe_out for every
  // token. Every read that does not depend on the position or the row is issued first.
  static __device__ void cache_rows(const MlaParams& p, long long block, int tid) {
    enum : int { kLaneVecs = (kVectors + 31) / 32 };
    const int lane = tid & 31;
    const long long t = block * (Cfg::kThreads / 32) + (tid >> 5);
    if (t >= p.tokens) return;
    const char* xr = static_cast<const char*>(p.kv_c) + t * p.kv_c_stride * (long long)sizeof(Raw);
    const void* kp = static_cast<const char*>(p.k_pe) + t * p.k_pe_stride * (long long)sizeof(Raw);
    Vec v[kLaneVecs];
#pragma unroll
    for (int i = 0; i < kLaneVecs; ++i) {
      const int at = i * 32 + lane;
      if (at < kVectors) v[i].load(xr + (long long)at * 16);
    }
    float xa = 0.0f, xb = 0.0f;
    if (lane < kHalf) {
      xa = load(kp, first(lane));
      xb = load(kp, second(lane));
    }
    const long long slot = cache_slot(p, t);
    const long long pos = position(p, t);
    if (slot == -2 && lane == 0 && p.skipped) atomicAdd(p.skipped, 1);
    const bool row_written = slot >= 0;
    if (!row_written && !p.k_pe_out) return;
    const bool in_table = pos >= 0 && pos < p.table_rows;
    const long long trow = in_table ? pos * p.table_stride : 0;
    float c = 0.0f, s = 0.0f;
    if (lane < kHalf && in_table) {
      c = table(p.cos, trow + lane);
      s = table(p.sin, trow + lane);
    }
    const float cscale = Cfg::kCacheE4m3 ? *p.cache_scale : 1.0f;
    const long long celem = Cfg::kCacheE4m3 ? 1LL : (long long)sizeof(Raw);
    char* row = row_written ? static_cast<char*>(p.cache) +
                                  row_at(p, slot, p.cache_stride, p.cache_block_stride) * celem
                            : nullptr;
    if (row_written) {
      float rstd = 1.0f;
      if (Cfg::kNorm) {
        float sumsq = 0.0f;
#pragma unroll
        for (int i = 0; i < kLaneVecs; ++i) {
          if (i * 32 + lane >= kVectors) continue;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const float f = v[i].get(e);
            sumsq = fmaf(f, f, sumsq);
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sumsq += __shfl_xor_sync(0xffffffffu, sumsq, o);
        rstd = 1.0f / sqrtf(sumsq / float(Cfg::kRank) + p.eps);
      }
#pragma unroll
      for (int i = 0; i < kLaneVecs; ++i) {
        const int at = i * 32 + lane;
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
    }
    // rope(k_pe): after kv_c in the row, or in cache_pe's row; rope_dim / 2 beyond a warp loops.
    char* pe_row = !row_written ? nullptr
                   : p.cache_pe
                       ? static_cast<char*>(p.cache_pe) +
                             row_at(p, slot, p.cache_pe_stride, p.cache_pe_block_stride) * celem
                       : row + Cfg::kRank * celem;
    void* kout =
        p.k_pe_out ? static_cast<char*>(p.k_pe_out) + t * p.k_pe_out_stride * (long long)sizeof(Raw)
                   : nullptr;
    for (int i = lane; i < kHalf; i += 32) {
      const int a = first(i), b = second(i);
      if (!in_table) {
        if (row_written) {
          put_nan<Cfg::kCacheE4m3>(pe_row, a);
          put_nan<Cfg::kCacheE4m3>(pe_row, b);
        }
        if (kout) {
          put_nan<false>(kout, a);
          put_nan<false>(kout, b);
        }
        continue;
      }
      if (i != lane) {
        xa = load(kp, a);
        xb = load(kp, b);
        c = table(p.cos, trow + i);
        s = table(p.sin, trow + i);
      }
      const float ya = xa * c - xb * s, yb = xb * c + xa * s;
      if (row_written) {
        put<Cfg::kCacheE4m3>(pe_row, a, ya, cscale);
        put<Cfg::kCacheE4m3>(pe_row, b, yb, cscale);
      }
      if (kout) {
        put<false>(kout, a, ya, 1.0f);
        put<false>(kout, b, yb, 1.0f);
      }
    }
  }

  // A query block's share: tokens [t0, t0 + tokens), heads [h0, h0 + heads).
  struct Tile {
    long long t0, h0;
    int tokens, heads;
  };

  // Item u of a tile walked token by token, head by head, `per_head` items a head: its token,
  // head and place in the head.
  struct Item {
    long long t, h;
    int c;
  };
  static __device__ __forceinline__ Item item(const Tile& w, int u, int per_head) {
    const int per_token = w.heads * per_head;
    const int r = u % per_token;
    return Item{w.t0 + u / per_token, w.h0 + r / per_head, r % per_head};
  }

  // Where the assembled query's rope part of (t, h) starts: after kv_rank in q_out's head, or
  // in q_out_pe's.
  static __device__ __forceinline__ void rope_out(const MlaParams& p, long long t, long long h,
                                                  void** out, long long* at) {
    if (p.q_out_pe) {
      *out = p.q_out_pe;
      *at = t * p.q_out_pe_token_stride + h * p.q_out_pe_head_stride;
    } else {
      *out = p.q_out;
      *at = t * p.q_out_token_stride + h * p.q_out_head_stride + Cfg::kRank;
    }
  }

  // rope(q_pe) a pair per step: any alignment.
  static __device__ void query_rope_pairs(const MlaParams& p, const Tile& w, int tid,
                                          float qscale) {
    const int pairs = w.tokens * w.heads * kHalf;
    for (int j = tid; j < pairs; j += Cfg::kThreads) {
      const Item it = item(w, j, kHalf);
      const long long t = it.t, h = it.h;
      const int i = it.c;
      const int a = first(i), b = second(i);
      const long long pos = position(p, t);
      Raw* q = static_cast<Raw*>(p.q_pe) + t * p.q_pe_token_stride + h * p.q_pe_head_stride;
      void* out = static_cast<void*>(q);
      long long at = 0;
      if (Cfg::kAssemble) rope_out(p, t, h, &out, &at);
      if (pos < 0 || pos >= p.table_rows) {
        put_nan<Cfg::kQE4m3>(out, at + a);
        put_nan<Cfg::kQE4m3>(out, at + b);
        continue;
      }
      const long long trow = pos * p.table_stride;
      const float c = table(p.cos, trow + i), s = table(p.sin, trow + i);
      const float xa = Elem<Cfg::kDType>::load(q[a]), xb = Elem<Cfg::kDType>::load(q[b]);
      put<Cfg::kQE4m3>(out, at + a, xa * c - xb * s, qscale);
      put<Cfg::kQE4m3>(out, at + b, xb * c + xa * s, qscale);
    }
  }

  // rope(q_pe) in 16-byte vectors (q_pe aligned, rope widths that split into them): a GPT-J
  // vector holds kPer / 2 pairs, a NeoX unit is a vector of each half. kBatch units a thread,
  // with their positions, are read before any is computed, so the reads are in flight together.
  static __device__ void query_rope_vectors(const MlaParams& p, const Tile& w, int tid,
                                            float qscale) {
    enum : int { kUnits = Cfg::kGptj ? Cfg::kRope / kPer : kHalf / kPer, kBatch = 4 };
    const int units = w.tokens * w.heads * kUnits;
    for (int base = tid; base < units; base += kBatch * Cfg::kThreads) {
      Vec x[kBatch], y[kBatch];
      long long pos[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int u = base + k * Cfg::kThreads;
        if (u >= units) continue;
        const Item it = item(w, u, kUnits);
        const Raw* q = static_cast<const Raw*>(p.q_pe) + it.t * p.q_pe_token_stride +
                       it.h * p.q_pe_head_stride + it.c * kPer;
        x[k].load(q);
        if (!Cfg::kGptj) y[k].load(q + kHalf);
        pos[k] = position(p, it.t);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int u = base + k * Cfg::kThreads;
        if (u >= units) continue;
        const Item it = item(w, u, kUnits);
        const long long t = it.t, h = it.h;
        const int c = it.c;
        const long long off = (long long)c * kPer;
        void* out = p.q_pe;
        long long at = t * p.q_pe_token_stride + h * p.q_pe_head_stride;
        if (Cfg::kAssemble) rope_out(p, t, h, &out, &at);
        at += off;
        if (pos[k] < 0 || pos[k] >= p.table_rows) {
          put_nan_vec<Cfg::kQE4m3>(out, at);
          if (!Cfg::kGptj) put_nan_vec<Cfg::kQE4m3>(out, at + kHalf);
          continue;
        }
        const long long trow = pos[k] * p.table_stride;
        float lo[kPer], hi[kPer];
        if (Cfg::kGptj) {
#pragma unroll
          for (int e = 0; e < kPer / 2; ++e) {
            const int i = c * (kPer / 2) + e;
            const float cs = table(p.cos, trow + i), sn = table(p.sin, trow + i);
            const float xa = x[k].get(2 * e), xb = x[k].get(2 * e + 1);
            lo[2 * e] = xa * cs - xb * sn;
            lo[2 * e + 1] = xb * cs + xa * sn;
          }
        } else {
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const int i = c * kPer + e;
            const float cs = table(p.cos, trow + i), sn = table(p.sin, trow + i);
            const float xa = x[k].get(e), xb = y[k].get(e);
            lo[e] = xa * cs - xb * sn;
            hi[e] = xb * cs + xa * sn;
          }
        }
        put_vec<Cfg::kQE4m3>(out, at, lo, qscale);
        if (!Cfg::kGptj) put_vec<Cfg::kQE4m3>(out, at + kHalf, hi, qscale);
      }
    }
  }

  // q_out's first kv_rank elements: q_nope, converted to the query's store.
  static __device__ void query_nope(const MlaParams& p, const Tile& w, int tid, float qscale) {
    enum : int { kBatch = 4 };
    const int vectors = w.tokens * w.heads * kVectors;
    for (int base = tid; base < vectors; base += kBatch * Cfg::kThreads) {
      Vec v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int j = base + k * Cfg::kThreads;
        if (j >= vectors) continue;
        const Item it = item(w, j, kVectors);
        v[k].load(static_cast<const Raw*>(p.q_nope) + it.t * p.q_nope_token_stride +
                  it.h * p.q_nope_head_stride + it.c * kPer);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int j = base + k * Cfg::kThreads;
        if (j >= vectors) continue;
        const Item it = item(w, j, kVectors);
        float out[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) out[e] = v[k].get(e);
        put_vec<Cfg::kQE4m3>(p.q_out,
                             it.t * p.q_out_token_stride + it.h * p.q_out_head_stride + it.c * kPer,
                             out, qscale);
      }
    }
  }

  // The grid: first p.cache_blocks blocks of cache rows (a warp per token), then the query's
  // blocks, each tokens_per_block tokens by heads_per_block heads: a decode step's few tokens
  // split their heads over the GPU, a prefill's tokens group so a thread has reads in flight.
  static __device__ void run(const MlaParams& p) {
    const long long block = blockIdx.x;
    const int tid = int(threadIdx.x);
    if (block < p.cache_blocks) {
      cache_rows(p, block, tid);
      return;
    }
    const long long qb = block - p.cache_blocks;
    const long long tile = qb / p.head_groups, group = qb % p.head_groups;
    Tile w;
    w.t0 = tile * p.tokens_per_block;
    w.h0 = group * p.heads_per_block;
    w.tokens = int(p.tokens - w.t0 < p.tokens_per_block ? p.tokens - w.t0 : p.tokens_per_block);
    w.heads = int(p.heads - w.h0 < p.heads_per_block ? p.heads - w.h0 : p.heads_per_block);
    const float qscale = Cfg::kQE4m3 ? *p.q_scale : 1.0f;
    if (kQVectors && p.q_pe_vectors)
      query_rope_vectors(p, w, tid, qscale);
    else
      query_rope_pairs(p, w, tid, qscale);
    if (Cfg::kAssemble) query_nope(p, w, tid, qscale);
  }
};

}  // namespace ropejit_dev
