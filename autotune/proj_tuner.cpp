// The projection's path tuner: times the fused kernel and the unfused path (RMSNorm key ->
// cuBLASLt GEMM -> RoPE key) on buffers it owns and records the faster per token bucket.
#include <algorithm>
#include <functional>
#include <string>

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

// The current context's device record; `what` names the tuning in the message when cuBLASLt,
// which the unfused path needs, cannot be loaded.
const detail::DeviceInfo& tuning_device(const char* what) {
  CUcontext ctx = nullptr;
  detail::check(detail::driver().CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) detail::invalid("tuning needs a current CUDA context");
  if (!detail::gemm_unavailable().empty())
    detail::fail(ErrorCode::no_driver, "tuning ", what, ": ", detail::gemm_unavailable());
  return detail::Engine::instance().device_info(ctx);
}

// A non-blocking stream for one bucket's runs.
class TuningStream {
 public:
  TuningStream() {
    detail::check(detail::driver().StreamCreate(&stream_, CU_STREAM_NON_BLOCKING),
                  "cuStreamCreate");
  }
  ~TuningStream() { detail::driver().StreamDestroy(stream_); }
  TuningStream(const TuningStream&) = delete;
  TuningStream& operator=(const TuningStream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

// One bucket's race: each path run once and checked against its float64 reference (when the
// problem has one: a wrong result must not win), then both timed; the entry names the faster.
template <class Problem>
ProjTuneReport race(Problem& problem, bool checked, CUstream stream, const std::string& key,
                    int64_t bucket, int64_t hidden, int64_t columns,
                    const std::function<void()>& fused, const std::function<void()>& unfused) {
  ProjTuneReport report;
  report.checked = checked;
  for (const ProjPath path : {ProjPath::fused, ProjPath::unfused}) {
    problem.upload();
    (path == ProjPath::fused ? fused : unfused)();
    if (!checked) continue;
    const CheckReport r = problem.check_as(path);
    if (!r.ok)
      detail::fail(ErrorCode::internal, "tuning ", key, ": the ", to_string(path),
                   " path fails the float64 check at ", bucket, " tokens: ", r.first_failure);
  }
  // A clean L2 before each call (read flush), as in a model's step, where the previous layer's
  // weights were read: after a memset both paths would also pay for writing dirty lines back.
  Timer timer(stream, size_t(256) << 20, Flush::read);
  report.fused_us = timer.time(fused, kWarmup, kReps).median_us;
  report.unfused_us = timer.time(unfused, kWarmup, kReps).median_us;
  ProjTuningEntry& e = report.best;
  e.key = key;
  e.bucket = bucket;
  e.hidden = hidden;
  e.columns = columns;
  e.path = report.unfused_us < report.fused_us ? ProjPath::unfused : ProjPath::fused;
  e.fused_us = report.fused_us;
  e.unfused_us = report.unfused_us;
  return report;
}

}  // namespace

ProjTuneReport tune_proj(const QkvProjSpec& spec, int64_t bucket, int64_t hidden, int32_t q_heads,
                         int32_t kv_heads) {
  const QkvProjSpec c = spec.canonical();
  if (c.weights == Weights::e4m3)
    detail::invalid(
        "spec.weights (e4m3): the projection takes one path with it (fused); there is "
        "no crossover to tune");
  const detail::DeviceInfo& device = tuning_device("the projection's path");
  detail::Engine& engine = detail::Engine::instance();
  const int64_t columns = int64_t(q_heads + 2 * kv_heads) * c.head_dim;
  ProjSizes z;
  z.tokens = bucket;
  z.hidden = hidden;
  z.q_heads = q_heads;
  z.kv_heads = kv_heads;
  z.path = ProjPath::automatic;  // the workspace, and both paths' references
  z.reference = double(bucket) * double(columns) * double(hidden) <= kMaxReferenceWork;
  ProjProblem problem(c, z);
  problem.upload();
  const TuningStream stream;
  QkvProjArgs fused = problem.args(stream.get());
  fused.path = ProjPath::fused;
  QkvProjArgs unfused = fused;
  unfused.path = ProjPath::unfused;
  const detail::ProjShape shape = detail::check_proj_call(c, fused);
  if (const std::string why = detail::proj_split_problem(c, unfused, shape, true); !why.empty())
    detail::invalid(c.key(), " has no unfused path here (", why,
                    "): there is no crossover to tune");
  const detail::ProjVariant variant = proj_heuristic(c, shape, device);
  ProjTuneReport report = race(
      problem, z.reference, stream.get(), c.key(), bucket, hidden, columns,
      [&] { engine.launch_proj(c, fused, shape, &variant); },
      [&] { engine.launch_proj_unfused(c, unfused, shape); });
  report.variant = variant;
  return report;
}

ProjTuneReport tune_ffn(const FfnSpec& spec, int64_t bucket, int64_t hidden, int64_t intermediate) {
  const FfnSpec c = spec.canonical();
  if (c.weights == Weights::e4m3)
    detail::invalid(
        "spec.weights (e4m3): the FFN's gate/up takes one path with e4m3 weights (fused); "
        "there is no crossover to tune");
  const detail::DeviceInfo& device = tuning_device("the FFN's path");
  detail::Engine& engine = detail::Engine::instance();
  FfnSizes z;
  z.tokens = bucket;
  z.hidden = hidden;
  z.intermediate = intermediate;
  z.path = ProjPath::automatic;
  z.reference = double(bucket) * double(2 * intermediate) * double(hidden) <= kMaxReferenceWork;
  FfnProblem problem(c, z);
  problem.upload();
  const TuningStream stream;
  FfnArgs fused = problem.args(stream.get());
  fused.path = ProjPath::fused;
  FfnArgs unfused = fused;
  unfused.path = ProjPath::unfused;
  const detail::FfnShape shape = detail::check_ffn_call(c, fused);
  const detail::ProjVariant variant = ffn_heuristic(c, shape.proj(), device);
  ProjTuneReport report = race(
      problem, z.reference, stream.get(), c.key(), bucket, hidden, 2 * intermediate,
      [&] { engine.launch_ffn(c, fused, shape, &variant); },
      [&] { engine.launch_ffn_unfused(c, unfused, shape); });
  report.variant = variant;
  return report;
}

}  // namespace ropejit::autotune
