// The QKV projection's problem and its float64 reference.
//
// The tolerance follows the kernel's arithmetic (templates/proj_kernel.cuh):
//   - the normalized activation a_k = round(x_k · w_k) is reproduced exactly: the kernel rounds
//     the exact product once (a packed multiply in the operand dtype), as the reference does
//     from the exact float64 product; Gemma's form round(fp32(x_k · fp32(1 + w_k))) likewise;
//   - the dot product of a row: tensor cores with fp32 accumulation, K/16 chained steps, each
//     allowed two fp32 ulps of the sum of magnitudes, plus the split-K partial sums:
//     (K/16 + 16) · 2^-22 · Σ|a_k W_nk|;
//   - rstd: Σx² in fp32 (at most K/4 + 24 chained additions), a division and a square root:
//     ((K/4 + 24) / 2 + 4) · 2^-24 relative;
//   - RoPE in fp32 on the sums: the propagated errors times |cos| and |sin|, two roundings of the
//     products, and the computed angle's error (cos/sin within 2.5e-7 of float64 up to 2^20;
//     4e-7 allowed); table values are exact inputs;
//   - one rounding to the output dtype.
// With e4m3 weights the products use the decoded codes (exact in the operand dtype) and the
// column's scale multiplies the fp32 sum: one more fp32 rounding of y.
#include "oracle/decode/proj_workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "jit/decode/proj.hpp"
#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "oracle/host_threads.hpp"
#include "oracle/numbers.hpp"

namespace ropejit::oracle {
namespace {

constexpr uint8_t kPoison = 0xff;  // NaN in f16 and bf16
constexpr size_t kGuardBytes = 256;

double unit_roundoff(DType t) {
  return t == DType::bf16  ? std::ldexp(1.0, -8)
         : t == DType::f16 ? std::ldexp(1.0, -11)
                           : std::ldexp(1.0, -24);
}

// The smallest magnitude one rounding to `t` may lose in absolute terms (subnormal spacing).
double abs_floor(DType t) { return t == DType::f16 ? std::ldexp(1.0, -25) : 1e-38; }

}  // namespace

ProjProblem::Buffer& ProjProblem::add(std::vector<uint8_t> host) {
  return buffers_.add(std::move(host), kGuardBytes, kPoison);
}

namespace {

std::vector<uint8_t> bytes_of(const std::vector<int32_t>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

ProjProblem::ProjProblem(const QkvProjSpec& spec, const ProjSizes& sizes)
    : spec_(spec.canonical()), sizes_(sizes), rng_(sizes.seed) {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  columns_ = int64_t(z.q_heads + 2 * z.kv_heads) * c.head_dim;
  x_stride_ = z.hidden + z.x_gap;
  w_stride_ = z.hidden + z.weight_gap;
  add_inputs();
  add_positions();
  add_outputs();
  if (c.cache != KvCache::none) add_cache();
  if (!z.reference) return;
  if (z.path != ProjPath::unfused && !unfused_only_) build_reference();
  if (z.path != ProjPath::fused) build_unfused_reference();
}

// Activations, weights (and e4m3 scales) and the norm weight.
void ProjProblem::add_inputs() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t e = detail::element_bytes(c.dtype);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);

  auto fill = [&](int64_t count, auto value) {
    std::vector<uint8_t> bytes(size_t(count * e), kPoison);
    for (int64_t i = 0; i < count; ++i) store_value(c.dtype, bytes.data() + i * e, value(i));
    return bytes;
  };
  // Activations (gaps stay poisoned: the kernel must not read them into a result).
  {
    std::vector<uint8_t> bytes(size_t(std::max<int64_t>(z.tokens, 1) * x_stride_ * e), kPoison);
    for (int64_t m = 0; m < z.tokens; ++m)
      for (int64_t k = 0; k < z.hidden; ++k)
        store_value(c.dtype, bytes.data() + (m * x_stride_ + k) * e, 2.0 * z.x_scale * unit(rng_));
    x_ = &add(std::move(bytes));
  }
  // Weights: uniform with the variance of a trained projection (1/K), rows w_stride_ apart.
  // e4m3: every finite code equally likely (all exponents and the subnormals), and a scale per
  // row that brings the row to about that variance.
  if (c.weights == Weights::e4m3) {
    std::uniform_int_distribution<int> code(0, 253);  // 254 finite codes: skip 0x7f and 0xff
    std::vector<uint8_t> bytes(size_t(columns_ * w_stride_), kPoison);
    for (int64_t n = 0; n < columns_; ++n)
      for (int64_t k = 0; k < z.hidden; ++k) {
        const int v = code(rng_);
        bytes[size_t(n * w_stride_ + k)] = uint8_t(v < 127 ? v : v + 1);
      }
    w_ = &add(std::move(bytes));
    std::vector<uint8_t> scales(size_t(columns_) * 4);
    const double base = std::sqrt(1.0 / double(z.hidden)) / 100.0;  // codes' rms is ~100
    for (int64_t n = 0; n < columns_; ++n) {
      const float v = float(base * (1.0 + 0.5 * unit(rng_)));
      std::memcpy(scales.data() + n * 4, &v, 4);
    }
    scale_ = &add(std::move(scales));
  } else {
    const double scale = std::sqrt(3.0 / double(z.hidden));
    std::vector<uint8_t> bytes(size_t(columns_ * w_stride_ * e), kPoison);
    for (int64_t n = 0; n < columns_; ++n)
      for (int64_t k = 0; k < z.hidden; ++k)
        store_value(c.dtype, bytes.data() + (n * w_stride_ + k) * e, scale * unit(rng_));
    w_ = &add(std::move(bytes));
  }
  if (c.norm != Norm::none) {
    const bool one_plus = c.norm == Norm::rms_one_plus;
    norm_ = &add(fill(
        z.hidden, [&](int64_t) { return one_plus ? 0.5 * unit(rng_) : 1.0 + 0.5 * unit(rng_); }));
  }
  if (z.bias) bias_ = &add(fill(columns_, [&](int64_t) { return 0.5 * unit(rng_); }));
}

// Position ids (or the offset's positions) and the cos/sin tables.
void ProjProblem::add_positions() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  table_rows_ = z.max_position + 1;
  positions_.resize(size_t(z.tokens));
  if (c.positions == Positions::ids) {
    std::uniform_int_distribution<int64_t> pos(0, z.max_position);
    for (int64_t& p : positions_) p = pos(rng_);
    for (int32_t i = 0; i < z.bad_positions && i < z.tokens; ++i)
      positions_[size_t(i * 7 % z.tokens)] = i % 2 ? -1 - i : table_rows_ + i;
    const int64_t ib = c.index_type == IndexType::i64 ? 8 : 4;
    std::vector<uint8_t> bytes(size_t(std::max<int64_t>(z.tokens, 1) * ib), 0);
    for (int64_t m = 0; m < z.tokens; ++m) {
      if (ib == 8) {
        std::memcpy(bytes.data() + m * 8, &positions_[size_t(m)], 8);
      } else {
        const int32_t v = int32_t(positions_[size_t(m)]);
        std::memcpy(bytes.data() + m * 4, &v, 4);
      }
    }
    ids_ = &add(std::move(bytes));
  } else {
    for (int64_t m = 0; m < z.tokens; ++m) positions_[size_t(m)] = z.position_offset + m;
    table_rows_ = std::max(table_rows_, z.position_offset + z.tokens);
  }
  if (c.freqs == Freqs::table) {
    Spec rope;  // the plain key whose table this is: same rotary part, style, table format
    rope.head_dim = c.head_dim;
    rope.rotary_dim = c.rotary_dim;
    rope.style = c.style;
    rope.table_dtype = c.table_dtype;
    rope.table_width = c.table_width;
    TableSpec t;
    t.freqs = Freqs::computed;
    t.base = z.base;
    t.rows = table_rows_;
    table_width_ = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
    const size_t bytes = size_t(table_rows_ * table_width_ * detail::element_bytes(c.table_dtype));
    std::vector<uint8_t> cs(bytes), sn(bytes);
    build_tables(rope, t, cs.data(), sn.data());
    cos_ = &add(std::move(cs));
    sin_ = &add(std::move(sn));
  }
}

// The outputs, poisoned, and the unfused path's workspace.
void ProjProblem::add_outputs() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t D = c.head_dim;
  const int64_t e = detail::element_bytes(c.dtype);
  const int64_t head_stride = D + z.out_head_gap;
  if (z.packed_out) {
    outs_.push_back(&add(std::vector<uint8_t>(
        size_t(std::max<int64_t>(z.tokens, 1) * (z.q_heads + 2 * z.kv_heads) * head_stride * e),
        kPoison)));
  } else {
    for (const int32_t h : {z.q_heads, z.kv_heads, z.kv_heads})
      outs_.push_back(&add(std::vector<uint8_t>(
          size_t(std::max<int64_t>(z.tokens, 1) * h * head_stride * e), kPoison)));
  }
  unfused_only_ = !detail::proj_fused_problem(c).empty();
  if (z.path == ProjPath::fused && unfused_only_)
    detail::invalid("ProjProblem: ", c.key(), " has the unfused path only (sizes.path is fused)");
  if (z.path != ProjPath::fused) {
    workspace_bytes_ = detail::proj_workspace_bytes(c, z.tokens, z.hidden, z.q_heads, z.kv_heads);
    workspace_ = &add(std::vector<uint8_t>(workspace_bytes_, kPoison));
  }
}

int64_t ProjProblem::sequence_tokens(int64_t b) const {
  return cu_seqlens_[size_t(b) + 1] - cu_seqlens_[size_t(b)];
}

// spec.cache: the sequences, the cache's pages (poisoned), and each token's place in them.
void ProjProblem::add_cache() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t D = c.head_dim;
  const int64_t e = detail::element_bytes(c.dtype);
  const int64_t ps = z.cache_page_size;
  const int64_t T = z.tokens;
  const bool chunks = z.cache_sequences > 0;
  if (chunks && c.cache == KvCache::slots)
    detail::invalid("ProjProblem: cache_sequences is for paged and contiguous caches");
  // The sequences: token t alone (a decode step), or cache_sequences random runs of tokens
  // (some empty) covering them all.
  const int64_t S = chunks ? z.cache_sequences : T;
  cu_seqlens_.assign(size_t(S) + 1, 0);
  if (chunks) {
    std::uniform_int_distribution<int64_t> cut(0, T);
    std::vector<int64_t> cuts(size_t(S - 1));
    for (int64_t& v : cuts) v = cut(rng_);
    std::sort(cuts.begin(), cuts.end());
    for (int64_t b2 = 1; b2 < S; ++b2) cu_seqlens_[size_t(b2)] = int32_t(cuts[size_t(b2 - 1)]);
    cu_seqlens_[size_t(S)] = int32_t(T);
  } else {
    for (int64_t m = 0; m <= T; ++m) cu_seqlens_[size_t(m)] = int32_t(m);
  }
  // Tokens held before the append: paged 0-2 pages' worth; contiguous up to what the row
  // leaves room for.
  std::vector<int64_t> held(size_t(S), 0);
  int64_t pages_needed = 0;
  for (int64_t b2 = 0; b2 < S; ++b2) {
    const int64_t n = sequence_tokens(b2);
    if (c.cache == KvCache::paged) {
      held[size_t(b2)] = std::uniform_int_distribution<int64_t>(n > 0 ? 0 : 1, 2 * ps)(rng_);
      pages_needed += (held[size_t(b2)] + n + ps - 1) / ps;
    } else if (c.cache == KvCache::contiguous) {
      held[size_t(b2)] =
          std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(ps - n, 0))(rng_);
    }
  }
  cache_pages_ = z.cache_pages > 0           ? z.cache_pages
                 : c.cache == KvCache::slots ? (T + ps - 1) / ps + 2
                 : c.cache == KvCache::paged ? pages_needed + 2
                                             : S + 1;
  if (c.cache == KvCache::paged && cache_pages_ < pages_needed)
    detail::invalid("ProjProblem: cache_pages (", cache_pages_, ") is fewer than the ",
                    pages_needed, " pages the sequences hold");
  slot_stride_ = int64_t(z.kv_heads) * D + z.cache_slot_gap;
  page_stride_ = ps * slot_stride_;
  const int64_t ce = is_fp8(c.cache_store) ? 1 : e;
  const size_t bytes = size_t(cache_pages_ * page_stride_ * ce);
  cache_k_ = &add(std::vector<uint8_t>(bytes, kPoison));
  cache_v_ = &add(std::vector<uint8_t>(bytes, kPoison));
  if (c.cache_store == Store::e4m3_dynamic) {
    scale_stride_page_ = ps * z.kv_heads + 1;
    const size_t scale_bytes = size_t(cache_pages_ * scale_stride_page_ * 4);
    scales_k_ = &add(std::vector<uint8_t>(scale_bytes, kPoison));
    scales_v_ = &add(std::vector<uint8_t>(scale_bytes, kPoison));
  }
  dest_page_.assign(size_t(T), -1);
  dest_row_.assign(size_t(T), -1);
  want_skipped_ = 0;
  // `bad_slots` draws: tokens (slots) or sequences (paged, contiguous) given a place outside
  // the cache.
  std::uniform_int_distribution<int64_t> token(0, std::max<int64_t>(T - 1, 0));
  std::uniform_int_distribution<int64_t> sequence(0, std::max<int64_t>(S - 1, 0));
  const int64_t units = c.cache == KvCache::slots ? T : S;
  std::vector<bool> bad(size_t(units), false);
  for (int32_t i = 0; i < z.bad_slots && units > 0; ++i)
    bad[size_t(c.cache == KvCache::slots ? token(rng_) : sequence(rng_))] = true;
  // Distinct places in a random order: slots, or pages.
  const int64_t count = c.cache == KvCache::slots ? cache_pages_ * ps : cache_pages_;
  std::vector<int64_t> pool(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) pool[size_t(i)] = i;
  std::shuffle(pool.begin(), pool.end(), rng_);
  if (c.cache == KvCache::slots)
    place_slots(bad, pool);
  else if (c.cache == KvCache::paged)
    place_paged(bad, pool, held);
  else
    place_contiguous(bad, held);
  if (chunks) cu_ = &add(bytes_of(cu_seqlens_));
  skipped_ = &add(std::vector<uint8_t>(4, 0));
}

// slots: token m at slot pool[m] (pool: distinct slots in a random order), padded tokens at -1,
// bad ones past the cache.
void ProjProblem::place_slots(const std::vector<bool>& bad, const std::vector<int64_t>& pool) {
  const ProjSizes& z = sizes_;
  const int64_t ps = z.cache_page_size;
  const int64_t T = z.tokens;
  const int64_t count = int64_t(pool.size());
  std::uniform_int_distribution<int64_t> token(0, std::max<int64_t>(T - 1, 0));
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t m = 0; m < T; ++m) slot[size_t(m)] = pool[size_t(m % count)];
  for (int32_t i = 0; i < z.padded_slots && T > 0; ++i) slot[size_t(token(rng_))] = -1;
  for (int64_t m = 0; m < T; ++m) {
    if (bad[size_t(m)]) slot[size_t(m)] = count + m * 1000003;
    if (slot[size_t(m)] >= 0 && !bad[size_t(m)]) {
      dest_page_[size_t(m)] = slot[size_t(m)] / ps;
      dest_row_[size_t(m)] = slot[size_t(m)] % ps;
    }
    want_skipped_ += bad[size_t(m)];
  }
  std::vector<uint8_t> sb(size_t(std::max<int64_t>(T, 1)) * 8, 0);
  std::memcpy(sb.data(), slot.data(), slot.size() * 8);
  slots_ = &add(std::move(sb));
}

// paged: each sequence's pages from the pool (distinct page numbers in a random order).
void ProjProblem::place_paged(const std::vector<bool>& bad, const std::vector<int64_t>& pool,
                              const std::vector<int64_t>& held) {
  const ProjSizes& z = sizes_;
  const int64_t ps = z.cache_page_size;
  const int64_t S = int64_t(held.size());
  // Sequence b holds its pages from the pool; after the append it has held + n tokens, the
  // last last_page_len of them in its last page; its new tokens take the last n positions.
  // Bad sequences: last_page_len 0 or past the page (every token skipped), or a last page
  // number outside the cache (the tokens on that page skipped).
  std::vector<int32_t> indptr(size_t(S) + 1, 0), indices, lens(size_t(std::max<int64_t>(S, 1)));
  int64_t next = 0;
  for (int64_t b2 = 0; b2 < S; ++b2) {
    const int64_t n = sequence_tokens(b2), after = held[size_t(b2)] + n;
    const int64_t npages = (after + ps - 1) / ps;
    const size_t base = indices.size();
    for (int64_t i = 0; i < npages; ++i) indices.push_back(int32_t(pool[size_t(next++)]));
    indptr[size_t(b2) + 1] = int32_t(indices.size());
    lens[size_t(b2)] = int32_t(after - (npages - 1) * ps);
    int kind = -1;
    if (bad[size_t(b2)]) {
      kind = int(b2 % 3);
      if (kind == 0) lens[size_t(b2)] = 0;
      if (kind == 1) lens[size_t(b2)] = int32_t(ps + 1);
      if (kind == 2) indices.back() = int32_t(cache_pages_ + 7);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t m = cu_seqlens_[size_t(b2)] + i, pos = held[size_t(b2)] + i;
      const bool skip = kind == 0 || kind == 1 || (kind == 2 && pos / ps == npages - 1);
      if (skip) {
        ++want_skipped_;
        continue;
      }
      dest_page_[size_t(m)] = indices[base + size_t(pos / ps)];
      dest_row_[size_t(m)] = pos % ps;
    }
  }
  num_indices_ = int64_t(indices.size());
  indices.resize(std::max<size_t>(indices.size(), 1));
  indptr_ = &add(bytes_of(indptr));
  indices_ = &add(bytes_of(indices));
  lens_ = &add(bytes_of(lens));
}

// contiguous: sequence b in page b.
void ProjProblem::place_contiguous(const std::vector<bool>& bad, const std::vector<int64_t>& held) {
  const ProjSizes& z = sizes_;
  const int64_t ps = z.cache_page_size;
  const int64_t S = int64_t(held.size());
  // Sequence b (page b) held seq_lens[b] tokens; its new ones follow. Bad sequences are
  // full (seq_lens = page_size): every token skipped; so is any token past the page.
  std::vector<int32_t> lens(size_t(std::max<int64_t>(S, 1)), 0);
  for (int64_t b2 = 0; b2 < S; ++b2) {
    lens[size_t(b2)] = int32_t(bad[size_t(b2)] ? ps : held[size_t(b2)]);
    for (int64_t i = 0; i < sequence_tokens(b2); ++i) {
      const int64_t m = cu_seqlens_[size_t(b2)] + i, row = lens[size_t(b2)] + i;
      if (row >= ps) {
        ++want_skipped_;
        continue;
      }
      dest_page_[size_t(m)] = b2;
      dest_row_[size_t(m)] = row;
    }
  }
  lens_ = &add(bytes_of(lens));
}

ProjProblem::Rotated ProjProblem::rotate(int64_t pos, int64_t n, const std::vector<double>& y,
                                         const std::vector<double>& e) const {
  const QkvProjSpec& c = spec_;
  const int64_t D = c.head_dim, R = c.rotary_dim, el = n % D, head = n / D;
  const DType te = c.table_dtype;
  const int64_t tb = detail::element_bytes(te);
  const double u32 = std::ldexp(1.0, -24);
  // The pair: neox (j, j + R/2), gptj (2j, 2j + 1); `first` says which side n is.
  const int64_t j = c.style == Style::neox ? el % (R / 2) : el / 2;
  const bool first = c.style == Style::neox ? el < R / 2 : el % 2 == 0;
  const int64_t partner = head * D + (c.style == Style::neox ? (first ? el + R / 2 : el - R / 2)
                                                             : (first ? el + 1 : el - 1));
  double cs = 0, sn = 0, angle_err = 0;
  if (c.freqs == Freqs::computed) {
    const double theta = std::pow(sizes_.base, -2.0 * double(j) / double(R));
    cs = std::cos(double(pos) * theta);
    sn = std::sin(double(pos) * theta);
    angle_err = 4e-7;
  } else if (pos < 0 || pos >= table_rows_) {
    cs = sn = std::nan("");
  } else {
    const int64_t col = c.table_width == TableWidth::full && c.style == Style::gptj ? 2 * j : j;
    cs = load_value(te, cos_->host.data() + (pos * table_width_ + col) * tb);
    sn = load_value(te, sin_->host.data() + (pos * table_width_ + col) * tb);
  }
  const double self = y[size_t(n)], other = y[size_t(partner)];
  // first: self·cos − other·sin; second: self·cos + other·sin (other is the first).
  Rotated r;
  r.value = first ? self * cs - other * sn : self * cs + other * sn;
  r.err = e[size_t(n)] * std::fabs(cs) + e[size_t(partner)] * std::fabs(sn) +
          2 * u32 * (std::fabs(self * cs) + std::fabs(other * sn)) +
          angle_err * (std::fabs(self) + std::fabs(other)) * (1 + 1e-6);
  return r;
}

void ProjProblem::build_reference() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t D = c.head_dim, R = c.rotary_dim, K = z.hidden;
  const int64_t e = detail::element_bytes(c.dtype);
  expected_.value.assign(size_t(z.tokens * columns_), 0.0);
  expected_.tol.assign(size_t(z.tokens * columns_), 0.0);
  const double gamma_dot = (double(K) / 16 + 16) * std::ldexp(1.0, -22);
  const double rel_rstd = ((double(K) / 4 + 24) / 2 + 4) * std::ldexp(1.0, -24);
  const double u32 = std::ldexp(1.0, -24);
  const double u_out = unit_roundoff(c.dtype);
  const bool w8 = c.weights == Weights::e4m3;
  std::vector<double> a(static_cast<size_t>(K));
  std::vector<double> sum(static_cast<size_t>(columns_)), mag(static_cast<size_t>(columns_));
  for (int64_t m = 0; m < z.tokens; ++m) {
    const uint8_t* xr = x_->host.data() + m * x_stride_ * e;
    double sumsq = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double x = load_value(c.dtype, xr + k * e);
      sumsq += x * x;
      if (c.norm == Norm::none) {
        a[size_t(k)] = x;
        continue;
      }
      double w = load_value(c.dtype, norm_->host.data() + k * e);
      if (c.norm == Norm::rms_one_plus) w = double(1.0f + float(w));  // fp32, as the kernel
      // rms: the exact product, rounded once below, as the kernel's packed multiply; rms_one_plus:
      // the kernel's fp32 multiply first
      const double product = c.norm == Norm::rms_one_plus ? double(float(x * w)) : x * w;
      a[size_t(k)] =
          c.dtype == DType::bf16 ? bf16_value(bf16_bits(product)) : f16_value(f16_bits(product));
    }
    const double rstd =
        c.norm == Norm::none ? 1.0 : 1.0 / std::sqrt(sumsq / double(K) + double(float(z.norm_eps)));
    // The columns' sums, spread over the host's cores (each column's own arithmetic).
    for_each_range(columns_, [&](int64_t first, int64_t last) {
      for (int64_t n = first; n < last; ++n) {
        double s = 0, s_abs = 0, scale = 1, scale_err = 0;
        if (w8) {
          const uint8_t* wr = w_->host.data() + n * w_stride_;
          for (int64_t k = 0; k < K; ++k) {
            const double t = a[size_t(k)] * e4m3_value(wr[k]);
            s += t;
            s_abs += std::fabs(t);
          }
          float f = 0;
          std::memcpy(&f, scale_->host.data() + n * 4, 4);
          scale = f;
          scale_err = u32;  // the fp32 product sum · scale
        } else {
          const uint8_t* wr = w_->host.data() + n * w_stride_ * e;
          for (int64_t k = 0; k < K; ++k) {
            const double t = a[size_t(k)] * load_value(c.dtype, wr + k * e);
            s += t;
            s_abs += std::fabs(t);
          }
        }
        sum[size_t(n)] = rstd * scale * s;
        // Error of the kernel's fp32 y = rstd · (scale · Σ) (absolute).
        mag[size_t(n)] =
            rstd * scale * gamma_dot * s_abs +
            ((c.norm == Norm::none ? 0.0 : rel_rstd + u32) + scale_err) * std::fabs(sum[size_t(n)]);
        if (bias_) {  // + bias_n in fp32: one more rounding of the sum
          sum[size_t(n)] += load_value(c.dtype, bias_->host.data() + n * e);
          mag[size_t(n)] += u32 * std::fabs(sum[size_t(n)]);
        }
      }
    });
    const int64_t pos = positions_[size_t(m)];
    for (int64_t n = 0; n < columns_; ++n) {
      const int64_t head = n / D, el = n % D;
      const bool rotary_head = head < z.q_heads + z.kv_heads;
      double value = sum[size_t(n)], err = mag[size_t(n)];
      if (rotary_head && el < R) {
        const Rotated r = rotate(pos, n, sum, mag);
        value = r.value;
        err = r.err;
      }
      const size_t at = size_t(m * columns_ + n);
      expected_.value[at] = value;
      expected_.tol[at] = u_out * std::fabs(value) + (1 + u_out) * err + abs_floor(c.dtype);
    }
  }
}

// The unfused path (RMSNorm key -> GEMM -> RoPE key):
//   - the normalized activation a_k = round((x_k · rstd) · w_k) in fp32: rstd carries the fp32
//     Σx² error (as above) and two fp32 products follow, so the device's a_k is the float64
//     value's rounding unless that value lies within (rel_rstd + 3 · 2^-24) of a rounding
//     boundary; there the neighbour is allowed too, its distance times |W_nk| added to the
//     column's error;
//   - e4m3 weights: W_nk = dtype(fp32(code · scale_n)), as the path's dequantization kernel
//     computes it (exactly reproduced here);
//   - the GEMM (cuBLASLt, fp32 accumulation in tensor cores, any split of K): (K/8 + 64) chained
//     steps of two fp32 ulps of Σ|a_k W_nk|;
//   - y rounded once to the dtype; v and the columns RoPE leaves alone are that value;
//   - RoPE in fp32 on the rounded y, as the fused path's epilogue, and one more rounding.
void ProjProblem::build_unfused_reference() {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t D = c.head_dim, R = c.rotary_dim, K = z.hidden;
  const int64_t e = detail::element_bytes(c.dtype);
  Expected& out = expected_unfused_;
  const bool w8 = c.weights == Weights::e4m3;
  out.value.assign(size_t(z.tokens * columns_), 0.0);
  out.tol.assign(size_t(z.tokens * columns_), 0.0);
  const double gamma_dot = (double(K) / 8 + 64) * std::ldexp(1.0, -22);
  const double rel_rstd = ((double(K) / 4 + 24) / 2 + 4) * std::ldexp(1.0, -24);
  const double u32 = std::ldexp(1.0, -24);
  const double u_out = unit_roundoff(c.dtype);
  auto round_to = [&](double v) {
    return c.dtype == DType::bf16 ? bf16_value(bf16_bits(v)) : f16_value(f16_bits(v));
  };
  std::vector<double> a(static_cast<size_t>(K)), amb(static_cast<size_t>(K), 0.0);
  std::vector<double> y(static_cast<size_t>(columns_)), ey(static_cast<size_t>(columns_));
  // e4m3 weights: every code's dequantized value per row, made once (a value per use took most
  // of a tuning run's reference time).
  const std::vector<double> deq =
      w8 ? dequantized_rows(c.dtype, scale_->host.data(), columns_) : std::vector<double>();
  for (int64_t m = 0; m < z.tokens; ++m) {
    const uint8_t* xr = x_->host.data() + m * x_stride_ * e;
    double sumsq = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double x = load_value(c.dtype, xr + k * e);
      sumsq += x * x;
    }
    const double rstd = 1.0 / std::sqrt(sumsq / double(K) + double(float(z.norm_eps)));
    for (int64_t k = 0; k < K; ++k) {
      const double x = load_value(c.dtype, xr + k * e);
      if (c.norm == Norm::none) {
        a[size_t(k)] = x;
        continue;
      }
      double w = load_value(c.dtype, norm_->host.data() + k * e);
      if (c.norm == Norm::rms_one_plus) w = double(1.0f + float(w));  // fp32, as the kernel
      const double v = x * rstd * w, slack = (rel_rstd + 3 * u32) * std::fabs(v);
      const double r = round_to(v);
      a[size_t(k)] = r;
      amb[size_t(k)] =
          std::max(std::fabs(round_to(v - slack) - r), std::fabs(round_to(v + slack) - r));
    }
    for_each_range(columns_, [&](int64_t first, int64_t last) {
      for (int64_t n = first; n < last; ++n) {
        const uint8_t* wr = w_->host.data() + n * w_stride_ * (w8 ? 1 : e);
        const double* row_values = w8 ? deq.data() + n * 256 : nullptr;
        double sum = 0, s_abs = 0, s_amb = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double wv = w8 ? row_values[wr[k]] : load_value(c.dtype, wr + k * e);
          const double t = a[size_t(k)] * wv;
          sum += t;
          s_abs += std::fabs(t);
          s_amb += amb[size_t(k)] * std::fabs(wv);
        }
        const double err = gamma_dot * s_abs + s_amb;  // of the fp32 sum
        y[size_t(n)] = sum;
        ey[size_t(n)] = u_out * std::fabs(sum) + (1 + u_out) * err;  // after rounding to the dtype
      }
    });
    const int64_t pos = positions_[size_t(m)];
    for (int64_t n = 0; n < columns_; ++n) {
      const int64_t head = n / D, el = n % D;
      const bool rotary_head = head < z.q_heads + z.kv_heads;
      double value = y[size_t(n)], tol = ey[size_t(n)] + abs_floor(c.dtype);
      if (rotary_head && el < R) {
        const Rotated r = rotate(pos, n, y, ey);
        value = r.value;
        tol = u_out * std::fabs(value) + (1 + u_out) * r.err + abs_floor(c.dtype);
      }
      const size_t at = size_t(m * columns_ + n);
      out.value[at] = value;
      out.tol[at] = tol;
    }
  }
}

void ProjProblem::upload() { buffers_.upload(); }

QkvProjArgs ProjProblem::args(void* stream) const {
  const ProjSizes& z = sizes_;
  const int64_t D = spec_.head_dim;
  const int64_t e = detail::element_bytes(spec_.dtype);
  QkvProjArgs a;
  a.tokens = z.tokens;
  a.hidden = z.hidden;
  a.q_heads = z.q_heads;
  a.kv_heads = z.kv_heads;
  a.x = device_pointer(x_);
  a.x_stride = x_stride_;
  a.norm_weight = device_pointer(norm_);
  a.bias = device_pointer(bias_);
  a.norm_eps = z.norm_eps;
  a.weight = device_pointer(w_);
  a.weight_stride = w_stride_;
  a.weight_scale = static_cast<const float*>(device_pointer(scale_));
  const int64_t hs = D + z.out_head_gap;
  const int32_t heads[3] = {z.q_heads, z.kv_heads, z.kv_heads};
  Tensor* outs[3] = {&a.q, &a.k, &a.v};
  int64_t first_head = 0;
  for (int i = 0; i < 3; ++i) {
    Tensor& t = *outs[i];
    t.heads = heads[i];
    t.stride_head = hs;
    if (z.packed_out) {
      t.data = static_cast<char*>(device_pointer(outs_[0])) + first_head * hs * e;
      t.stride_seq = int64_t(z.q_heads + 2 * z.kv_heads) * hs;
    } else {
      t.data = device_pointer(outs_[size_t(i)]);
      t.stride_seq = heads[i] * hs;
    }
    first_head += heads[i];
  }
  a.position_offset = z.position_offset;
  a.position_ids = device_pointer(ids_);
  a.cos = device_pointer(cos_);
  a.sin = device_pointer(sin_);
  a.table_rows = table_rows_;
  a.base = z.base;
  a.path = z.path;
  a.workspace = device_pointer(workspace_);
  a.workspace_bytes = workspace_bytes_;
  a.stream = stream;
  if (cache_k_) {
    KvCacheArgs& kc = a.cache;
    kc.k = device_pointer(cache_k_);
    kc.v = device_pointer(cache_v_);
    kc.pages = cache_pages_;
    kc.page_size = z.cache_page_size;
    kc.stride_page = page_stride_;
    kc.stride_slot = slot_stride_;
    kc.stride_head = D;
    kc.slot_mapping = static_cast<const int64_t*>(device_pointer(slots_));
    kc.indptr = static_cast<const int32_t*>(device_pointer(indptr_));
    kc.indices = static_cast<const int32_t*>(device_pointer(indices_));
    kc.num_indices = num_indices_;
    kc.last_page_len = spec_.cache == KvCache::paged
                           ? static_cast<const int32_t*>(device_pointer(lens_))
                           : nullptr;
    kc.seq_lens = spec_.cache == KvCache::contiguous
                      ? static_cast<const int32_t*>(device_pointer(lens_))
                      : nullptr;
    kc.skipped = static_cast<int32_t*>(device_pointer(skipped_));
    kc.k_quant_scale = is_fp8(spec_.cache_store) ? 4.0f : 1.0f;
    kc.v_quant_scale = is_fp8(spec_.cache_store) ? 16.0f : 1.0f;
    if (scales_k_) {
      kc.k_scales = static_cast<float*>(device_pointer(scales_k_));
      kc.v_scales = static_cast<float*>(device_pointer(scales_v_));
      kc.scale_stride_page = scale_stride_page_;
      kc.scale_stride_slot = z.kv_heads;
      kc.scale_stride_head = 1;
    }
    if (z.cache_only) a.k.data = a.v.data = nullptr;
    if (cu_) {
      a.cu_seqlens = static_cast<const int32_t*>(device_pointer(cu_));
      a.batch = sizes_.cache_sequences;
    }
  }
  return a;
}

int64_t ProjProblem::weight_bytes() const {
  return spec_.weights == Weights::e4m3
             ? columns_ * sizes_.hidden + columns_ * 4
             : columns_ * sizes_.hidden * detail::element_bytes(spec_.dtype);
}

int64_t ProjProblem::bytes_moved() const {
  const int64_t e = detail::element_bytes(spec_.dtype);
  return weight_bytes() + sizes_.tokens * sizes_.hidden * e + sizes_.tokens * columns_ * e +
         (spec_.norm != Norm::none ? sizes_.hidden * e : 0);
}

CheckReport ProjProblem::check_as(ProjPath path) {
  return check_on_path(*this, &sizes_.path, path);
}

CheckReport ProjProblem::check() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel");
  if (!sizes_.reference)
    detail::invalid("ProjProblem::check: the problem was made without a reference");
  std::vector<std::vector<uint8_t>> got;
  for (const Buffer* out : outs_) got.push_back(DeviceBuffers::download(*out));
  CheckReport r;
  const bool unfused = sizes_.path == ProjPath::unfused || unfused_only_;
  if (!unfused) {
    r = compare(expected_, got);
    matched_ = ProjPath::fused;
  }
  if (unfused || (sizes_.path == ProjPath::automatic && !r.ok)) {
    CheckReport u = compare(expected_unfused_, got);
    if (unfused || u.ok) {
      r = u;
      matched_ = ProjPath::unfused;
    }
  }
  if (cache_k_) compare_cache(r, matched_ == ProjPath::unfused ? expected_unfused_ : expected_);
  // The workspace's guard: the unfused path writes nothing past workspace_bytes.
  if (workspace_) {
    std::vector<uint8_t> guard(kGuardBytes);
    detail::check(d.MemcpyDtoH(guard.data(), workspace_->device + workspace_bytes_, kGuardBytes),
                  "cuMemcpyDtoH");
    for (const uint8_t b : guard)
      if (b != kPoison) {
        ++r.mismatches;
        r.ok = false;
        if (r.first_failure.empty()) r.first_failure = "the guard after the workspace was written";
        break;
      }
  }
  return r;
}

CheckReport ProjProblem::compare(const Expected& want_all,
                                 const std::vector<std::vector<uint8_t>>& all) const {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const int64_t D = c.head_dim, e = detail::element_bytes(c.dtype);
  const int64_t hs = D + z.out_head_gap;
  CheckReport r;
  double err2 = 0, ref2 = 0;
  for (size_t b = 0; b < all.size(); ++b) {
    const std::vector<uint8_t>& got = all[b];
    std::vector<bool> addressed(got.size() / size_t(e), false);
    const int64_t heads = z.packed_out ? z.q_heads + 2 * z.kv_heads
                          : b == 0     ? z.q_heads
                                       : z.kv_heads;
    const int64_t first_column = z.packed_out ? 0
                                 : b == 0     ? 0
                                 : b == 1     ? z.q_heads * D
                                              : (z.q_heads + z.kv_heads) * D;
    for (int64_t m = 0; m < z.tokens; ++m)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t el = 0; el < D; ++el) {
          // With cache_only, k's and v's heads are not outputs: they stay poisoned.
          if (cache_k_ && z.cache_only && first_column / D + h >= z.q_heads) continue;
          const int64_t at = m * heads * hs + h * hs + el;
          addressed[size_t(at)] = true;
          const size_t ref_at = size_t(m * columns_ + first_column + h * D + el);
          const double want = want_all.value[ref_at], tol = want_all.tol[ref_at];
          const double have = load_value(c.dtype, got.data() + at * e);
          ++r.checked;
          const bool ok = std::isnan(want) ? std::isnan(have) : std::fabs(have - want) <= tol;
          if (!std::isnan(want) && std::isfinite(have)) {
            err2 += (have - want) * (have - want);
            ref2 += want * want;
            r.max_abs_err = std::max(r.max_abs_err, std::fabs(have - want));
          }
          if (!ok) {
            ++r.mismatches;
            if (r.first_failure.empty())
              r.first_failure = detail::concat("token ", m, " column ", first_column + h * D + el,
                                               ": got ", have, ", expected ", want, " +- ", tol);
          }
        }
    // Gaps between heads and the guard after the buffer: untouched poison.
    for (size_t i = 0; i < got.size(); ++i) {
      if (i / size_t(e) < addressed.size() && addressed[i / size_t(e)]) continue;
      if (got[i] != kPoison) {
        ++r.mismatches;
        if (r.first_failure.empty())
          r.first_failure = detail::concat("output buffer ", b, " byte ", i,
                                           " is outside every output element but was written");
        break;
      }
    }
  }
  r.max_rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
  r.ok = r.mismatches == 0;
  return r;
}

void ProjProblem::compare_cache(CheckReport& r, const Expected& expected) const {
  const QkvProjSpec& c = spec_;
  const ProjSizes& z = sizes_;
  const detail::Driver& d = detail::driver();
  const int64_t D = c.head_dim;
  const bool fp8 = is_fp8(c.cache_store);
  const int64_t ce = fp8 ? 1 : detail::element_bytes(c.dtype);
  const double u32 = std::ldexp(1.0, -24);
  auto fail = [&](const std::string& why) {
    ++r.mismatches;
    r.ok = false;
    if (r.first_failure.empty()) r.first_failure = why;
  };
  const bool dynamic = c.cache_store == Store::e4m3_dynamic;
  for (int which = 0; which < 2; ++which) {
    const Buffer& b = *(which == 0 ? cache_k_ : cache_v_);
    const char* name = which == 0 ? "k cache" : "v cache";
    const std::vector<uint8_t> got = DeviceBuffers::download(b);
    std::vector<bool> addressed(got.size() / size_t(ce), false);
    // Dynamic scales: a float per written row and head, every other byte of them poisoned.
    std::vector<uint8_t> scales_got;
    std::vector<bool> scale_addressed;
    if (dynamic) {
      const Buffer& sb = *(which == 0 ? scales_k_ : scales_v_);
      scales_got = DeviceBuffers::download(sb);
      scale_addressed.assign(scales_got.size() / 4, false);
    }
    for (int64_t m = 0; m < z.tokens; ++m) {
      const int64_t page = dest_page_[size_t(m)], row = dest_row_[size_t(m)];
      if (page < 0) continue;
      for (int64_t h = 0; h < z.kv_heads; ++h) {
        const size_t head_at =
            size_t(m * columns_ + (int64_t(z.q_heads) + which * z.kv_heads + h) * D);
        double scale = fp8 ? (which == 0 ? 4.0 : 16.0) : 1.0;
        double scale_slack = 0;  // relative: the kernel's multiplier, known from its stored scale
        if (dynamic) {
          // The kernel's amax a = max(max |value|, 2^-9) over its fp32 values, each within the
          // reference's tolerance; it stores fl(a / 448) and multiplies by fl(448 / a).
          double a_lo = 0, a_hi = 0;
          for (int64_t el = 0; el < D; ++el) {
            const double v = std::fabs(expected.value[head_at + size_t(el)]);
            const double t = expected.tol[head_at + size_t(el)];
            a_lo = std::max(a_lo, v - t);
            a_hi = std::max(a_hi, v + t);
          }
          a_lo = std::max(a_lo, 0x1p-9);
          a_hi = std::max(a_hi, 0x1p-9);
          const int64_t s_at = page * scale_stride_page_ + row * z.kv_heads + h;
          scale_addressed[size_t(s_at)] = true;
          float s_got;
          std::memcpy(&s_got, scales_got.data() + s_at * 4, 4);
          ++r.checked;
          if (!(s_got >= float(a_lo / 448.0) && s_got <= float(a_hi / 448.0))) {
            fail(detail::concat(name, " scale: token ", m, " head ", h, ": got ", s_got,
                                ", expected within [", float(a_lo / 448.0), ", ",
                                float(a_hi / 448.0), "]"));
            for (int64_t el = 0; el < D; ++el)  // its codes are not judged, nor stray writes
              addressed[size_t(page * page_stride_ + row * slot_stride_ + h * D + el)] = true;
            continue;
          }
          // s_got = fl(a / 448) puts a within half an ulp of 448 s_got: the multiplier is 1 /
          // s_got within that, and its own rounding.
          scale = 1.0 / double(s_got);
          scale_slack = 4 * u32;
        }
        for (int64_t el = 0; el < D; ++el) {
          const int64_t at = page * page_stride_ + row * slot_stride_ + h * D + el;
          addressed[size_t(at)] = true;
          const size_t ref_at = head_at + size_t(el);
          const double want = expected.value[ref_at] * scale;
          const double tol = expected.tol[ref_at] * scale + scale_slack * std::fabs(want);
          bool good;
          double have;
          if (fp8) {
            // The kernel's fp32 value lies within the tolerance of the float64 one, and its
            // product with the scale within one more fp32 rounding: either rounding of that
            // interval's ends is the byte (both zeros where it spans zero).
            const double t = tol + u32 * std::fabs(want) * 2;
            const uint8_t byte = got[size_t(at)];
            have = e4m3_value(byte);
            const uint8_t lo = e4m3_bits(want - t), hi = e4m3_bits(want + t);
            good = std::isnan(want) ? std::isnan(have)
                                    : byte == lo || byte == hi ||
                                          (have >= e4m3_value(lo) && have <= e4m3_value(hi));
          } else {
            have = load_value(c.dtype, got.data() + at * ce);
            good = std::isnan(want) ? std::isnan(have) : std::fabs(have - want) <= tol;
          }
          ++r.checked;
          if (!good)
            fail(detail::concat(name, ": token ", m, " page ", page, " row ", row, " head ", h,
                                " element ", el, ": got ", have, ", expected ", want, " +- ", tol));
        }
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (i / size_t(ce) < addressed.size() && addressed[i / size_t(ce)]) continue;
      if (got[i] != kPoison) {
        fail(detail::concat(name, " byte ", i, " is in no token's row but was written"));
        break;
      }
    }
    for (size_t i = 0; i < scales_got.size(); ++i) {
      if (i / 4 < scale_addressed.size() && scale_addressed[i / 4]) continue;
      if (scales_got[i] != kPoison) {
        fail(detail::concat(name, " scale byte ", i, " is in no token's row but was written"));
        break;
      }
    }
  }
  int32_t skipped = 0;
  detail::check(d.MemcpyDtoH(&skipped, skipped_->device, 4), "cuMemcpyDtoH");
  if (skipped != want_skipped_)
    fail(detail::concat("args.cache.skipped holds ", skipped, ", expected ", want_skipped_));
}

}  // namespace ropejit::oracle
