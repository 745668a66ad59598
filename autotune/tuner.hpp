// Measures every candidate configuration of one key and call shape on the current GPU and
// picks the fastest whose output is bit-identical to the default configuration's.
#pragma once

#include <string>
#include <vector>

#include "autotune/tuning_cache.hpp"
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

// Tunes `canonical` for `bucket` tokens (one sequence; thd: one packed sequence) and the
// given head counts, on buffers this function owns; never touches callers' data. Needs a
// current CUDA context. Deterministic tie-break: the earlier candidate wins.
TuneReport tune(const Spec& canonical, int64_t bucket, int32_t q_heads, int32_t k_heads);

}  // namespace ropejit::autotune
