// The tuner: compile all candidate variants in parallel, then check and time each candidate.
#include "autotune/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "autotune/candidates.hpp"
#include "autotune/policy.hpp"
#include "autotune/timing.hpp"
#include "jit/call.hpp"
#include "jit/driver.hpp"
#include "jit/engine.hpp"
#include "jit/errors.hpp"
#include "jit/nvrtc.hpp"
#include "oracle/workload.hpp"

namespace ropejit::autotune {

using oracle::CheckReport;
using oracle::Sizes;
using oracle::Workload;

namespace {

constexpr int kWarmup = 2;
constexpr int kReps = 15;
constexpr int64_t kMaxReferenceTokens = 4096;  // float64 check of the default up to this size

CUcontext current_context() {
  CUcontext ctx = nullptr;
  detail::check(detail::driver().CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) detail::invalid("tuning needs a current CUDA context");
  return ctx;
}

// NVRTC is thread-safe: compile every distinct kernel variant at once before timing. Returns
// how many there were.
size_t compile_variants(const Spec& c, const std::vector<detail::LaunchConfig>& cands,
                        const std::string& target) {
  std::vector<detail::KernelVariant> variants;
  std::set<std::string> seen;
  for (const detail::LaunchConfig& cfg : cands)
    if (seen.insert(cfg.kernel.name()).second) variants.push_back(cfg.kernel);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(variants.size());
  for (size_t i = 0; i < variants.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        detail::Engine::instance().image(c, variants[i], target);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) detail::fail(ErrorCode::compile, "tuning ", c.key(), ": ", e);
  return variants.size();
}

}  // namespace

Fingerprint current_fingerprint() {
  const detail::DeviceInfo& dev = detail::Engine::instance().device_info(current_context());
  Fingerprint f;
  f.gpu_name = dev.name;
  f.cc = dev.cc;
  f.sm_count = dev.sm_count;
  detail::driver().DriverGetVersion(&f.driver_version);
  const detail::NvrtcVersion nv = detail::nvrtc_version();
  f.nvrtc = detail::concat(nv.major, ".", nv.minor);
  f.library = kVersion;
  return f;
}

TuneReport tune(const Spec& c, int64_t bucket, int32_t q_heads, int32_t k_heads,
                const std::function<void(const TuneProgress&)>& progress) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const detail::Driver& d = detail::driver();
  detail::Engine& engine = detail::Engine::instance();
  const detail::DeviceInfo device = engine.device_info(current_context());

  Sizes sizes;
  sizes.batch = 1;
  sizes.seq_len = bucket;
  sizes.seq_lens = {bucket};
  sizes.q_heads = q_heads;
  sizes.k_heads = k_heads;
  sizes.max_position = 8191;
  Workload w(c, sizes);
  w.upload();
  CUstream stream = nullptr;
  detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  struct StreamGuard {
    CUstream s;
    ~StreamGuard() { detail::driver().StreamDestroy(s); }
  } guard{stream};
  const Args args = w.args(stream);
  // The shape a user's call of these sizes has (v heads of fused keys, alignment) as the
  // engine sees it.
  const detail::CallShape shape = detail::check_call(c, args);

  // The default is what apply() launches untuned. Its output is the reference every
  // candidate must reproduce bit for bit (same math, so any difference is a bug in that
  // configuration).
  const detail::LaunchConfig def = heuristic_config(c, shape, device);
  const std::vector<detail::LaunchConfig> cands = candidates(c, shape, device);
  TuneProgress status;
  status.total = cands.size();
  const Clock::time_point compile_start = Clock::now();
  status.variants = compile_variants(c, cands, detail::target_for(device.cc));
  status.compile_s = since(compile_start);
  status.elapsed_s = since(t0);
  if (progress) progress(status);
  Clock::time_point last_report = Clock::now();
  engine.launch(c, args, shape, &def);
  if (bucket <= kMaxReferenceTokens) {
    const CheckReport r = w.check();
    if (!r.ok)
      detail::fail(ErrorCode::internal,
                   "tuning: default configuration fails the float64 check: ", r.first_failure);
  }
  const std::vector<std::vector<uint8_t>> expected = w.download();

  TuneReport report;
  report.bytes = w.bytes_moved();
  Timer timer(stream);
  double default_us = 0;
  for (const detail::LaunchConfig& cfg : cands) {
    CandidateResult res;
    res.config = cfg;
    w.reset();  // fresh inputs, poisoned outputs (a device-side copy after the first)
    engine.launch(c, args, shape, &cfg);
    if (w.download() != expected) {
      res.rejected = "output differs from the default configuration's";
      ++report.rejected;
    } else {
      res.median_us =
          timer.time([&] { engine.launch(c, args, shape, &cfg); }, kWarmup, kReps).median_us;
      if (cfg == def) default_us = res.median_us;
      if (status.best.empty() || res.median_us < status.best_us) {
        status.best = cfg.name();
        status.best_us = res.median_us;
      }
    }
    report.results.push_back(res);
    status.done = report.results.size();
    if (progress && status.done < status.total && since(last_report) >= TuneProgress::kEvery) {
      status.elapsed_s = since(t0);
      progress(status);
      last_report = Clock::now();
    }
  }
  const CandidateResult* best = nullptr;
  for (const CandidateResult& r : report.results)
    if (r.rejected.empty() && (!best || r.median_us < best->median_us)) best = &r;
  if (!best)
    detail::fail(ErrorCode::internal, "tuning ", c.key(), ": every candidate was rejected");

  w.drop_reset_copy();  // room for the copy below
  // A device copy of the same bytes, timed the same way, for the % of copy bandwidth.
  CUdeviceptr src = 0, dst = 0;
  const size_t half = size_t(report.bytes / 2);
  detail::check(d.MemAlloc(&src, half), "cuMemAlloc");
  detail::check(d.MemAlloc(&dst, half), "cuMemAlloc");
  report.copy_us =
      timer.time([&] { d.MemcpyDtoDAsync(dst, src, half, stream); }, kWarmup, kReps).median_us;
  d.MemFree(src);
  d.MemFree(dst);

  TuningEntry& e = report.best;
  e.key = c.key();
  e.bucket = bucket;
  e.q_heads = q_heads;
  e.k_heads = k_heads;
  e.config = best->config;
  // Entries hold what the tuning file holds: narrow offsets are each call's own decision
  // (select_config), timed here as the tuned shape's calls run them.
  e.config.kernel.narrow = false;
  e.median_us = best->median_us;
  e.gbps = double(report.bytes) / best->median_us * 1e-3;
  e.default_us = default_us;
  return report;
}

}  // namespace ropejit::autotune
