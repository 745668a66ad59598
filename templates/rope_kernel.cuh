// The RoPE kernel body. A generated entry point binds a Cfg (dtype, dims, style, position
// mode, frequency source, launch constants) and calls RopeKernel<Cfg>::run.
//
// Thread mapping, block = (kChunks, rows, tokens):
//   x: one chunk of the head vector: kVec elements (gptj) or kVec pairs (neox, two vectors
//      R/2 apart); chunks past the rotary part copy the pass-through tail (out of place).
//   y: a row of heads; each thread handles heads y, y + rows, ... kHeadsPerThread at a time,
//      loading all of them before the first store so several 16-byte loads are in flight
//      (rows >= heads: one head per thread). With gridDim.y > 1 (head groups) the heads are
//      dealt over that many blocks per token group: row y of block g starts at head
//      g * rows + y and steps by rows * gridDim.y. Decode spreads a token over several SMs so:
//      one token's 40 heads on one SM take longer to issue than five blocks of 8 heads
//      (bench/history/2026-11-23.md, "Decode: where the time goes").
//   z: tokens; a block handles one group of blockDim.z tokens, or (kGridStride) strides over
//      the groups, so a small grid can be persistent.
// cos/sin for a thread's chunk are fetched once per token (tables) or computed once per token
// per block into shared memory (computed frequencies), and reused for every q and k head the
// thread handles; its first q/k loads are issued before them so the latencies overlap.
#pragma once
#include "rope_freqs.cuh"
#include "rope_params.cuh"
#include "rope_types.cuh"

namespace ropejit_dev {

enum : int { kPosOffset = 0, kPosSeqOffsets = 1, kPosIds = 2, kPosMrope = 3 };

template <bool kIdx64>
__device__ __forceinline__ long long load_index(const void* base, long long i) {
  if (kIdx64) return __ldg(static_cast<const long long*>(base) + i);
  return __ldg(static_cast<const int*>(base) + i);
}

// Where one token lives: sequence b, index s inside it, and whether it belongs to any
// sequence (thd tokens outside cu_seqlens[0]..cu_seqlens[batch] pass through unchanged).
struct TokenPlace {
  long long b;
  long long s;
  bool valid;
};

// One token of one operand (q or k): where its head 0 lives in the input and the output,
// and the byte strides between heads.
struct TokenRows {
  const char* in;
  char* out;
  long long in_head;  // bytes between heads
  long long out_head;
};
template <class Cfg>
struct RopeKernel {
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  typedef Pack<Cfg::kDType, Cfg::kVec> Vec;

  // Enumerators, not static constexpr members, for the reason given in rope_entry.cu.in.
  enum : int {
    kPairs = Cfg::kRotaryDim / 2,
    kPairsAll = kPairs,
    kPairsPerChunk = Cfg::kNeox ? Cfg::kVec : Cfg::kVec / 2,
    kRotChunks = kPairs / kPairsPerChunk,
    kTailChunks = Cfg::kInPlace ? 0 : (Cfg::kHeadDim - Cfg::kRotaryDim) / Cfg::kVec,
    kChunks = kRotChunks + kTailChunks,
    kHpt = Cfg::kHeadsPerThread
  };

  static_assert(Cfg::kRotaryDim % 2 == 0 && Cfg::kRotaryDim <= Cfg::kHeadDim, "rotary_dim");
  static_assert(kPairsPerChunk >= 1 && kPairs % kPairsPerChunk == 0, "vector width vs R");
  static_assert((Cfg::kHeadDim - Cfg::kRotaryDim) % Cfg::kVec == 0, "vector width vs tail");

  // The sequence that equal lengths would give packed token t < tokens (exact for decode, one
  // token per sequence), in 0..batch-1; batch > 0.
  static __device__ __forceinline__ long long guess_sequence(const RopeParams& p, long long t) {
    // Decode: no division on the chain of dependent steps before the cache placement.
    if (p.batch == p.tokens) return t;
    const unsigned long long n = (unsigned long long)t * (unsigned long long)p.batch;
    const long long g = n >> 32 == 0 ? (long long)(unsigned(n) / unsigned(p.tokens))
                                     : (long long)(n / (unsigned long long)p.tokens);
    return g < p.batch - 1 ? g : p.batch - 1;
  }

  // kGuess: first try the sequence that equal lengths would give (one round of loads; exact for
  // decode, one token per sequence), then search. The fused kernel's cache placement waits on
  // this, where a binary search over 64 sequences is six dependent loads.
  template <bool kGuess = false>
  static __device__ __forceinline__ TokenPlace locate(const RopeParams& p, long long t) {
    TokenPlace tp;
    if (Cfg::kPacked) {
      tp.b = 0;
      tp.s = t;
      tp.valid = true;
      // ids give positions; the sequence is looked up only when something else needs it (a KV
      // cache addressed by sequence).
      if ((Cfg::kPosMode == kPosIds || Cfg::kPosMode == kPosMrope) && !Cfg::kNeedSequence)
        return tp;
      const int* cu = p.cu_seqlens;
      if (kGuess && p.batch > 0) {
        const long long g = guess_sequence(p, t);
        const long long first = __ldg(cu + g), end = __ldg(cu + g + 1);
        if (first <= t && t < end) {
          tp.b = g;
          tp.s = t - first;
          return tp;
        }
      }
      long long lo = 0, hi = p.batch;  // invariant: cu[lo] <= t < cu[hi]
      if (t < __ldg(cu) || t >= __ldg(cu + hi)) {
        tp.valid = false;
        return tp;
      }
      while (hi - lo > 1) {
        const long long mid = (lo + hi) >> 1;
        if (__ldg(cu + mid) <= t)
          lo = mid;
        else
          hi = mid;
      }
      tp.b = lo;
      tp.s = t - __ldg(cu + lo);
    } else if (Cfg::kSeqMajor) {
      // sbhd: walk tokens in memory order (s outer, b inner) so neighbouring blocks touch
      // neighbouring rows; b-major order is slower at batch 8 (that A/B is not in the log; this
      // order's sweep: bench/history/2026-11-22.md, "sbhd sweep").
      const unsigned s = unsigned(t) / unsigned(p.batch);
      tp.s = s;
      tp.b = t - (long long)s * p.batch;
      tp.valid = true;
    } else {
      // One sequence, or sequences of one token (decode's two shapes), need no division: one
      // branch on both, then selects (s = t - b holds for both). Branching on each in turn puts
      // two dependent parameter reads and branches before every load, a cost every decode call
      // pays (bench/history/2026-11-24.md, "decode, the parameter chain").
      tp.valid = true;
      if (p.batch == 1 || p.seq_len == 1) {
        tp.b = p.batch == 1 ? 0 : t;
        tp.s = t - tp.b;
        return tp;
      }
      // The host guarantees tokens < 2^31, so 32-bit division is exact here.
      const unsigned b = unsigned(t) / unsigned(p.seq_len);
      tp.b = b;
      tp.s = t - (long long)b * p.seq_len;
    }
    return tp;
  }

  // Index of a token's position id: ids are [batch, seq] (thd: [tokens]).
  static __device__ __forceinline__ long long id_index(const RopeParams& p, const TokenPlace& tp,
                                                       long long t) {
    return Cfg::kSeqMajor ? tp.b * p.seq_len + tp.s : t;
  }

  typedef PairTable<kPairsAll> Pairs;

  static __device__ __forceinline__ long long position(const RopeParams& p, const TokenPlace& tp,
                                                       long long t) {
    if (Cfg::kPosMode == kPosIds) return load_index<Cfg::kIdx64>(p.positions, id_index(p, tp, t));
    if (Cfg::kPosMode == kPosMrope) return position_row(p, tp, t, 0);
    const long long offset =
        Cfg::kPosMode == kPosSeqOffsets ? load_index<Cfg::kIdx64>(p.positions, tp.b) : p.pos_offset;
    return tp.s + offset;
  }

  // mRoPE: the token's position in row `row` of the [3][ids] position ids.
  static __device__ __forceinline__ long long position_row(const RopeParams& p,
                                                           const TokenPlace& tp, long long t,
                                                           int row) {
    return load_index<Cfg::kIdx64>(p.positions, row * p.tokens + id_index(p, tp, t));
  }

  // The positions every pair of a token may take: one, or (mRoPE) the three rows'.
  struct Positions3 {
    long long v[3];
  };
  static __device__ __forceinline__ Positions3 positions(const RopeParams& p, const TokenPlace& tp,
                                                         long long t) {
    Positions3 r;
    if (Cfg::kPosMode == kPosMrope) {
#pragma unroll
      for (int i = 0; i < 3; ++i) r.v[i] = position_row(p, tp, t, i);
    } else {
      r.v[0] = r.v[1] = r.v[2] = position(p, tp, t);
    }
    return r;
  }

  static __device__ __forceinline__ TokenRows rows_of(const HeadOperand& o, const TokenPlace& tp,
                                                      long long t) {
    const long long in_off =
        Cfg::kPacked ? t * o.stride_seq : tp.b * o.stride_batch + tp.s * o.stride_seq;
    const long long out_off =
        Cfg::kPacked ? t * o.out_stride_seq : tp.b * o.out_stride_batch + tp.s * o.out_stride_seq;
    TokenRows r;
    r.in = static_cast<const char*>(o.in) + in_off * (long long)sizeof(Raw);
    r.out = static_cast<char*>(o.out) + out_off * (long long)sizeof(Raw);
    r.in_head = o.stride_head * (long long)sizeof(Raw);
    r.out_head = o.out_stride_head * (long long)sizeof(Raw);
    return r;
  }

  // cos/sin of this chunk's pairs at `pos`; NaN for a table position outside the table, so
  // a bad position id poisons its token instead of reading out of bounds.
  static __device__ __forceinline__ void angles(const RopeParams& p, int chunk, long long pos,
                                                const float2* shared, float* cs, float* sn) {
    angles(p, chunk, Positions3{{pos, pos, pos}}, shared, cs, sn, nullptr);
  }

  // The same with mRoPE's per-pair positions (the pair's row of `pos3`, by f->rows).
  // `outside`: when given, a table position outside the table is reported there instead of
  // poisoning cs/sn at once (the caller poisons them later: a select right after the loads
  // would make the thread wait for them there).
  static __device__ __forceinline__ void angles(const RopeParams& p, int chunk,
                                                const Positions3& pos3, const float2* shared,
                                                float* cs, float* sn, const Pairs* f,
                                                bool* outside = nullptr) {
    const long long pos = pos3.v[0];
    if (Cfg::kComputed) {
      // Computed once per token by the whole block (share_angles); (cos, sin) pairs.
      const float2* a = shared + chunk * kPairsPerChunk;
#pragma unroll
      for (int j = 0; j < kPairsPerChunk; ++j) {
        cs[j] = a[j].x;
        sn[j] = a[j].y;
      }
    } else {
      const int first = chunk * kPairsPerChunk;
      if (Cfg::kPosMode == kPosMrope) {
        // Each pair reads the row of its own position: element by element.
        const bool strided = Cfg::kTableFull && !Cfg::kNeox;
#pragma unroll
        for (int j = 0; j < kPairsPerChunk; ++j) {
          const long long pj = pos3.v[f->rows[first + j]];
          const bool in_table = pj >= 0 && pj < p.table_rows;
          const long long at =
              (in_table ? pj : 0) * p.table_stride + (strided ? 2 * (first + j) : first + j);
          cs[j] = in_table ? table_load<Cfg::kTableDType>(p.cos, at) : __int_as_float(0x7fc00000);
          sn[j] = in_table ? table_load<Cfg::kTableDType>(p.sin, at) : __int_as_float(0x7fc00000);
        }
        if (Cfg::kBackward) {
#pragma unroll
          for (int j = 0; j < kPairsPerChunk; ++j) sn[j] = -sn[j];
        }
        return;
      }
      const bool inside = pos >= 0 && pos < p.table_rows;
      const long long row = (inside ? pos : 0) * p.table_stride;
      // Full-width tables repeat each frequency: neox as [f, f], gptj as f0 f0 f1 f1 ...
      const bool strided = Cfg::kTableFull && !Cfg::kNeox;
      typedef typename Elem<Cfg::kTableDType>::Raw TRaw;
      constexpr int kPerLoad =
          (16 / int(sizeof(TRaw))) < kPairsPerChunk ? 16 / int(sizeof(TRaw)) : kPairsPerChunk;
      // kTableVec: the host checked that cos, sin and the row stride allow these vectors.
      if (!strided && Cfg::kTableVec) {
        const TRaw* c = static_cast<const TRaw*>(p.cos) + row + first;
        const TRaw* s = static_cast<const TRaw*>(p.sin) + row + first;
#pragma unroll
        for (int j = 0; j < kPairsPerChunk; j += kPerLoad) {
          Pack<Cfg::kTableDType, kPerLoad> pc, ps;
          pc.load_ro(c + j);
          ps.load_ro(s + j);
#pragma unroll
          for (int m = 0; m < kPerLoad; ++m) {
            cs[j + m] = pc.get(m);
            sn[j + m] = ps.get(m);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kPairsPerChunk; ++j) {
          const int col = strided ? 2 * (first + j) : first + j;
          cs[j] = table_load<Cfg::kTableDType>(p.cos, row + col);
          sn[j] = table_load<Cfg::kTableDType>(p.sin, row + col);
        }
      }
      if (outside) {
        *outside = !inside;
      } else if (!inside) {
#pragma unroll
        for (int j = 0; j < kPairsPerChunk; ++j) cs[j] = sn[j] = __int_as_float(0x7fc00000);
      }
    }
    if (Cfg::kBackward) {
#pragma unroll
      for (int j = 0; j < kPairsPerChunk; ++j) sn[j] = -sn[j];
    }
  }

  static __device__ __forceinline__ void rotate(Vec& lo, Vec& hi, const float* cs,
                                                const float* sn) {
    if (Cfg::kNeox) {
      // Every element read before any is written: a read of a vector being rewritten makes
      // the compiler pack the words between the two (twice the conversions).
      float a[Cfg::kVec], b[Cfg::kVec];
#pragma unroll
      for (int j = 0; j < Cfg::kVec; ++j) {
        a[j] = lo.get(j);
        b[j] = hi.get(j);
      }
#pragma unroll
      for (int j = 0; j < Cfg::kVec; ++j) {
        lo.set(j, fmaf(a[j], cs[j], -b[j] * sn[j]));
        hi.set(j, fmaf(b[j], cs[j], a[j] * sn[j]));
      }
    } else {
      float x[Cfg::kVec];
#pragma unroll
      for (int j = 0; j < Cfg::kVec; ++j) x[j] = lo.get(j);
#pragma unroll
      for (int m = 0; m < Cfg::kVec / 2; ++m) {
        const float a = x[2 * m], b = x[2 * m + 1];
        lo.set(2 * m, fmaf(a, cs[m], -b * sn[m]));
        lo.set(2 * m + 1, fmaf(b, cs[m], a * sn[m]));
      }
    }
  }

  // The heads of one token that one thread handles, kHpt at a time: h0, h0 + rows, ...
  struct TokenHeads {
    TokenRows q, k;
    int q_heads, total_heads, rows;
    int col;           // byte offset of the thread's chunk inside a head
    bool two_vectors;  // neox rotary chunk: a second vector kPairs elements further
  };
  struct Batch {
    Vec lo[kHpt], hi[kHpt];
    const char* src[kHpt];
  };
  enum : int { kPartner = kPairs * int(sizeof(Raw)) };

  // Issues every load of the batch starting at head h0 (up to 2 * kHpt 16-byte loads).
  static __device__ __forceinline__ void load_batch(const TokenHeads& th, int h0, Batch& b) {
#pragma unroll
    for (int j = 0; j < kHpt; ++j) {
      const int h = h0 + j * th.rows;
      const bool is_k = h >= th.q_heads;
      b.src[j] = (is_k ? th.k.in : th.q.in) +
                 (is_k ? h - th.q_heads : h) * (is_k ? th.k.in_head : th.q.in_head) + th.col;
      if (h < th.total_heads) {
        b.lo[j].load(b.src[j]);
        if (th.two_vectors) b.hi[j].load(b.src[j] + kPartner);
      }
    }
  }

  static __device__ __forceinline__ void store_batch(const TokenHeads& th, int h0, Batch& b,
                                                     bool turn, const float* cs, const float* sn) {
#pragma unroll
    for (int j = 0; j < kHpt; ++j) {
      const int h = h0 + j * th.rows;
      if (h < th.total_heads) {
        // In place, the output is the input (same pointer and strides, checked on the host).
        const bool is_k = h >= th.q_heads;
        char* dst = Cfg::kInPlace
                        ? const_cast<char*>(b.src[j])
                        : (is_k ? th.k.out : th.q.out) +
                              (is_k ? h - th.q_heads : h) * (is_k ? th.k.out_head : th.q.out_head) +
                              th.col;
        if (turn) rotate(b.lo[j], b.hi[j], cs, sn);
        b.lo[j].store(dst);
        if (th.two_vectors) b.hi[j].store(dst + kPartner);
      }
    }
  }

  // One head for this thread in all (the one-head kernel's usual decode launch): its address from
  // its own operand's fields alone. The general path computes both operands' token rows first
  // and then selects per head, ~50 more PTX instructions before the first load. That measures
  // within noise: the gap to a hand-written kernel of the same mapping is the chain of
  // branches on parameters in `locate` (bench/history/2026-11-24.md, "decode, the parameter
  // chain").
  static __device__ __forceinline__ void one_head(const RopeParams& p, const TokenPlace& tp,
                                                  long long t, int h, const TokenHeads& th,
                                                  bool turn, int chunk, const Pairs* f) {
    const bool is_k = h >= th.q_heads;
    const HeadOperand& o = is_k ? p.k : p.q;
    // Token places and head indices are below 2^31 (checked on the host): 32-bit factors.
    const unsigned hh = unsigned(is_k ? h - th.q_heads : h);
    const unsigned b = unsigned(tp.b), s = unsigned(Cfg::kPacked ? t : tp.s);
    const long long in_el = (Cfg::kPacked ? 0 : (long long)b * o.stride_batch) +
                            (long long)s * o.stride_seq + (long long)hh * o.stride_head;
    const char* src = static_cast<const char*>(o.in) + in_el * (long long)sizeof(Raw) + th.col;
    Vec lo, hi;
    lo.load(src);
    if (th.two_vectors) hi.load(src + kPartner);
    if (turn) {
      float cs[kPairsPerChunk], sn[kPairsPerChunk];
      bool outside = false;
      angles(p, chunk, positions(p, tp, t), nullptr, cs, sn, f, &outside);
      rotate(lo, hi, cs, sn);
      // A position outside the table poisons the rotated elements themselves: one select per
      // element, where poisoning cos and sin took two.
      if (outside) {
        lo.poison();
        hi.poison();
      }
    }
    char* dst = const_cast<char*>(src);
    if (!Cfg::kInPlace) {
      const long long out_el = (Cfg::kPacked ? 0 : (long long)b * o.out_stride_batch) +
                               (long long)s * o.out_stride_seq + (long long)hh * o.out_stride_head;
      dst = static_cast<char*>(o.out) + out_el * (long long)sizeof(Raw) + th.col;
    }
    lo.store(dst);
    if (th.two_vectors) hi.store(dst + kPartner);
  }

  // Computed frequencies: the threads of a token's slice of the block compute its kPairs
  // (cos, sin) pairs once, into shared memory, instead of every head row computing the same
  // values again (the float64 angle reduction is what made this path compute-bound).
  // Scaled variants take each pair's turns per position (and the attention factor) from the
  // host's float64 table; mRoPE each pair's position from its row.
  static __device__ __forceinline__ void share_angles(const RopeParams& p, const TokenPlace& tp,
                                                      long long t, float2* shared,
                                                      const Pairs* f = nullptr) {
    if (!tp.valid) return;
    const Positions3 pos3 = positions(p, tp, t);
    const int slice = blockDim.x * blockDim.y;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < kPairs; i += slice) {
      const long long pos = Cfg::kPosMode == kPosMrope ? pos3.v[f->rows[i]] : pos3.v[0];
      const double turns =
          Cfg::kPairTable ? f->turns[i] : turns_per_position<Cfg::kRotaryDim>(i, p.log2_base);
      float sn, cs;
      sincos_turns(double(pos) * turns, &sn, &cs);
      if (Cfg::kPairTable) {
        cs *= f->attention;
        sn *= f->attention;
      }
      shared[i] = make_float2(cs, sn);
    }
  }

  static __device__ void run(const RopeParams& p, const Pairs* f) {
    const int chunk = threadIdx.x;
    const bool rot_chunk = chunk < kRotChunks;
    TokenHeads th;
    th.q_heads = p.q.heads;
    th.total_heads = p.q.heads + p.k.heads;
    th.rows = blockDim.y * gridDim.y;
    th.two_vectors = Cfg::kNeox && rot_chunk;
    // Tail chunks (out of place, partial rotary) start after the rotary part.
    th.col = int(sizeof(Raw)) *
             (rot_chunk ? chunk * Cfg::kVec : Cfg::kRotaryDim + (chunk - kRotChunks) * Cfg::kVec);
    const int step = th.rows * kHpt;
    extern __shared__ float2 shared_angles[];  // [blockDim.z][kPairs], computed frequencies only
    float2* shared = shared_angles + threadIdx.z * kPairs;

    // The grid never has more blocks than token groups, so the first group exists. The loop
    // bound is the same for the whole block (the shared angles need __syncthreads); without
    // kGridStride the loop runs once and compiles to straight-line code (`continue` exits).
    long long base = (long long)blockIdx.x * blockDim.z;
    do {
      const long long t = base + threadIdx.z;
      const bool live = t < p.tokens;
      // Located whether live or not (its loads stay inside cu_seqlens either way), so the
      // token bound is not one more branch ahead of the first load.
      TokenPlace tp = locate(p, t);
      tp.valid = tp.valid && live;
      // In place, a pass-through chunk or a token outside every sequence has nothing to change.
      int h0 = blockIdx.y * blockDim.y + threadIdx.y;
      const bool work = live && (!Cfg::kInPlace || (tp.valid && rot_chunk)) && h0 < th.total_heads;
      const bool turn = tp.valid && rot_chunk;
      if (kHpt == 1 && !Cfg::kComputed && work && h0 + step >= th.total_heads) {
        one_head(p, tp, t, h0, th, turn, chunk, f);
        continue;
      }
      if (work) {
        th.q = rows_of(p.q, tp, t);
        th.k = rows_of(p.k, tp, t);
      }
      // The first batch's q/k loads go out before cos/sin are ready, so the latencies overlap:
      // the table's position id -> row chain of two dependent loads, or the shared angles'
      // computation and barriers (measured: bench/history/2026-11-22.md, "What changed in the
      // previous session, and what it measured").
      float cs[kPairsPerChunk], sn[kPairsPerChunk];
      if constexpr (Cfg::kComputed) {
        Batch b;
        if (work) load_batch(th, h0, b);
        __syncthreads();  // the previous token's readers are done
        share_angles(p, tp, t, shared, f);
        __syncthreads();
        if (!work) continue;
        if (turn) angles(p, chunk, 0, shared, cs, sn);
        for (;;) {
          store_batch(th, h0, b, turn, cs, sn);
          h0 += step;
          if (h0 >= th.total_heads) break;
          load_batch(th, h0, b);
        }
      } else {
        // One copy of the loop body, not a peeled first batch as above: less to compile, and
        // faster for gptj tables on the H100 (bench/history/2026-11-22.md, "What changed in the
        // previous session, and what it measured").
        if (!work) continue;
        bool first = true;
        do {
          Batch b;
          load_batch(th, h0, b);
          if (first && turn) angles(p, chunk, positions(p, tp, t), shared, cs, sn, f);
          first = false;
          store_batch(th, h0, b, turn, cs, sn);
          h0 += step;
        } while (h0 < th.total_heads);
      }
    } while (Cfg::kGridStride && (base += (long long)gridDim.x * blockDim.z) < p.tokens);
  }
};

}  // namespace ropejit_dev
