// The projection's path tuner: times the fused kernel and the unfused path (RMSNorm key ->
// cuBLASLt GEMM -> RoPE key) on buffers it owns and records the faster per token bucket.
#include <algorithm>

#include "autotune/ffn_workload.hpp"
#include "autotune/policy.hpp"
#include "autotune/proj_workload.hpp"
#include "autotune/timing.hpp"
#include "autotune/tuner.hpp"
#include "jit/driver.hpp"
#include "jit/engine.hpp"
#include "jit/errors.hpp"
#include "jit/gemm.hpp"

namespace ropejit::autotune {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 20;
// The float64 reference costs tokens x columns x hidden multiply-adds on the host: up to 2^32
// (a second or two), both paths are checked against it before they are timed.
constexpr double kMaxReferenceWork = 4294967296.0;

}  // namespace

ProjTuneReport tune_proj(const QkvProjSpec& spec, int64_t bucket, int64_t hidden, int32_t q_heads,
                         int32_t kv_heads) {
  const QkvProjSpec c = spec.canonical();
  const detail::Driver& d = detail::driver();
  CUcontext ctx = nullptr;
  detail::check(d.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) detail::invalid("tuning needs a current CUDA context");
  if (!detail::gemm_unavailable().empty())
    detail::fail(ErrorCode::no_driver,
                 "tuning the projection's path: ", detail::gemm_unavailable());
  detail::Engine& engine = detail::Engine::instance();
  const detail::DeviceInfo& device = engine.device_info(ctx);

  ProjSizes z;
  z.tokens = bucket;
  z.hidden = hidden;
  z.q_heads = q_heads;
  z.kv_heads = kv_heads;
  z.path = ProjPath::automatic;  // the workspace, and both paths' references
  z.reference = double(bucket) * double(q_heads + 2 * kv_heads) * c.head_dim * double(hidden) <=
                kMaxReferenceWork;
  ProjProblem problem(c, z);
  problem.upload();
  CUstream stream = nullptr;
  detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  struct StreamGuard {
    CUstream s;
    ~StreamGuard() { detail::driver().StreamDestroy(s); }
  } guard{stream};
  QkvProjArgs fused = problem.args(stream);
  fused.path = ProjPath::fused;
  QkvProjArgs unfused = fused;
  unfused.path = ProjPath::unfused;
  const detail::ProjShape shape = detail::check_proj_call(c, fused);
  const detail::ProjVariant variant = proj_heuristic(c, shape, device);

  ProjTuneReport report;
  report.variant = variant;
  report.checked = z.reference;
  const std::pair<const QkvProjArgs*, const char*> runs[] = {{&fused, "fused"},
                                                             {&unfused, "unfused"}};
  for (const auto& [args, name] : runs) {
    problem.upload();
    if (args == &fused)
      engine.launch_proj(c, *args, shape, &variant);
    else
      engine.launch_proj_unfused(c, *args, shape);
    if (z.reference) {
      const CheckReport r = problem.check_as(args == &fused ? ProjPath::fused : ProjPath::unfused);
      if (!r.ok)
        detail::fail(ErrorCode::internal, "tuning ", c.key(), ": the ", name,
                     " path fails the float64 check at ", bucket, " tokens: ", r.first_failure);
    }
  }
  Timer timer(stream);
  report.fused_us =
      timer.time([&] { engine.launch_proj(c, fused, shape, &variant); }, kWarmup, kReps).median_us;
  report.unfused_us =
      timer.time([&] { engine.launch_proj_unfused(c, unfused, shape); }, kWarmup, kReps).median_us;

  ProjTuningEntry& e = report.best;
  e.key = c.key();
  e.bucket = bucket;
  e.hidden = hidden;
  e.columns = int64_t(q_heads + 2 * kv_heads) * c.head_dim;
  e.path = report.unfused_us < report.fused_us ? ProjPath::unfused : ProjPath::fused;
  e.fused_us = report.fused_us;
  e.unfused_us = report.unfused_us;
  return report;
}

ProjTuneReport tune_ffn(const FfnSpec& spec, int64_t bucket, int64_t hidden, int64_t intermediate) {
  const FfnSpec c = spec.canonical();
  const detail::Driver& d = detail::driver();
  CUcontext ctx = nullptr;
  detail::check(d.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) detail::invalid("tuning needs a current CUDA context");
  if (!detail::gemm_unavailable().empty())
    detail::fail(ErrorCode::no_driver, "tuning the FFN's path: ", detail::gemm_unavailable());
  detail::Engine& engine = detail::Engine::instance();
  const detail::DeviceInfo& device = engine.device_info(ctx);

  FfnSizes z;
  z.tokens = bucket;
  z.hidden = hidden;
  z.intermediate = intermediate;
  z.path = ProjPath::automatic;
  z.reference = double(bucket) * double(2 * intermediate) * double(hidden) <= kMaxReferenceWork;
  FfnProblem problem(c, z);
  problem.upload();
  CUstream stream = nullptr;
  detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  struct StreamGuard {
    CUstream s;
    ~StreamGuard() { detail::driver().StreamDestroy(s); }
  } guard{stream};
  FfnArgs fused = problem.args(stream);
  fused.path = ProjPath::fused;
  FfnArgs unfused = fused;
  unfused.path = ProjPath::unfused;
  const detail::FfnShape shape = detail::check_ffn_call(c, fused);
  const detail::ProjVariant variant = ffn_heuristic(c, shape.proj(), device);

  ProjTuneReport report;
  report.variant = variant;
  report.checked = z.reference;
  for (const bool split : {false, true}) {
    problem.upload();
    if (split)
      engine.launch_ffn_unfused(c, unfused, shape);
    else
      engine.launch_ffn(c, fused, shape, &variant);
    if (z.reference) {
      const CheckReport r = problem.check_as(split ? ProjPath::unfused : ProjPath::fused);
      if (!r.ok)
        detail::fail(ErrorCode::internal, "tuning ", c.key(), ": the ", split ? "unfused" : "fused",
                     " path fails the float64 check at ", bucket, " tokens: ", r.first_failure);
    }
  }
  Timer timer(stream);
  report.fused_us =
      timer.time([&] { engine.launch_ffn(c, fused, shape, &variant); }, kWarmup, kReps).median_us;
  report.unfused_us =
      timer.time([&] { engine.launch_ffn_unfused(c, unfused, shape); }, kWarmup, kReps).median_us;
  ProjTuningEntry& e = report.best;
  e.key = c.key();
  e.bucket = bucket;
  e.hidden = hidden;
  e.columns = 2 * intermediate;
  e.path = report.unfused_us < report.fused_us ? ProjPath::unfused : ProjPath::fused;
  e.fused_us = report.fused_us;
  e.unfused_us = report.unfused_us;
  return report;
}

}  // namespace ropejit::autotune
