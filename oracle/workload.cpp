// Workload: random inputs, device buffers, and the float64 reference check.
#include "oracle/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "oracle/numbers.hpp"

namespace ropejit::oracle {

using detail::element_bytes;

namespace {

constexpr int64_t kGuardBytes = 256;  // poisoned bytes after every allocation
constexpr uint8_t kPoison = 0xff;     // NaN in f32, f16 and bf16

}  // namespace

Workload::Buffer& Workload::add_buffer(std::vector<uint8_t> host) {
  return buffers_.add(std::move(host), kGuardBytes, kPoison);
}

int Workload::buffer_index(const void* host) const {
  const int i = buffers_.index_of(host);
  if (i < 0) detail::fail(ErrorCode::internal, "workload: pointer outside its buffers");
  return i;
}

void Workload::add_output(const void* host, int kind, bool poison) {
  const int b = buffer_index(host);
  for (const Output& o : outputs_)
    if (o.buffer == b) return;  // packed q/k/v: one buffer, listed once
  outputs_.push_back({b, kind, poison});
}

Workload::Workload(const Spec& spec, const Sizes& sizes)
    : spec_(spec.canonical()), sizes_(sizes), rng_(sizes.seed) {
  const bool dense = spec_.layout != Layout::thd;
  int64_t total = 0;
  for (int64_t n : sizes.seq_lens) total += n;
  tokens_ = dense ? sizes.batch * sizes.seq_len : total + sizes.padding_tokens;
  host_args_.batch = dense ? sizes.batch : int64_t(sizes.seq_lens.size());
  host_args_.seq_len = dense ? sizes.seq_len : tokens_;
  host_args_.base = sizes.base;
  add_operands();
  add_tables(add_positions());
  if (spec_.fused()) add_fusion();
  add_scaling();
}

// q/k (and v) inputs: one packed buffer (q heads, k heads, v heads) or one buffer each;
// out-of-place outputs are separate, contiguous and poisoned (e4m3 for FP8 stores).
void Workload::add_operands() {
  const Spec& c = spec_;
  Args& a = host_args_;
  const int64_t e = element_bytes(c.dtype);
  const int64_t D = c.head_dim, row = D + sizes_.head_gap, m = sizes_.misalign_elems;
  const int32_t hq = sizes_.q_heads, hk = sizes_.k_heads;
  const bool with_v = c.cache != KvCache::none && sizes_.with_v && hk > 0;
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  auto make_input = [&](int64_t heads) -> Buffer& {
    std::vector<uint8_t> bytes(size_t((tokens_ * heads * row + m) * e));
    for (size_t i = 0; i < bytes.size(); i += size_t(e)) store_value(c.dtype, &bytes[i], uni(rng_));
    return add_buffer(std::move(bytes));
  };
  auto view = [&](Buffer& b, int64_t heads_in_buffer, int64_t first_head, int64_t heads) {
    Tensor t =
        contiguous(c.layout, b.host.data() + m * e, a.batch, a.seq_len, heads_in_buffer, row);
    t.data = static_cast<uint8_t*>(t.data) + first_head * t.stride_head * e;
    t.heads = heads;
    return t;
  };
  if (sizes_.packed_qkv) {
    const int64_t heads = hq + 2 * hk;
    Buffer& b = make_input(heads);
    a.q = view(b, heads, 0, hq);
    if (hk) a.k = view(b, heads, hq, hk);
    if (with_v) a.v = view(b, heads, hq + hk, hk);
  } else {
    a.q = view(make_input(hq), hq, 0, hq);
    if (hk) a.k = view(make_input(hk), hk, 0, hk);
    if (with_v) a.v = view(make_input(hk), hk, 0, hk);
  }
  // In place, the inputs are the outputs (a packed buffer's untouched heads are checked too).
  add_output(a.q.data, int(c.dtype), false);
  if (hk) add_output(a.k.data, int(c.dtype), false);
  if (c.in_place) return;
  const int64_t out_elem = is_fp8(c.out_store) ? 1 : e;
  const int out_kind = is_fp8(c.out_store) ? kE4m3 : int(c.dtype);
  auto make_output = [&](int64_t heads) -> Tensor {
    Buffer& b =
        add_buffer(std::vector<uint8_t>(size_t((tokens_ * heads * D + m) * out_elem), kPoison));
    add_output(b.host.data(), out_kind, true);
    return contiguous(c.layout, b.host.data() + m * out_elem, a.batch, a.seq_len, heads, D);
  };
  a.q_out = make_output(hq);
  const bool k_out = hk && c.fusion == Fusion::qk;
  if (k_out) a.k_out = make_output(hk);
  if (c.out_store != Store::e4m3_dynamic) return;
  // Dynamic FP8: a float scale per token and head, poisoned; with a packed QKV input, q's and
  // k's scales are views of one [tokens][q + k heads] tensor (distinct heads of one buffer).
  auto make_scales = [&](int64_t heads) -> uint8_t* {
    Buffer& b = add_buffer(std::vector<uint8_t>(size_t(tokens_ * heads * 4), kPoison));
    add_output(b.host.data(), int(DType::f32), true);
    return b.host.data();
  };
  auto scale_view = [&](uint8_t* data, int64_t heads_in_buffer, int64_t first, int64_t heads) {
    Tensor t = contiguous(c.layout, data, a.batch, a.seq_len, heads_in_buffer, 1);
    t.data = data + first * t.stride_head * 4;
    t.heads = heads;
    return t;
  };
  if (sizes_.packed_qkv && k_out) {
    uint8_t* both = make_scales(hq + hk);
    a.q_out_scale = scale_view(both, hq + hk, 0, hq);
    a.k_out_scale = scale_view(both, hq + hk, hq, hk);
  } else {
    a.q_out_scale = scale_view(make_scales(hq), hq, 0, hq);
    if (k_out) a.k_out_scale = scale_view(make_scales(hk), hk, 0, hk);
  }
}

// cu_seqlens (thd), then the positions of the key's mode; returns the largest position used.
int64_t Workload::add_positions() {
  const Spec& c = spec_;
  Args& a = host_args_;
  const bool dense = c.layout != Layout::thd;
  int64_t max_pos = 0;
  const int64_t max_random = sizes_.max_position > 0 ? sizes_.max_position
                             : sizes_.table_rows > 0 ? sizes_.table_rows - 1
                                                     : 4095;
  std::uniform_int_distribution<int64_t> pick(0, max_random);
  auto random_indices = [&](int64_t n) {
    const int64_t ib = c.index_type == IndexType::i64 ? 8 : 4;
    std::vector<uint8_t> bytes(size_t(n * ib));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = pick(rng_);
      max_pos = std::max(max_pos, v);
      if (ib == 8) {
        std::memcpy(&bytes[size_t(i * 8)], &v, 8);
      } else {
        const int32_t v32 = int32_t(v);
        std::memcpy(&bytes[size_t(i * 4)], &v32, 4);
      }
    }
    return add_buffer(std::move(bytes)).host.data();
  };
  if (!dense) {
    std::vector<uint8_t> bytes(size_t((a.batch + 1) * 4));
    int32_t at = 0;
    for (int64_t i = 0; i <= a.batch; ++i) {
      std::memcpy(&bytes[size_t(i * 4)], &at, 4);
      if (i < a.batch) at += int32_t(sizes_.seq_lens[size_t(i)]);
    }
    a.cu_seqlens = reinterpret_cast<const int32_t*>(add_buffer(std::move(bytes)).host.data());
  }
  int64_t longest = dense ? sizes_.seq_len : 0;
  for (int64_t n : sizes_.seq_lens) longest = std::max(longest, n);
  if (c.positions == Positions::offset) {
    a.position_offset = sizes_.position_offset;
    max_pos = sizes_.position_offset + std::max<int64_t>(longest, 1) - 1;
  } else if (c.positions == Positions::seq_offsets) {
    a.seq_offsets = random_indices(a.batch);
    max_pos += std::max<int64_t>(longest, 1) - 1;
  } else {
    // ids: one per token; mrope: three rows of them (temporal, height, width).
    a.position_ids = random_indices(c.positions == Positions::mrope ? 3 * tokens_ : tokens_);
  }
  return max_pos;
}

// Scaled variants' parameters (the variant's typical published values unless the sizes give
// them) and mRoPE's sections.
void Workload::add_scaling() {
  const Spec& c = spec_;
  Args& a = host_args_;
  const int32_t pairs = c.rotary_dim / 2;
  if (c.positions == Positions::mrope) {
    std::copy(sizes_.mrope_section, sizes_.mrope_section + 3, a.mrope_section);
    if (a.mrope_section[0] + a.mrope_section[1] + a.mrope_section[2] == 0) {
      a.mrope_section[1] = a.mrope_section[2] = pairs * 3 / 8;  // Qwen2-VL: 16, 24, 24 of 64
      a.mrope_section[0] = pairs - 2 * a.mrope_section[1];
    }
    a.mrope_interleaved = sizes_.mrope_interleaved;
  }
  if (c.freqs == Freqs::table || c.freqs == Freqs::computed) return;
  RopeScaling& s = a.scaling;
  s = sizes_.scaling;
  if (s.factor == 1.0) {
    switch (c.freqs) {
      case Freqs::linear:
        s.factor = 4;
        break;
      case Freqs::dynamic_ntk:
        s.factor = 2;
        s.original_max_positions = 2048;
        s.seq_len = 8192;
        break;
      case Freqs::llama3:
        s.factor = 8;
        s.low_freq_factor = 1;
        s.high_freq_factor = 4;
        s.original_max_positions = 8192;
        break;
      case Freqs::yarn:
        s.factor = 4;
        s.original_max_positions = 32768;
        break;
      case Freqs::longrope:
        s.factor = 32;
        s.original_max_positions = 4096;
        s.seq_len = 8192;
        break;
      default:
        break;
    }
  }
  if (c.freqs == Freqs::longrope) {
    std::uniform_real_distribution<double> short_f(1.0, 1.5), long_f(1.0, 8.0);
    short_factor_ = sizes_.short_factor;
    long_factor_ = sizes_.long_factor;
    while (int32_t(short_factor_.size()) < pairs) short_factor_.push_back(short_f(rng_));
    while (int32_t(long_factor_.size()) < pairs) long_factor_.push_back(long_f(rng_));
    s.short_factor = short_factor_.data();
    s.long_factor = long_factor_.data();
    s.factor_count = pairs;
  }
}

// cos/sin tables (table keys) covering positions up to `max_pos`, built in float64 and rounded
// once to the table dtype; half or full width, separate or one combined cos|sin row.
void Workload::add_tables(int64_t max_pos) {
  const Spec& c = spec_;
  Args& a = host_args_;
  const int64_t half = c.rotary_dim / 2, te = element_bytes(c.table_dtype);
  if (c.freqs != Freqs::table || half < 1) return;  // a canonical spec has half >= 1
  const int64_t width = c.table_width == TableWidth::half ? half : c.rotary_dim;
  a.table_rows = sizes_.table_rows > 0 ? sizes_.table_rows : max_pos + 1;
  const bool combined = sizes_.combined_table && c.table_width == TableWidth::half;
  a.table_stride = combined ? 2 * half : width;
  auto fill = [&](bool is_sin, uint8_t* base) {
    for (int64_t r = 0; r < a.table_rows; ++r)
      for (int64_t col = 0; col < width; ++col) {
        const int64_t pair = c.table_width == TableWidth::half ? col
                             : c.style == Style::neox          ? col % half
                                                               : col / 2;
        const double angle =
            double(r) * std::pow(sizes_.base, -2.0 * double(pair) / double(c.rotary_dim));
        store_value(c.table_dtype, base + (r * a.table_stride + col) * te,
                    is_sin ? std::sin(angle) : std::cos(angle));
      }
  };
  if (combined) {
    Buffer& b = add_buffer(std::vector<uint8_t>(size_t(a.table_rows * a.table_stride * te)));
    fill(false, b.host.data());
    fill(true, b.host.data() + half * te);
    a.cos = b.host.data();
    a.sin = b.host.data() + half * te;
    return;
  }
  Buffer& bc = add_buffer(std::vector<uint8_t>(size_t(a.table_rows * width * te)));
  fill(false, bc.host.data());
  a.cos = bc.host.data();
  Buffer& bs = add_buffer(std::vector<uint8_t>(size_t(a.table_rows * width * te)));
  fill(true, bs.host.data());
  a.sin = bs.host.data();
}

void Workload::upload() {
  const detail::Driver& d = detail::driver();
  buffers_.upload();
  // Out-of-place outputs hold the expected bytes on the host; their device copies start
  // poisoned. (Counters start as their host bytes: zero, then the guard.)
  for (const Output& o : outputs_) {
    const Buffer& b = buffers_[size_t(o.buffer)];
    if (o.poison) detail::check(d.MemsetD8(b.device, kPoison, b.host.size()), "cuMemsetD8");
  }
  // A copy from pageable memory may return before its last bytes land, and the memset runs
  // on the legacy stream: neither orders itself before a launch on a non-blocking stream
  // (the tuner's and the benchmark's), so wait for both here.
  detail::check(d.CtxSynchronize(), "uploading the workload (cuCtxSynchronize)");
}

void Workload::reset() {
  const detail::Driver& d = detail::driver();
  if (!buffers_.has_initial()) {
    upload();
    if (initial_failed_) return;
    // No room for a second copy: each reset uploads.
    initial_failed_ = !buffers_.keep_initial();
  } else {
    buffers_.restore_initial();
  }
  // The copies run on the legacy stream: done before a launch on the tuner's own stream.
  detail::check(d.CtxSynchronize(), "resetting the workload (cuCtxSynchronize)");
}

void Workload::drop_reset_copy() { buffers_.drop_initial(); }

Args Workload::args(void* stream) const {
  auto device = [&](const void* host) { return buffers_.device_address(host); };
  Args a = host_args_;
  a.q.data = device(a.q.data);
  a.k.data = device(a.k.data);
  a.q_out.data = device(a.q_out.data);
  a.k_out.data = device(a.k_out.data);
  a.seq_offsets = device(a.seq_offsets);
  a.position_ids = device(a.position_ids);
  a.cu_seqlens = static_cast<const int32_t*>(device(a.cu_seqlens));
  a.cos = device(a.cos);
  a.sin = device(a.sin);
  a.v.data = device(a.v.data);
  a.q_norm_weight = device(a.q_norm_weight);
  a.k_norm_weight = device(a.k_norm_weight);
  a.q_out_scale.data = device(a.q_out_scale.data);
  a.k_out_scale.data = device(a.k_out_scale.data);
  KvCacheArgs& k = a.cache;
  k.k_scales = static_cast<float*>(device(k.k_scales));
  k.v_scales = static_cast<float*>(device(k.v_scales));
  k.k = device(k.k);
  k.v = device(k.v);
  k.slot_mapping = static_cast<const int64_t*>(device(k.slot_mapping));
  k.indptr = static_cast<const int32_t*>(device(k.indptr));
  k.indices = static_cast<const int32_t*>(device(k.indices));
  k.last_page_len = static_cast<const int32_t*>(device(k.last_page_len));
  k.seq_lens = static_cast<const int32_t*>(device(k.seq_lens));
  k.skipped = static_cast<int32_t*>(device(k.skipped));
  a.stream = stream;
  return a;
}

const std::vector<std::vector<uint8_t>>& Workload::download() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel execution (cuCtxSynchronize)");
  downloaded_.resize(outputs_.size());
  for (size_t slot = 0; slot < outputs_.size(); ++slot) {
    const Buffer& b = buffers_[size_t(outputs_[slot].buffer)];
    downloaded_[slot].resize(b.host.size());
    detail::check(d.MemcpyDtoH(downloaded_[slot].data(), b.device, b.host.size()), "cuMemcpyDtoH");
  }
  return downloaded_;
}

namespace {

int64_t kind_bytes(int kind) { return kind == 3 ? 1 : kind == 4 ? 4 : element_bytes(DType(kind)); }

double kind_value(int kind, const uint8_t* p) {
  if (kind == 3) return e4m3_value(*p);
  if (kind == 4) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  return load_value(DType(kind), p);
}

}  // namespace

CheckReport Workload::check() {
  if (expect_.empty()) build_reference();
  download();
  CheckReport r;
  double err2 = 0, ref2 = 0;
  for (size_t slot = 0; slot < outputs_.size(); ++slot) {
    const Output& o = outputs_[slot];
    const int64_t e = kind_bytes(o.kind);
    const Buffer& b = buffers_[size_t(o.buffer)];
    const std::vector<uint8_t>& got = downloaded_[slot];
    for (size_t i = 0; i < got.size() / size_t(e); ++i) {
      const double tol = tol_[slot][i];
      const uint8_t* g = &got[i * size_t(e)];
      bool good;
      double value = 0, want = 0;
      if (tol < 0) {
        good = std::memcmp(g, &b.host[i * size_t(e)], size_t(e)) == 0;
        if (!good) {
          value = kind_value(o.kind, g);
          want = kind_value(o.kind, &b.host[i * size_t(e)]);
        }
      } else if (o.kind == kE4m3) {
        // Either rounding of the interval's ends (the kernel's fp32 value lies inside it): the
        // bits are exact wherever the interval holds no rounding boundary. An interval around
        // zero admits both zeros (compared as values: -0 == +0).
        want = expect_[slot][i];
        value = e4m3_value(*g);
        const uint8_t lo = e4m3_bits(want - tol), hi = e4m3_bits(want + tol);
        const double vlo = e4m3_value(lo), vhi = e4m3_value(hi);
        good = std::isnan(want) ? std::isnan(value)
                                : *g == lo || *g == hi || (value >= vlo && value <= vhi);
        if (!std::isnan(want)) {
          const double err = std::fabs(value - want);
          err2 += std::isnan(err) ? INFINITY : err * err;
          ref2 += want * want;
        }
      } else {
        value = kind_value(o.kind, g);
        want = expect_[slot][i];
        const double err = std::fabs(value - want);
        good = std::isnan(want) ? std::isnan(value) : err <= tol;
        if (!std::isnan(want)) {
          err2 += std::isnan(err) ? INFINITY : err * err;
          ref2 += want * want;
          r.max_abs_err = std::max(r.max_abs_err, std::isnan(err) ? INFINITY : err);
        }
      }
      ++r.checked;
      if (!good) {
        if (r.mismatches == 0)
          r.first_failure =
              detail::concat(spec_.key(), ": output buffer ", slot, " (",
                             o.kind == kE4m3  ? "e4m3"
                             : o.kind == kI32 ? "counter"
                                              : "values",
                             ") element ", i, " got ", value, " expected ", want,
                             tol < 0 ? " (exact bytes)" : " tolerance ", tol < 0 ? 0 : tol);
        ++r.mismatches;
      }
    }
  }
  r.max_rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
  r.ok = r.mismatches == 0;
  return r;
}

int64_t Workload::bytes_moved() const {
  const Spec& c = spec_;
  const int64_t e = element_bytes(c.dtype);
  int64_t bytes = 0;
  if (!c.fused()) {
    const int64_t heads = sizes_.q_heads + sizes_.k_heads;
    const int64_t per_head = c.in_place ? 2 * c.rotary_dim * e : 2 * c.head_dim * e;
    bytes = tokens_ * heads * per_head;
  } else {
    // Whole heads: q, k (and v) read once; q (and k) written once in their output's dtype;
    // k (and v) written once more into the cache.
    const int64_t D = c.head_dim, hq = sizes_.q_heads, hk = sizes_.k_heads;
    const int64_t hv = host_args_.v.data ? hk : 0;
    const int64_t out_e = is_fp8(c.out_store) ? 1 : e;
    const int64_t cache_e = is_fp8(c.cache_store) ? 1 : e;
    const int64_t written_k = c.fusion == Fusion::qk ? hk : 0;
    bytes = tokens_ * D * ((hq + hk + hv) * e + (hq + written_k) * out_e);
    if (c.cache != KvCache::none) bytes += tokens_ * D * (hk + hv) * cache_e;
    // Dynamic FP8: a float scale per token and head written.
    if (c.out_store == Store::e4m3_dynamic) bytes += tokens_ * (hq + written_k) * 4;
    if (c.cache_store == Store::e4m3_dynamic && c.cache != KvCache::none)
      bytes += tokens_ * (hk + hv) * 4;
    if (c.norm != Norm::none) bytes += 2 * D * e;
  }
  if (c.freqs == Freqs::table) bytes += tokens_ * c.rotary_dim * element_bytes(c.table_dtype);
  if (c.positions == Positions::ids) bytes += tokens_ * (c.index_type == IndexType::i64 ? 8 : 4);
  return bytes;
}

}  // namespace ropejit::oracle
