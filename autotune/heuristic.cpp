// Built-in launch heuristic, used when no tuned entry exists.
#include <algorithm>

#include "policy.hpp"

namespace ropejit::autotune {

detail::LaunchConfig heuristic_config(const Spec& c, const detail::CallShape& shape,
                                      const detail::DeviceInfo& device) {
  (void)device;
  detail::LaunchConfig cfg;
  cfg.kernel.vec = detail::max_vec(c, shape.align_bytes);
  cfg.kernel.heads_per_thread = 4;
  const int32_t x = detail::chunks(c, cfg.kernel.vec);
  int32_t max_threads = 256;
  while (max_threads < x) max_threads *= 2;
  cfg.kernel.max_threads = max_threads;
  const int32_t heads = std::max(shape.q_heads + shape.k_heads, 1);
  const int32_t rows_needed = (heads + cfg.kernel.heads_per_thread - 1) / cfg.kernel.heads_per_thread;
  cfg.rows = std::max(1, std::min(rows_needed, max_threads / x));
  cfg.tokens_per_block = std::max(1, std::min(64, max_threads / (x * cfg.rows)));
  cfg.blocks_per_sm = 0;
  return cfg;
}

}  // namespace ropejit::autotune
