// Built-in launch heuristic, used when no tuned entry exists. It follows what the tuner picks
// on H100/H200 (bench/history/2026-11-22.md, "Memory roofline, H200", "Memory roofline, H100"
// and "The H200 launch rule"):
//   - two kernel variants per key and alignment, both with the widest vectors and a
//     512-thread bound: up to 2 heads per thread per pass (prefill) and 1 (decode). The engine
//     compiles and loads both on a key's first use (policy_variants()), so changing shapes
//     never compiles anything (fused keys: each with 64-bit and 32-bit offsets, four kernels);
//   - few tokens (decode: the token bucket is at most 4 blocks per SM): one head per thread,
//     one token per block: the most blocks and the shortest chain of dependent loads per
//     thread. The one-head kernel (fewer registers, less code before the first load) is
//     faster per graph-replayed call than the two-head kernel running one head per thread
//     (bench/history/2026-11-22.md, "Decode under graph replay, per launch"). A token's heads
//     are dealt over several blocks (head groups) of up to 10 heads, whatever their number: one
//     token's 40 heads in one block wait on one SM's schedulers, 4 blocks of 10 run on 4 SMs.
//     Under graph replay on the H100 that is the best grouping tried, or close to it, at every
//     size (bench/history/2026-11-23.md, "Head groups"). Fused keys take the same
//     launch up to 64 tokens (a head's lanes still reduce inside one block), and the two-head
//     kernel over a token's heads in one block above (fused_config). A norm over all heads
//     keeps a token's heads in one block;
//   - many tokens: two heads per thread in one pass (cos/sin fetched once for both), one token
//     per block unless blocks would be tiny, and a one-shot grid: small blocks keep the SMs
//     evenly loaded to the last wave, which measures better than persistent grids;
//   - on GPUs with more DRAM bandwidth per SM (H200: 37 GB/s per SM; H100: 25), half as many
//     rows, so each thread makes two passes of two heads. The H200 tuner's winners mostly make
//     two or more passes per thread (usually of one head); two passes of two heads keep the
//     one kernel variant and measure faster than one pass there, slightly slower on the H100.
//     Heads of 5 or 6 chunks (d80, d96) measure slower with two passes, so only power-of-two
//     chunk counts take them.
#include <algorithm>

#include "autotune/policy.hpp"

namespace ropejit::autotune {
namespace {

constexpr int32_t kHeadsPerThread = 2;         // as detail::prefill_variant
constexpr int32_t kMinBlockThreads = 64;       // 32 resident blocks x 64 threads fill an SM
constexpr int64_t kDecodeBlocksPerSm = 4;      // token bucket <= this * SMs: a decode-sized call
constexpr double kTwoPassGbpsPerSm = 30;       // DRAM GB/s per SM from which prefill takes 2 passes
constexpr int32_t kDecodeGroupRows = 10;       // heads per block when decode deals them over blocks
constexpr int64_t kFusedGroupedTokens = 64;    // fused keys: head groups up to this token bucket
constexpr int32_t kFusedPrefillThreads = 128;  // fused keys' prefill blocks: tokens to fill this
constexpr int32_t kFusedRingPasses = 6;        // passes per token a ring kernel's rows aim at
constexpr int32_t kFusedRingMaxRows = 4;

// Decode-sized calls, plain and fused alike (not a norm over all heads, which needs every head
// of a token in one block): the one-head kernel, one token per block, the token's heads dealt
// over blocks of up to kDecodeGroupRows rows (head groups).
detail::LaunchConfig decode_config(const Spec& c, const detail::CallShape& shape,
                                   detail::LaunchConfig cfg) {
  cfg.kernel = detail::decode_variant(c, shape.align_bytes, shape.table_align);
  const int32_t x = detail::chunks(c, cfg.kernel.vec);
  const int32_t max_rows = std::max(1, cfg.kernel.max_threads / x);
  const int32_t heads = std::max(shape.q_heads + shape.k_heads + shape.v_heads, 1);
  const int32_t groups =
      std::min((heads + kDecodeGroupRows - 1) / kDecodeGroupRows, detail::kMaxHeadGroups);
  cfg.rows = std::min(max_rows, (heads + groups - 1) / groups);
  cfg.head_groups = std::min((heads + cfg.rows - 1) / cfg.rows, detail::kMaxHeadGroups);
  cfg.tokens_per_block = 1;
  detail::set_persistent(cfg, 0);
  return cfg;
}

// Fused keys above kFusedGroupedTokens (a whole head per row of lanes, a head reduction per
// norm, the cache placement computed by every thread): the two-head kernel. Decode sizes cover a
// token's heads in one pass, one token per block: from 128 tokens on the one-head kernel's
// per-thread work (every thread places its token) outweighs its shorter chains, head groups or
// not (bench/history/2026-11-24.md, "Fused decode"). Prefill: what `ropejit tune` picks for that
// step on the H100 and the H200: two rows (looping over the heads; a row per head pair is
// slower) and as many tokens as fill 128 threads, of the 256-thread kernel (v8h2t256_r2_z8, the
// best candidate, ahead of r2_z32 with 512 threads; same file, "The two-head kernel at 256
// threads"). The kernel is prefill_variant's: two heads per thread, whose next pass's heads load
// while the current ones are finished. Balancing the rows of a decode-sized call over its passes
// (12 rows of 2 heads for Qwen3's 48 heads, not 16 with a half-empty second pass) measures the
// same at 256 tokens (bench/history/2026-11-25.md, "Dynamic FP8 prefill: two heads per thread").
// With the ring of passes in shared memory (prefill_variant's), more rows: as many as make about
// six passes per token, two to four. Nothing is held in registers ahead any more, and a token's
// passes are fewer. For the Qwen3 step on the H100, `ropejit tune` puts four or more rows first
// in most cases, and in a same-run benchmark four rows beat two in all six Qwen3 rows
// (bench/history/2026-11-27.md, "Rows of a ring kernel"). Without the ring, two rows.
// Dynamic FP8 scales on a GPU with more DRAM bandwidth per SM (the H200) keep two rows: that
// kernel issues the most instructions per byte, and there each row's share of a token's work
// (its cos/sin row, its cache slot, its loop) counts. The H200's tuner puts two rows (or one) in
// all its fastest launches, and in a benchmark four rows are slower than two there
// (bench/history/2026-11-27.md, "Dynamic FP8 on the H200: two rows"). Measured with dynamic q
// and cache scales; keys with one of the two dynamic follow them.
detail::LaunchConfig fused_config(const Spec& c, const detail::CallShape& shape,
                                  const detail::DeviceInfo& device, detail::LaunchConfig cfg,
                                  bool decode) {
  const int32_t x = detail::chunks(c, cfg.kernel.vec);
  const int32_t heads = std::max(shape.q_heads + shape.k_heads + shape.v_heads, 1);
  const int32_t max_rows = std::max(1, cfg.kernel.max_threads / x);
  const bool dynamic = c.out_store == Store::e4m3_dynamic || c.cache_store == Store::e4m3_dynamic;
  const bool ring_rows =
      cfg.kernel.ring > 0 &&
      !(dynamic && device.memory_gbps / std::max(device.sm_count, 1) >= kTwoPassGbpsPerSm);
  const int32_t prefill_rows = ring_rows
                                   ? std::clamp((heads + kHeadsPerThread * kFusedRingPasses - 1) /
                                                    (kHeadsPerThread * kFusedRingPasses),
                                                2, kFusedRingMaxRows)
                                   : 2;
  cfg.rows =
      decode ? std::min(max_rows, (heads + 1) / 2) : std::min({prefill_rows, max_rows, heads});
  cfg.tokens_per_block =
      decode ? 1 : std::max(1, std::min(64, kFusedPrefillThreads / (x * cfg.rows)));
  detail::set_persistent(cfg, 0);
  return cfg;
}

}  // namespace

namespace {

// `ring`: whether the prefill kernel may keep its ring (heuristic_config's second call, for a
// GPU that cannot run it, chooses the whole launch without one).
detail::LaunchConfig shaped_config(const Spec& c, const detail::CallShape& shape,
                                   const detail::DeviceInfo& device, bool ring) {
  detail::LaunchConfig cfg;
  cfg.kernel = detail::prefill_variant(c, shape.align_bytes, shape.table_align);
  if (!ring) cfg.kernel.ring = 0;
  const int32_t x = detail::chunks(c, cfg.kernel.vec);
  const int32_t max_rows = std::max(1, cfg.kernel.max_threads / x);
  const int32_t heads = std::max(shape.q_heads + shape.k_heads + shape.v_heads, 1);
  // Decided on the token bucket, as the plan that remembers this choice is keyed by it.
  const bool decode =
      detail::token_bucket(shape.tokens) <= kDecodeBlocksPerSm * std::max(device.sm_count, 1);
  if (decode && c.norm != Norm::rms_all_heads &&
      (!c.fused() || detail::token_bucket(shape.tokens) <= kFusedGroupedTokens))
    return decode_config(c, shape, cfg);
  if (c.fused() && c.norm != Norm::rms_all_heads)
    return fused_config(c, shape, device, cfg, decode);
  // A norm over all heads needs every q and k head in the block's first pass.
  const bool two_passes = c.norm != Norm::rms_all_heads &&
                          device.memory_gbps / std::max(device.sm_count, 1) >= kTwoPassGbpsPerSm &&
                          (x & (x - 1)) == 0;
  const int32_t heads_per_row = decode ? 1 : kHeadsPerThread * (two_passes ? 2 : 1);
  cfg.rows = std::min(max_rows, (heads + heads_per_row - 1) / heads_per_row);
  if (decode && cfg.rows == heads) {  // a thread for every head: the one-head kernel
    cfg.kernel = detail::decode_variant(c, shape.align_bytes, shape.table_align);
  }
  const int32_t row_threads = x * cfg.rows;
  cfg.tokens_per_block =
      decode ? 1
             : std::min({64, cfg.kernel.max_threads / row_threads,
                         std::max(1, (kMinBlockThreads + row_threads - 1) / row_threads)});
  detail::set_persistent(cfg, 0);  // one-shot: one block per token group
  return cfg;
}

}  // namespace

detail::LaunchConfig heuristic_config(const Spec& c, const detail::CallShape& shape,
                                      const detail::DeviceInfo& device) {
  detail::LaunchConfig cfg = shaped_config(c, shape, device, true);
  cfg.kernel.narrow = shape.narrow;  // 32-bit offsets wherever the call's fit (fused keys)
  // The launch of a kernel without the ring (whose rows may differ) on a GPU without cp.async
  // (sm_75: each copy would be a load the thread waits for) or that grants a block less shared
  // memory than the ring's launch asks for (every GPU ropejit targets grants at least 64 KB).
  if (cfg.kernel.ring > 0 &&
      (device.cc < 80 || !detail::illegal_reason(c, shape, cfg, device).empty())) {
    cfg = shaped_config(c, shape, device, false);
    cfg.kernel.narrow = shape.narrow;
  }
  return cfg;
}

}  // namespace ropejit::autotune
