// The FFN gate/up problem and its float64 references.
//
// Fused kernel (templates/proj_kernel.cuh, GLU epilogue): the normalized activation
// a_k = round(x_k · w_k) is reproduced exactly (as the projection's reference does); the gate
// and up sums g, u carry the tensor-core dot error (K/16 + 16) · 2^-22 · Σ|a_k W_nk| and rstd's
// fp32 error; then act(g) · u in fp32: |act'| <= 1.2 times g's error, act's own error
// 8 · 2^-24 · (|act(g)| + |g| / 2) (expf / tanhf and the operations around them; gelu's
// 1 + tanh cancels for negative g, hence the |g| term), two fp32 products, one rounding.
//
// With e4m3 weights the products use the decoded codes (exact in the operand dtype) and each
// row's scale multiplies its fp32 sum: one more fp32 rounding of g and of u.
// The unfused path dequantizes first: W_nk = dtype(fp32(code · scale_n)), exactly reproduced
// here.
//
// Unfused path (RMSNorm key -> cuBLASLt -> GLU key): a_k = round((x_k · rstd) · w_k) with the
// neighbour allowed where float64 lies within rstd's error of a rounding boundary (as the
// projection's unfused reference); g and u from cuBLASLt ((K/8 + 64) · 2^-22 · Σ|a W|) each
// rounded to the dtype; act(g) · u on those, in fp32, rounded once.
#include "oracle/decode/ffn_workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "jit/decode/ffn.hpp"
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
  return t == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}
double abs_floor(DType t) { return t == DType::f16 ? std::ldexp(1.0, -25) : 1e-38; }

double act_of(Activation a, double g) {
  if (a == Activation::silu) return g / (1.0 + std::exp(-g));
  return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

}  // namespace

FfnProblem::Buffer& FfnProblem::add(std::vector<uint8_t> host) {
  return buffers_.add(std::move(host), kGuardBytes, kPoison);
}

FfnProblem::FfnProblem(const FfnSpec& spec, const FfnSizes& sizes)
    : spec_(spec.canonical()), sizes_(sizes), rng_(sizes.seed) {
  const FfnSpec& c = spec_;
  const FfnSizes& z = sizes_;
  const int64_t e = detail::element_bytes(c.dtype);
  x_stride_ = z.hidden + z.x_gap;
  w_stride_ = z.hidden + z.weight_gap;
  out_stride_ = z.intermediate + z.out_gap;
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  {
    std::vector<uint8_t> bytes(size_t(std::max<int64_t>(z.tokens, 1) * x_stride_ * e), kPoison);
    for (int64_t m = 0; m < z.tokens; ++m)
      for (int64_t k = 0; k < z.hidden; ++k)
        store_value(c.dtype, bytes.data() + (m * x_stride_ + k) * e, 2.0 * z.x_scale * unit(rng_));
    x_ = &add(std::move(bytes));
  }
  // Weights with a trained projection's variance (1/K), scaled up 3x so that the gate reaches
  // the activation's curved part. e4m3: every finite code equally likely (all exponents and the
  // subnormals) and a scale per row that brings the row to about that variance.
  const bool w8 = c.weights == Weights::e4m3;
  const int64_t we = w8 ? 1 : e;
  const double scale = 3.0 * std::sqrt(3.0 / double(z.hidden));
  std::uniform_int_distribution<int> code(0, 253);  // 254 finite codes: skip 0x7f and 0xff
  auto weights = [&](int64_t rows) {
    std::vector<uint8_t> bytes(size_t(rows * w_stride_ * we), kPoison);
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < z.hidden; ++k) {
        if (w8) {
          const int v = code(rng_);
          bytes[size_t(n * w_stride_ + k)] = uint8_t(v < 127 ? v : v + 1);
        } else {
          store_value(c.dtype, bytes.data() + (n * w_stride_ + k) * e, scale * unit(rng_));
        }
      }
    return bytes;
  };
  gate_ = &add(weights(z.packed ? 2 * z.intermediate : z.intermediate));
  if (!z.packed) up_ = &add(weights(z.intermediate));
  if (w8) {
    std::vector<uint8_t> scales(size_t(2 * z.intermediate) * 4);
    const double base = 3.0 * std::sqrt(1.0 / double(z.hidden)) / 100.0;  // codes' rms is ~100
    for (int64_t n = 0; n < 2 * z.intermediate; ++n) {
      const float v = float(base * (1.0 + 0.5 * unit(rng_)));
      std::memcpy(scales.data() + n * 4, &v, 4);
    }
    scale_ = &add(std::move(scales));
  }
  if (c.norm != Norm::none) {
    const bool one_plus = c.norm == Norm::rms_one_plus;
    std::vector<uint8_t> bytes(size_t(z.hidden * e));
    for (int64_t k = 0; k < z.hidden; ++k)
      store_value(c.dtype, bytes.data() + k * e,
                  one_plus ? 0.5 * unit(rng_) : 1.0 + 0.5 * unit(rng_));
    norm_ = &add(std::move(bytes));
  }
  out_ =
      &add(std::vector<uint8_t>(size_t(std::max<int64_t>(z.tokens, 1) * out_stride_ * e), kPoison));
  if (z.path != ProjPath::fused) {
    workspace_bytes_ = detail::ffn_workspace_bytes(c, z.tokens, z.hidden, z.intermediate);
    workspace_ = &add(std::vector<uint8_t>(workspace_bytes_, kPoison));
  }
  if (!z.reference) return;
  if (z.path != ProjPath::unfused) build_reference(false, &fused_);
  if (z.path != ProjPath::fused) build_reference(true, &unfused_);
}

void FfnProblem::build_reference(bool unfused, Expected* out) {
  const FfnSpec& c = spec_;
  const FfnSizes& z = sizes_;
  const int64_t K = z.hidden, I = z.intermediate;
  const int64_t e = detail::element_bytes(c.dtype);
  const double u32 = std::ldexp(1.0, -24);
  const double u_out = unit_roundoff(c.dtype);
  const double gamma = unfused ? (double(K) / 8 + 64) * std::ldexp(1.0, -22)
                               : (double(K) / 16 + 16) * std::ldexp(1.0, -22);
  const double rel_rstd = ((double(K) / 4 + 24) / 2 + 4) * u32;
  auto round_to = [&](double v) {
    return c.dtype == DType::bf16 ? bf16_value(bf16_bits(v)) : f16_value(f16_bits(v));
  };
  const bool w8 = c.weights == Weights::e4m3;
  const int64_t we = w8 ? 1 : e;
  const uint8_t* gate_rows = gate_->host.data();
  const uint8_t* up_rows = z.packed ? gate_->host.data() + I * w_stride_ * we : up_->host.data();
  out->value.assign(size_t(z.tokens * I), 0.0);
  out->tol.assign(size_t(z.tokens * I), 0.0);
  // The unfused path's dequantized e4m3 weights: every code's value per row (gate rows, then up
  // rows, as the scales), made once.
  const std::vector<double> deq =
      w8 && unfused ? dequantized_rows(c.dtype, scale_->host.data(), 2 * I) : std::vector<double>();
  // Every token's operand a_k (and, unfused, how far its rounding may move) and the factor on its
  // sums: the fused reference holds rstd · Σ (rstd applied to the sums), the unfused Σ of a_k.
  std::vector<double> a(static_cast<size_t>(z.tokens * K)),
      amb(static_cast<size_t>(z.tokens * K), 0.0), post(static_cast<size_t>(z.tokens), 1.0);
  for (int64_t m = 0; m < z.tokens; ++m) {
    const uint8_t* xr = x_->host.data() + m * x_stride_ * e;
    double sumsq = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double x = load_value(c.dtype, xr + k * e);
      sumsq += x * x;
    }
    const double rstd =
        c.norm == Norm::none ? 1.0 : 1.0 / std::sqrt(sumsq / double(K) + double(float(z.norm_eps)));
    if (!unfused) post[size_t(m)] = rstd;
    double* am = a.data() + m * K;
    double* ambm = amb.data() + m * K;
    for (int64_t k = 0; k < K; ++k) {
      const double x = load_value(c.dtype, xr + k * e);
      if (c.norm == Norm::none) {
        am[k] = x;
        continue;
      }
      double w = load_value(c.dtype, norm_->host.data() + k * e);
      if (c.norm == Norm::rms_one_plus) w = double(1.0f + float(w));
      if (!unfused) {
        // exactly the kernel's operand: the exact product rounded once (Gemma's form: its fp32
        // product first)
        am[k] = round_to(c.norm == Norm::rms_one_plus ? double(float(x * w)) : x * w);
      } else {
        const double v = x * rstd * w, slack = (rel_rstd + 3 * u32) * std::fabs(v);
        const double r = round_to(v);
        am[k] = r;
        ambm[k] = std::max(std::fabs(round_to(v - slack) - r), std::fabs(round_to(v + slack) - r));
      }
    }
  }
  // Each output column's gate and up rows are read into doubles once, then every token's sums
  // over them; columns spread over the host's cores.
  for_each_range(I, [&](int64_t begin, int64_t end) {
    std::vector<double> wv[2] = {std::vector<double>(static_cast<size_t>(K)),
                                 std::vector<double>(static_cast<size_t>(K))};
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* rows[2] = {gate_rows + n * w_stride_ * we, up_rows + n * w_stride_ * we};
      double row_scale[2] = {1, 1};
      for (int h = 0; h < 2; ++h) {
        // The unfused path multiplies each dequantized weight by its row's scale, the fused
        // kernel the row's sum.
        const double* row_values = deq.empty() ? nullptr : deq.data() + (h * I + n) * 256;
        for (int64_t k = 0; k < K; ++k)
          wv[h][size_t(k)] = !w8          ? load_value(c.dtype, rows[h] + k * e)
                             : row_values ? row_values[rows[h][k]]
                                          : e4m3_value(rows[h][k]);
        if (w8 && !unfused) {
          float scale = 1.0f;
          std::memcpy(&scale, scale_->host.data() + (h * I + n) * 4, 4);
          row_scale[h] = scale;
        }
      }
      for (int64_t m = 0; m < z.tokens; ++m) {
        const double* am = a.data() + m * K;
        const double* ambm = amb.data() + m * K;
        double sum[2] = {0, 0}, mag[2] = {0, 0}, amg[2] = {0, 0};
        for (int h = 0; h < 2; ++h)
          for (int64_t k = 0; k < K; ++k) {
            const double w = wv[h][size_t(k)];
            sum[h] += am[k] * w;
            mag[h] += std::fabs(am[k] * w);
            amg[h] += ambm[k] * std::fabs(w);
          }
        double v[2], err[2];
        for (int h = 0; h < 2; ++h) {
          v[h] = post[size_t(m)] * row_scale[h] * sum[h];
          err[h] = post[size_t(m)] * row_scale[h] * (gamma * mag[h] + amg[h]);
          if (!unfused && c.norm != Norm::none) err[h] += (rel_rstd + u32) * std::fabs(v[h]);
          if (w8 && !unfused) err[h] += u32 * std::fabs(v[h]);  // the fp32 sum · scale
          if (unfused) err[h] = u_out * std::fabs(v[h]) + (1 + u_out) * err[h];  // rounded product
        }
        const double act = act_of(c.act, v[0]);
        const double value = act * v[1];
        const double act_err = 1.2 * err[0] + 8 * u32 * (std::fabs(act) + 0.5 * std::fabs(v[0]));
        const double e_total = act_err * (std::fabs(v[1]) + err[1]) + std::fabs(act) * err[1] +
                               2 * u32 * std::fabs(value);
        const size_t at = size_t(m * I + n);
        out->value[at] = value;
        out->tol[at] = u_out * std::fabs(value) + (1 + u_out) * e_total + abs_floor(c.dtype);
      }
    }
  });
}

void FfnProblem::upload() { buffers_.upload(); }

FfnArgs FfnProblem::args(void* stream) const {
  const FfnSizes& z = sizes_;
  const int64_t e = detail::element_bytes(spec_.dtype);
  FfnArgs a;
  a.tokens = z.tokens;
  a.hidden = z.hidden;
  a.intermediate = z.intermediate;
  a.x = device_pointer(x_);
  a.x_stride = x_stride_;
  a.norm_weight = device_pointer(norm_);
  a.norm_eps = z.norm_eps;
  a.gate_weight = device_pointer(gate_);
  const int64_t we = spec_.weights == Weights::e4m3 ? 1 : e;
  a.up_weight = z.packed
                    ? static_cast<char*>(device_pointer(gate_)) + z.intermediate * w_stride_ * we
                    : device_pointer(up_);
  a.weight_stride = w_stride_;
  if (scale_) {
    a.gate_scale = static_cast<const float*>(device_pointer(scale_));
    a.up_scale = a.gate_scale + z.intermediate;
  }
  a.out = device_pointer(out_);
  a.out_stride = out_stride_;
  a.path = z.path;
  a.workspace = device_pointer(workspace_);
  a.workspace_bytes = workspace_bytes_;
  a.stream = stream;
  return a;
}

int64_t FfnProblem::weight_bytes() const {
  if (spec_.weights == Weights::e4m3)
    return 2 * sizes_.intermediate * sizes_.hidden + 2 * sizes_.intermediate * 4;
  return 2 * sizes_.intermediate * sizes_.hidden * detail::element_bytes(spec_.dtype);
}

int64_t FfnProblem::bytes_moved() const {
  const int64_t e = detail::element_bytes(spec_.dtype);
  return weight_bytes() + sizes_.tokens * (sizes_.hidden + sizes_.intermediate) * e +
         (spec_.norm != Norm::none ? sizes_.hidden * e : 0);
}

CheckReport FfnProblem::check_as(ProjPath path) { return check_on_path(*this, &sizes_.path, path); }

CheckReport FfnProblem::check() {
  const detail::Driver& d = detail::driver();
  detail::check(d.CtxSynchronize(), "kernel");
  if (!sizes_.reference)
    detail::invalid("FfnProblem::check: the problem was made without a reference");
  const std::vector<uint8_t> got = DeviceBuffers::download(*out_);
  CheckReport r;
  if (sizes_.path != ProjPath::unfused) {
    r = compare(fused_, got);
    matched_ = ProjPath::fused;
  }
  if (sizes_.path == ProjPath::unfused || (sizes_.path == ProjPath::automatic && !r.ok)) {
    CheckReport u = compare(unfused_, got);
    if (sizes_.path == ProjPath::unfused || u.ok) {
      r = u;
      matched_ = ProjPath::unfused;
    }
  }
  if (workspace_) {
    std::vector<uint8_t> guard(kGuardBytes);
    detail::check(d.MemcpyDtoH(guard.data(), workspace_->device + workspace_bytes_, kGuardBytes),
                  "cuMemcpyDtoH");
    if (std::any_of(guard.begin(), guard.end(), [](uint8_t b) { return b != kPoison; })) {
      ++r.mismatches;
      r.ok = false;
      if (r.first_failure.empty()) r.first_failure = "the guard after the workspace was written";
    }
  }
  return r;
}

CheckReport FfnProblem::compare(const Expected& want, const std::vector<uint8_t>& got) const {
  const FfnSizes& z = sizes_;
  const int64_t e = detail::element_bytes(spec_.dtype);
  CheckReport r;
  double err2 = 0, ref2 = 0;
  std::vector<bool> addressed(got.size() / size_t(e), false);
  for (int64_t m = 0; m < z.tokens; ++m)
    for (int64_t n = 0; n < z.intermediate; ++n) {
      const int64_t at = m * out_stride_ + n;
      addressed[size_t(at)] = true;
      const size_t ref_at = size_t(m * z.intermediate + n);
      const double w = want.value[ref_at], tol = want.tol[ref_at];
      const double have = load_value(spec_.dtype, got.data() + at * e);
      ++r.checked;
      if (std::isfinite(have)) {
        err2 += (have - w) * (have - w);
        ref2 += w * w;
        r.max_abs_err = std::max(r.max_abs_err, std::fabs(have - w));
      }
      if (!(std::fabs(have - w) <= tol)) {
        ++r.mismatches;
        if (r.first_failure.empty())
          r.first_failure = detail::concat("token ", m, " column ", n, ": got ", have,
                                           ", expected ", w, " +- ", tol);
      }
    }
  for (size_t i = 0; i < got.size(); ++i) {
    if (i / size_t(e) < addressed.size() && addressed[i / size_t(e)]) continue;
    if (got[i] != kPoison) {
      ++r.mismatches;
      if (r.first_failure.empty())
        r.first_failure =
            detail::concat("output byte ", i, " is outside every output element but was written");
      break;
    }
  }
  r.max_rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace ropejit::oracle
