// Measures every candidate configuration of one key and call shape on the current GPU and
// picks the fastest whose output is bit-identical to the default configuration's.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autotune/tuning_cache.hpp"
#include "jit/decode/proj.hpp"
#include "jit/launch_config.hpp"

namespace ropejit::autotune {

struct CandidateResult {
  detail::LaunchConfig config;
  double median_us = 0;
  std::string rejected;  // why the candidate was not eligible ("" when it was)
};

struct TuneReport {
  TuningEntry best;  // key, bucket, heads, winning config, its median and GB/s, default's µs
  std::vector<CandidateResult> results;
  double copy_us = 0;  // device copy of the same bytes, same run
  int64_t bytes = 0;
  int rejected = 0;
};

// The environment fingerprint of the GPU owning the current context.
Fingerprint current_fingerprint();

// Where a long tuning run stands, for a caller that shows it: after the compile, then at most
// every `TuneProgress::kEvery` seconds while candidates are checked and timed.
struct TuneProgress {
  static constexpr double kEvery = 5.0;
  size_t variants = 0;   // distinct kernels the candidates need
  double compile_s = 0;  // their compile (or disk-cache load), all at once
  size_t done = 0;       // candidates checked and timed so far
  size_t total = 0;      // candidates in all
  double elapsed_s = 0;  // since the call began (the inputs' setup included)
  std::string best;      // the fastest eligible candidate so far ("" before the first)
  double best_us = 0;
};

// Tunes `canonical` for `bucket` tokens (one sequence; thd: one packed sequence) and the
// given head counts, on buffers this function owns; never touches callers' data. Needs a
// current CUDA context. Deterministic tie-break: the earlier candidate wins. `progress`, when
// set, is called from this thread as described at TuneProgress.
TuneReport tune(const Spec& canonical, int64_t bucket, int32_t q_heads, int32_t k_heads,
                const std::function<void(const TuneProgress&)>& progress = {});

// The decode block's projection: the fused kernel (the heuristic's variant) and the unfused
// path (RMSNorm key -> cuBLASLt GEMM -> RoPE key), both checked against float64 where the host
// reference is affordable (tokens x columns x hidden <= 2^32), then timed (L2 flushed, medians);
// the faster is the entry's path (a tie goes to fused). Where the fused kernel is within 1.25x
// of the unfused path, or is the call's only path (unfused_us 0), its launch
// variants (warps, chunks per iteration, clusters on sm_90) are checked and timed too and the
// fastest is recorded.
struct ProjTuneReport {
  ProjTuningEntry best;
  detail::ProjVariant variant;  // the fused kernel's (the search's winner, else the heuristic's)
  double fused_us = 0, unfused_us = 0;
  bool checked = false;  // both paths passed the float64 check
  // Where the fused kernel came within 1.25x of the unfused path, its launch variants were
  // searched (fused_us is then the winner's; best.variant names it): how many, and the
  // heuristic variant's time in the same search.
  size_t candidates = 0;
  double heuristic_us = 0;
  // Every searched variant's median, in candidate order (empty where none were searched).
  std::vector<std::pair<detail::ProjVariant, double>> timed;
};

// The fused kernel's variants tune_proj() and tune_ffn() race at a bucket whose heuristic variant
// is `heuristic`: that one first, then its token tiles and half as many with 2/4/8 warps, 1/2/4
// chunks per iteration, clusters of 2 and 4 on sm_90+, e4m3 codes in 64-element chunks (`wide`)
// at 2 and 4 tiles, and with 16-bit weights the tokens as the 16-row operand (`swap`) from 2
// tiles; legal ones only. Needs no GPU.
std::vector<detail::ProjVariant> proj_fused_candidates(const detail::ProjVariant& heuristic,
                                                       bool fp8_weights,
                                                       const detail::DeviceInfo& device);

// Tunes `canonical`'s path at `bucket` tokens for one projection shape, on buffers it owns.
// Needs a current CUDA context and cuBLASLt.
ProjTuneReport tune_proj(const QkvProjSpec& canonical, int64_t bucket, int64_t hidden,
                         int32_t q_heads, int32_t kv_heads);
// The same for the FFN's gate/up (hidden -> intermediate).
ProjTuneReport tune_ffn(const FfnSpec& canonical, int64_t bucket, int64_t hidden,
                        int64_t intermediate);

}  // namespace ropejit::autotune
