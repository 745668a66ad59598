// The RMSNorm problem and its float64 reference. The residual sum is fp32 then rounded once
// (reproduced bit for bit); the output's tolerance: one rounding to the dtype, plus Σx² in fp32
// (a chain of at most hidden / 256 + 8 terms per thread, then 10 shuffle levels), a division,
// a square root and two fp32 products.
#include "oracle/decode/norm_workload.hpp"

#include <algorithm>
#include <cmath>

#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "oracle/numbers.hpp"

namespace ropejit::oracle {
namespace {

constexpr uint8_t kPoison = 0xff;
constexpr size_t kGuardBytes = 256;

double round_to(DType t, double v) {
  return t == DType::bf16  ? bf16_value(bf16_bits(v))
         : t == DType::f16 ? f16_value(f16_bits(v))
                           : double(float(v));
}

}  // namespace

NormProblem::Buffer& NormProblem::add(std::vector<uint8_t> host) {
  return buffers_.add(std::move(host), kGuardBytes, kPoison);
}

NormProblem::NormProblem(const RmsNormSpec& spec, const NormSizes& sizes)
    : spec_(spec.canonical()), sizes_(sizes) {
  const DType t = spec_.dtype;
  const int64_t e = detail::element_bytes(t), K = sizes.hidden,
                rows = std::max<int64_t>(sizes.rows, 1);
  stride_ = K + sizes.gap;
  std::mt19937_64 rng(sizes.seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  auto matrix = [&](double scale) {
    std::vector<uint8_t> bytes(size_t(rows * stride_ * e), kPoison);
    for (int64_t r = 0; r < sizes.rows; ++r)
      for (int64_t k = 0; k < K; ++k)
        store_value(t, bytes.data() + (r * stride_ + k) * e, scale * unit(rng));
    return bytes;
  };
  x_ = &add(matrix(2.0 * sizes.x_scale));
  if (spec_.residual) residual_ = &add(matrix(2.0 * sizes.x_scale));
  {
    std::vector<uint8_t> w(size_t(K * e));
    const bool one_plus = spec_.norm == Norm::rms_one_plus;
    for (int64_t k = 0; k < K; ++k)
      store_value(t, w.data() + k * e, one_plus ? 0.5 * unit(rng) : 1.0 + 0.5 * unit(rng));
    w_ = &add(std::move(w));
  }
  out_ = sizes.in_place ? x_ : &add(std::vector<uint8_t>(size_t(rows * stride_ * e), kPoison));

  // The reference.
  if (residual_) want_residual_ = residual_->host;
  want_.assign(size_t(sizes.rows * K), 0.0);
  tol_.assign(size_t(sizes.rows * K), 0.0);
  const double u = t == DType::bf16  ? std::ldexp(1.0, -8)
                   : t == DType::f16 ? std::ldexp(1.0, -11)
                                     : std::ldexp(1.0, -24);
  const double rel = ((double(K) / 256 + 18) / 2 + 3) * std::ldexp(1.0, -24);
  const double floor = t == DType::f16 ? std::ldexp(1.0, -25) : 1e-38;
  std::vector<double> s(static_cast<size_t>(K));
  for (int64_t r = 0; r < sizes.rows; ++r) {
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = (r * stride_ + k) * e;
      double v = load_value(t, x_->host.data() + at);
      if (residual_) {
        const float sum = float(v) + float(load_value(t, residual_->host.data() + at));
        v = round_to(t, double(sum));
        store_value(t, want_residual_.data() + at, v);
      }
      s[size_t(k)] = v;
      ss += v * v;
    }
    const double rstd = 1.0 / std::sqrt(ss / double(K) + double(float(sizes.eps)));
    for (int64_t k = 0; k < K; ++k) {
      double w = load_value(t, w_->host.data() + k * e);
      if (spec_.norm == Norm::rms_one_plus) w = double(1.0f + float(w));
      const double y = s[size_t(k)] * rstd * w;
      want_[size_t(r * K + k)] = y;
      tol_[size_t(r * K + k)] = u * std::fabs(y) + (1 + u) * rel * std::fabs(y) + floor;
    }
  }
}

void NormProblem::upload() { buffers_.upload(); }

RmsNormArgs NormProblem::args(void* stream) const {
  RmsNormArgs a;
  a.rows = sizes_.rows;
  a.hidden = sizes_.hidden;
  a.x = reinterpret_cast<const void*>(x_->device);
  a.x_stride = stride_;
  a.residual = residual_ ? reinterpret_cast<void*>(residual_->device) : nullptr;
  a.residual_stride = stride_;
  a.weight = reinterpret_cast<const void*>(w_->device);
  a.norm_eps = sizes_.eps;
  a.out = reinterpret_cast<void*>(out_->device);
  a.out_stride = stride_;
  a.stream = stream;
  return a;
}

int64_t NormProblem::bytes_moved() const {
  const int64_t row = sizes_.rows * sizes_.hidden * detail::element_bytes(spec_.dtype);
  return 2 * row + (spec_.residual ? 2 * row : 0);
}

CheckReport NormProblem::check() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel");
  const DType t = spec_.dtype;
  const int64_t e = detail::element_bytes(t), K = sizes_.hidden;
  CheckReport r;
  const std::vector<uint8_t> got = DeviceBuffers::download(*out_);
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < got.size(); i += size_t(e)) {
    const int64_t el = int64_t(i) / e, row = el / stride_, k = el % stride_;
    const bool addressed = row < sizes_.rows && k < K && i + size_t(e) <= got.size() &&
                           int64_t(i) < sizes_.rows * stride_ * e;
    if (!addressed) {
      // Gaps and the guard: untouched (poison, or x's own bytes when in place).
      for (size_t b = i; b < std::min(got.size(), i + size_t(e)); ++b)
        if (got[b] != out_->host[b]) {
          ++r.mismatches;
          if (r.first_failure.empty())
            r.first_failure = detail::concat("out byte ", b, " is outside every row but changed");
        }
      continue;
    }
    const double want = want_[size_t(row * K + k)], tol = tol_[size_t(row * K + k)];
    const double have = load_value(t, got.data() + i);
    ++r.checked;
    err2 += (have - want) * (have - want);
    ref2 += want * want;
    r.max_abs_err = std::max(r.max_abs_err, std::fabs(have - want));
    if (!(std::fabs(have - want) <= tol)) {
      ++r.mismatches;
      if (r.first_failure.empty())
        r.first_failure = detail::concat("row ", row, " element ", k, ": got ", have, ", expected ",
                                         want, " +- ", tol);
    }
  }
  if (residual_) {
    const std::vector<uint8_t> res = DeviceBuffers::download(*residual_);
    for (size_t b = 0; b < res.size(); ++b)
      if (res[b] != want_residual_[b]) {
        ++r.mismatches;
        if (r.first_failure.empty())
          r.first_failure = detail::concat("residual byte ", b, " is ", int(res[b]), ", expected ",
                                           int(want_residual_[b]), " (x + residual rounded once)");
        break;
      }
  }
  r.max_rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace ropejit::oracle
