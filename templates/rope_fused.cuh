// The fused kernel: QK-norm -> RoPE -> FP8 quantization (a static per-tensor scale, or a
// dynamic one per token and head from the head's largest magnitude) -> KV-cache append, each stage
// bound in or out by the key (Cfg), on the plain kernel's pieces (token placement, positions,
// cos/sin, vector access; rope_kernel.cuh). One launch reads q, k and v once and writes q and the
// cache once.
//
// Thread mapping, block = (kLanes, rows, tokens):
//   x: a chunk of the whole head (rotary chunks as in the plain kernel, then the pass-through
//      tail: every element is normalized, written and cached); kLanes is the chunk count
//      rounded up to a power of two (whole warps beyond 32), so that a head's lanes reduce with
//      shuffles; lanes past the head idle.
//   y: head rows; each thread takes heads y, y + rows, ... kHeadsPerThread at a time over q,
//      then k, then v. With gridDim.y > 1 (head groups, not for a norm over all heads) the rows
//      of all the token's blocks count as one: row y of block g is row g * blockDim.y + y, so a
//      decode token's heads run on several SMs, as in the plain kernel. The loop over head
//      batches runs the same number of times in every thread of the grid, so the reductions may
//      use the block's barriers.
//   z: tokens, as in the plain kernel.
// All arithmetic is fp32 from the loaded values to the stored ones, rounded once at the store.
#pragma once
#include "rope_kernel.cuh"

namespace ropejit_dev {

enum : int { kNormNone = 0, kNormRms = 1, kNormRmsOnePlus = 2, kNormRmsAllHeads = 3 };
enum : int { kCacheNone = 0, kCacheContiguous = 1, kCachePaged = 2, kCacheSlots = 3 };

// Where one token's k and v rows go: element offsets of head 0 in the cache tensors (and in
// the dynamic FP8 cache's scale tensors).
struct CacheDest {
  long long offset;
  long long scale_offset;
  bool write;
};

// q = a / b and a - q * b for a >= 0, b > 0: in 32 bits when both fit. A 64-bit division is a
// call of some seventy instructions, here on the chain of dependent steps before a token's
// cache rows can be written.
__device__ __forceinline__ long long div_nonneg(long long a, long long b, long long* rem) {
  long long q;
  if (((unsigned long long)a | (unsigned long long)b) >> 32 == 0)
    q = (long long)(unsigned(a) / unsigned(b));
  else
    q = a / b;
  *rem = a - q * b;
  return q;
}

// n / page_size and its remainder. Below 2^32 (n and the page size): by the host's multiplier
// (CacheParams::page_magic, round-up method of Granlund and Montgomery), six instructions
// where a 32-bit division takes some twenty, on the chain between a decode token's page-table
// loads; else divided.
__device__ __forceinline__ long long page_div(const CacheParams& c, long long n, long long* rem) {
  if (((unsigned long long)n | (unsigned long long)c.page_size) >> 32 == 0) {
    const unsigned un = unsigned(n);
    const unsigned hi = __umulhi(un, c.page_magic);
    const unsigned q = (hi + ((un - hi) >> c.page_shift_a)) >> c.page_shift_b;
    *rem = un - q * unsigned(c.page_size);
    return q;
  }
  return div_nonneg(n, c.page_size, rem);
}

// The integer type of offsets inside q, k, v, their outputs and scales and inside one cache page:
// int where the host found that every such offset of the call fits (Cfg::kNarrow, the launch
// variant's "n"), else long long. A page's own offset (page * stride_page) is 64-bit either way.
template <bool kNarrow>
struct OffsetType {
  typedef long long T;
};
template <>
struct OffsetType<true> {
  typedef int T;
};

template <class Cfg>
struct FusedKernel {
  typedef RopeKernel<Cfg> Rope;
  typedef typename OffsetType<Cfg::kNarrow>::T Off;
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  typedef Pack<Cfg::kDType, Cfg::kVec> Vec;

  enum : int {
    kVec = Cfg::kVec,
    kPairs = Cfg::kRotaryDim / 2,
    kPairsPerChunk = Cfg::kNeox ? kVec : kVec / 2,
    kRotChunks = kPairs / kPairsPerChunk,
    kChunks = kRotChunks + (Cfg::kHeadDim - Cfg::kRotaryDim) / kVec,
    kLanes = Cfg::kLanes,
    kWarpsPerRow = kLanes > 32 ? kLanes / 32 : 1,
    kHpt = Cfg::kHeadsPerThread,
    kOutDType = Cfg::kOutE4m3 ? int(kE4M3) : int(Cfg::kDType),
    kCacheDType = Cfg::kCacheE4m3 ? int(kE4M3) : int(Cfg::kDType),
    kNorm = Cfg::kNorm,
    kCache = Cfg::kCache,
    kDynamic = Cfg::kOutDynamic || Cfg::kCacheDynamic,
    // Passes loaded ahead through shared memory (the variant's "a" suffix, 0: none): each
    // thread's cp.async copies of the next kRing - 1 passes' heads are in flight while it
    // finishes the current pass, and hold no registers. Prefill kernels of one or two heads per
    // thread (measured: bench/history/2026-11-26.md, "A cp.async ring").
    kRing = Cfg::kRing,
    // Without the ring, whether a prefill kernel loads the next pass's heads into registers
    // before it finishes the current ones: with one or two heads per thread (four already keep
    // enough loads in flight, and have no registers left). Two passes ahead in registers
    // measure no faster (bench/history/2026-11-25.md, "The next pass's heads loaded ahead").
    kAhead = kHpt <= 2 && kRing == 0,
    // Where every store of q and k is FP8, the norm's 1/rms moves out of the elements into the
    // store's multiplier (one multiply per element fewer): it commutes with the rotation, and
    // the amax of the head's values times inv is the amax of the values, times inv (rounding
    // is monotonic). Not bit-identical to multiplying each element: x * w skips a rounding and
    // scale * inv adds one (the reference's error budget counts it, autotune/reference.cpp).
    // Faster on the H200's dynamic FP8 prefill, level on the H100 (measured:
    // bench/history/2026-11-27.md, "Dynamic FP8 on the H200: two rows").
    kFold = kNorm != kNormNone && Cfg::kOutE4m3 && (Cfg::kCacheE4m3 || kCache == kCacheNone),
  };
  typedef typename Elem<kOutDType>::Raw OutRaw;
  static_assert(kRing == 0 || (kRing >= 2 && kHpt <= 2 && sizeof(Vec) == 16),
                "a ring of two to four passes, for one or two heads of 16-byte vectors");
  static_assert(kLanes >= kChunks, "a lane for every chunk");
  static_assert(kLanes <= 32 ? (kLanes & (kLanes - 1)) == 0 : kLanes % 32 == 0,
                "lanes: a power of two up to a warp, else whole warps");
  static_assert((Cfg::kHeadDim - Cfg::kRotaryDim) % kVec == 0, "vector width vs tail");

  // One token of an operand: where its head 0 starts and the bytes between its heads.
  struct Rows {
    const char* at;
    Off head;
  };

  // One thread's slice of a head: elements [col, col + kVec), and for a neox rotary chunk also
  // [col + kPairs, ...): the pair partners.
  struct Slice {
    float lo[kVec];
    float hi[kVec];
  };

  // The cache placement in three steps, so that each step's loads go out with the token's other
  // loads of the same depth (the thread issues in order and waits at the first use of a load):
  //   cache_fetch: what needs only the token's sequence `b` (a guess for packed tokens, checked
  //     before use) or the token: the page table's row, the slot, the sequence's length;
  //   cache_place: the slot from those, and for a paged cache the load of its page number;
  //   cache_dest: that page number checked, the offset.
  // An index read from device memory that puts a token outside the cache sets `bad` (the token
  // is then skipped and counted); a negative slot means "do not write".
  // As loaded: converted only in cache_place, so that no conversion sits between the loads.
  struct CacheFetch {
    long long slot;
    // Paged: the sequence's indptr range and last_page_len; contiguous: `start` holds its
    // seq_lens entry (the tokens it held before the call).
    int start, end, last;
  };
  struct CachePending {
    long long page, slot;
    int loaded_page;  // paged: as loaded, checked and widened in cache_dest
    bool write;
  };

  static __device__ __forceinline__ CacheFetch cache_fetch(const FusedParams& fp,
                                                           const TokenPlace& tp, long long b,
                                                           long long t) {
    const CacheParams& c = fp.cache;
    CacheFetch f = {0, 0, 0, 0};
    if (kCache == kCacheSlots) {
      // Indexed like position ids: (sequence, index) order, whatever the layout's token walk.
      f.slot = __ldg(c.slot_mapping + Rope::id_index(fp.rope, tp, t));
    } else if (kCache == kCachePaged) {
      f.start = __ldg(c.indptr + b);
      f.end = __ldg(c.indptr + b + 1);
      f.last = __ldg(c.last_page_len + b);
    } else if (kCache == kCacheContiguous) {
      f.start = __ldg(c.seq_lens + b);
    }
    return f;
  }

  // `seq_tokens`: the tokens of the token's sequence in this call (the paged append's length).
  static __device__ __forceinline__ CachePending cache_place(const FusedParams& fp,
                                                             const CacheFetch& f,
                                                             const TokenPlace& tp,
                                                             long long seq_tokens, bool* bad) {
    const CacheParams& c = fp.cache;
    CachePending d = {0, 0, 0, false};
    if (kCache == kCacheSlots) {
      if (f.slot < 0) return d;  // "do not write this token" (padding, speculative decoding)
      d.page = page_div(c, f.slot, &d.slot);
      if (d.page >= c.pages) {
        *bad = true;
        return d;
      }
    } else if (kCache == kCachePaged) {
      // As loaded (int); the sequence's pages and tokens in 64 bits, so a malformed table
      // (a start of INT_MIN, say) cannot overflow before the check below refuses it.
      const int start = f.start, end = f.end, last = f.last;
      const long long held = ((long long)end - start - 1) * c.page_size + last;  // after the append
      const long long pos = held - seq_tokens + tp.s;
      if (start < 0 || end <= start || end > c.num_indices || last < 1 || last > c.page_size ||
          pos < 0 || pos >= held) {
        *bad = true;
        return d;
      }
      // pos < held, so the page is below end - start.
      d.loaded_page = __ldg(c.indices + start + int(page_div(c, pos, &d.slot)));
    } else {  // contiguous: row tp.b of the cache, after the tokens it holds
      const long long held = f.start;
      d.slot = held + tp.s;
      d.page = tp.b;
      if (held < 0 || d.slot >= c.page_size || d.page >= c.pages) {
        *bad = true;
        return d;
      }
    }
    d.write = true;
    return d;
  }

  static __device__ __forceinline__ CacheDest cache_dest(const FusedParams& fp,
                                                         const CachePending& d, bool* bad) {
    const CacheParams& c = fp.cache;
    CacheDest r = {0, 0, false};
    if (!d.write) return r;
    const long long page = kCache == kCachePaged ? (long long)d.loaded_page : d.page;
    if (kCache == kCachePaged && (page < 0 || page >= c.pages)) {
      *bad = true;
      return r;
    }
    // The slot's offset stays inside its page.
    r.offset = page * Off(c.stride_page) + Off(d.slot) * Off(c.stride_slot);
    if (Cfg::kCacheDynamic)
      r.scale_offset = page * Off(c.scale_stride_page) + Off(d.slot) * Off(c.scale_stride_slot);
    r.write = true;
    return r;
  }

  template <bool kMax>
  static __device__ __forceinline__ float combine(float a, float b) {
    return kMax ? fmaxf(a, b) : a + b;
  }
  // A butterfly over each row of kLanes lanes (up to a warp) among the lanes of `mask`.
  template <bool kMax, int N>
  static __device__ __forceinline__ void butterfly(float (&v)[N], unsigned mask) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
#pragma unroll
      for (int off = kLanes / 2; off > 0; off >>= 1)
        v[j] = combine<kMax>(v[j], __shfl_xor_sync(mask, v[j], off, kLanes));
    }
  }
  // Sums (kMax: the largest of) v[j] over the lanes of each head row and gives every lane the
  // same result, so the whole head is scaled alike: in a butterfly every lane combines the same
  // two values at each step, in either order, and a + b and fmaxf(a, b) do not depend on the
  // order (fmaxf sees no -0 here: magnitudes and sums of squares). All threads of the block call it
  // together. `whole_warps`: the block's threads fill whole warps; else `mask`: the lanes of this
  // thread's warp that exist (the block's last warp is partial).
  template <bool kMax, int N>
  static __device__ __forceinline__ void row_reduce(float (&v)[N], float* scratch, bool whole_warps,
                                                    unsigned mask) {
    static_assert(N <= kHpt, "the scratch holds kHpt values per warp of a row");
    if (kLanes <= 32) {
      // Rows are whole, aligned groups of kLanes lanes inside one warp. A whole warp's mask as
      // a constant: with a mask known only at run time every shuffle is preceded by a check
      // that the lanes it names are converged (four instructions and a branch).
      if (whole_warps)
        butterfly<kMax>(v, 0xffffffffu);
      else
        butterfly<kMax>(v, mask);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
          v[j] = combine<kMax>(v[j], __shfl_xor_sync(0xffffffffu, v[j], off));
      }
      const int row = threadIdx.z * blockDim.y + threadIdx.y;
      float* r = scratch + row * kWarpsPerRow * N;
      if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < N; ++j) r[(threadIdx.x / 32) * N + j] = v[j];
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float s = r[j];
        for (int w = 1; w < kWarpsPerRow; ++w) s = combine<kMax>(s, r[w * N + j]);
        v[j] = s;
      }
      __syncthreads();
    }
  }

  // A slice as loaded. Values stay in their vectors until first used: a conversion right after
  // its load would make the thread wait there, before issuing the loads that follow (the decode
  // step had eight memory round trips in a row so; bench/history/2026-11-24.md, "Fused decode").
  struct RawSlice {
    Vec lo, hi;
  };
  // One pass's heads as loaded, with their kinds (0 q, 1 k, 2 v), indices within their kind and
  // whether this thread holds them.
  struct Batch {
    RawSlice x[kHpt];
    int kind[kHpt], idx[kHpt];
    bool act[kHpt];
  };

  static __device__ __forceinline__ void load_slice(const char* src, bool two, RawSlice& x) {
    x.lo.load(src);
    if (two) x.hi.load(src + kPairs * int(sizeof(Raw)));
  }

  static __device__ __forceinline__ void widen(const RawSlice& r, bool two, Slice& x) {
#pragma unroll
    for (int m = 0; m < kVec; ++m) x.lo[m] = r.lo.get(m);
    if (two) {
#pragma unroll
      for (int m = 0; m < kVec; ++m) x.hi[m] = r.hi.get(m);
    }
  }

  // One norm weight as the kernel applies it: w, or 1 + w (Gemma).
  static __device__ __forceinline__ float weight(float w) {
    return kNorm == kNormRmsOnePlus ? 1.0f + w : w;
  }

  // kVec floats times `scale` as e4m3 codes, converted two at a time and assembled a 32-bit
  // word at a time (element by element, the conversions and byte inserts took twice the
  // instructions), then stored at once.
  static __device__ __forceinline__ void store_e4m3(char* dst, const float (&v)[kVec],
                                                    float scale) {
    Pack<kE4M3, kVec> a;
    u32* words = reinterpret_cast<u32*>(&a.w);
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j)
      words[j] = e4m3x2(v[4 * j] * scale, v[4 * j + 1] * scale) |
                 (e4m3x2(v[4 * j + 2] * scale, v[4 * j + 3] * scale) << 16);
    a.store(dst);
  }

  // Stores a slice as kDst elements (activation dtype, or e4m3 after multiplying by `scale`).
  template <int kDst>
  static __device__ __forceinline__ void store_slice(char* dst, bool two, const Slice& x,
                                                     float scale) {
    if constexpr (kDst == kE4M3 && kVec % 4 == 0) {
      store_e4m3(dst, x.lo, scale);
      if (two) store_e4m3(dst + kPairs, x.hi, scale);
      return;
    }
    typedef typename Elem<kDst>::Raw DRaw;
    Pack<kDst, kVec> a;
#pragma unroll
    for (int m = 0; m < kVec; ++m) a.set(m, kDst == kE4M3 ? x.lo[m] * scale : x.lo[m]);
    a.store(dst);
    if (two) {
      Pack<kDst, kVec> b;
#pragma unroll
      for (int m = 0; m < kVec; ++m) b.set(m, kDst == kE4M3 ? x.hi[m] * scale : x.hi[m]);
      b.store(dst + kPairs * int(sizeof(DRaw)));
    }
  }

  // Norm weights (w, or w + 1 for Gemma) for elements [first, ...) and their partners.
  static __device__ __forceinline__ void load_weight(const void* weights, long long first, bool two,
                                                     Slice& w) {
    Vec a;
    a.load_ro(static_cast<const Raw*>(weights) + first);
#pragma unroll
    for (int m = 0; m < kVec; ++m) w.lo[m] = kNorm == kNormRmsOnePlus ? 1.0f + a.get(m) : a.get(m);
    if (two) {
      Vec b;
      b.load_ro(static_cast<const Raw*>(weights) + first + kPairs);
#pragma unroll
      for (int m = 0; m < kVec; ++m)
        w.hi[m] = kNorm == kNormRmsOnePlus ? 1.0f + b.get(m) : b.get(m);
    }
  }

  // x * inv * w, element by element (x * w where kFold leaves inv to the stores).
  static __device__ __forceinline__ float normed(float x, float inv, float w) {
    return kFold ? x * w : x * inv * w;
  }
  static __device__ __forceinline__ void scale_slice(Slice& x, float inv, const Slice& w,
                                                     bool two) {
#pragma unroll
    for (int m = 0; m < kVec; ++m) x.lo[m] = normed(x.lo[m], inv, w.lo[m]);
    if (two) {
#pragma unroll
      for (int m = 0; m < kVec; ++m) x.hi[m] = normed(x.hi[m], inv, w.hi[m]);
    }
  }

  // The same with q's or k's per-head weights as loaded, chosen element by element: a
  // reference chosen at run time between two register arrays would put both in local memory.
  static __device__ __forceinline__ void scale_slice(Slice& x, float inv, const RawSlice& wq,
                                                     const RawSlice& wk, bool is_q, bool two) {
#pragma unroll
    for (int m = 0; m < kVec; ++m)
      x.lo[m] = normed(x.lo[m], inv, weight(is_q ? wq.lo.get(m) : wk.lo.get(m)));
    if (two) {
#pragma unroll
      for (int m = 0; m < kVec; ++m)
        x.hi[m] = normed(x.hi[m], inv, weight(is_q ? wq.hi.get(m) : wk.hi.get(m)));
    }
  }

  // 1 / sqrt(sum * per_element + eps): the mean and eps in one fma, then the hardware's
  // reciprocal square root (within 2 ulp; a rounded sqrt and a rounded division took ~20
  // instructions and two branches per head, and a norm's error is dominated by its sum anyway:
  // autotune/reference.cpp budgets both).
  static __device__ __forceinline__ float inv_rms(float sum, float per_element, float eps) {
    return rsqrtf(__fmaf_rn(sum, per_element, eps));
  }

  // One head's slice, widened in `x`, as it is stored: for q and k normalized and rotated. `ss`:
  // the head's sum of squares (per-head norms); q_inv / k_inv: the norm over all heads.
  // Returns the factor the stores still apply: the norm's 1/rms where kFold leaves it to them,
  // else 1.
  static __device__ __forceinline__ float finish(const FusedParams& fp, int kind, int idx, int col,
                                                 bool rot, bool two, float ss, float q_inv,
                                                 float k_inv, const RawSlice& wq,
                                                 const RawSlice& wk, const float* cs,
                                                 const float* sn, Slice& x) {
    float left = 1.0f;
    if (kNorm != kNormNone && kind < 2) {
      const bool is_q = kind == 0;
      if (kNorm == kNormRmsAllHeads) {
        Slice w;  // a weight per element of the projection: this head's row
        load_weight(is_q ? fp.q_norm_w : fp.k_norm_w, (long long)idx * Cfg::kHeadDim + col, two, w);
        left = is_q ? q_inv : k_inv;
        scale_slice(x, left, w, two);
      } else {
        left = inv_rms(ss, 1.0f / float(Cfg::kHeadDim), fp.norm_eps);
        scale_slice(x, left, wq, wk, is_q, two);
      }
    }
    if (rot && kind < 2) rotate(x, cs, sn);
    return kFold ? left : 1.0f;
  }

  // Whether a head of this kind gets a dynamic FP8 scale: q when its output is dynamic, k when
  // its output or its cache rows are, v when its cache rows are.
  static __device__ __forceinline__ bool scaled(int kind) {
    return kind == 0   ? bool(Cfg::kOutDynamic)
           : kind == 1 ? (Cfg::kOutDynamic && Cfg::kWriteK) || Cfg::kCacheDynamic
                       : bool(Cfg::kCacheDynamic);
  }

  // The slice's largest magnitude, in four independent chains like the norm's sums.
  static __device__ __forceinline__ float slice_amax(const Slice& x, bool two) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < kVec; ++m) a[m % 4] = fmaxf(a[m % 4], fabsf(x.lo[m]));
    if (two) {
#pragma unroll
      for (int m = 0; m < kVec; ++m) a[m % 4] = fmaxf(a[m % 4], fabsf(x.hi[m]));
    }
    return fmaxf(fmaxf(a[0], a[1]), fmaxf(a[2], a[3]));
  }

  // Where a dynamic FP8 output's scale of head `idx` of the token goes.
  static __device__ __forceinline__ float* scale_at(const ScaleOperand& o, const TokenPlace& tp,
                                                    int t, int idx) {
    return o.data + (token_offset(o.stride_batch, o.stride_seq, tp, t) +
                     Off(unsigned(idx)) * Off(o.stride_head));
  }

  // The grid's row of this thread (head groups: the rows of a token's blocks in a row) and how
  // many rows the token has.
  static __device__ __forceinline__ int grid_row() { return blockIdx.y * blockDim.y + threadIdx.y; }
  static __device__ __forceinline__ int grid_rows() { return gridDim.y * blockDim.y; }

  // The batch of heads starting at hb + grid_row(), kHpt heads grid_rows() apart: their kinds,
  // indices within their kind and whether this thread holds them.
  static __device__ __forceinline__ void batch_heads(int hb, bool loadable, bool in_head, int hq,
                                                     int hk, int total, int (&kind)[kHpt],
                                                     int (&idx)[kHpt], bool (&act)[kHpt]) {
#pragma unroll
    for (int j = 0; j < kHpt; ++j) {
      const int h = hb + grid_row() + j * grid_rows();
      act[j] = loadable && in_head && h < total;
      kind[j] = kind_of(h, hq, hk);
      idx[j] = index_in_kind(h, kind[j], hq, hk);
    }
  }

  // Where this lane's slice of head `idx` of a kind starts.
  static __device__ __forceinline__ const char* slice_at(const Rows& q, const Rows& k,
                                                         const Rows& v, int kind, int idx,
                                                         int col) {
    const Rows& r = kind == 0 ? q : kind == 1 ? k : v;
    return r.at + (Off(unsigned(idx)) * r.head + Off(col * int(sizeof(Raw))));
  }

  // Loads the batch of heads starting at hb into registers.
  static __device__ __forceinline__ void load_batch(int hb, const Rows& q, const Rows& k,
                                                    const Rows& v, bool loadable, bool in_head,
                                                    int col, bool two, int hq, int hk, int total,
                                                    RawSlice (&x)[kHpt], int (&kind)[kHpt],
                                                    int (&idx)[kHpt], bool (&act)[kHpt]) {
    batch_heads(hb, loadable, in_head, hq, hk, total, kind, idx, act);
#pragma unroll
    for (int j = 0; j < kHpt; ++j)
      if (act[j]) load_slice(slice_at(q, k, v, kind[j], idx[j], col), two, x[j]);
  }

  // The kind of head h (0 q, 1 k, 2 v) and its index within that kind.
  static __device__ __forceinline__ int kind_of(int h, int hq, int hk) {
    return h < hq ? 0 : h < hq + hk ? 1 : 2;
  }
  static __device__ __forceinline__ int index_in_kind(int h, int kind, int hq, int hk) {
    return h - (kind == 0 ? 0 : kind == 1 ? hq : hq + hk);
  }

  // Where this lane's slice of head h of the token starts. `one_row`: q, k and v are one row
  // of heads (a packed QKV projection's), so head h is h rows from q's head 0 whatever its kind.
  static __device__ __forceinline__ const char* head_at(const Rows& q, const Rows& k, const Rows& v,
                                                        bool one_row, int h, int hq, int hk,
                                                        int col) {
    // (64-bit: the narrow offsets are checked inside each of q, k and v, not across them.)
    if (one_row) return q.at + col * int(sizeof(Raw)) + (long long)h * q.head;
    const int kind = kind_of(h, hq, hk);
    return slice_at(q, k, v, kind, index_in_kind(h, kind, hq, hk), col);
  }

  // The ring (kRing > 0): slots of one pass each, [slot][head j][lo, hi][thread of the block],
  // 16 bytes apiece, so that a warp's accesses are consecutive (no bank conflicts). A thread
  // reads back only what it copied itself: waiting for its own copies is all the ordering it needs.
  // Addressed in the shared window (32 bits) from `mine`, the thread's entry of slot 0, head 0:
  // converted from a generic pointer at each access, every copy and read re-derived the block's
  // window base (bench/history/2026-11-27.md, "Kind-uniform passes? No: the ring's addressing").
  static __device__ __forceinline__ unsigned ring_at(unsigned mine, int slot, int j, int half,
                                                     unsigned threads) {
    return mine + unsigned((slot * kHpt + j) * 2 + half) * threads * unsigned(sizeof(uint4));
  }
  static __device__ __forceinline__ void copy16_async(unsigned dst, const char* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
#else  // sm_75: an ordinary load and store
    const uint4 w = *reinterpret_cast<const uint4*>(src);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w.x), "r"(w.y),
                 "r"(w.z), "r"(w.w)
                 : "memory");
#endif
  }
  static __device__ __forceinline__ uint4 ring_load(unsigned at) {
    uint4 w;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                 : "r"(at)
                 : "memory");
    return w;
  }
  // Copies this lane's slice of a head (at src) into head j of ring slot `slot`.
  static __device__ __forceinline__ void ring_copy(int slot, int j, unsigned mine, unsigned threads,
                                                   bool two, const char* src) {
    copy16_async(ring_at(mine, slot, j, 0, threads), src);
    if (two) copy16_async(ring_at(mine, slot, j, 1, threads), src + kPairs * int(sizeof(Raw)));
  }
  // The copies of the batch of heads starting at hb into ring slot `slot` (kOneRow: see head_at).
  template <bool kOneRow>
  static __device__ __forceinline__ void ring_copies(int hb, int slot, unsigned mine,
                                                     unsigned threads, const Rows& q, const Rows& k,
                                                     const Rows& v, bool loadable, bool in_head,
                                                     int col, bool two, int hq, int hk, int total) {
#pragma unroll
    for (int j = 0; j < kHpt; ++j) {
      const int h = hb + grid_row() + j * grid_rows();
      if (loadable && in_head && h < total)
        ring_copy(slot, j, mine, threads, two, head_at(q, k, v, kOneRow, h, hq, hk, col));
    }
  }
  // Copies the batch of heads starting at hb into ring slot `slot`, as one group of copies
  // (empty past the last pass, so that every pass commits exactly one group).
  static __device__ __forceinline__ void ring_issue(int hb, int slot, unsigned mine,
                                                    unsigned threads, const Rows& q, const Rows& k,
                                                    const Rows& v, bool one_row, bool loadable,
                                                    bool in_head, int col, bool two, int hq, int hk,
                                                    int total) {
    // (One test of one_row per pass, not per head.)
    if (one_row)
      ring_copies<true>(hb, slot, mine, threads, q, k, v, loadable, in_head, col, two, hq, hk,
                        total);
    else
      ring_copies<false>(hb, slot, mine, threads, q, k, v, loadable, in_head, col, two, hq, hk,
                         total);
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
  }
  // Waits for the oldest group in flight (the pass in `slot`) and reads it into registers.
  static __device__ __forceinline__ void ring_read(int slot, unsigned mine, unsigned threads,
                                                   bool two, RawSlice (&x)[kHpt]) {
    if constexpr (kRing > 0) {  // (16-byte vectors: compiled only for ring kernels)
#if __CUDA_ARCH__ >= 800
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kRing - 1) : "memory");
#endif
#pragma unroll
      for (int j = 0; j < kHpt; ++j) {
        x[j].lo.w = ring_load(ring_at(mine, slot, j, 0, threads));
        if (two) x[j].hi.w = ring_load(ring_at(mine, slot, j, 1, threads));
      }
    }
  }

  static __device__ __forceinline__ void rotate(Slice& x, const float* cs, const float* sn) {
    if (Cfg::kNeox) {
#pragma unroll
      for (int m = 0; m < kVec; ++m) {
        const float a = x.lo[m], b = x.hi[m];
        x.lo[m] = fmaf(a, cs[m], -b * sn[m]);
        x.hi[m] = fmaf(b, cs[m], a * sn[m]);
      }
    } else {
#pragma unroll
      for (int m = 0; m < kVec / 2; ++m) {
        const float a = x.lo[2 * m], b = x.lo[2 * m + 1];
        x.lo[2 * m] = fmaf(a, cs[m], -b * sn[m]);
        x.lo[2 * m + 1] = fmaf(b, cs[m], a * sn[m]);
      }
    }
  }

  // Element offset of a token's head 0 in a tensor of these strides. Tokens, sequences and
  // indices inside a sequence are below 2^31 (checked on the host): unsigned 32-bit factors.
  // Narrow offsets multiply in one instruction where 64-bit ones take three or four: a decode
  // kernel's time is mostly the chain of instructions before its loads and stores.
  static __device__ __forceinline__ Off token_offset(long long stride_batch, long long stride_seq,
                                                     const TokenPlace& tp, int t) {
    return Cfg::kPacked
               ? Off(unsigned(t)) * Off(stride_seq)
               : Off(unsigned(tp.b)) * Off(stride_batch) + Off(unsigned(tp.s)) * Off(stride_seq);
  }

  static __device__ __forceinline__ Rows rows_of(const HeadOperand& o, const TokenPlace& tp,
                                                 int t) {
    Rows r;
    r.at = static_cast<const char*>(o.in) +
           token_offset(o.stride_batch, o.stride_seq, tp, t) * Off(sizeof(Raw));
    r.head = Off(o.stride_head) * Off(sizeof(Raw));
    return r;
  }

  // Where one token of an operand's output starts, in bytes of the output's dtype (which for
  // e4m3 outputs differs from the input's).
  static __device__ __forceinline__ char* out_row(const HeadOperand& o, const TokenPlace& tp,
                                                  int t) {
    return static_cast<char*>(o.out) +
           token_offset(o.out_stride_batch, o.out_stride_seq, tp, t) * Off(sizeof(OutRaw));
  }

  static __device__ void run(const FusedParams& fp, const typename Rope::Pairs* f) {
    const RopeParams& p = fp.rope;
    const unsigned flat = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned block_threads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned warp_lanes = min(32u, block_threads - (flat & ~31u));
    const unsigned mask = warp_lanes == 32 ? 0xffffffffu : (1u << warp_lanes) - 1u;
    const bool whole_warps = block_threads % 32 == 0;  // the same in every thread of the block
    // Blocks are kLanes wide (the host launches chunks() lanes): told to the compiler, a head
    // whose chunks fill its lanes then has no test of in_head, rot or two left in the kernel.
    const int lane = threadIdx.x;
    __builtin_assume(lane < kLanes);
    const bool in_head = lane < kChunks;
    const bool rot = lane < kRotChunks;
    const bool two = Cfg::kNeox && rot;  // a neox rotary chunk: lo and its partners
    // Element of the head where this lane's slice starts.
    const int col = rot ? (Cfg::kNeox ? lane * kVec : lane * kVec)
                        : Cfg::kRotaryDim + (lane - kRotChunks) * kVec;
    const int hq = p.q.heads, hk = p.k.heads, hv = fp.v.heads;
    const int total = hq + hk + hv;
    const int step = grid_rows() * kHpt;
    // A ring kernel launched with a token's heads in one pass (a decode-sized launch) loads them
    // straight into registers: through the ring they would take one more hop (the same for
    // every thread of the grid).
    const bool ringed = kRing > 0 && step < total;
    // A norm over all heads: 1 / elements of the q (k) heads, for their mean.
    const float q_per_element =
        kNorm == kNormRmsAllHeads ? __frcp_rn(float(hq * Cfg::kHeadDim)) : 0.0f;
    const float k_per_element =
        kNorm == kNormRmsAllHeads ? __frcp_rn(float((hk > 0 ? hk : 1) * Cfg::kHeadDim)) : 0.0f;

    // Dynamic shared memory, in this order (the host sizes it alike, jit/launch_config.cpp):
    // the ring, shared angles (computed frequencies), the reduction scratch of heads wider than
    // a warp, and per-head sums of squares (norm over all heads).
    extern __shared__ __align__(16) float2 fused_shared[];
    uint4* ring = reinterpret_cast<uint4*>(fused_shared);
    const unsigned mine = unsigned(__cvta_generic_to_shared(ring + flat));
    float2* angles_base =
        reinterpret_cast<float2*>(ring + (kRing > 0 ? kRing * kHpt * 2 * block_threads : 0));
    const int angle_slots = Cfg::kComputed ? int(blockDim.z) * kPairs : 0;
    float* scratch = reinterpret_cast<float*>(angles_base + angle_slots);
    const int scratch_floats = kLanes > 32 ? int(blockDim.y * blockDim.z) * kWarpsPerRow * kHpt : 0;
    float* head_sums = scratch + scratch_floats + threadIdx.z * (hq + hk);
    float2* shared = angles_base + threadIdx.z * kPairs;

    // Per-head norm weights for this lane's slice, loaded once for every token and head.
    // Unconditional loads from addresses inside the weights (lanes past the head read element
    // 0, no k heads read q's weights): a conditional load's merge would be a use of it.
    // (Read from shared memory as floats instead, ring kernels are slower, whether filled at the
    // block's start or after its first loads: bench/history/2026-11-26.md, "A cp.async ring", and
    // bench/history/2026-11-27.md, "Three more levers for dynamic FP8 on the H200".)
    RawSlice wq, wk;
    if (kNorm == kNormRms || kNorm == kNormRmsOnePlus) {
      const Raw* wq_ptr = static_cast<const Raw*>(fp.q_norm_w);
      const Raw* wk_ptr = hk > 0 ? static_cast<const Raw*>(fp.k_norm_w) : wq_ptr;
      const int lo_at = in_head ? col : 0, hi_at = in_head && two ? col + kPairs : lo_at;
      wq.lo.load_ro(wq_ptr + lo_at);
      wq.hi.load_ro(wq_ptr + hi_at);
      wk.lo.load_ro(wk_ptr + lo_at);
      wk.hi.load_ro(wk_ptr + hi_at);
    }

    // A token goes in three steps of loads, each issued whole before anything waits on it
    // (the thread issues in order and stalls at the first use of a load):
    //   1. what depends on the token alone: its position id, the cu_seqlens bounds of the
    //      sequence equal lengths would give a packed token, the cache's row for that sequence
    //      (page table, length) or the token's slot, and last its q/k/v rows;
    //   2. the guess checked (else the sequence searched and its cache row read again), the
    //      cos/sin row of the position, the paged cache's page number;
    //   3. the norm, rotation, FP8 and the stores.
    // A decode token so waits on two memory round trips, as in the plain kernel, not on each
    // link of the chain in turn.
    long long base = (long long)blockIdx.x * blockDim.z;
    do {
      const bool live = base + threadIdx.z < p.tokens;
      // The token, or for a thread past the last token the last one (its loads then stay inside
      // every array): below 2^31, checked on the host, so 32-bit from here.
      const int t = int(live ? base + threadIdx.z : p.tokens - 1);
      // Tokens outside every sequence (thd padding) are not touched by fused keys. Dense
      // layouts place tokens arithmetically; a packed token's rows depend on t alone.
      TokenPlace tp = {0, 0, false};
      if (!Cfg::kPacked && live) tp = Rope::template locate<true>(p, t);
      const bool loadable = Cfg::kPacked ? live : live && tp.valid;
      // Step 1. Every load here reads an address inside its array whatever the thread (a
      // thread past the last token reads the last token's), so none needs a branch: a branch
      // would end the run of loads the compiler may issue together.
      // Position ids are indexed by the token (packed) or its arithmetic place (dense).
      const bool early_position = !Cfg::kComputed && (!Cfg::kPacked || Cfg::kPosMode == kPosIds ||
                                                      Cfg::kPosMode == kPosMrope);
      typename Rope::Positions3 pos3 = {{0, 0, 0}};
      if (early_position) pos3 = Rope::positions(p, tp, t);
      // A packed token's sequence: the bounds of the guess, checked in step 2 (cu_seqlens has
      // batch + 1 >= 2 entries whenever it is needed).
      const bool packed_search =
          Cfg::kPacked &&
          !((Cfg::kPosMode == kPosIds || Cfg::kPosMode == kPosMrope) && !Cfg::kNeedSequence);
      long long guess = 0;
      int first = 0, end = 0;  // as loaded
      if (packed_search) {
        guess = Rope::guess_sequence(p, t);
        first = __ldg(p.cu_seqlens + guess);
        end = __ldg(p.cu_seqlens + guess + 1);
      }
      // The cache row of that sequence (dense: the token's own), or the token's slot.
      CacheFetch fetch = {0, 0, 0, 0};
      if (kCache != kCacheNone) fetch = cache_fetch(fp, tp, Cfg::kPacked ? guess : tp.b, t);
      // The heads' rows last: the loads above start chains of dependent steps (cos/sin, the
      // page number) that a decode call waits on; the rows are first needed in step 3.
      Rows q = {nullptr, 0}, k = {nullptr, 0}, v = {nullptr, 0};
      char *q_out = nullptr, *k_out = nullptr;
      if (loadable) {
        q = rows_of(p.q, tp, t);
        k = rows_of(p.k, tp, t);
        v = rows_of(fp.v, tp, t);
        if (!Cfg::kInPlace) {
          q_out = out_row(p.q, tp, t);
          k_out = out_row(p.k, tp, t);
        }
      }
      const bool one_row = q.head == k.head && k.head == v.head &&
                           q.at + (long long)hq * q.head == k.at &&
                           k.at + (long long)hk * k.head == v.at;
      RawSlice xr[kHpt];
      int kind[kHpt], idx[kHpt];  // 0 q, 1 k, 2 v; index within its kind
      bool act[kHpt];
      if (ringed) {  // the first kRing - 1 passes' copies (the loop issues the rest)
#pragma unroll
        for (int s = 0; s < kRing - 1; ++s)
          ring_issue(s * step, s, mine, block_threads, q, k, v, one_row, loadable, in_head, col,
                     two, hq, hk, total);
      } else {
        load_batch(0, q, k, v, loadable, in_head, col, two, hq, hk, total, xr, kind, idx, act);
      }

      // Step 2. A position loaded in step 1 gives its cos/sin loads first: they wait on that
      // load alone, not on the sequence check (a token that turns out to be outside every
      // sequence loads a row it does not use; angles() keeps every address inside the table).
      const bool early_angles = !Cfg::kComputed && early_position;
      float cs[kPairsPerChunk], sn[kPairsPerChunk];
      bool table_outside = false;  // poisoned in step 3
      if (early_angles && live && rot)
        Rope::angles(p, lane, pos3, shared, cs, sn, f, &table_outside);
      long long seq_tokens = p.seq_len;  // the token's sequence length in this call
      if (Cfg::kPacked && live) {
        if (packed_search && first <= t && t < end) {
          tp.b = guess;
          tp.s = t - first;
          tp.valid = true;
          seq_tokens = (long long)end - first;
        } else {
          tp = Rope::template locate<false>(p, t);
          if (packed_search && tp.valid) {
            seq_tokens = (long long)__ldg(p.cu_seqlens + tp.b + 1) - __ldg(p.cu_seqlens + tp.b);
            if (kCache == kCachePaged || kCache == kCacheContiguous)
              fetch = cache_fetch(fp, tp, tp.b, t);
          }
        }
      }
      const bool valid = live && tp.valid;
      if (Cfg::kComputed) {
        __syncthreads();  // the previous token's readers are done
        Rope::share_angles(p, valid ? tp : TokenPlace{0, 0, false}, t, shared, f);
        __syncthreads();
        if (valid && rot) Rope::angles(p, lane, 0, shared, cs, sn);
      } else if (!early_angles && valid && rot) {
        Rope::angles(p, lane, Rope::positions(p, tp, t), shared, cs, sn, f, &table_outside);
      }
      CachePending pending = {0, 0, 0, false};
      bool bad = false;
      if (kCache != kCacheNone && valid) pending = cache_place(fp, fetch, tp, seq_tokens, &bad);

      // Step 3.
      if (table_outside) {
#pragma unroll
        for (int j = 0; j < kPairsPerChunk; ++j) cs[j] = sn[j] = __int_as_float(0x7fc00000);
      }
      CacheDest dest = {0, 0, false};
      if (kCache != kCacheNone && valid) {
        dest = cache_dest(fp, pending, &bad);
        // Counted once per token: by the first thread of its first head group.
        if (bad && fp.cache.skipped && threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.y == 0)
          atomicAdd(fp.cache.skipped, 1);
      }
      // With the ring or kAhead, later passes' heads load before this one is finished: a thread
      // of a prefill kernel makes several passes, each otherwise a full memory round trip with
      // nothing in flight behind it. The ring issues pass + kRing - 1, then waits for this one.
      Batch next;
      int slot = 0;  // the ring slot of this pass; the one before it was freed by the last pass
      for (int hb = 0; hb < total; hb += step) {  // the same trip count in every thread
        if (ringed) {
          ring_issue(hb + (kRing - 1) * step, slot == 0 ? kRing - 1 : slot - 1, mine, block_threads,
                     q, k, v, one_row, loadable, in_head, col, two, hq, hk, total);
          ring_read(slot, mine, block_threads, two, xr);
          slot = slot == kRing - 1 ? 0 : slot + 1;
          batch_heads(hb, loadable, in_head, hq, hk, total, kind, idx, act);
        } else if (!kAhead) {  // (a ring kernel's single pass is loaded already)
          if (hb > 0)
            load_batch(hb, q, k, v, loadable, in_head, col, two, hq, hk, total, xr, kind, idx, act);
        } else if (hb + step < total) {
          load_batch(hb + step, q, k, v, loadable, in_head, col, two, hq, hk, total, next.x,
                     next.kind, next.idx, next.act);
        }
#pragma unroll
        for (int j = 0; j < kHpt; ++j) act[j] = act[j] && valid;

        // The norm's sums come from the loaded vectors; each head is widened to fp32 only for
        // its own scaling, rotation and stores, so one head's floats are live at a time.
        float ss[kHpt];
        float q_inv = 0.0f, k_inv = 0.0f;
        if (kNorm != kNormNone) {
#pragma unroll
          for (int j = 0; j < kHpt; ++j) {
            // Four partial sums: four short chains of dependent fmas instead of one long one
            // (one head per thread leaves the scheduler nothing else to issue meanwhile).
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (act[j] && kind[j] < 2) {
#pragma unroll
              for (int m = 0; m < kVec; ++m) {
                const float a = xr[j].lo.get(m);
                part[m % 4] = fmaf(a, a, part[m % 4]);
              }
              if (two) {
#pragma unroll
                for (int m = 0; m < kVec; ++m) {
                  const float a = xr[j].hi.get(m);
                  part[m % 4] = fmaf(a, a, part[m % 4]);
                }
              }
            }
            ss[j] = (part[0] + part[1]) + (part[2] + part[3]);
          }
          row_reduce<false>(ss, scratch, whole_warps, mask);
          if (kNorm == kNormRmsAllHeads) {
            // One pass holds every q and k head of the token (the host checks rows * heads
            // per thread >= q + k heads): per-head sums, then their total in a fixed order.
#pragma unroll
            for (int j = 0; j < kHpt; ++j) {
              const int h = hb + grid_row() + j * grid_rows();  // one group: the block's rows
              if (lane == 0 && valid && h < hq + hk) head_sums[h] = ss[j];
            }
            __syncthreads();
            float qs = 0.0f, ks = 0.0f;
            if (valid) {
              for (int h = 0; h < hq; ++h) qs += head_sums[h];
              for (int h = hq; h < hq + hk; ++h) ks += head_sums[h];
            }
            __syncthreads();
            q_inv = inv_rms(qs, q_per_element, fp.norm_eps);
            k_inv = inv_rms(ks, k_per_element, fp.norm_eps);
          }
        }

        // Each head in turn: finished (widened, normalized, rotated), with dynamic FP8 scales
        // its largest magnitude over its lanes, then stored. One head's floats are live at a time,
        // so a dynamic key's kernel also takes two heads per thread (and a pass ahead) in its
        // registers; finishing a head twice instead (once for the amax, once for the stores)
        // cost a third of a prefill's time.
#pragma unroll
        for (int j = 0; j < kHpt; ++j) {
          // A thread without this head skips it; with dynamic scales only after the head's
          // reduction, which every thread of the block joins.
          if (!act[j] && !kDynamic) continue;
          Slice x;
          float amax[1] = {0.0f};
          float left = 1.0f;  // what the stores multiply in besides their scale (kFold)
          if (act[j]) {
            widen(xr[j], two, x);
            left = finish(fp, kind[j], idx[j], col, rot, two, kNorm != kNormNone ? ss[j] : 0.0f,
                          q_inv, k_inv, wq, wk, cs, sn, x);
            if (kDynamic && scaled(kind[j])) amax[0] = slice_amax(x, two);
          }
          if (kDynamic) {
            row_reduce<true>(amax, scratch, whole_warps, mask);  // by every thread of the block
            if (!act[j]) continue;
          }
          // The head's dynamic scale: stored = value * (448 / a), dequantized by a / 448, both
          // divisions rounded to nearest whatever the compiler's flags.
          float dyn_mul = 1.0f, dyn_scale = 1.0f;
          if (kDynamic && scaled(kind[j])) {
            const float a = fmaxf(kFold ? amax[0] * left : amax[0], 0x1p-9f);
            dyn_mul = __fdiv_rn(448.0f, a);
            dyn_scale = e4m3_scale_of(a);
          }
          const int elem_off = col;
          if (kind[j] == 0 || (kind[j] == 1 && Cfg::kWriteK)) {
            const Rows& r = kind[j] == 0 ? q : k;
            const HeadOperand& o = kind[j] == 0 ? p.q : p.k;
            char* dst = Cfg::kInPlace
                            ? const_cast<char*>(r.at) + (Off(unsigned(idx[j])) * r.head +
                                                         Off(elem_off * int(sizeof(Raw))))
                            : (kind[j] == 0 ? q_out : k_out) +
                                  (Off(unsigned(idx[j])) * Off(o.out_stride_head) + Off(elem_off)) *
                                      Off(sizeof(OutRaw));
            store_slice<kOutDType>(dst, two, x, (Cfg::kOutDynamic ? dyn_mul : fp.out_scale) * left);
            if (Cfg::kOutDynamic && lane == 0)
              *scale_at(kind[j] == 0 ? fp.q_scale : fp.k_scale, tp, t, idx[j]) = dyn_scale;
          }
          if (kCache != kCacheNone && kind[j] > 0 && dest.write) {
            const bool is_k = kind[j] == 1;
            char* base_ptr = static_cast<char*>(is_k ? fp.cache.k : fp.cache.v);
            const long long off =
                dest.offset + (Off(unsigned(idx[j])) * Off(fp.cache.stride_head) + Off(elem_off));
            store_slice<kCacheDType>(base_ptr + off * int(sizeof(typename Elem<kCacheDType>::Raw)),
                                     two, x,
                                     (Cfg::kCacheDynamic ? dyn_mul
                                      : is_k             ? fp.cache.k_scale
                                                         : fp.cache.v_scale) *
                                         left);
            if (Cfg::kCacheDynamic && lane == 0)
              (is_k ? fp.cache.k_scales
                    : fp.cache.v_scales)[dest.scale_offset +
                                         Off(unsigned(idx[j])) * Off(fp.cache.scale_stride_head)] =
                  dyn_scale;
          }
        }
        if (kAhead) {
#pragma unroll
          for (int j = 0; j < kHpt; ++j) {
            xr[j] = next.x[j];
            kind[j] = next.kind[j];
            idx[j] = next.idx[j];
            act[j] = next.act[j];
          }
        }
      }
    } while (Cfg::kGridStride && (base += (long long)gridDim.x * blockDim.z) < p.tokens);
  }
};

}  // namespace ropejit_dev
