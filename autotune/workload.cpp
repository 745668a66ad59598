// Workload: random inputs, device buffers, and the float64 reference check.
#include "autotune/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "autotune/numbers.hpp"
#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"

namespace ropejit::autotune {

using detail::element_bytes;

namespace {

constexpr int64_t kGuardBytes = 256;  // poisoned bytes after every allocation
constexpr uint8_t kPoison = 0xff;     // NaN in f32, f16 and bf16

void store(DType t, uint8_t* p, double v) {
  switch (t) {
    case DType::f32: {
      const float f = f32_value(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::f16: {
      const uint16_t h = f16_bits(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::bf16: {
      const uint16_t b = bf16_bits(v);
      std::memcpy(p, &b, 2);
      break;
    }
  }
}

double load(DType t, const uint8_t* p) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_value(h);
    }
    case DType::bf16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_value(b);
    }
  }
  return 0;
}

// Half an ulp of dtype at magnitude x: the error of one correct rounding.
double half_ulp(DType t, double x) {
  const int mant = t == DType::f32 ? 23 : t == DType::f16 ? 10 : 7;
  const double tiny = t == DType::f32 ? 0x1p-150 : t == DType::f16 ? 0x1p-25 : 0x1p-134;
  if (x == 0) return tiny;
  return std::max(tiny, std::ldexp(1.0, std::ilogb(x) - mant - 1));
}

}  // namespace

struct Workload::Buffer {
  std::vector<uint8_t> host;
  CUdeviceptr device = 0;
};

Workload::Buffer& Workload::add_buffer(std::vector<uint8_t> host) {
  host.resize(host.size() + kGuardBytes, kPoison);
  buffers_.push_back(new Buffer{std::move(host), 0});
  return *buffers_.back();
}

Workload::~Workload() {
  std::string why;
  const detail::Driver* d = detail::try_driver(&why);
  for (Buffer* b : buffers_) {
    if (b->device && d) d->MemFree(b->device);
    delete b;
  }
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
}

// q/k inputs: one packed buffer (q heads, k heads, an untouched v) or one buffer each;
// out-of-place outputs are separate, contiguous and poisoned.
void Workload::add_operands() {
  const Spec& c = spec_;
  Args& a = host_args_;
  const int64_t e = element_bytes(c.dtype);
  const int64_t D = c.head_dim, row = D + sizes_.head_gap, m = sizes_.misalign_elems;
  const int32_t hq = sizes_.q_heads, hk = sizes_.k_heads;
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  auto make_input = [&](int64_t heads) -> Buffer& {
    std::vector<uint8_t> bytes(size_t((tokens_ * heads * row + m) * e));
    for (size_t i = 0; i < bytes.size(); i += size_t(e)) store(c.dtype, &bytes[i], uni(rng_));
    return add_buffer(std::move(bytes));
  };
  auto view = [&](Buffer& b, int64_t heads_in_buffer, int64_t first_head, int64_t heads) {
    Tensor t =
        contiguous(c.layout, b.host.data() + m * e, a.batch, a.seq_len, heads_in_buffer, row);
    t.data = static_cast<uint8_t*>(t.data) + first_head * t.stride_head * e;
    t.heads = heads;
    return t;
  };
  std::vector<int> inputs;
  if (sizes_.packed_qkv) {
    const int64_t heads = hq + 2 * hk;
    Buffer& b = make_input(heads);
    inputs.push_back(int(buffers_.size()) - 1);
    a.q = view(b, heads, 0, hq);
    if (hk) a.k = view(b, heads, hq, hk);
  } else {
    a.q = view(make_input(hq), hq, 0, hq);
    inputs.push_back(int(buffers_.size()) - 1);
    if (hk) {
      a.k = view(make_input(hk), hk, 0, hk);
      inputs.push_back(int(buffers_.size()) - 1);
    }
  }
  if (c.in_place) {
    output_buffers_ = inputs;
    return;
  }
  auto make_output = [&](int64_t heads) -> Tensor {
    Buffer& b = add_buffer(std::vector<uint8_t>(size_t((tokens_ * heads * D + m) * e), kPoison));
    output_buffers_.push_back(int(buffers_.size()) - 1);
    return contiguous(c.layout, b.host.data() + m * e, a.batch, a.seq_len, heads, D);
  };
  a.q_out = make_output(hq);
  if (hk) a.k_out = make_output(hk);
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
    a.position_ids = random_indices(tokens_);
  }
  return max_pos;
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
        store(c.table_dtype, base + (r * a.table_stride + col) * te,
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

void Workload::build_reference() {
  const Spec& c = spec_;
  const Args& a = host_args_;
  const bool dense = c.layout != Layout::thd;
  const int64_t e = element_bytes(c.dtype), half = c.rotary_dim / 2;
  expect_.clear();
  tol_.clear();
  for (int idx : output_buffers_) {
    const size_t n = buffers_[size_t(idx)]->host.size() / size_t(e);
    expect_.emplace_back(n, 0.0);
    tol_.emplace_back(n, -1.0);
  }
  // Output element index of a host pointer inside output buffer `slot`.
  auto locate = [&](const uint8_t* p, int* slot) {
    for (size_t i = 0; i < output_buffers_.size(); ++i) {
      const std::vector<uint8_t>& h = buffers_[size_t(output_buffers_[i])]->host;
      if (p >= h.data() && p < h.data() + h.size()) {
        *slot = int(i);
        return (p - h.data()) / e;
      }
    }
    detail::fail(ErrorCode::internal, "workload reference: pointer outside the outputs");
  };
  auto index_at = [&](const void* base, int64_t i) -> int64_t {
    if (c.index_type == IndexType::i64) return static_cast<const int64_t*>(base)[i];
    return static_cast<const int32_t*>(base)[i];
  };
  for (int64_t t = 0; t < tokens_; ++t) {
    int64_t b = 0, s = t;
    bool valid = true;
    if (dense) {
      b = t / a.seq_len;
      s = t % a.seq_len;
    } else if (c.positions != Positions::ids) {
      valid = t >= a.cu_seqlens[0] && t < a.cu_seqlens[a.batch];
      while (valid && a.cu_seqlens[b + 1] <= t) ++b;
      s = t - a.cu_seqlens[b];
    }
    const int64_t pos = c.positions == Positions::ids           ? index_at(a.position_ids, t)
                        : c.positions == Positions::seq_offsets ? s + index_at(a.seq_offsets, b)
                                                                : s + a.position_offset;
    for (int op = 0; op < 2; ++op) {
      const Tensor& in = op == 0 ? a.q : a.k;
      const Tensor& out = c.in_place ? in : (op == 0 ? a.q_out : a.k_out);
      if (!in.data) continue;
      for (int64_t h = 0; h < in.heads; ++h) {
        auto offset = [&](const Tensor& x) {
          return (dense ? b * x.stride_batch + s * x.stride_seq : t * x.stride_seq) +
                 h * x.stride_head;
        };
        const uint8_t* src = static_cast<const uint8_t*>(in.data) + offset(in) * e;
        int slot = 0;
        const int64_t dst = locate(static_cast<const uint8_t*>(out.data) + offset(out) * e, &slot);
        std::vector<double>& ex = expect_[size_t(slot)];
        std::vector<double>& tl = tol_[size_t(slot)];
        std::vector<uint8_t>& exact = buffers_[size_t(output_buffers_[size_t(slot)])]->host;
        if (!c.in_place)  // pass-through elements: the input's bytes, copied exactly
          std::memcpy(&exact[size_t(dst * e)], src, size_t(c.head_dim * e));
        if (!valid) continue;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = c.style == Style::neox ? i : 2 * i;
          const int64_t ib = c.style == Style::neox ? i + half : 2 * i + 1;
          double cs, sn;
          if (c.freqs == Freqs::computed) {
            const double angle =
                double(pos) * std::pow(a.base, -2.0 * double(i) / double(c.rotary_dim));
            cs = std::cos(angle);
            sn = std::sin(angle);
          } else if (pos < 0 || pos >= a.table_rows) {
            cs = sn = NAN;
          } else {
            const int64_t col =
                (c.table_width == TableWidth::full && c.style == Style::gptj) ? 2 * i : i;
            const int64_t te = element_bytes(c.table_dtype);
            cs = load(c.table_dtype,
                      static_cast<const uint8_t*>(a.cos) + (pos * a.table_stride + col) * te);
            sn = load(c.table_dtype,
                      static_cast<const uint8_t*>(a.sin) + (pos * a.table_stride + col) * te);
          }
          if (c.direction == Direction::backward) sn = -sn;
          const double x = load(c.dtype, src + ia * e), y = load(c.dtype, src + ib * e);
          const double rx = x * cs - y * sn, ry = y * cs + x * sn;
          // fp32 arithmetic (product + fma, generously 1 ulp each), the 2.5e-7 bound on
          // computed cos/sin, then one rounding to the output dtype.
          const double arith = 0x1p-23 * (std::fabs(x * cs) + std::fabs(y * sn));
          const double arith_y = 0x1p-23 * (std::fabs(y * cs) + std::fabs(x * sn));
          const double freq =
              c.freqs == Freqs::computed ? 2.5e-7 * (std::fabs(x) + std::fabs(y)) : 0.0;
          ex[size_t(dst + ia)] = rx;
          ex[size_t(dst + ib)] = ry;
          tl[size_t(dst + ia)] = arith + freq + half_ulp(c.dtype, std::fabs(rx) + arith + freq);
          tl[size_t(dst + ib)] = arith_y + freq + half_ulp(c.dtype, std::fabs(ry) + arith_y + freq);
        }
      }
    }
  }
}

void Workload::upload() {
  const detail::Driver& d = detail::driver();
  for (Buffer* b : buffers_) {
    if (!b->device) detail::check(d.MemAlloc(&b->device, b->host.size()), "cuMemAlloc");
    detail::check(d.MemcpyHtoD(b->device, b->host.data(), b->host.size()), "cuMemcpyHtoD");
  }
  // Output buffers of out-of-place calls hold the expected pass-through bytes on the host;
  // the device copies must start poisoned.
  if (!spec_.in_place)
    for (int idx : output_buffers_)
      detail::check(
          d.MemsetD8(buffers_[size_t(idx)]->device, kPoison, buffers_[size_t(idx)]->host.size()),
          "cuMemsetD8");
  // A copy from pageable memory may return before its last bytes land, and the memset runs
  // on the legacy stream: neither orders itself before a launch on a non-blocking stream
  // (the tuner's and the benchmark's), so wait for both here.
  detail::check(d.CtxSynchronize(), "uploading the workload (cuCtxSynchronize)");
}

Args Workload::args(void* stream) const {
  auto device = [&](const void* host) -> void* {
    if (!host) return nullptr;
    const uint8_t* p = static_cast<const uint8_t*>(host);
    for (const Buffer* b : buffers_)
      if (p >= b->host.data() && p < b->host.data() + b->host.size())
        return reinterpret_cast<void*>(b->device + CUdeviceptr(p - b->host.data()));
    detail::fail(ErrorCode::internal, "workload: pointer outside its buffers");
  };
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
  a.stream = stream;
  return a;
}

const std::vector<std::vector<uint8_t>>& Workload::download() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel execution (cuCtxSynchronize)");
  downloaded_.resize(output_buffers_.size());
  for (size_t slot = 0; slot < output_buffers_.size(); ++slot) {
    const Buffer& b = *buffers_[size_t(output_buffers_[slot])];
    downloaded_[slot].resize(b.host.size());
    detail::check(d.MemcpyDtoH(downloaded_[slot].data(), b.device, b.host.size()), "cuMemcpyDtoH");
  }
  return downloaded_;
}

CheckReport Workload::check() {
  if (expect_.empty()) build_reference();
  download();
  const int64_t e = element_bytes(spec_.dtype);
  CheckReport r;
  double err2 = 0, ref2 = 0;
  for (size_t slot = 0; slot < output_buffers_.size(); ++slot) {
    const Buffer& b = *buffers_[size_t(output_buffers_[slot])];
    const std::vector<uint8_t>& got = downloaded_[slot];
    for (size_t i = 0; i < got.size() / size_t(e); ++i) {
      const double tol = tol_[slot][i];
      const uint8_t* g = &got[i * size_t(e)];
      bool good;
      double value = 0, want = 0;
      if (tol < 0) {
        good = std::memcmp(g, &b.host[i * size_t(e)], size_t(e)) == 0;
        if (!good) {
          value = load(spec_.dtype, g);
          want = load(spec_.dtype, &b.host[i * size_t(e)]);
        }
      } else {
        value = load(spec_.dtype, g);
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
          r.first_failure = detail::concat(
              spec_.key(), ": output buffer ", slot, " element ", i, " got ", value, " expected ",
              want, tol < 0 ? " (exact bytes)" : " tolerance ", tol < 0 ? 0 : tol);
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
  const int64_t heads = sizes_.q_heads + sizes_.k_heads;
  const int64_t per_head = c.in_place ? 2 * c.rotary_dim * e : 2 * c.head_dim * e;
  int64_t bytes = tokens_ * heads * per_head;
  if (c.freqs == Freqs::table) bytes += tokens_ * c.rotary_dim * element_bytes(c.table_dtype);
  if (c.positions == Positions::ids) bytes += tokens_ * (c.index_type == IndexType::i64 ? 8 : 4);
  return bytes;
}

}  // namespace ropejit::autotune
