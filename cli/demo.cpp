// `ropejit demo`: the whole path once, end to end, with honest numbers.
#include <chrono>
#include <cstdio>

#include "api/engine.hpp"
#include "autotune/timing.hpp"
#include "cli/cli.hpp"
#include "cli/presets.hpp"
#include "jit/coverage.hpp"
#include "jit/driver.hpp"
#include "jit/names.hpp"
#include "oracle/workload.hpp"

namespace ropejit::cli {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_demo(const DemoOptions& o) {
  const ModelRope model = model_for(o.preset, o.hf_config);
  const std::string name = o.hf_config.empty() ? o.preset : o.hf_config;
  const std::string note = o.hf_config.empty() ? find_preset(o.preset).note : describe(model);
  if (o.tokens < 1) detail::invalid("--tokens (", o.tokens, ") must be >= 1");
  // The demo runs plain RoPE at the model's shape with per-token position ids (mRoPE models'
  // text tokens have one position in all three rows; QK-norm is a separate fused key).
  Spec spec = spec_from_model(model, detail::parse_name<DType>(o.dtype, "--dtype"));
  spec.positions = Positions::ids;
  spec.norm = Norm::none;
  spec = spec.canonical();
  std::printf("ropejit demo: %s (%s), %lld tokens, q %d heads, k %d heads\nkey %s\n", name.c_str(),
              note.c_str(), static_cast<long long>(o.tokens), model.q_heads, model.kv_heads,
              spec.key().c_str());

  std::string why;
  if (!detail::try_driver(&why)) {
    const detail::EngineStats before = api::engine().stats();
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> files = precompile(spec, "sm_90");
    const bool hit = api::engine().stats().nvrtc_compiles == before.nvrtc_compiles;
    std::printf("%s for sm_90 in %.1f ms -> %s\n", hit ? "loaded from the disk cache" : "compiled",
                ms_since(t0), files[0].empty() ? "(memory only)" : files[0].c_str());
    std::printf("GPU part SKIPPED: %s\n", why.c_str());
    return 0;
  }

  detail::use_primary_context(0);
  oracle::Sizes sizes;
  sizes.batch = 1;
  // The model's own frequency scaling (its factors, when longrope).
  sizes.scaling = model.scaling;
  const int32_t pairs = spec.rotary_dim / 2;
  if (model.scaling.short_factor)
    sizes.short_factor.assign(model.scaling.short_factor, model.scaling.short_factor + pairs);
  if (model.scaling.long_factor)
    sizes.long_factor.assign(model.scaling.long_factor, model.scaling.long_factor + pairs);
  sizes.seq_len = o.tokens;
  sizes.q_heads = model.q_heads;
  sizes.k_heads = model.kv_heads;
  sizes.max_position = (int64_t(1) << 20) - 1;  // long-context positions
  sizes.base = model.base;
  oracle::Workload w(spec, sizes);
  w.upload();
  const detail::Driver& d = detail::driver();
  CUstream stream = nullptr;
  detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  const Args args = w.args(stream);

  const auto t0 = std::chrono::steady_clock::now();
  apply(spec, args);
  detail::check(d.StreamSynchronize(stream), "first launch");
  const double first_ms = ms_since(t0);
  const detail::EngineStats st = api::engine().stats();
  std::printf("first call (JIT %s + load + run): %.1f ms\n",
              st.nvrtc_compiles ? "compile" : "disk-cache hit", first_ms);

  const oracle::CheckReport r = w.check();
  std::printf("check vs float64: %s (%lld elements, relative L2 error %.2e, max abs error %.2e)\n",
              r.ok ? "PASS" : "FAIL", static_cast<long long>(r.checked), r.max_rel_l2,
              r.max_abs_err);
  if (!r.ok) std::printf("  first mismatch: %s\n", r.first_failure.c_str());

  // Time ropejit against a device copy of the same q+k bytes, in the same run.
  const int64_t bytes = w.bytes_moved();
  CUdeviceptr src = 0, dst = 0;
  detail::check(d.MemAlloc(&src, size_t(bytes / 2)), "cuMemAlloc");
  detail::check(d.MemAlloc(&dst, size_t(bytes / 2)), "cuMemAlloc");
  autotune::Timer timer(stream);
  const autotune::Timing rope = timer.time([&] { apply(spec, args); }, 5, 50);
  const autotune::Timing copy = timer.time(
      [&] { detail::check(d.MemcpyDtoDAsync(dst, src, size_t(bytes / 2), stream), "copy"); }, 5,
      50);
  d.MemFree(src);
  d.MemFree(dst);
  const auto host0 = std::chrono::steady_clock::now();
  constexpr int kCalls = 1000;
  for (int i = 0; i < kCalls; ++i) apply(spec, args);
  const double host_us = ms_since(host0) * 1000.0 / kCalls;
  detail::check(d.StreamSynchronize(stream), "timed launches");
  d.StreamDestroy(stream);

  std::printf("ropejit   median %8.2f us  %7.1f GB/s  (%lld bytes read+written)\n", rope.median_us,
              double(bytes) / rope.median_us * 1e-3, static_cast<long long>(bytes));
  std::printf("copy      median %8.2f us  %7.1f GB/s  (device-to-device copy of the same bytes)\n",
              copy.median_us, double(bytes) / copy.median_us * 1e-3);
  std::printf("ropejit reaches %.1f%% of copy bandwidth; host time per cached call %.2f us\n",
              100.0 * copy.median_us / rope.median_us, host_us);
  return r.ok ? 0 : 1;
}

}  // namespace ropejit::cli
