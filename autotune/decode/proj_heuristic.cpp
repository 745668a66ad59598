// The QKV projection's and the FFN gate/up's launch choice (templates/proj_kernel.cuh). Blocks
// own 8 column pairs over the whole hidden dimension, so a Llama-3-8B projection (6144 columns)
// runs 384 blocks, compiled to stay resident together (one wave on 132 SMs). The variants are
// what `ropejit tune` picks at Llama-3-8B's shapes, and a tuning file overrides them:
//   - eight warps split the hidden dimension up to four token tiles, four beyond; two chunks per
//     iteration at one tile, one from two tiles on: the activations take the registers
//     (bench/history/2026-11-24.md, "The decode block's QKV projection" and "A clean L2, a
//     read-pass floor, and thread-block clusters");
//   - 16-bit weights: four warps of two chunks at four tiles (bench/history/2026-11-26.md, "The
//     decode block's kernel loop, reworked"), the tokens as the mma's 16-row operand from two
//     tiles on (`swap`, name suffix `t`; templates/proj_kernel.cuh says why; same file,
//     "Swapped operands"), and on sm_90+ at four tiles, where the grid stays wide, eight row
//     groups of one warp sharing staged activations in clusters of four (`m4s1u2r8c4`; it
//     needs as many blocks as SMs, so a narrower projection keeps m4s4u2t;
//     bench/history/2026-11-27.md, "Row groups sharing staged activations");
//   - e4m3 weights: 64-element chunks, at one tile already (two of them spill there), at two and
//     four tiles as `wide` (bench/history/2026-11-25.md, "Tuning the fused variants"); the FFN's
//     two chunks at one tile and two warps of two wide chunks at two (2026-11-26.md, "The decode
//     block's kernel loop, reworked");
//   - the FFN with 16-bit weights (a grid of several waves): four warps of two chunks at one tile
//     (2026-11-25.md, "Tuning the fused variants"), staged row groups at two (at the FFN's
//     functions below);
//   - grids with fewer blocks than the GPU has SMs (a tensor-parallel shard: Llama-3-70B at TP 8
//     has 80 column blocks) split the hidden dimension over a thread-block cluster on sm_90+: the
//     largest of 2, 4, 8 that keeps the grid within three blocks per SM; at Llama-3-8B clusters
//     would only add a second wave (bench/history/2026-11-24.md, "A clean L2, a read-pass floor,
//     and thread-block clusters").
#include <algorithm>

#include "autotune/policy.hpp"

namespace ropejit::autotune {
namespace {

// The largest token count the heuristic runs fused (proj_heuristic_path and ffn_heuristic_path
// say why).
int64_t fused_up_to(Weights weights, bool ffn) {
  return weights == Weights::e4m3 ? 64 : ffn ? 16 : 32;
}

// The variant for calls of `tiles` token tiles (detail::proj_token_tiles). e4m3 weights from 33
// tokens on run four tiles per block (two rows of blocks at 64 tokens) with two warps of wide
// chunks: eight tiles of 32-element chunks need registers the wide ones leave free.
detail::ProjVariant variant_for_tiles(int32_t tiles, int32_t unroll_at_one_tile = 1,
                                      bool fp8_weights = false) {
  detail::ProjVariant v;
  v.token_tiles = tiles;
  v.splits = tiles <= 4 ? 8 : 4;
  v.unroll = tiles == 1 ? unroll_at_one_tile : 1;
  if (fp8_weights && (tiles == 2 || tiles == 4)) {
    v.splits = 4;
    v.wide = true;
  }
  if (fp8_weights && tiles == 8) {
    v.token_tiles = 4;
    v.splits = 2;
    v.wide = true;
  }
  return v;
}

// The projection's variant: with 16-bit weights two chunks per iteration at one token tile, and
// at four tiles four warps with two chunks each.
detail::ProjVariant proj_variant_for_tiles(const QkvProjSpec& canonical, int32_t tiles) {
  const bool fp8 = canonical.weights == Weights::e4m3;
  detail::ProjVariant v = variant_for_tiles(tiles, fp8 ? 1 : 2, fp8);
  if (!fp8 && tiles == 4) {
    v.splits = 4;
    v.unroll = 2;
  }
  if (!fp8 && tiles >= 2) v.swap = true;
  return v;
}

// The cluster for a grid of `blocks` (1: none).
int32_t cluster_for(int64_t blocks, const detail::DeviceInfo& device) {
  if (device.cc < 90 || blocks >= device.sm_count) return 1;
  int32_t c = 1;
  while (c < 8 && blocks * 2 * c <= 3 * int64_t(device.sm_count)) c *= 2;
  return c;
}

// The staged variant at four token tiles, where the call's projection is wide enough for it (see
// the top of this file); false where the rule does not apply.
bool staged_at_four_tiles(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                          const detail::DeviceInfo& device, detail::ProjVariant* out) {
  detail::ProjVariant v{4, 1, 2};
  v.rows = 8;
  v.cluster = 4;
  if (canonical.weights == Weights::e4m3 || device.cc < 90 || shape.pairs <= 0) return false;
  if (int64_t(detail::proj_grid_x(shape, v)) * v.cluster < device.sm_count) return false;
  *out = v;
  return true;
}

}  // namespace

detail::ProjVariant proj_heuristic(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                                   const detail::DeviceInfo& device) {
  const int32_t tiles = detail::proj_token_tiles(shape.tokens);
  detail::ProjVariant staged;
  if (tiles == 4 && staged_at_four_tiles(canonical, shape, device, &staged)) return staged;
  detail::ProjVariant v = proj_variant_for_tiles(canonical, tiles);
  v.cluster =
      cluster_for(int64_t(detail::proj_grid_x(shape, v)) * detail::proj_grid_y(shape, v), device);
  return v;
}

// The path by token count: fused up to fused_up_to's count, unfused (cuBLAS's GEMM with the
// RMSNorm and RoPE launches) beyond. With 16-bit weights the fused projection wins up to 32
// tokens and the fused FFN up to 16, level at 32 (bench/history/2026-11-24.md, "The chooser:
// fused or unfused per token bucket, QKV projection and FFN gate/up"; 2026-11-26.md, "The
// decode block's kernel loop, reworked"). With e4m3 weights the fused kernel reads half the
// bytes, while the unfused path first dequantizes the weight chunk by chunk
// (jit/decode/dequant.hpp) before the same GEMM, a nearly flat cost, so both run fused up to 64
// tokens (bench/history/2026-11-26.md, "e4m3 weights: where the unfused path takes over"). `ropejit
// tune --key qkvproj_...` races both paths on a shape's GPU, each checked against float64 first,
// and its file overrides this.
ProjPath proj_heuristic_path(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                             const detail::DeviceInfo& device) {
  (void)device;
  return shape.tokens <= fused_up_to(canonical.weights, false) ? ProjPath::fused
                                                               : ProjPath::unfused;
}

std::vector<detail::ProjVariant> proj_heuristic_variants(const QkvProjSpec& canonical,
                                                         const detail::ProjShape& shape,
                                                         const detail::DeviceInfo& device) {
  std::vector<detail::ProjVariant> out;
  for (const int32_t tiles : {1, 2, 4, 8}) {
    const detail::ProjVariant v = proj_variant_for_tiles(canonical, tiles);
    out.push_back(v);
    if (shape.pairs <= 0) continue;
    // Token counts of this tile count: one row of blocks, or (eight tiles) any number of rows;
    // the cluster shrinks as the rows grow and is 1 from a grid of sm_count blocks on.
    const int64_t columns = detail::proj_grid_x(shape, v);
    for (int64_t rows = 1; tiles == 8 || rows == 1; ++rows) {
      detail::ProjVariant c = v;
      c.cluster = cluster_for(columns * rows, device);
      if (c.cluster == 1) break;
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
    detail::ProjVariant staged;
    if (tiles == 4 && staged_at_four_tiles(canonical, shape, device, &staged))
      out.push_back(staged);
  }
  return out;
}

// The FFN's gate/up runs the same kernel with another epilogue: the same variants by token
// tiles, and the same crossover until `ropejit tune --key ffnglu_...` measures its own. With
// 16-bit weights at two token tiles (9-16 tokens) it runs row groups sharing staged
// activations, as each GPU's tuner chooses at Llama-3-8B's 16 tokens, ahead of `m2s4u1t`
// (bench/history/2026-11-27.md, "The FFN's default at two tiles"): where an SM has less DRAM
// bandwidth (the H100's 25 GB/s), two groups of two warps (`m2s2u4tr2`; level on the H200);
// from 30 GB/s per SM (the H200's 37), four groups of one warp (`m2s1u4r4`, slower than
// `m2s4u1t` on the H100).
namespace {

constexpr double kWideFfnGbpsPerSm = 30;  // DRAM GB/s per SM from which m2s1u4r4 runs

detail::ProjVariant ffn_variant_for_tiles(const FfnSpec& canonical, int32_t tiles,
                                          const detail::DeviceInfo& device) {
  const bool fp8 = canonical.weights == Weights::e4m3;
  detail::ProjVariant v = variant_for_tiles(tiles, 1, fp8);
  if (!fp8 && tiles == 1) {
    v.splits = 4;
    v.unroll = 2;
  }
  if (!fp8 && tiles == 2) {  // row groups of four chunks per warp, sharing activations
    const bool wide = device.memory_gbps / std::max(device.sm_count, 1) >= kWideFfnGbpsPerSm;
    v.splits = wide ? 1 : 2;
    v.unroll = 4;
    v.rows = wide ? 4 : 2;
    v.swap = !wide;
    return v;
  }
  if (!fp8 && tiles >= 2) v.swap = true;
  if (fp8 && tiles == 1) v.unroll = 2;  // two 64-element chunks per iteration
  if (fp8 && tiles == 2) {              // two warps, two wide chunks each
    v.splits = 2;
    v.unroll = 2;
  }
  return v;
}

}  // namespace

detail::ProjVariant ffn_heuristic(const FfnSpec& canonical, const detail::ProjShape& shape,
                                  const detail::DeviceInfo& device) {
  return ffn_variant_for_tiles(canonical, detail::proj_token_tiles(shape.tokens), device);
}

std::vector<detail::ProjVariant> ffn_heuristic_variants(const FfnSpec& canonical,
                                                        const detail::DeviceInfo& device) {
  std::vector<detail::ProjVariant> out;
  for (const int32_t tiles : {1, 2, 4, 8})
    out.push_back(ffn_variant_for_tiles(canonical, tiles, device));
  return out;
}

ProjPath ffn_heuristic_path(const FfnSpec& canonical, const detail::ProjShape& shape,
                            const detail::DeviceInfo& device) {
  (void)device;
  return shape.tokens <= fused_up_to(canonical.weights, true) ? ProjPath::fused : ProjPath::unfused;
}

}  // namespace ropejit::autotune
