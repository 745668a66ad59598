// Built-in launch heuristic, used when no tuned entry exists. It follows what the tuner picks
// on H100/H200 (bench/RESULTS.md):
//   - one kernel variant per key and alignment: widest vectors, up to 2 heads per thread per
//     pass, 512-thread bound. A 2-heads variant launched with rows >= heads runs one head per
//     thread, so the same compiled kernel serves decode and prefill and changing shapes
//     never compiles anything;
//   - few tokens (decode): one head per thread and one token per block: the most blocks and
//     the shortest chain of dependent loads per thread;
//   - many tokens: 4 heads per thread (2 passes of 2) so cos/sin are fetched once for 4 heads,
//     blocks near 512 threads, and when the grid would take more than one wave, a persistent
//     grid of exactly the blocks that fit at once, so no partial last wave is left.
#include <algorithm>

#include "policy.hpp"

namespace ropejit::autotune {
namespace {

constexpr int32_t kHeadsPerThread = 2;
constexpr int32_t kBlockThreads = 512;
constexpr int32_t kHeadsPerThreadLarge = 4;  // over kHeadsPerThread-wide passes
constexpr int64_t kDecodeBlocksPerSm = 4;    // tokens <= this * SMs: decode shape

}  // namespace

detail::KernelVariant heuristic_variant(const Spec& c, int32_t align_bytes) {
  detail::KernelVariant v;
  v.vec = detail::max_vec(c, align_bytes);
  v.heads_per_thread = kHeadsPerThread;
  const int32_t x = detail::chunks(c, v.vec);
  v.max_threads = kBlockThreads;
  while (v.max_threads < x) v.max_threads *= 2;
  return v;
}

detail::LaunchConfig heuristic_config(const Spec& c, const detail::CallShape& shape,
                                      const detail::DeviceInfo& device, int32_t regs_per_thread) {
  detail::LaunchConfig cfg;
  cfg.kernel = heuristic_variant(c, shape.align_bytes);
  const int32_t x = detail::chunks(c, cfg.kernel.vec);
  const int32_t max_rows = std::max(1, cfg.kernel.max_threads / x);
  const int32_t heads = std::max(shape.q_heads + shape.k_heads, 1);
  if (shape.tokens <= kDecodeBlocksPerSm * std::max(device.sm_count, 1)) {
    cfg.rows = std::min(heads, max_rows);
    cfg.tokens_per_block = 1;
    return cfg;
  }
  cfg.rows = std::min(max_rows, (heads + kHeadsPerThreadLarge - 1) / kHeadsPerThreadLarge);
  cfg.tokens_per_block = std::max(1, std::min(64, cfg.kernel.max_threads / (x * cfg.rows)));
  const int32_t threads = x * cfg.rows * cfg.tokens_per_block;
  const int32_t resident = detail::resident_blocks(device, threads, regs_per_thread);
  const int64_t groups = (shape.tokens + cfg.tokens_per_block - 1) / cfg.tokens_per_block;
  if (groups > int64_t(resident) * device.sm_count) cfg.blocks_per_sm = resident;
  return cfg;
}

}  // namespace ropejit::autotune
