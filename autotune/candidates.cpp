// Candidate launch configurations for the tuner.
#include "autotune/candidates.hpp"

#include <algorithm>
#include <set>
#include <string>

#include "autotune/policy.hpp"

namespace ropejit::autotune {

std::vector<detail::LaunchConfig> candidates(const Spec& c, const detail::CallShape& shape,
                                             const detail::DeviceInfo& device) {
  std::vector<detail::LaunchConfig> out;
  std::set<std::string> seen;
  auto add = [&](detail::LaunchConfig cfg) {
    cfg.kernel.narrow = shape.narrow;  // decided by the call, as in select_config
    if (!detail::illegal_reason(c, shape, cfg, device).empty()) return;
    if (seen.insert(cfg.name()).second) out.push_back(cfg);
  };
  add(heuristic_config(c, shape, device));
  const int32_t vec = detail::max_vec(c, shape.align_bytes);
  const int32_t x = detail::chunks(c, vec);
  const int32_t heads = std::max(shape.q_heads + shape.k_heads + shape.v_heads, 1);
  // Fused kernels of one or two heads per thread and 16-byte vectors also with a ring of passes
  // loaded ahead: prefill sizes 2..4 slots, decode sizes (fewer passes per thread) the
  // heuristic's three only.
  const bool rings = c.fused() && vec * detail::element_bytes(c.dtype) == 16;
  const bool prefill =
      detail::token_bucket(shape.tokens) > 4 * int64_t(std::max(device.sm_count, 1));
  auto add_rings = [&](const detail::LaunchConfig& cfg) {
    if (!rings || cfg.kernel.heads_per_thread > 2) return;
    for (int32_t ring : {2, 3, 4}) {
      if (!prefill && ring != detail::kPrefillRing) continue;
      detail::LaunchConfig r = cfg;
      r.kernel.ring = ring;
      add(r);
    }
  };
  for (int32_t hpt : {1, 2, 4, 8}) {
    const int32_t full = (heads + hpt - 1) / hpt;  // rows that cover every head in one pass
    for (int32_t threads : {128, 256, 512}) {
      for (int32_t rows : {full, (full + 1) / 2, (full + 3) / 4, 1, 2, 4, 8}) {
        if (rows < 1 || rows > full) continue;
        detail::LaunchConfig cfg;
        cfg.kernel.vec = vec;
        cfg.kernel.table_vec = detail::table_vectors_ok(c, vec, shape.table_align);
        cfg.kernel.heads_per_thread = hpt;
        cfg.kernel.max_threads = std::max(256, threads);
        while (cfg.kernel.max_threads < x) cfg.kernel.max_threads *= 2;
        cfg.rows = rows;
        cfg.tokens_per_block = std::max(1, std::min(64, threads / (x * rows)));
        for (int32_t persistent : {0, 2, 4}) {
          if (persistent && shape.tokens < 4096) continue;  // small grids are one wave anyway
          // Persistent grids win no entry on the H100 and one (d80, 2 heads per thread) on the
          // H200, and only ever with 1-2 heads per thread (bench/history/2026-11-22.md, "Tuner"
          // and "Memory roofline, H200"). For the fused ring kernel they are slower on the
          // H200's dynamic FP8 step, with or without its ring chained across token groups
          // (bench/history/2026-11-27.md, "Three more levers for dynamic FP8 on the H200"). Each
          // persistent variant is one more compile and every candidate one more timing, so the
          // rest are not tried.
          if (persistent && hpt > 2) continue;
          detail::set_persistent(cfg, persistent);
          add(cfg);
          add_rings(cfg);
        }
      }
    }
  }
  // Decode sizes: a token's heads dealt over several blocks (head groups), one token per block.
  if (c.norm != Norm::rms_all_heads &&
      detail::token_bucket(shape.tokens) <= 4 * std::max(device.sm_count, 1)) {
    for (int32_t hpt : {1, 2}) {
      for (int32_t rows : {4, 8, 16}) {
        const int32_t per_block = rows * hpt;
        if (per_block >= heads) continue;
        detail::LaunchConfig cfg;
        cfg.kernel.vec = vec;
        cfg.kernel.table_vec = detail::table_vectors_ok(c, vec, shape.table_align);
        cfg.kernel.heads_per_thread = hpt;
        cfg.kernel.max_threads = 256;
        while (cfg.kernel.max_threads < x * rows) cfg.kernel.max_threads *= 2;
        cfg.rows = rows;
        cfg.head_groups = std::min((heads + per_block - 1) / per_block, detail::kMaxHeadGroups);
        add(cfg);
        cfg.kernel.max_threads = 512;  // the heuristic's decode variant, already compiled
        add(cfg);
      }
    }
  }
  return out;
}

}  // namespace ropejit::autotune
