// The float64 reference of a workload: every output element's exact value with the tolerance
// the kernel's fp32 arithmetic and one final rounding allow, and every byte the call must not
// touch. Plain keys rotate; fused keys run norm -> RoPE -> FP8 -> cache placement per token.
#include <cmath>
#include <cstring>
#include <vector>

#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "jit/scaling.hpp"
#include "oracle/numbers.hpp"
#include "oracle/workload.hpp"

namespace ropejit::oracle {

using detail::element_bytes;

namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of fp32

// One token of the call: sequence, index in it, position, and whether any sequence owns it.
struct TokenInfo {
  int64_t b = 0, s = 0, pos = 0;
  bool valid = true;
};

int64_t index_at(IndexType t, const void* base, int64_t i) {
  if (t == IndexType::i64) return static_cast<const int64_t*>(base)[i];
  return static_cast<const int32_t*>(base)[i];
}

TokenInfo token_info(const Spec& c, const Args& a, int64_t t) {
  TokenInfo k;
  k.s = t;
  if (c.layout != Layout::thd) {
    k.b = t / a.seq_len;
    k.s = t % a.seq_len;
  } else if ((c.positions != Positions::ids && c.positions != Positions::mrope) ||
             c.cache == KvCache::paged || c.cache == KvCache::contiguous) {
    // As the kernel: with ids, thd tokens are placed in sequences only when a cache addressed
    // by sequence needs it; otherwise every token counts (its id is its position).
    k.valid = t >= a.cu_seqlens[0] && t < a.cu_seqlens[a.batch];
    while (k.valid && a.cu_seqlens[k.b + 1] <= t) ++k.b;
    k.s = t - a.cu_seqlens[k.b];
  }
  k.pos = c.positions == Positions::ids           ? index_at(c.index_type, a.position_ids, t)
          : c.positions == Positions::seq_offsets ? k.s + index_at(c.index_type, a.seq_offsets, k.b)
                                                  : k.s + a.position_offset;
  return k;
}

// Per-pair frequency data: inverse frequencies (computed families, as jit/scaling.hpp defines
// each variant), the attention factor, and mRoPE's position row of each pair.
struct Frequencies {
  std::vector<double> inv;
  double attention = 1.0;
  std::vector<int8_t> rows;
};

Frequencies frequencies(const Spec& c, const Args& a) {
  Frequencies f;
  const int32_t half = c.rotary_dim / 2;
  if (c.freqs != Freqs::table)
    f.inv = detail::inverse_frequencies(c.freqs, c.rotary_dim, a.base, a.scaling, "args.scaling");
  if (c.freqs != Freqs::table && c.freqs != Freqs::computed)
    f.attention = detail::attention_factor(c.freqs, c.rotary_dim, a.scaling, "args.scaling");
  f.rows.assign(size_t(half), 0);
  if (c.positions == Positions::mrope)
    f.rows = detail::mrope_pair_rows(c.rotary_dim, a.mrope_section, a.mrope_interleaved);
  return f;
}

// cos and sin of pair i at position `pos`, as the kernel reads or computes them.
void angle(const Spec& c, const Args& a, const Frequencies& f, int64_t pos, int64_t i, double* cs,
           double* sn) {
  if (c.freqs != Freqs::table) {
    const double angle = double(pos) * f.inv[size_t(i)];
    *cs = std::cos(angle) * f.attention;
    *sn = std::sin(angle) * f.attention;
  } else if (pos < 0 || pos >= a.table_rows) {
    *cs = *sn = NAN;
  } else {
    const int64_t col = (c.table_width == TableWidth::full && c.style == Style::gptj) ? 2 * i : i;
    const int64_t te = element_bytes(c.table_dtype);
    *cs = load_value(c.table_dtype,
                     static_cast<const uint8_t*>(a.cos) + (pos * a.table_stride + col) * te);
    *sn = load_value(c.table_dtype,
                     static_cast<const uint8_t*>(a.sin) + (pos * a.table_stride + col) * te);
  }
  if (c.direction == Direction::backward) *sn = -*sn;
}

// The kernel's cache placement of a token (templates/rope_fused.cuh, cache_dest): the element
// offset of its head-0 row, whether it is written, and whether it counts as skipped.
struct Placement {
  int64_t offset = 0;
  int64_t scale_offset = 0;  // dynamic FP8 cache: of head 0's scale
  bool write = false;
  bool bad = false;
};

Placement place(const Spec& c, const Args& a, int64_t t, const TokenInfo& tk) {
  const KvCacheArgs& k = a.cache;
  Placement p;
  int64_t page = 0, slot = 0;
  if (c.cache == KvCache::slots) {
    const int64_t s = k.slot_mapping[t];
    if (s < 0) return p;
    page = s / k.page_size;
    slot = s % k.page_size;
    if (page >= k.pages) {
      p.bad = true;
      return p;
    }
  } else if (c.cache == KvCache::paged) {
    const int64_t start = k.indptr[tk.b], end = k.indptr[tk.b + 1], last = k.last_page_len[tk.b];
    const int64_t append =
        c.layout == Layout::thd ? int64_t(a.cu_seqlens[tk.b + 1]) - a.cu_seqlens[tk.b] : a.seq_len;
    const int64_t held = (end - start - 1) * k.page_size + last;
    const int64_t pos = held - append + tk.s;
    if (start < 0 || end <= start || end > k.num_indices || last < 1 || last > k.page_size ||
        pos < 0 || pos >= held) {
      p.bad = true;
      return p;
    }
    page = k.indices[start + pos / k.page_size];
    slot = pos % k.page_size;
    if (page < 0 || page >= k.pages) {
      p.bad = true;
      return p;
    }
  } else {
    const int64_t held = k.seq_lens[tk.b];
    slot = held + tk.s;
    page = tk.b;
    if (held < 0 || slot >= k.page_size || page >= k.pages) {
      p.bad = true;
      return p;
    }
  }
  p.offset = page * k.stride_page + slot * k.stride_slot;
  p.scale_offset = page * k.scale_stride_page + slot * k.scale_stride_slot;
  p.write = true;
  return p;
}

}  // namespace

// The reference's steps and what they share: the call, the output element a host pointer names,
// and the expected value and tolerance written there.
struct Workload::Reference {
  Workload& w;
  const Spec& c;
  const Args& a;
  const bool dense;
  const int64_t e, half, D;
  const Frequencies freqs;
  int32_t skipped = 0;
  int exponent = 0;  // frexp's scratch

  explicit Reference(Workload& workload)
      : w(workload),
        c(workload.spec_),
        a(workload.host_args_),
        dense(c.layout != Layout::thd),
        e(element_bytes(c.dtype)),
        half(c.rotary_dim / 2),
        D(c.head_dim),
        freqs(frequencies(c, a)) {}

  static int64_t kind_size(int kind) {
    return kind == kE4m3 ? 1 : kind == kI32 ? 4 : element_bytes(DType(kind));
  }

  // Output slot and element index of a host pointer.
  int64_t locate(const void* ptr, int* slot) const {
    const uint8_t* p = static_cast<const uint8_t*>(ptr);
    for (size_t i = 0; i < w.outputs_.size(); ++i) {
      const std::vector<uint8_t>& h = w.buffers_[size_t(w.outputs_[i].buffer)].host;
      if (p >= h.data() && p < h.data() + h.size()) {
        *slot = int(i);
        return (p - h.data()) / kind_size(w.outputs_[i].kind);
      }
    }
    detail::fail(ErrorCode::internal, "workload reference: pointer outside the outputs");
  }

  // Expects `value` (error `err` before the final rounding) at the element `ptr` points to,
  // stored in its output's kind; e4m3 stores value * scale.
  void expect(const void* ptr, double value, double err, float scale) {
    int slot = 0;
    const int64_t i = locate(ptr, &slot);
    if (w.outputs_[size_t(slot)].kind == kE4m3) {
      // value * scale in fp32 is exact for a power-of-two scale: then an exact input (a
      // pass-through element) must give exactly the reference's bits.
      const double v = value * double(scale);
      const bool exact_scale = std::frexp(double(scale), &exponent) == 0.5;
      w.expect_[size_t(slot)][size_t(i)] = v;
      w.tol_[size_t(slot)][size_t(i)] =
          err * double(scale) + (exact_scale ? 0.0 : std::fabs(v) * 2 * kU);
    } else {
      const DType t = DType(w.outputs_[size_t(slot)].kind);
      w.expect_[size_t(slot)][size_t(i)] = value;
      w.tol_[size_t(slot)][size_t(i)] = err + half_ulp(t, std::fabs(value) + err);
    }
  }

  int64_t row(const Tensor& x, const TokenInfo& tk, int64_t t, int64_t h) const {
    return (dense ? tk.b * x.stride_batch + tk.s * x.stride_seq : t * x.stride_seq) +
           h * x.stride_head;
  }

  // Plain: rotate the rotary part; out of place, the tail (and tokens outside every sequence)
  // are the input's bytes, copied exactly.
  void plain_token(int64_t t, const TokenInfo& tk, const std::vector<double>& cs,
                   const std::vector<double>& sn, double freq_err) {
    for (int op = 0; op < 2; ++op) {
      const Tensor& in = op == 0 ? a.q : a.k;
      const Tensor& out = c.in_place ? in : (op == 0 ? a.q_out : a.k_out);
      if (!in.data) continue;
      for (int64_t h = 0; h < in.heads; ++h) {
        const uint8_t* src = static_cast<const uint8_t*>(in.data) + row(in, tk, t, h) * e;
        uint8_t* dst = static_cast<uint8_t*>(out.data) + row(out, tk, t, h) * e;
        if (!c.in_place) {
          int slot = 0;
          const int64_t at = locate(dst, &slot);
          std::memcpy(&w.buffers_[size_t(w.outputs_[size_t(slot)].buffer)].host[size_t(at * e)],
                      src, size_t(D * e));
        }
        if (!tk.valid) continue;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = c.style == Style::neox ? i : 2 * i;
          const int64_t ib = c.style == Style::neox ? i + half : 2 * i + 1;
          const double x = load_value(c.dtype, src + ia * e), y = load_value(c.dtype, src + ib * e);
          const double c0 = cs[size_t(i)], s0 = sn[size_t(i)];
          // fp32 arithmetic (product + fma, generously 1 ulp each), the 2.5e-7 bound on
          // computed cos/sin, then one rounding to the output dtype.
          const double fx = freq_err * (std::fabs(x) + std::fabs(y));
          expect(dst + ia * e, x * c0 - y * s0,
                 2 * kU * (std::fabs(x * c0) + std::fabs(y * s0)) + fx, 1.0f);
          expect(dst + ib * e, y * c0 + x * s0,
                 2 * kU * (std::fabs(y * c0) + std::fabs(x * s0)) + fx, 1.0f);
        }
      }
    }
  }

  // One head's input elements.
  std::vector<double> read(const Tensor& x, const TokenInfo& tk, int64_t t, int64_t h) const {
    std::vector<double> v(static_cast<size_t>(D));
    const uint8_t* src = static_cast<const uint8_t*>(x.data) + row(x, tk, t, h) * e;
    for (int64_t d = 0; d < D; ++d) v[size_t(d)] = load_value(c.dtype, src + d * e);
    return v;
  }

  static double sumsq(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return s;
  }

  // QK-norm of head `idx` of q (kind 0) or k (1) in place, with each element's error.
  void normalize(int kind, int64_t idx, int64_t heads, double all_sum, std::vector<double>& y,
                 std::vector<double>& err) const {
    const bool all = c.norm == Norm::rms_all_heads;
    const int64_t n = all ? heads * D : D;
    const double mean = (all ? all_sum : sumsq(y)) / double(n);
    const double inv = 1.0 / std::sqrt(mean + a.norm_eps);
    // fp32: the sum of n squares (n - 1 roundings at most, in any order), the mean and eps
    // in one fma by a rounded 1 / n (two roundings), the hardware's reciprocal square root
    // (2 ulp: four), then x * inv * w (two); eps and 1 + w rounded to fp32 (one each).
    // Where every q and k store is FP8, the kernel multiplies x * w and leaves inv to the
    // store's multiplier, scale * inv rounded once more (one more, as an exact
    // power-of-two scale no longer keeps the store's product exact).
    const bool folded =
        c.out_store != Store::same && (c.cache == KvCache::none || c.cache_store != Store::same);
    const double rel = (0.5 * double(n + 3) + (folded ? 9 : 8)) * kU;
    const void* wp = kind == 0 ? a.q_norm_weight : a.k_norm_weight;
    for (int64_t d = 0; d < D; ++d) {
      const int64_t wi = (all ? idx * D : 0) + d;
      double wt = load_value(c.dtype, static_cast<const uint8_t*>(wp) + wi * e);
      if (c.norm == Norm::rms_one_plus) wt += 1.0;
      y[size_t(d)] *= inv * wt;
      err[size_t(d)] = rel * std::fabs(y[size_t(d)]);
    }
  }

  // RoPE of a q or k head in place, with each element's error.
  void rotate(const std::vector<double>& cs, const std::vector<double>& sn, double freq_err,
              std::vector<double>& y, std::vector<double>& err) const {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ia = c.style == Style::neox ? i : 2 * i;
      const int64_t ib = c.style == Style::neox ? i + half : 2 * i + 1;
      const double x0 = y[size_t(ia)], y0 = y[size_t(ib)];
      const double c0 = cs[size_t(i)], s0 = sn[size_t(i)];
      const double fx = freq_err * (std::fabs(x0) + std::fabs(y0));
      const double ex = err[size_t(ia)], ey = err[size_t(ib)];
      // A norm's error in either input reaches both outputs through cos and sin (<= 1).
      y[size_t(ia)] = x0 * c0 - y0 * s0;
      y[size_t(ib)] = y0 * c0 + x0 * s0;
      err[size_t(ia)] = 2 * kU * (std::fabs(x0 * c0) + std::fabs(y0 * s0)) + fx + ex + ey;
      err[size_t(ib)] = 2 * kU * (std::fabs(y0 * c0) + std::fabs(x0 * s0)) + fx + ex + ey;
    }
  }

  // A head's values at `at` elements from `base`, in the store's kind.
  void put(void* base, int64_t at, int64_t elem, float scale, const std::vector<double>& y,
           const std::vector<double>& err) {
    for (int64_t d = 0; d < D; ++d)
      expect(static_cast<uint8_t*>(base) + (at + d) * elem, y[size_t(d)], err[size_t(d)], scale);
  }

  // Dynamic FP8: the kernel's amax is that of its fp32 values, each within err[d] of y[d], so
  // within the largest err of the float64 amax; its 448 / a and a / 448 add a rounding each.
  // Each element is expected at y * 448 / a (tolerance: its own error scaled, plus the
  // multiplier's relative error), and the scale at a / 448.
  void put_dynamic(void* base, int64_t at, void* scale_at, const std::vector<double>& y,
                   const std::vector<double>& err) {
    double amax = 0, amax_err = 0;
    for (int64_t d = 0; d < D; ++d) {
      amax = std::max(amax, std::fabs(y[size_t(d)]));
      amax_err = std::max(amax_err, err[size_t(d)]);
    }
    const double a_eff = std::max(amax, 0x1p-9);
    const double mul = kE4m3Max / a_eff, mul_rel = amax_err / a_eff + kU;
    for (int64_t d = 0; d < D; ++d) {
      int slot = 0;
      const int64_t i = locate(static_cast<uint8_t*>(base) + at + d, &slot);
      const double v = y[size_t(d)] * mul;
      w.expect_[size_t(slot)][size_t(i)] = v;
      w.tol_[size_t(slot)][size_t(i)] = err[size_t(d)] * mul + std::fabs(v) * (mul_rel + 2 * kU);
    }
    expect(scale_at, a_eff / kE4m3Max, amax_err / kE4m3Max, 1.0f);
  }

  // Where a finished head goes: q (and k, unless it goes only to the cache) to its output, k
  // and v to the cache.
  void store_head(int kind, int64_t idx, int64_t t, const TokenInfo& tk, const Placement& cache,
                  const std::vector<double>& y, const std::vector<double>& err) {
    const Tensor& in = kind == 0 ? a.q : kind == 1 ? a.k : a.v;
    const int64_t out_elem = is_fp8(c.out_store) ? 1 : e;
    if (kind == 0 || (kind == 1 && c.fusion == Fusion::qk)) {
      if (c.in_place) {
        put(in.data, row(in, tk, t, idx), e, 1.0f, y, err);
      } else {
        const Tensor& out = kind == 0 ? a.q_out : a.k_out;
        if (c.out_store == Store::e4m3_dynamic) {
          const Tensor& s = kind == 0 ? a.q_out_scale : a.k_out_scale;
          put_dynamic(out.data, row(out, tk, t, idx),
                      static_cast<float*>(s.data) + row(s, tk, t, idx), y, err);
        } else {
          put(out.data, row(out, tk, t, idx), out_elem, a.out_quant_scale, y, err);
        }
      }
    }
    if (kind > 0 && cache.write) {
      void* base = kind == 1 ? a.cache.k : a.cache.v;
      const int64_t at = cache.offset + idx * a.cache.stride_head;
      if (c.cache_store == Store::e4m3_dynamic) {
        float* scales = kind == 1 ? a.cache.k_scales : a.cache.v_scales;
        put_dynamic(base, at, scales + cache.scale_offset + idx * a.cache.scale_stride_head, y,
                    err);
      } else {
        const int64_t ce = is_fp8(c.cache_store) ? 1 : e;
        const float scale = kind == 1 ? a.cache.k_quant_scale : a.cache.v_quant_scale;
        put(base, at, ce, c.cache_store == Store::e4m3 ? scale : 1.0f, y, err);
      }
    }
  }

  // Fused: norm -> RoPE -> stores of every head of one token; tokens outside every sequence are
  // not touched.
  void fused_token(int64_t t, const TokenInfo& tk, const std::vector<double>& cs,
                   const std::vector<double>& sn, double freq_err) {
    if (!tk.valid) return;
    const Placement cache = c.cache != KvCache::none ? place(c, a, t, tk) : Placement{};
    if (cache.bad) ++skipped;
    const int64_t hq = a.q.heads, hk = a.k.data ? a.k.heads : 0, hv = a.v.data ? hk : 0;
    double all_sum[2] = {0, 0};
    if (c.norm == Norm::rms_all_heads) {
      for (int64_t h = 0; h < hq; ++h) all_sum[0] += sumsq(read(a.q, tk, t, h));
      for (int64_t h = 0; h < hk; ++h) all_sum[1] += sumsq(read(a.k, tk, t, h));
    }
    for (int64_t h = 0; h < hq + hk + hv; ++h) {
      const int kind = h < hq ? 0 : h < hq + hk ? 1 : 2;
      const int64_t idx = h - (kind == 0 ? 0 : kind == 1 ? hq : hq + hk);
      std::vector<double> y = read(kind == 0 ? a.q : kind == 1 ? a.k : a.v, tk, t, idx);
      std::vector<double> err(static_cast<size_t>(D), 0.0);
      if (kind < 2 && c.norm != Norm::none)
        normalize(kind, idx, kind == 0 ? hq : hk, all_sum[kind], y, err);
      if (kind < 2) rotate(cs, sn, freq_err, y, err);
      store_head(kind, idx, t, tk, cache, y, err);
    }
  }
};

void Workload::build_reference() {
  expect_.clear();
  tol_.clear();
  for (const Output& o : outputs_) {
    const size_t n = buffers_[size_t(o.buffer)].host.size() / size_t(Reference::kind_size(o.kind));
    expect_.emplace_back(n, 0.0);
    tol_.emplace_back(n, -1.0);
  }
  Reference r(*this);
  const Spec& c = r.c;
  const Args& a = r.a;
  for (int64_t t = 0; t < tokens_; ++t) {
    const TokenInfo tk = token_info(c, a, t);
    std::vector<double> cs(static_cast<size_t>(r.half)), sn(static_cast<size_t>(r.half));
    for (int64_t i = 0; i < r.half; ++i) {
      // mRoPE: the pair's row of the [3][tokens] ids (ids are indexed like position ids).
      const int64_t pos =
          c.positions == Positions::mrope
              ? index_at(c.index_type, a.position_ids, r.freqs.rows[size_t(i)] * tokens_ + t)
              : tk.pos;
      angle(c, a, r.freqs, pos, i, &cs[size_t(i)], &sn[size_t(i)]);
    }
    // Computed cos/sin are within 2.5e-7 of float64, then (scaled variants) multiplied by the
    // attention factor in fp32.
    const double freq_err = c.freqs == Freqs::table ? 0.0 : (2.5e-7 + 2 * kU) * r.freqs.attention;
    if (c.fused())
      r.fused_token(t, tk, cs, sn, freq_err);
    else
      r.plain_token(t, tk, cs, sn, freq_err);
  }
  if (c.cache != KvCache::none) {
    int slot = 0;
    const int64_t at = r.locate(a.cache.skipped, &slot);
    expect_[size_t(slot)][size_t(at)] = r.skipped;
    tol_[size_t(slot)][size_t(at)] = 0;
  }
}

}  // namespace ropejit::oracle
