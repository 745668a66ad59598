// The projection's path tuner: times the fused kernel and the unfused path (RMSNorm key ->
// cuBLASLt GEMM -> RoPE key) on buffers it owns and records the faster per token bucket; where
// the fused kernel is in the race, also its fastest launch variant.
#include <algorithm>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "autotune/policy.hpp"
#include "autotune/timing.hpp"
#include "autotune/tuner.hpp"
#include "jit/decode/engine.hpp"
#include "jit/decode/gemm.hpp"
#include "jit/driver.hpp"
#include "jit/engine.hpp"
#include "jit/errors.hpp"
#include "jit/nvrtc.hpp"
#include "oracle/decode/ffn_workload.hpp"
#include "oracle/decode/proj_workload.hpp"

namespace ropejit::autotune {

using oracle::CheckReport;
using oracle::FfnProblem;
using oracle::FfnSizes;
using oracle::ProjProblem;
using oracle::ProjSizes;

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
    if (path == ProjPath::unfused && !unfused) continue;  // the fused path only
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
  if (unfused) report.unfused_us = timer.time(unfused, kWarmup, kReps).median_us;
  ProjTuningEntry& e = report.best;
  e.key = key;
  e.bucket = bucket;
  e.hidden = hidden;
  e.columns = columns;
  e.path = unfused && report.unfused_us < report.fused_us ? ProjPath::unfused : ProjPath::fused;
  e.fused_us = report.fused_us;
  e.unfused_us = report.unfused_us;
  return report;
}

// The fused kernel's variants are searched where it is in the race: its heuristic variant
// within this factor of the unfused path (beyond, no variant makes it win).
constexpr double kSearchWithin = 1.25;

// Every candidate compiled (concurrently), run once and checked against the float64 reference
// where `checked` (a wrong result from a legal variant is a library bug: an error), then timed
// with a clean L2; the fastest goes into `report` (the heuristic's on a tie) with the path
// decided again against the unfused time.
template <class Problem>
void search_variants(Problem& problem, bool checked, CUstream stream, const std::string& key,
                     int64_t bucket, const std::vector<detail::ProjVariant>& candidates,
                     const std::function<std::future<void>(const detail::ProjVariant&)>& compile,
                     const std::function<void(const detail::ProjVariant&)>& launch,
                     ProjTuneReport* report) {
  std::vector<std::future<void>> compiling;
  for (const detail::ProjVariant& v : candidates) compiling.push_back(compile(v));
  for (std::future<void>& f : compiling) f.get();  // rethrows a compile error
  for (const detail::ProjVariant& v : candidates) {
    problem.upload();
    launch(v);
    if (!checked) continue;
    const CheckReport r = problem.check_as(ProjPath::fused);
    if (!r.ok)
      detail::fail(ErrorCode::internal, "tuning ", key, ": fused variant ", v.name(),
                   " fails the float64 check at ", bucket, " tokens: ", r.first_failure);
  }
  Timer timer(stream, size_t(256) << 20, Flush::read);
  double best_us = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const detail::ProjVariant& v = candidates[i];
    const double us = timer.time([&] { launch(v); }, kWarmup, kReps).median_us;
    report->timed.emplace_back(v, us);
    if (i == 0) report->heuristic_us = us;
    if (i == 0 || us < best_us) {
      best_us = us;
      report->variant = v;
    }
  }
  report->candidates = candidates.size();
  report->fused_us = best_us;
  ProjTuningEntry& e = report->best;
  e.fused_us = best_us;
  e.variant = report->variant.name();
  e.path =
      report->unfused_us > 0 && report->unfused_us < best_us ? ProjPath::unfused : ProjPath::fused;
}

// Whether the fused kernel's variants are worth searching: it is the only path, or within
// kSearchWithin of the unfused one.
bool worth_searching(const ProjTuneReport& r) {
  return r.unfused_us == 0 || r.fused_us <= kSearchWithin * r.unfused_us;
}

// The two paths raced at the heuristic's variant, then, where the fused kernel is worth it,
// its other variants: what the projection's and the FFN's tuners share. `fused` launches the
// fused kernel at a variant, `unfused` the other path (empty: the call has none).
template <class Problem, class Spec>
ProjTuneReport race_and_search(Problem& problem, bool checked, CUstream stream, const Spec& c,
                               int64_t bucket, int64_t hidden, int64_t columns,
                               const detail::ProjVariant& variant, bool fp8,
                               const detail::DeviceInfo& device,
                               const std::function<void(const detail::ProjVariant*)>& fused,
                               const std::function<void()>& unfused) {
  ProjTuneReport report = race(
      problem, checked, stream, c.key(), bucket, hidden, columns, [&] { fused(&variant); },
      unfused);
  report.variant = variant;
  if (worth_searching(report)) {
    const std::string target = detail::target_for(device.cc);
    detail::DecodeEngine& engine = detail::DecodeEngine::instance();
    search_variants(
        problem, checked, stream, c.key(), bucket, proj_fused_candidates(variant, fp8, device),
        [&](const detail::ProjVariant& v) { return engine.image_async(c, v, target); },
        [&](const detail::ProjVariant& v) { fused(&v); }, &report);
  }
  return report;
}

}  // namespace

// The fused kernel's candidates at a bucket: the heuristic's variant first, then its token tiles
// and half as many (two rows of blocks, each reading the weight: the second read may come from
// L2), each with 2, 4 or 8 warps splitting the hidden dimension, 1 or 2 chunks per iteration (4
// too at one tile), on sm_90+ clusters of 2 and 4 blocks splitting it further, for e4m3 weights
// at 2 and 4 tiles 64-element chunks (`wide`), for 16-bit weights from 2 tiles the tokens as
// the 16-row operand (`swap`); from 2 tiles also blocks of 2, 4 or 8 row groups sharing staged
// activations (`rows`), 4 or 8 warps in all, 1, 2 or 4 chunks, clusters of 1, 2 or 4 (fewer,
// wider blocks: at Llama-3-8B's 64 tokens on the H100 eight groups in clusters of four are the
// fastest of them, bench/history/2026-11-27.md, "Row groups sharing staged activations");
// legal ones.
std::vector<detail::ProjVariant> proj_fused_candidates(const detail::ProjVariant& heuristic,
                                                       bool fp8_weights,
                                                       const detail::DeviceInfo& device) {
  std::vector<detail::ProjVariant> out{heuristic};
  const int32_t most = heuristic.token_tiles;
  for (const int32_t tiles : {most, most / 2}) {
    if (tiles < 1) continue;
    for (const bool wide : {false, true})    // e4m3 codes in 64-element chunks at 2 and 4 tiles
      for (const bool swap : {false, true})  // 16-bit weights: tokens as the 16-row operand
        for (const int32_t splits : {2, 4, 8})
          for (const int32_t unroll : {1, 2, 4})
            for (const int32_t cluster : {1, 2, 4}) {
              if ((unroll == 4 && tiles > 1) || (cluster > 1 && device.cc < 90)) continue;
              detail::ProjVariant v{tiles, splits, unroll};
              v.cluster = cluster;
              v.wide = wide;
              v.swap = swap;
              if (!detail::proj_variant_problem(v, fp8_weights).empty()) continue;
              if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
            }
    if (tiles < 2) continue;
    for (const bool swap : {false, true})
      for (const int32_t rows : {2, 4, 8})
        for (const int32_t splits : {1, 2, 4})
          for (const int32_t unroll : {1, 2, 4})
            for (const int32_t cluster : {1, 2, 4}) {
              const int32_t warps = rows * splits;
              if ((warps != 4 && warps != 8) || (cluster > 1 && device.cc < 90)) continue;
              detail::ProjVariant v{tiles, splits, unroll};
              v.rows = rows;
              v.cluster = cluster;
              v.swap = swap;
              if (!detail::proj_variant_problem(v, fp8_weights).empty()) continue;
              if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
            }
  }
  return out;
}

ProjTuneReport tune_proj(const QkvProjSpec& spec, int64_t bucket, int64_t hidden, int32_t q_heads,
                         int32_t kv_heads) {
  const QkvProjSpec c = spec.canonical();
  if (const std::string why = detail::proj_fused_problem(c); !why.empty())
    detail::invalid(c.key(), " has one path, nothing to tune: ", why);
  const bool fp8 = c.weights == Weights::e4m3;
  const detail::DeviceInfo& device = tuning_device("the projection's path");
  detail::DecodeEngine& engine = detail::DecodeEngine::instance();
  const int64_t columns = int64_t(q_heads + 2 * kv_heads) * c.head_dim;
  ProjSizes z;
  z.tokens = bucket;
  z.hidden = hidden;
  z.q_heads = q_heads;
  z.kv_heads = kv_heads;
  z.path = ProjPath::automatic;  // the workspace, both references
  z.reference = double(bucket) * double(columns) * double(hidden) <= kMaxReferenceWork;
  ProjProblem problem(c, z);
  problem.upload();
  const TuningStream stream;
  QkvProjArgs fused = problem.args(stream.get());
  fused.path = ProjPath::fused;
  QkvProjArgs unfused = fused;
  unfused.path = ProjPath::unfused;
  const detail::ProjShape shape = detail::check_proj_call(c, fused);
  // Calls without an unfused path (offset positions with a paged cache, say) race the fused
  // kernel's variants alone.
  const bool two_paths = detail::proj_split_problem(c, unfused, shape, true).empty();
  const detail::ProjVariant variant = proj_heuristic(c, shape, device);
  return race_and_search(
      problem, z.reference, stream.get(), c, bucket, hidden, columns, variant, fp8, device,
      [&](const detail::ProjVariant* v) { engine.launch_proj(c, fused, shape, v); },
      two_paths ? std::function<void()>([&] { engine.launch_proj_unfused(c, unfused, shape); })
                : std::function<void()>());
}

ProjTuneReport tune_ffn(const FfnSpec& spec, int64_t bucket, int64_t hidden, int64_t intermediate) {
  const FfnSpec c = spec.canonical();
  const bool fp8 = c.weights == Weights::e4m3;
  const detail::DeviceInfo& device = tuning_device("the FFN's path");
  detail::DecodeEngine& engine = detail::DecodeEngine::instance();
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
  return race_and_search(
      problem, z.reference, stream.get(), c, bucket, hidden, 2 * intermediate, variant, fp8, device,
      [&](const detail::ProjVariant* v) { engine.launch_ffn(c, fused, shape, v); },
      detail::ffn_split_problem(c, unfused, shape, true).empty()
          ? std::function<void()>([&] { engine.launch_ffn_unfused(c, unfused, shape); })
          : std::function<void()>());
}

}  // namespace ropejit::autotune
