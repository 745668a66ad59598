// The MLA problem and its float64 reference. Every output is fp32 arithmetic rounded once, so
// an output is right when it lies between the roundings of (want - err) and (want + err), err
// bounding the fp32 arithmetic before the rounding: for the rotation two products and a sum,
// for the norm Σx² in fp32 (at most kv_rank / 128 + 10 terms a chain), a division, a square
// root and two products, and for an e4m3 store the division by its scale. Where the rounding
// cannot straddle a boundary, that is the bits exactly.
#include "oracle/mla/mla_workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "oracle/numbers.hpp"

namespace ropejit::oracle {
namespace {

constexpr uint8_t kPoison = 0xff;
constexpr size_t kGuardBytes = 256;
constexpr double kBase = 10000.0;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

double rounded(DType t, bool fp8, double v) {
  if (fp8) return e4m3_value(e4m3_bits(v));
  return t == DType::bf16 ? bf16_value(bf16_bits(v)) : f16_value(f16_bits(v));
}

}  // namespace

MlaProblem::Buffer& MlaProblem::add(std::vector<uint8_t> host) {
  return buffers_.add(std::move(host), kGuardBytes, kPoison);
}

MlaProblem::MlaProblem(const MlaSpec& spec, const MlaSizes& sizes)
    : spec_(spec.canonical()), sizes_(sizes) {
  using Addressing = MlaSizes::Addressing;
  if (sizes_.addressing == Addressing::page_table) {
    if (sizes_.page_size < 1) detail::invalid("MlaSizes: page_size must be >= 1");
    sizes_.cache_slots = round_up(sizes_.cache_slots, sizes_.page_size);
  }
  if (sizes_.block_size > 0) sizes_.cache_slots = round_up(sizes_.cache_slots, sizes_.block_size);
  const MlaSizes& z = sizes_;
  const DType t = spec_.dtype;
  const int64_t e = detail::element_bytes(t), R = spec_.kv_rank, P = spec_.rope_dim, half = P / 2,
                row = R + P, T = z.tokens, H = z.heads;
  const bool cache_fp8 = spec_.cache_store == Store::e4m3;
  const bool assemble = spec_.query == MlaQuery::assemble;
  const bool q_fp8 = spec_.q_store == Store::e4m3;
  const bool by_token = z.addressing == Addressing::rows_by_token;
  if (z.padded + z.bad_slots + z.off_table > T ||
      (!by_token && T - z.padded - z.bad_slots > z.cache_slots))
    detail::invalid(
        "MlaSizes: more padded, bad or off-table tokens than tokens, or more cached "
        "tokens than cache slots");
  if (by_token && (z.padded || z.bad_slots || z.cache_slots < T))
    detail::invalid("MlaSizes: rows by token have no padding or bad slots, and a row a token");
  if (z.k_pe_out != MlaSizes::KpeOut::none && !z.with_cache)
    detail::invalid("MlaSizes: k_pe_out needs the cache");
  std::mt19937_64 rng(z.seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const int64_t kv_stride = round_up(R + z.row_gap, 8), pe_stride = P + z.row_gap,
                cache_stride = round_up((z.cache_pe ? R : row) + z.row_gap, 8),
                qpe_hs = P + z.head_gap, nope_hs = round_up(R + z.head_gap, 8),
                out_hs = round_up((z.q_out_pe ? R : row) + z.head_gap, 8),
                out_pe_hs = P + z.head_gap;
  auto values = [&](int64_t rows, int64_t stride, int64_t width, double scale) {
    std::vector<uint8_t> bytes(size_t(std::max<int64_t>(rows, 1) * stride * e), kPoison);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < width; ++k)
        store_value(t, bytes.data() + (r * stride + k) * e, scale * unit(rng));
    return bytes;
  };
  kv_c_ = &add(values(T, kv_stride, R, 2.0));
  k_pe_ = &add(values(T, pe_stride, P, 2.0));
  {
    std::vector<uint8_t> w(size_t(R * e));
    for (int64_t k = 0; k < R; ++k) store_value(t, w.data() + k * e, 1.0 + 0.5 * unit(rng));
    w_ = &add(std::move(w));
  }
  q_pe_ = &add(values(T * H, qpe_hs, P, 2.0));
  if (assemble) q_nope_ = &add(values(T * H, nope_hs, R, 2.0));
  if (assemble)
    q_out_ = &add(std::vector<uint8_t>(
        size_t(std::max<int64_t>(T * H, 1) * out_hs * (q_fp8 ? 1 : e)), kPoison));
  if (assemble && z.q_out_pe)
    q_out_pe_ = &add(std::vector<uint8_t>(
        size_t(std::max<int64_t>(T * H, 1) * out_pe_hs * (q_fp8 ? 1 : e)), kPoison));
  const int64_t celem = cache_fp8 ? 1 : e;
  cache_stride_ = cache_stride;
  cache_pe_stride_ = P + z.row_gap;
  cache_ = &add(std::vector<uint8_t>(size_t(row_at(z.cache_slots, cache_stride) * celem), kPoison));
  if (z.cache_pe)
    cache_pe_ = &add(
        std::vector<uint8_t>(size_t(row_at(z.cache_slots, cache_pe_stride_) * celem), kPoison));
  if (z.k_pe_out == MlaSizes::KpeOut::own)
    k_pe_out_ =
        &add(std::vector<uint8_t>(size_t(std::max<int64_t>(T, 1) * (P + z.row_gap) * e), kPoison));
  if (z.k_pe_out == MlaSizes::KpeOut::in_place) k_pe_out_ = k_pe_;

  // Slots: distinct rows for the cached tokens, then padding and rows past the cache, shuffled.
  std::vector<int64_t> perm(size_t(z.cache_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i)
    slots[size_t(i)] = i < z.padded                 ? -1
                       : i < z.padded + z.bad_slots ? (i % 2 ? -2 - i : z.cache_slots + i)
                                                    : perm[size_t(i - z.padded - z.bad_slots)];
  std::shuffle(slots.begin(), slots.end(), rng);
  if (by_token)
    for (int64_t i = 0; i < T; ++i) slots[size_t(i)] = i < z.cache_slots ? i : z.cache_slots + i;
  {
    std::vector<uint8_t> b(size_t(T) * 8);
    std::memcpy(b.data(), slots.data(), b.size());
    slots_ = &add(std::move(b));
  }
  if (z.addressing == Addressing::page_table) add_page_table(slots);
  // Positions: in the table, the last off_table tokens past it.
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i)
    pos[size_t(i)] =
        i >= T - z.off_table ? z.table_rows + i : int64_t(rng() % uint64_t(z.table_rows));
  {
    const bool i64 = spec_.index_type == IndexType::i64;
    std::vector<uint8_t> b(size_t(T) * (i64 ? 8 : 4));
    for (int64_t i = 0; i < T; ++i) {
      if (i64)
        std::memcpy(b.data() + i * 8, &pos[size_t(i)], 8);
      else {
        const int32_t p32 = int32_t(pos[size_t(i)]);
        std::memcpy(b.data() + i * 4, &p32, 4);
      }
    }
    ids_ = &add(std::move(b));
  }
  // The tables as stored (the reference rotates by these rounded values).
  const int64_t te = detail::element_bytes(spec_.table_dtype), ts = half + z.table_gap;
  std::vector<uint8_t> cos_b(size_t(z.table_rows * ts * te), kPoison), sin_b(cos_b.size(), kPoison);
  for (int64_t r = 0; r < z.table_rows; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(r) * std::pow(kBase, -2.0 * double(i) / double(P));
      store_value(spec_.table_dtype, cos_b.data() + (r * ts + i) * te, std::cos(a));
      store_value(spec_.table_dtype, sin_b.data() + (r * ts + i) * te, std::sin(a));
    }
  cos_ = &add(cos_b);
  sin_ = &add(sin_b);
  auto scalar = [&](float v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  cache_scale_ = &add(scalar(z.cache_scale));
  q_scale_ = &add(scalar(z.q_scale));
  skipped_ = &add(std::vector<uint8_t>(4, 0));

  kv_stride_ = kv_stride;
  pe_stride_ = pe_stride;
  cache_stride_ = cache_stride;
  qpe_hs_ = qpe_hs;
  nope_hs_ = nope_hs;
  out_hs_ = out_hs;
  out_pe_hs_ = out_pe_hs;
  table_stride_ = ts;
  kout_stride_ = P + z.row_gap;
  if (z.k_pe_out == MlaSizes::KpeOut::in_place) kout_stride_ = pe_stride;
  cache_pe_stride_ = P + z.row_gap;
  build_reference(slots, pos);
}

// Every element the call writes, in float64, with the fp32 arithmetic's error bound.
void MlaProblem::build_reference(const std::vector<int64_t>& slots,
                                 const std::vector<int64_t>& pos) {
  const MlaSizes& z = sizes_;
  const DType t = spec_.dtype;
  const int64_t e = detail::element_bytes(t), R = spec_.kv_rank, P = spec_.rope_dim, half = P / 2,
                T = z.tokens, H = z.heads;
  const int64_t kv_stride = kv_stride_, pe_stride = pe_stride_, cache_stride = cache_stride_,
                qpe_hs = qpe_hs_, nope_hs = nope_hs_, out_hs = out_hs_, ts = table_stride_;
  const bool cache_fp8 = spec_.cache_store == Store::e4m3;
  const bool assemble = spec_.query == MlaQuery::assemble;
  const bool q_fp8 = spec_.q_store == Store::e4m3;
  const int64_t celem = cache_fp8 ? 1 : e;
  const int64_t te = detail::element_bytes(spec_.table_dtype);
  auto table = [&](const Buffer* b, int64_t r, int64_t i) {
    return load_value(spec_.table_dtype, b->host.data() + (r * ts + i) * te);
  };
  // The rotation of pair i of the `P` values at `x` (bytes of the dtype), at position p.
  const double nan = std::nan("");
  auto rotate = [&](const uint8_t* x, int64_t p, std::vector<double>* want,
                    std::vector<double>* err) {
    want->assign(size_t(P), nan);
    err->assign(size_t(P), 0.0);
    if (p < 0 || p >= z.table_rows) return;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = spec_.style == Style::gptj ? 2 * i : i;
      const int64_t b = spec_.style == Style::gptj ? 2 * i + 1 : i + half;
      const double c = table(cos_, p, i), s = table(sin_, p, i);
      const double xa = load_value(t, x + a * e), xb = load_value(t, x + b * e);
      (*want)[size_t(a)] = xa * c - xb * s;
      (*want)[size_t(b)] = xb * c + xa * s;
      (*err)[size_t(a)] = std::ldexp(std::fabs(xa * c) + std::fabs(xb * s), -22);
      (*err)[size_t(b)] = std::ldexp(std::fabs(xb * c) + std::fabs(xa * s), -22);
    }
  };
  const double rel = ((double(R) / 128 + 10) / 2 + 6) * std::ldexp(1.0, -23);
  std::vector<double> want, err, rot, rot_err;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t slot = slots[size_t(i)];
    if (slot >= z.cache_slots || slot < -1) ++want_skipped_;
    if (k_pe_out_) {  // every token's, padding and skipped rows included
      rotate(k_pe_->host.data() + i * pe_stride * e, pos[size_t(i)], &rot, &rot_err);
      expect_row(&k_pe_expect_, size_t(i * kout_stride_ * e), rot, rot_err, false, 1.0);
    }
    if (z.with_cache && slot >= 0 && slot < z.cache_slots) {
      const uint8_t* x = kv_c_->host.data() + i * kv_stride * e;
      double ss = 0;
      for (int64_t k = 0; k < R; ++k) ss += load_value(t, x + k * e) * load_value(t, x + k * e);
      const double rstd = 1.0 / std::sqrt(ss / double(R) + double(float(z.eps)));
      want.assign(size_t(R), 0.0);
      err.assign(size_t(R), 0.0);
      for (int64_t k = 0; k < R; ++k) {
        const double v = load_value(t, x + k * e);
        const double y =
            spec_.norm == Norm::rms ? v * rstd * load_value(t, w_->host.data() + k * e) : v;
        want[size_t(k)] = y;
        err[size_t(k)] = spec_.norm == Norm::rms ? rel * std::fabs(y) : 0.0;
      }
      rotate(k_pe_->host.data() + i * pe_stride * e, pos[size_t(i)], &rot, &rot_err);
      if (z.cache_pe) {
        expect_row(&cache_pe_expect_, size_t(row_at(slot, cache_pe_stride_) * celem), rot, rot_err,
                   cache_fp8, z.cache_scale);
      } else {
        want.insert(want.end(), rot.begin(), rot.end());
        err.insert(err.end(), rot_err.begin(), rot_err.end());
      }
      expect_row(&cache_expect_, size_t(row_at(slot, cache_stride) * celem), want, err, cache_fp8,
                 z.cache_scale);
    }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qh = i * H + h;
      rotate(q_pe_->host.data() + qh * qpe_hs * e, pos[size_t(i)], &rot, &rot_err);
      if (!assemble) {
        expect_row(&q_pe_expect_, size_t(qh * qpe_hs * e), rot, rot_err, false, 1.0);
        continue;
      }
      want.assign(size_t(R), 0.0);
      err.assign(size_t(R), 0.0);
      for (int64_t k = 0; k < R; ++k)
        want[size_t(k)] = load_value(t, q_nope_->host.data() + (qh * nope_hs + k) * e);
      if (q_out_pe_) {
        expect_row(&q_out_pe_expect_, size_t(qh * out_pe_hs_ * (q_fp8 ? 1 : e)), rot, rot_err,
                   q_fp8, z.q_scale);
      } else {
        want.insert(want.end(), rot.begin(), rot.end());
        err.insert(err.end(), rot_err.begin(), rot_err.end());
      }
      expect_row(&q_out_expect_, size_t(qh * out_hs * (q_fp8 ? 1 : e)), want, err, q_fp8,
                 z.q_scale);
    }
  }
}

void MlaProblem::expect_row(std::vector<Expect>* out, size_t at, const std::vector<double>& want,
                            const std::vector<double>& err, bool fp8, double scale) const {
  const size_t step = fp8 ? 1 : size_t(detail::element_bytes(spec_.dtype));
  for (size_t k = 0; k < want.size(); ++k) {
    if (fp8) {
      // _smul: the code of value × scale (one fp32 product, like the division's one rounding).
      const bool mul = spec_.scale_multiplies;
      const double v = mul ? want[k] * scale : want[k] / scale;
      const double e = mul ? err[k] * scale : err[k] / scale;
      out->push_back({at + k * step, true, v, e + std::ldexp(std::fabs(v), -23)});
    } else {
      out->push_back({at + k * step, false, want[k], err[k]});
    }
  }
}

int64_t MlaProblem::block_stride(int64_t stride) const {
  return sizes_.block_size * stride + sizes_.block_gap;
}

int64_t MlaProblem::row_at(int64_t slot, int64_t stride) const {
  const int64_t bs = sizes_.block_size;
  if (bs == 0) return slot * stride;
  return slot / bs * block_stride(stride) + slot % bs * stride;
}

void MlaProblem::add_page_table(const std::vector<int64_t>& slots) {
  constexpr int64_t kBatch = 2;
  const int64_t ps = sizes_.page_size, pages = sizes_.cache_slots / ps, T = sizes_.tokens;
  std::vector<std::vector<int32_t>> entries(kBatch);  // each request's pages, in its order
  std::vector<int32_t> batch(size_t(T), 0), position(size_t(T), 0);
  std::vector<int64_t> bad;
  // A cached token gets an entry of its own in request t % 2: its page, at the position whose
  // page index is that entry and whose offset is the slot's in its page.
  for (int64_t i = 0; i < T; ++i) {
    const int64_t s = slots[size_t(i)], b = i % kBatch;
    batch[size_t(i)] = int32_t(b);
    if (s == -1) {
      batch[size_t(i)] = i % 2 ? -1 : int32_t(kBatch);  // padding: outside the batch
    } else if (s < 0 || s >= sizes_.cache_slots) {
      bad.push_back(i);
    } else {
      position[size_t(i)] = int32_t(int64_t(entries[size_t(b)].size()) * ps + s % ps);
      entries[size_t(b)].push_back(int32_t(s / ps));
    }
  }
  // Skipped: a page past the request's own entries, a negative position, a page past the cache.
  for (size_t k = 0; k < bad.size(); ++k) {
    const size_t i = size_t(bad[k]);
    std::vector<int32_t>& own = entries[size_t(batch[i])];
    if (k % 3 == 0) {
      position[i] = int32_t((int64_t(own.size()) + 2) * ps);
    } else if (k % 3 == 1) {
      position[i] = -1 - int32_t(k);
    } else {
      position[i] = int32_t(int64_t(own.size()) * ps + (ps - 1));
      own.push_back(int32_t(pages + int64_t(k)));
    }
  }
  std::vector<int32_t> indices, indptr{0};
  for (const auto& own : entries) {
    indices.insert(indices.end(), own.begin(), own.end());
    indptr.push_back(int32_t(indices.size()));
  }
  num_indices_ = int64_t(indices.size());
  if (indices.empty()) indices.push_back(0);  // a valid array no request refers to
  num_indices_ = std::max<int64_t>(num_indices_, 1);
  auto bytes = [](const std::vector<int32_t>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  kv_indices_ = &add(bytes(indices));
  kv_indptr_ = &add(bytes(indptr));
  batch_indices_ = &add(bytes(batch));
  page_positions_ = &add(bytes(position));
}

void MlaProblem::upload() { buffers_.upload(); }

MlaArgs MlaProblem::args(void* stream) const {
  const int64_t R = spec_.kv_rank, P = spec_.rope_dim;
  MlaArgs a;
  a.tokens = sizes_.tokens;
  a.heads = sizes_.heads;
  a.kv_c = device_pointer(kv_c_);
  a.kv_c_stride = round_up(R + sizes_.row_gap, 8);
  a.k_pe = device_pointer(k_pe_);
  a.k_pe_stride = P + sizes_.row_gap;
  a.norm_weight = spec_.norm == Norm::rms ? device_pointer(w_) : nullptr;
  a.norm_eps = sizes_.eps;
  if (sizes_.with_cache) {
    a.cache = device_pointer(cache_);
    a.cache_slots = sizes_.cache_slots;
    a.cache_stride = cache_stride_;
    switch (sizes_.addressing) {
      case MlaSizes::Addressing::slots:
        a.slots = static_cast<const int64_t*>(device_pointer(slots_));
        break;
      case MlaSizes::Addressing::rows_by_token:
        a.rows_by_token = true;
        break;
      case MlaSizes::Addressing::page_table:
        a.kv_indices = static_cast<const int32_t*>(device_pointer(kv_indices_));
        a.kv_indptr = static_cast<const int32_t*>(device_pointer(kv_indptr_));
        a.batch_indices = static_cast<const int32_t*>(device_pointer(batch_indices_));
        a.page_positions = static_cast<const int32_t*>(device_pointer(page_positions_));
        a.batch = 2;
        a.num_indices = num_indices_;
        a.page_size = sizes_.page_size;
        break;
    }
    if (cache_pe_) {
      a.cache_pe = device_pointer(cache_pe_);
      a.cache_pe_stride = cache_pe_stride_;
    }
    if (sizes_.block_size > 0) {
      a.cache_block_size = sizes_.block_size;
      a.cache_block_stride = block_stride(cache_stride_);
      a.cache_pe_block_stride = cache_pe_ ? block_stride(cache_pe_stride_) : 0;
    }
    if (k_pe_out_) {
      a.k_pe_out = device_pointer(k_pe_out_);
      a.k_pe_out_stride = kout_stride_;
    }
    a.cache_scale = spec_.cache_store == Store::e4m3
                        ? static_cast<const float*>(device_pointer(cache_scale_))
                        : nullptr;
    a.skipped = static_cast<int32_t*>(device_pointer(skipped_));
  }
  a.q_pe = device_pointer(q_pe_);
  a.q_pe_head_stride = P + sizes_.head_gap;
  a.q_pe_token_stride = sizes_.heads * a.q_pe_head_stride;
  if (spec_.query == MlaQuery::assemble) {
    a.q_nope = device_pointer(q_nope_);
    a.q_nope_head_stride = round_up(R + sizes_.head_gap, 8);
    a.q_nope_token_stride = sizes_.heads * a.q_nope_head_stride;
    a.q_out = device_pointer(q_out_);
    a.q_out_head_stride = out_hs_;
    a.q_out_token_stride = sizes_.heads * a.q_out_head_stride;
    if (q_out_pe_) {
      a.q_out_pe = device_pointer(q_out_pe_);
      a.q_out_pe_head_stride = out_pe_hs_;
      a.q_out_pe_token_stride = sizes_.heads * out_pe_hs_;
    }
    a.q_scale = spec_.q_store == Store::e4m3 ? static_cast<const float*>(device_pointer(q_scale_))
                                             : nullptr;
  }
  a.position_ids = device_pointer(ids_);
  a.cos = device_pointer(cos_);
  a.sin = device_pointer(sin_);
  a.table_rows = sizes_.table_rows;
  a.table_stride = spec_.rope_dim / 2 + sizes_.table_gap;
  a.stream = stream;
  return a;
}

void MlaProblem::check_buffer(const char* name, const Buffer& b,
                              const std::vector<uint8_t>& untouched,
                              const std::vector<Expect>& expect, CheckReport* r) const {
  const std::vector<uint8_t> got = DeviceBuffers::download(b);
  const DType t = spec_.dtype;
  const size_t e = size_t(detail::element_bytes(t));
  std::vector<bool> written(got.size(), false);
  auto fail = [&](const std::string& what) {
    ++r->mismatches;
    if (r->first_failure.empty()) r->first_failure = what;
  };
  for (const Expect& x : expect) {
    const size_t n = x.fp8 ? 1 : e;
    for (size_t k = 0; k < n; ++k) written[x.at + k] = true;
    const double have = x.fp8 ? e4m3_value(got[x.at]) : load_value(t, got.data() + x.at);
    ++r->checked;
    if (std::isnan(x.want)) {
      // The kernels' quiet NaN exactly: the poison is a NaN too, so "is NaN" would not show that
      // anything was written.
      uint32_t bits = got[x.at];
      if (!x.fp8) bits |= uint32_t(got[x.at + 1]) << 8;
      const uint32_t want_bits = x.fp8 ? 0x7fu : t == DType::bf16 ? 0x7fc0u : 0x7e00u;
      if (bits != want_bits)
        fail(detail::concat(name, " byte ", x.at, ": bits ", bits, ", expected the quiet NaN ",
                            want_bits, " (a position outside the table)"));
      continue;
    }
    const double lo = rounded(t, x.fp8, x.want - x.err), hi = rounded(t, x.fp8, x.want + x.err);
    r->max_abs_err = std::max(r->max_abs_err, std::fabs(have - x.want));
    if (!(have >= lo && have <= hi))
      fail(detail::concat(name, " byte ", x.at, ": got ", have, ", expected ", x.want, " +- ",
                          x.err, " rounded once (", lo, " .. ", hi, ")"));
  }
  for (size_t i = 0; i < got.size(); ++i)
    if (!written[i] && got[i] != untouched[i]) {
      fail(detail::concat(name, " byte ", i, " is not written by the call but changed (",
                          int(untouched[i]), " -> ", int(got[i]), ")"));
      break;
    }
}

CheckReport MlaProblem::check() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel");
  CheckReport r;
  check_buffer("cache", *cache_, cache_->host, cache_expect_, &r);
  if (spec_.query == MlaQuery::assemble)
    check_buffer("q_out", *q_out_, q_out_->host, q_out_expect_, &r);
  if (q_out_pe_) check_buffer("q_out_pe", *q_out_pe_, q_out_pe_->host, q_out_pe_expect_, &r);
  check_buffer("q_pe", *q_pe_, q_pe_->host, q_pe_expect_, &r);  // in place, or untouched
  if (cache_pe_) check_buffer("cache_pe", *cache_pe_, cache_pe_->host, cache_pe_expect_, &r);
  const bool k_in_place = sizes_.k_pe_out == MlaSizes::KpeOut::in_place;
  check_buffer("k_pe", *k_pe_, k_pe_->host, k_in_place ? k_pe_expect_ : std::vector<Expect>{},
               &r);  // in place, or untouched
  if (k_pe_out_ && !k_in_place)
    check_buffer("k_pe_out", *k_pe_out_, k_pe_out_->host, k_pe_expect_, &r);
  int32_t skipped = 0;
  detail::check(d.MemcpyDtoH(&skipped, skipped_->device, 4), "cuMemcpyDtoH");
  const int32_t want = sizes_.with_cache ? want_skipped_ : 0;
  if (skipped != want) {
    ++r.mismatches;
    if (r.first_failure.empty())
      r.first_failure = detail::concat("skipped count ", skipped, ", expected ", want);
  }
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace ropejit::oracle
