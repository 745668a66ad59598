// The decode block's QKV projection in one kernel: y = RoPE(RMSNorm(x) · Wᵀ) for a few tokens.
//
// Tensor cores (mma.sync m16n8k16, fp32 accumulation, sm_80+) with the weight as the 16-row
// operand and the tokens as the 8-column one, so one token costs no more than eight. Each
// block owns 8 column pairs (16 weight rows) over the whole hidden dimension, its warps
// splitting the hidden dimension (kSplits) and summing through shared memory; blockIdx.y
// takes the next kTokenTiles * 8 tokens.
//
// Rows of the 16-row operand are chosen so that row r and row r + 8 are the two columns of
// one rotary pair (neox: i and i + R/2; gptj: 2i and 2i + 1; columns past the rotary part and
// v's in consecutive twos): the accumulator fragment then gives every thread both columns of
// its pair, and RoPE is applied in registers on the fp32 sums, rounded once at the store.
//
// Swapped operands (Cfg::kSwap, 16-bit weights, an even number of token tiles): tiles 2m and
// 2m + 1 form the 16-row operand (tokens g and g + 8 of the lane's group) and the weights the
// 8-column one, two n-tiles of 8 weight rows per block (pairs 0-3 and 4-7, a pair's two columns
// adjacent). A lane's 16-byte load of one weight row then holds both k16 steps' B registers as
// they are, where the weights as the 16-row operand need its two rows interleaved (a move per
// register); the accumulator gives a lane both columns of pair t of each n-tile for tokens g and
// g + 8. The same loads, sums and epilogue otherwise.
//
// The hidden dimension is read in a permuted order, the same for both operands: thread
// (group g, lane-in-group t) loads 8 consecutive elements at k0 + 8t of its two weight rows
// and of token g's activations, and feeds elements 0..3 to the first k16 step and 4..7 to the
// second. A sum does not depend on the order of its terms, and every load is 16 bytes.
//
// The GLU epilogue (Cfg::kGlu, the FFN's gate/up half): the thread's two rows are gate row n
// (of w) and up row n (of w2), and the store is act(gate) · up of the fp32 sums, column n.
//
// FP8 weights (Cfg::kW8): e4m3 codes with a float scale per output column (weight row). With
// one token tile (or the `wide` variants at two and four) a lane loads 16 codes (16 bytes) of
// each of its rows per 64-element chunk and the matching 16 activations and feeds four k16
// steps; otherwise it loads 8 codes per 32-element chunk (8 bytes), so that a stage holds no
// more activations than with 16-bit weights (16 per lane and tile spill from two tiles on at
// four resident 8-warp blocks per SM; the wide variants are compiled for two). The codes are
// widened to the operand dtype exactly (every e4m3 value is a bf16 and an f16 value); the column's
// scale multiplies its fp32 sum.
//
// KV cache (Cfg::kCache: slots, paged or contiguous): k after RoPE and v are also stored, rounded
// once from the same fp32 values (FP8: value · scale, saturating), in the cache row of the token's
// slot.
//
// Bias (QKV only, p.bias): the column's bias, in the activation dtype, is added to the fp32 sum
// (after rstd and the FP8 scale) before RoPE, and the result is rounded once.
//
// RMSNorm: y = rstd(x) · Σ_k bf16(x_k · w_k) W_nk. The weight product is rounded once to the
// operand dtype (exactly what the float64 reference reproduces), the statistics Σ x² are
// gathered while the activations stream by, and rstd is applied to the fp32 sums.
#pragma once
#include "activation.cuh"
#include "e4m3_widen.cuh"
#include "proj_params.cuh"
#include "rope_freqs.cuh"

namespace ropejit_dev {

enum : int { kProjNormNone = 0, kProjNormRms = 1, kProjNormRmsOnePlus = 2 };

template <int kDType>
struct MmaOp;

template <>
struct MmaOp<kBF16> {
  static __device__ __forceinline__ void run(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                             u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  // Two floats rounded to nearest even, `lo` in the low half.
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  // The two products a · b, each rounded once from the exact product (+ -0 keeps a product's
  // sign of zero).
  static __device__ __forceinline__ u32 mul(u32 a, u32 b) {
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
    return r;
  }
};

template <>
struct MmaOp<kF16> {
  static __device__ __forceinline__ void run(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                             u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ u32 mul(u32 a, u32 b) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
    return r;
  }
};

// 16 bytes of weights, read once: not kept in L1, and the L2 asked to fetch the surrounding
// 256 bytes (the other warps of the block read them next): faster at Llama-3-8B's shape on the
// H100 than without the hint (bench/history/2026-11-24.md, "The decode block's QKV projection").
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The same for 8 bytes (in x and y; z and w zero).
__device__ __forceinline__ uint4 load_stream8(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p));
  v.z = v.w = 0u;
  return v;
}

// Thread-block clusters (sm_90+; Cfg::kCluster > 1): the block's rank in its cluster, a float
// of another block's shared memory (`local` is this block's copy of the same variable), and a
// barrier over the cluster that orders shared-memory writes before the reads after it.
__device__ __forceinline__ int cluster_rank() {
  unsigned r = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return int(r);
}

__device__ __forceinline__ float cluster_load(const float* local, int rank) {
#if __CUDA_ARCH__ >= 900
  const unsigned addr = unsigned(__cvta_generic_to_shared(local));
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  return rank == 0 ? *local : 0.0f;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
#else
  __syncthreads();
#endif
}

// A pointer the compiler must keep as it is (not recompute from what it was computed from).
__device__ __forceinline__ void opaque(const char*& p) { asm("" : "+l"(p)); }

template <class Cfg>
struct ProjKernel {
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  typedef MmaOp<Cfg::kDType> Mma;
  enum : int {
    kPairsPerHead = Cfg::kHeadDim / 2,
    kRotPairs = Cfg::kRotaryDim / 2,
    kTiles = Cfg::kTokenTiles,  // 8 tokens each
    kSplits = Cfg::kSplits,     // warps per block, each a slice of the hidden dimension
    kUnroll = Cfg::kUnroll,     // chunks per warp per iteration
    kSwap = Cfg::kSwap,  // tokens as the 16-row operand (pairs of tiles), weights as the 8-column
    kW8Wide = Cfg::kW8 && (kTiles == 1 || Cfg::kWide),  // 16 codes per lane and chunk (else 8)
    kChunk = kW8Wide ? 64 : 32,                         // elements of a chunk
    kLaneK = kChunk / 4,                                // a lane's consecutive elements in a chunk
    kXv = kLaneK / 8,  // 16-byte activation vectors per lane per chunk
    kWBytes = Cfg::kW8 ? 1 : int(sizeof(Raw)),
    kWLoad = kLaneK * kWBytes,     // bytes of a weight row a lane loads per chunk: 16 or 8
    kCluster = Cfg::kCluster,      // blocks of a cluster, each a slice of the hidden dimension
    kSlices = kSplits * kCluster,  // warps of the cluster, each a slice
    kStep = kChunk * kUnroll * kSlices,
    kMine = (kTiles + kSlices - 1) / kSlices,  // tiles a warp finishes
    // Row groups (Cfg::kRows > 1): the block's 16 * kRows weight rows, kSplits warps each, share
    // its tokens' activations, staged in shared memory once per iteration.
    kRows = Cfg::kRows,
    kStaged = kRows > 1,
    kThreads = 32 * kSplits * kRows,
    kBlockW = kChunk * kUnroll * kSplits,  // hidden elements a block covers per iteration
    kTokens = kTiles * 8,                  // tokens of a block
    kTokenVecs = kBlockW / 8,              // 16-byte vectors of one token per iteration
    kStageVecs = kTokens * kTokenVecs,     // vectors of a stage
    kStagePer = kStaged ? kStageVecs / kThreads : 1,  // vectors a thread stages
    kPartRows = kSlices > 1 ? kSplits* kRows : 1,     // warps whose partial sums are shared
    kSumRows = kStaged ? 1 : kSplits,                 // rows of Σ x² in shared memory
    kSharedFloats = kStaged && 8 * kStageVecs > kPartRows* kTiles * 128 ? 8 * kStageVecs
                                                                        : kPartRows* kTiles * 128
  };
  static_assert(!kStaged || (kXv == 1 && kStageVecs % kThreads == 0 && 32 % kTokenVecs == 0),
                "staged activations: one 16-byte vector per lane and chunk, whole vectors per "
                "thread, a token's vectors within one warp");

  // The two output columns of the thread's pair, and where they go.
  struct Pair {
    int part;  // 0 q, 1 k, 2 v
    int head;  // within its part
    int a, b;  // columns within the head
    int j;     // rotary pair index (rotated only when j < kRotPairs and part < 2)
    bool rotate;
    long long col;  // output column of `a` in the projection (weight row)
    long long col_b;
  };

  static __device__ __forceinline__ Pair locate(const ProjParams& p, long long pair) {
    Pair r;
    if (Cfg::kGlu) {  // column `pair`: gate row and up row of the same index
      r.part = r.head = r.a = r.b = r.j = 0;
      r.rotate = false;
      r.col = r.col_b = pair;
      return r;
    }
    const int head = int(pair / kPairsPerHead);
    const int j = int(pair % kPairsPerHead);
    if (j < kRotPairs) {
      r.a = Cfg::kNeox ? j : 2 * j;
      r.b = Cfg::kNeox ? j + kRotPairs : 2 * j + 1;
    } else {
      r.a = Cfg::kRotaryDim + 2 * (j - kRotPairs);
      r.b = r.a + 1;
    }
    r.j = j;
    r.col = (long long)head * Cfg::kHeadDim + r.a;
    r.col_b = (long long)head * Cfg::kHeadDim + r.b;
    const int q = p.out[0].heads, k = p.out[1].heads;
    r.part = head < q ? 0 : head < q + k ? 1 : 2;
    r.head = head - (r.part == 0 ? 0 : r.part == 1 ? q : q + k);
    r.rotate = j < kRotPairs && r.part < 2;
    return r;
  }

  static __device__ __forceinline__ long long position(const ProjParams& p, long long token) {
    if (Cfg::kPosIds) {
      return Cfg::kIdx64 ? static_cast<const long long*>(p.positions)[token]
                         : (long long)static_cast<const int*>(p.positions)[token];
    }
    return p.pos_offset + token;
  }

  // cos and sin of pair j at `pos`; NaN for a table position outside the table.
  static __device__ __forceinline__ void angle(const ProjParams& p, int j, long long pos, float* c,
                                               float* s) {
    if (Cfg::kComputed) {
      const double turns = double(pos) * turns_per_position<Cfg::kRotaryDim>(j, p.log2_base);
      sincos_turns(turns, s, c);
      return;
    }
    if (pos < 0 || pos >= p.table_rows) {
      *c = *s = __int_as_float(0x7fc00000);
      return;
    }
    const long long at = pos * p.table_stride + ((Cfg::kTableFull && !Cfg::kNeox) ? 2 * j : j);
    *c = table_load<Cfg::kTableDType>(p.cos, at);
    *s = table_load<Cfg::kTableDType>(p.sin, at);
  }

  // Rotates (by c, s from Epilogue::fetch) and stores the pair's two columns for one token (GLU:
  // act(gate) · up, column r.col).
  static __device__ __forceinline__ void finish(const ProjParams& p, const Pair& r, long long token,
                                                float ya, float yb, float rstd, float c, float s) {
    if (Cfg::kNorm != kProjNormNone) {
      ya *= rstd;
      yb *= rstd;
    }
    if (Cfg::kGlu) {
      const ProjOutput& o = p.out[0];
      static_cast<Raw*>(o.data)[token * o.stride_token + r.col] =
          Elem<Cfg::kDType>::store(activate<Cfg::kAct>(ya) * yb);
      return;
    }
    if (p.bias) {  // Qwen2's q/k/v biases: on the projection's fp32 sums, before RoPE
      const Raw* bias = static_cast<const Raw*>(p.bias);
      ya += Elem<Cfg::kDType>::load(__ldg(bias + r.col));
      yb += Elem<Cfg::kDType>::load(__ldg(bias + r.col_b));
    }
    if (r.rotate) {
      const float a = fmaf(ya, c, -yb * s);
      const float b = fmaf(yb, c, ya * s);
      ya = a;
      yb = b;
    }
    const ProjOutput& o = p.out[r.part];
    if (Cfg::kCache == 0 || o.data) {
      Raw* row = static_cast<Raw*>(o.data) + token * o.stride_token + r.head * o.stride_head;
      row[r.a] = Elem<Cfg::kDType>::store(ya);
      row[r.b] = Elem<Cfg::kDType>::store(yb);
    }
    if (Cfg::kCache != 0 && r.part > 0) append(p, r, token, ya, yb);
  }

  // k (rotated) or v of one token into its cache row (Cfg::kCache). A row outside the cache
  // (an index read here) is not written and is counted once per token (by the thread of k head
  // 0's first pair); a negative slot is padding, and a token outside every sequence of
  // cu_seqlens is not a sequence's: neither is written or counted.
  static __device__ __forceinline__ void append(const ProjParams& p, const Pair& r, long long token,
                                                float ya, float yb) {
    const ProjCache& c = p.cache;
    long long page = 0, slot = 0;  // slot: the row within the page
    bool bad = false;
    if (Cfg::kCache == 3) {  // slots
      const long long flat = __ldg(c.slots + token);
      if (flat < 0) return;
      bad = flat >= c.slot_count;
      page = flat / c.page_size;
      slot = flat - page * c.page_size;
    } else {
      // The token's sequence b, and its place s among the sequence's n new tokens: itself
      // alone, or from cu_seqlens (the last sequence starting at or before the token, searched
      // in [0, batch); whatever the device data, the token must lie inside its range).
      long long b = token, s = 0, n = 1;
      if (c.cu_seqlens) {
        long long lo = 0, hi = c.batch;
        while (hi - lo > 1) {
          const long long mid = (lo + hi) >> 1;
          if (__ldg(c.cu_seqlens + mid) <= token)
            lo = mid;
          else
            hi = mid;
        }
        const long long first = __ldg(c.cu_seqlens + lo), end = __ldg(c.cu_seqlens + lo + 1);
        if (token < first || token >= end) return;
        b = lo;
        s = token - first;
        n = end - first;
      }
      if (Cfg::kCache == 2) {  // paged: the sequence's last n positions, after the append
        const long long first = __ldg(c.indptr + b), end = __ldg(c.indptr + b + 1);
        const long long last = __ldg(c.last_page_len + b);
        const long long pos = (end - first - 1) * c.page_size + last - n + s;
        bad = end <= first || first < 0 || end > c.num_indices || last < 1 || last > c.page_size ||
              pos < 0;
        if (!bad) {
          const long long nth = pos / c.page_size;
          slot = pos - nth * c.page_size;
          page = __ldg(c.indices + first + nth);
          bad = page < 0 || page >= c.pages;
        }
      } else {  // contiguous: page b, after the tokens it held (the host checks b < pages)
        const long long held = __ldg(c.seq_lens + b);
        page = b;
        slot = held + s;
        bad = held < 0 || slot >= c.page_size;
      }
    }
    if (bad) {
      if (c.skipped && r.part == 1 && r.head == 0 && r.a == 0) atomicAdd(c.skipped, 1);
      return;
    }
    const long long at = page * c.stride_page + slot * c.stride_slot + r.head * c.stride_head;
    if (Cfg::kCacheE4m3) {
      const float scale = r.part == 1 ? c.k_scale : c.v_scale;
      unsigned char* row = static_cast<unsigned char*>(r.part == 1 ? c.k : c.v) + at;
      row[r.a] = Elem<kE4M3>::store(ya * scale);
      row[r.b] = Elem<kE4M3>::store(yb * scale);
    } else {
      Raw* row = static_cast<Raw*>(r.part == 1 ? c.k : c.v) + at;
      row[r.a] = Elem<Cfg::kDType>::store(ya);
      row[r.b] = Elem<Cfg::kDType>::store(yb);
    }
  }

  // One token's 8 activations (as loaded) -> the two k16 steps' B registers, and Σ x².
  // RMSNorm: each x_k · w_k rounded once, two at a time in the operand dtype (the product of
  // two 8- or 11-bit significands is exact before that rounding); Gemma's x_k · (1 + w_k) in
  // fp32 (1 + w_k is not an operand-dtype value), then rounded.
  static __device__ __forceinline__ void operand(uint4 xv, uint4 nv, float& sumsq, u32* b) {
    if (Cfg::kNorm == kProjNormNone) {
      b[0] = xv.x;
      b[1] = xv.y;
      b[2] = xv.z;
      b[3] = xv.w;
      return;
    }
    const u32 xs[4] = {xv.x, xv.y, xv.z, xv.w};
    const u32 ns[4] = {nv.x, nv.y, nv.z, nv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x0 = Elem<Cfg::kDType>::load(Raw(xs[i] & 0xffffu));
      const float x1 = Elem<Cfg::kDType>::load(Raw(xs[i] >> 16));
      sumsq = fmaf(x0, x0, sumsq);
      sumsq = fmaf(x1, x1, sumsq);
      if (Cfg::kNorm == kProjNormRms) {
        b[i] = Mma::mul(xs[i], ns[i]);
      } else {
        const float w0 = 1.0f + Elem<Cfg::kDType>::load(Raw(ns[i] & 0xffffu));
        const float w1 = 1.0f + Elem<Cfg::kDType>::load(Raw(ns[i] >> 16));
        b[i] = Mma::pack(x0 * w0, x1 * w1);
      }
    }
  }

  // One loop iteration's operands: kUnroll chunks of the thread's two weight rows, the norm
  // weight, and the activations of its token in each tile. A lane whose pair lies past the last
  // column reads the weight's row 0 instead, and the activations of a token past the end are
  // token 0's: both reach only sums of their own (that pair's rows, that token's column of the
  // products and its Σ x²), which are not stored, so every load of a full iteration goes out
  // unconditionally. A chunk past the end of the hidden dimension (the last iteration only) is
  // zeros.
  struct Stage {
    enum : int { kXu = kStaged ? 1 : kUnroll, kXt = kStaged ? 1 : kTiles };  // (staged: unused)
    uint4 a[kUnroll], b[kUnroll], n[kXu][kXv], x[kXu][kXt][kXv];

    // Chunk u at byte offsets woff (weights) and off (activations); `in`: inside the hidden
    // dimension.
    __device__ __forceinline__ void chunk(const ProjParams& p, const char* wa, const char* wb,
                                          const char* const* xrow, int u, unsigned woff,
                                          unsigned off, bool in) {
      const uint4 z = make_uint4(0, 0, 0, 0);
      a[u] = !in ? z : kWLoad == 16 ? load_stream16(wa + woff) : load_stream8(wa + woff);
      b[u] = !in ? z : kWLoad == 16 ? load_stream16(wb + woff) : load_stream8(wb + woff);
      if constexpr (!kStaged) {  // (staged: the activations come from shared memory)
#pragma unroll
        for (int v = 0; v < kXv; ++v) {
          if (Cfg::kNorm != kProjNormNone)
            n[u][v] = in ? __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(p.norm_w) +
                                                                off + 16 * v))
                         : z;
#pragma unroll
          for (int i = 0; i < kTiles; ++i)
            x[u][i][v] = in ? __ldg(reinterpret_cast<const uint4*>(xrow[i] + off + 16 * v)) : z;
        }
      }
    }

    // The iteration whose first chunk starts at k0 (32-bit offsets: hidden <= 2^24, the host's
    // check). hidden is a multiple of kLaneK, so a lane's chunk is all inside or all outside;
    // only the last iteration has chunks outside.
    __device__ __forceinline__ void load(const ProjParams& p, const char* wa, const char* wb,
                                         const char* const* xrow, int hidden, int k0, int t) {
      const bool full = k0 + kChunk * kUnroll <= hidden;  // the same in every lane of the warp
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = k0 + kChunk * u + kLaneK * t;
        const unsigned woff = unsigned(k) * kWBytes, off = unsigned(k) * unsigned(sizeof(Raw));
        chunk(p, wa, wb, xrow, u, woff, off, full || k < hidden);
      }
    }
  };

  // Staged activations (kStaged): every iteration the block's threads load its tokens' kBlockW
  // activations, form the operand once (the norm products, and Σ x²) and store it in shared
  // memory as [chunk][token][32 elements], where a warp's lanes (g, t) read tile i's 8 tokens as
  // 512 consecutive bytes (no bank conflicts). Thread `tid` stages vectors tid + j * kThreads:
  // token (tid + j * kThreads) / kTokenVecs, at element 8 * (tid % kTokenVecs) of every iteration
  // (kThreads is a multiple of kTokenVecs), so its Σ x² stay with their tokens.
  struct Staging {
    const char* row[kStagePer];  // the tokens' activation rows
    uint4 x[kStagePer], n;
    float sumsq[kStagePer];
    int vec;  // the thread's vector within a token's kBlockW elements

    __device__ __forceinline__ void init(const ProjParams& p, long long first_token, int tid) {
      vec = tid % kTokenVecs;
#pragma unroll
      for (int j = 0; j < kStagePer; ++j) {  // a token past the end reads token 0 (Stage says why)
        const long long token = first_token + (tid + j * kThreads) / kTokenVecs;
        row[j] = static_cast<const char*>(p.x) +
                 (token < p.tokens ? token : 0) * p.x_stride * (long long)sizeof(Raw);
        if (kStagePer <= 4) opaque(row[j]);
        sumsq[j] = 0.0f;
      }
    }

    // The vectors of the iteration whose block slice starts at `base`; zeros past the end.
    __device__ __forceinline__ void load(const ProjParams& p, int hidden, int base) {
      const uint4 z = make_uint4(0, 0, 0, 0);
      const int k = base + 8 * vec;
      const bool in = k < hidden;  // hidden is a multiple of 8
      const unsigned off = unsigned(k) * unsigned(sizeof(Raw));
      n = Cfg::kNorm != kProjNormNone && in
              ? __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(p.norm_w) + off))
              : z;
#pragma unroll
      for (int j = 0; j < kStagePer; ++j)
        x[j] = in ? __ldg(reinterpret_cast<const uint4*>(row[j] + off)) : z;
    }

    // The loaded vectors' operands into `plane` (kStageVecs vectors).
    __device__ __forceinline__ void publish(uint4* plane, int tid) {
#pragma unroll
      for (int j = 0; j < kStagePer; ++j) {
        u32 b[4];
        operand(x[j], n, sumsq[j], b);
        const int token = (tid + j * kThreads) / kTokenVecs;
        plane[((vec >> 2) * kTokens + token) * 4 + (vec & 3)] = make_uint4(b[0], b[1], b[2], b[3]);
      }
    }

    // Σ x² of each staged token into sums[token]: its kTokenVecs threads are adjacent lanes,
    // added in a fixed butterfly order.
    __device__ __forceinline__ void reduce(float* sums, int tid) const {
#pragma unroll
      for (int j = 0; j < kStagePer; ++j) {
        float s = sumsq[j];
#pragma unroll
        for (int o = 1; o < kTokenVecs; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (vec == 0) sums[(tid + j * kThreads) / kTokenVecs] = s;
      }
    }
  };

  // The lane's operand of token tile i in chunk u (vector v of a 64-element chunk) of the
  // current iteration: formed from its own loads, or (staged) read from shared memory, where
  // `lane` points at its first chunk's tile 0.
  static __device__ __forceinline__ void products(const Stage& cur, const uint4* lane, int u, int i,
                                                  int v, float& sumsq, u32* b) {
    if constexpr (kStaged) {
      const uint4 q = lane[(u * kTokens + i * 8) * 4];
      b[0] = q.x;
      b[1] = q.y;
      b[2] = q.z;
      b[3] = q.w;
    } else {
      operand(cur.x[u][i][v], cur.n[u][v], sumsq, b);
    }
  }

  // The accumulator tiles ("units") a lane finishes, and what each holds. Not swapped: unit i is
  // token tile i, and the lane holds the two columns (rows g and g + 8) of its pair g for tokens
  // 2t and 2t + 1 (c[h] and c[2 + h]). Swapped: unit i is n-tile i % 2 of token pair-tile i / 2,
  // and the lane holds the two columns (2t, 2t + 1) of pair 4 (i % 2) + t for tokens g and g + 8
  // (c[2h] and c[2h + 1]). `group`: the first of the warp's 8 pairs.
  static __device__ __forceinline__ long long unit_pair(long long group, int i, int g, int t) {
    return group + (kSwap ? 4 * (i & 1) + t : g);
  }
  static __device__ __forceinline__ int unit_token(int i, int g, int t, int h) {
    return kSwap ? (i >> 1) * 16 + 8 * h + g : i * 8 + 2 * t + h;
  }

  // What the epilogue needs besides the sums: cos and sin of the pair at each token the lane
  // finishes (units slice + m * kSlices), and the FP8 column scales.
  struct Epilogue {
    float c[kMine][2], s[kMine][2];
    float scale_a, scale_b;

    __device__ __forceinline__ void fetch(const ProjParams& p, const Pair& r, bool live,
                                          long long group, long long first_token, int finisher,
                                          int g, int t) {
      scale_a = scale_b = 1.0f;
      if (Cfg::kW8 && live) {
        scale_a = __ldg(p.w_scale + r.col);
        scale_b = __ldg((Cfg::kGlu ? p.w2_scale : p.w_scale) + r.col_b);
      }
#pragma unroll
      for (int m = 0; m < kMine; ++m) {
        const int i = finisher + m * kSlices;
        Pair ri = r;
        bool live_i = live;
        if (kSwap) {
          const long long pair = unit_pair(group, i, g, t);
          live_i = pair < p.pairs;
          ri = locate(p, live_i ? pair : 0);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          c[m][h] = 1.0f;
          s[m][h] = 0.0f;
          const long long token = first_token + unit_token(i, g, t, h);
          if (!Cfg::kGlu && live_i && ri.rotate && i < kTiles && token < p.tokens)
            angle(p, ri.j, position(p, token), &c[m][h], &s[m][h]);
        }
      }
    }
  };

  // One iteration's products into the accumulators, and the activations' Σ x².
  static __device__ __forceinline__ void accumulate(const Stage& cur, const uint4* lane,
                                                    float (&acc)[kTiles][4],
                                                    float (&sumsq)[kTiles]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (Cfg::kW8) {
        // Half a lane's codes at a time (8 elements: two k16 steps), all tiles, so that only
        // those two steps' widened weights are live.
        const u32 wa[4] = {cur.a[u].x, cur.a[u].y, cur.a[u].z, cur.a[u].w};
        const u32 wb[4] = {cur.b[u].x, cur.b[u].y, cur.b[u].z, cur.b[u].w};
#pragma unroll
        for (int v = 0; v < kXv; ++v) {
          u32 a8[4], b8[4];  // steps 2v and 2v + 1: A registers (a0, a2) and (a1, a3)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            a8[2 * q] = widen_e4m3_pair<Cfg::kDType>(__byte_perm(wa[2 * v + q], 0u, 0x1404));
            a8[2 * q + 1] = widen_e4m3_pair<Cfg::kDType>(__byte_perm(wa[2 * v + q], 0u, 0x3424));
            b8[2 * q] = widen_e4m3_pair<Cfg::kDType>(__byte_perm(wb[2 * v + q], 0u, 0x1404));
            b8[2 * q + 1] = widen_e4m3_pair<Cfg::kDType>(__byte_perm(wb[2 * v + q], 0u, 0x3424));
          }
#pragma unroll
          for (int i = 0; i < kTiles; ++i) {
            u32 b[4];
            products(cur, lane, u, i, v, sumsq[i], b);
            Mma::run(acc[i], a8[0], b8[0], a8[1], b8[1], b[0], b[1]);
            Mma::run(acc[i], a8[2], b8[2], a8[3], b8[3], b[2], b[3]);
          }
        }
      } else if (kSwap) {
        // Tiles 2m and 2m + 1 are the A operand's rows g and g + 8; the weight rows of the
        // lane's two loads are column g of n-tiles 2m (acc[2m]) and 2m + 1 (acc[2m + 1]), each
        // k16 step's two registers already adjacent in the load's.
#pragma unroll
        for (int m = 0; m < kTiles / 2; ++m) {
          u32 x0[4], x1[4];
          products(cur, lane, u, 2 * m, 0, sumsq[2 * m], x0);
          products(cur, lane, u, 2 * m + 1, 0, sumsq[2 * m + 1], x1);
          Mma::run(acc[2 * m], x0[0], x1[0], x0[1], x1[1], cur.a[u].x, cur.a[u].y);
          Mma::run(acc[2 * m], x0[2], x1[2], x0[3], x1[3], cur.a[u].z, cur.a[u].w);
          Mma::run(acc[2 * m + 1], x0[0], x1[0], x0[1], x1[1], cur.b[u].x, cur.b[u].y);
          Mma::run(acc[2 * m + 1], x0[2], x1[2], x0[3], x1[3], cur.b[u].z, cur.b[u].w);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          u32 b[4];
          products(cur, lane, u, i, 0, sumsq[i], b);
          Mma::run(acc[i], cur.a[u].x, cur.b[u].x, cur.a[u].y, cur.b[u].y, b[0], b[1]);
          Mma::run(acc[i], cur.a[u].z, cur.b[u].z, cur.a[u].w, cur.b[u].w, b[2], b[3]);
        }
      }
    }
  }

  static_assert(!kSwap || (kTiles % 2 == 0 && !Cfg::kW8),
                "swapped operands take pairs of token tiles and 16-bit weights");

  static __device__ void run(const ProjParams& p) {
    // The warps' partial sums after the loop; staged: first the ring of two stages' operands.
    __shared__ __align__(16) float shared[kSharedFloats];
    __shared__ float sums[kSumRows][kTiles * 8];
    float(&partial)[kPartRows][kTiles][4][32] =
        *reinterpret_cast<float(*)[kPartRows][kTiles][4][32]>(shared);
    const int lane = int(threadIdx.x) & 31;
    const int warp = int(threadIdx.x) >> 5;
    const int split = kStaged ? warp % kSplits : warp;  // the warp's slice within the block
    const int g = lane >> 2;  // row group: the pair, and the token whose activations it loads
    const int t = lane & 3;   // lane in group: which 8 elements of a 32-element chunk
    // The first of the warp's 8 pairs: row group warp / kSplits of the block's kRows.
    const long long group = ((long long)blockIdx.x * kRows + (kStaged ? warp / kSplits : 0)) * 8;
    const long long pair = group + g;
    const bool live = pair < p.pairs;
    const Pair r = locate(p, live ? pair : 0);
    const long long first_token = (long long)blockIdx.y * kTiles * 8;  // this block's tokens
    // The lane's two weight rows: its pair's two columns, or (swapped) column g of both n-tiles:
    // member g % 2 of pairs g / 2 and 4 + g / 2 (GLU: member 1 is the up row, of w2).
    const char* wa;
    const char* wb;
    if (kSwap) {
      const long long pa = group + (g >> 1), pb = pa + 4;
      const Pair ra = locate(p, pa < p.pairs ? pa : 0), rb = locate(p, pb < p.pairs ? pb : 0);
      const char* base = static_cast<const char*>(Cfg::kGlu && (g & 1) ? p.w2 : p.w);
      wa = base + ((g & 1) ? ra.col_b : ra.col) * p.w_stride * (long long)kWBytes;
      wb = base + ((g & 1) ? rb.col_b : rb.col) * p.w_stride * (long long)kWBytes;
    } else {
      wa = static_cast<const char*>(p.w) + r.col * p.w_stride * (long long)kWBytes;
      wb = static_cast<const char*>(Cfg::kGlu ? p.w2 : p.w) +
           r.col_b * p.w_stride * (long long)kWBytes;
    }
    const char* xrow[kStaged ? 1 : kTiles];  // (staged: the Staging's rows instead)
#pragma unroll
    for (int i = 0; i < (kStaged ? 0 : kTiles); ++i) {  // a token past the end reads token 0
      const long long token = first_token + i * 8 + g;  // (Stage says why)
      xrow[i] = static_cast<const char*>(p.x) +
                (token < p.tokens ? token : 0) * p.x_stride * (long long)sizeof(Raw);
    }
    // Kept in registers: left to itself the compiler recomputes them from the parameters in
    // every iteration (64-bit products, some forty instructions per iteration at two tiles).
    // Up to four tiles: beyond, these registers would spill.
    if (kTiles <= 4 || kStaged) {
      opaque(wa);
      opaque(wb);
#pragma unroll
      for (int i = 0; i < (kStaged ? 0 : kTiles); ++i) opaque(xrow[i]);
    }

    float acc[kTiles][4];
    float sumsq[kTiles];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
      sumsq[i] = 0.0f;
    }
    // Software-pipelined: the next iteration's loads are issued before this one's products, so
    // every warp keeps two iterations of weight loads in flight. The epilogue's inputs are
    // fetched after the loop: fetching them before it (under the weight stream) measures no
    // faster at 1-8 tokens and slower beyond, its registers spilling (bench/history/2026-11-24.md,
    // "FP8 weights, and the epilogue's loads moved ahead").
    // The warp's slice among the cluster's (one block: kSlices = kSplits, rank 0).
    // Staged, the loop runs over the block's iterations (`base`, the same in every warp, as the
    // barriers need), each warp kChunk * kUnroll elements from its `skip`; otherwise over the
    // warp's own chunks from its slice's first.
    const int rank = kCluster > 1 ? cluster_rank() : 0;
    const int slice = rank * kSplits + split;  // also the tiles it finishes: slice, + kSlices, ...
    const int first = kStaged ? rank * kBlockW : slice * kChunk * kUnroll;
    const int skip = kStaged ? split * kChunk * kUnroll : 0;
    Stage cur, next;
    Staging st;
    uint4* const ring = reinterpret_cast<uint4*>(shared);  // staged: two stages of kStageVecs
    const uint4* const mine = ring + (split * kUnroll * kTokens + g) * 4 + t;  // lane's operand
    Epilogue ep;
    const int hidden = int(p.hidden);
    const int tid = int(threadIdx.x);
    cur.load(p, wa, wb, xrow, hidden, first + skip, t);
    if constexpr (kStaged) {
      st.init(p, first_token, tid);
      st.load(p, hidden, first);
      st.publish(ring, tid);
      __syncthreads();
    }
    for (int k0 = first; k0 < hidden; k0 += 2 * kStep) {
      next.load(p, wa, wb, xrow, hidden, k0 + kStep + skip, t);
      if constexpr (kStaged) st.load(p, hidden, k0 + kStep);
      accumulate(cur, mine, acc, sumsq);
      if constexpr (kStaged) {  // the next stage into the other half, read after the barrier
        st.publish(ring + kStageVecs, tid);
        __syncthreads();
      }
      if (k0 + kStep >= hidden) break;
      cur.load(p, wa, wb, xrow, hidden, k0 + 2 * kStep + skip, t);
      if constexpr (kStaged) st.load(p, hidden, k0 + 2 * kStep);
      accumulate(next, mine + kStageVecs, acc, sumsq);
      if constexpr (kStaged) {
        st.publish(ring, tid);
        __syncthreads();
      }
    }
    ep.fetch(p, r, live, group, first_token, slice, g, t);

    // Σ x² of token i * 8 + g: the group's four lanes hold disjoint parts of each slice (staged:
    // the threads that staged each token's vectors).
    if constexpr (kStaged) {
      if (Cfg::kNorm != kProjNormNone) st.reduce(sums[0], tid);
    } else if (Cfg::kNorm != kProjNormNone) {
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        float s = sumsq[i];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (t == 0) sums[warp][i * 8 + g] = s;
      }
    }
    if (kSlices > 1) {
#pragma unroll
      for (int i = 0; i < kTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) partial[warp][i][e][lane] = acc[i][e];
    }
    if (kCluster > 1)
      cluster_sync();  // every block's partial sums visible to the cluster
    else if (kSplits > 1 || Cfg::kNorm != kProjNormNone)
      __syncthreads();
    if (live || kSwap)
      finish_tiles(p, r, acc, partial, sums, ep, group, first_token, warp - split, slice, lane);
    // A cluster's blocks stay until every finisher has read their shared memory.
    if (kCluster > 1) cluster_sync();
  }

  // The epilogue of the tiles this warp finishes (slice, slice + kSlices, ...): the cluster's
  // sums added in rank and warp order, then norm, scales, RoPE and the stores.
  static __device__ __forceinline__ void finish_tiles(
      const ProjParams& p, const Pair& r, const float (&acc)[kTiles][4],
      float (&partial)[kPartRows][kTiles][4][32], float (&sums)[kSumRows][kTiles * 8],
      const Epilogue& ep, long long group, long long first_token, int row0, int slice, int lane) {
    // row0: the first warp of the lane's row group (its kSplits warps' partial sums).
    // Slice w finishes units w, w + kSlices, ... (unit_pair says what a unit holds; the loop is
    // unrolled so that acc[] stays in registers).
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (i % kSlices != slice) continue;
      Pair ri = r;
      if (kSwap) {
        const long long pair = unit_pair(group, i, g, t);
        if (pair >= p.pairs) continue;
        ri = locate(p, pair);
      }
      float c[4];
      if (kSlices > 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = 0.0f;
#pragma unroll
          for (int b = 0; b < kCluster; ++b)
#pragma unroll
            for (int w = 0; w < kSplits; ++w)
              s += kCluster > 1 ? cluster_load(&partial[row0 + w][i][e][lane], b)
                                : partial[row0 + w][i][e][lane];
          c[e] = s;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = acc[i][e];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int local = unit_token(i, g, t, h);
        const long long token = first_token + local;
        if (token >= p.tokens) continue;
        float rstd = 1.0f;
        if (Cfg::kNorm != kProjNormNone) {
          float s = 0.0f;
#pragma unroll
          for (int b = 0; b < kCluster; ++b)
#pragma unroll
            for (int w = 0; w < kSumRows; ++w)
              s += kCluster > 1 ? cluster_load(&sums[w][local], b) : sums[w][local];
          rstd = 1.0f / sqrtf(s / float(p.hidden) + p.norm_eps);
        }
        const float ya = kSwap ? c[2 * h] : Cfg::kW8 ? c[h] * ep.scale_a : c[h];
        const float yb = kSwap ? c[2 * h + 1] : Cfg::kW8 ? c[2 + h] * ep.scale_b : c[2 + h];
        finish(p, ri, token, ya, yb, rstd, ep.c[i / kSlices][h], ep.s[i / kSlices][h]);
      }
    }
  }
};

}  // namespace ropejit_dev
