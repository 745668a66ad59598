// The QKV projection's launch choice (templates/proj_kernel.cuh). Blocks own 8 column pairs
// over the whole hidden dimension, so a Llama-3-8B projection (6144 columns) runs 384 blocks,
// compiled to stay resident together (one wave on 132 SMs). What the H100 measured at that
// shape, every variant with the call's token tiles (bench/RESULTS.md, "The decode block's QKV
// projection" and "A clean L2"): eight warps splitting the hidden dimension beat four and two
// at 1 and 16 tokens (23.4 / 29.5 / 44.2 µs at one token with one chunk per iteration, clean
// L2); at one token two 32-element chunks per iteration beat one (22.3 against 23.4 µs with a
// clean L2; the same within 0.1 µs after a memset flush), four spill; from two tiles on one
// chunk is best (the activations take the registers: 25.6 against 50.5 µs at 16 tokens); at
// 64 tokens four warps beat eight (58.9 against 70.4 µs): the activations of eight token tiles
// then need the registers. e4m3 weights at one tile already read 64-element chunks (two of them
// spill). The FFN with 16-bit weights (a 1792-block grid of several waves at Llama-3-8B's
// 14336 columns) runs four warps of two chunks at one token tile: `ropejit tune` measured 82.6
// against 85.3 µs at one token (eight warps, one chunk; bench/RESULTS.md, "Tuning the fused
// variants"); at two tiles, staged row groups (below, at the FFN's functions). With e4m3 weights
// it keeps the projection's choice (52.4 against 52.6 µs: level).
//
// e4m3 weights at two and four token tiles read 64-element chunks (`wide`, four warps, compiled
// for two resident 8-warp blocks' worth): 21.3 against 22.5 µs at 16 tokens and 29.7 against
// 35.2 at 32 on the H100 (`ropejit tune`, bench/RESULTS.md "Tuning the fused variants"); the
// FFN's e4m3 key likewise (72.7 against 74.4 µs at 16).
//
// Grids with fewer blocks than the GPU has SMs (a tensor-parallel shard: Llama-3-70B at TP 8 has
// 80 column blocks) split the hidden dimension over a thread-block cluster on sm_90+: the
// largest of 2, 4, 8 that keeps the grid within three blocks per SM. The H100 at that shard
// (bench/RESULTS.md, "Thread-block clusters"): 15.8 against 18.0 µs at one token (c4), 17.7
// against 30.3 at 16 (c4); at Llama-3-8B (384 blocks) clusters only add a second wave.
//
// After the kernel loop's rework (packed norm multiply, unconditional loads, alternating
// stages; bench/RESULTS.md, "The decode block's kernel loop, reworked"), `ropejit tune` on the H100
// at Llama-3-8B: the projection with 16-bit weights at four tiles runs four warps of two chunks
// (m4s4u2 26.5 against m4s8u1 33.2 µs at 32 tokens, and against the unfused path's 29.5, so the
// fused path now goes to 32 tokens); the FFN with e4m3 weights two chunks at one tile (m1s8u2
// 47.8 against 50.0 µs) and two warps of two wide chunks at two tiles (m2s2u2w 54.5 against
// 59.8); with e4m3 weights at 64 tokens both run m4s2u1w (four tiles, two warps of wide chunks:
// projection 35.1 against m8s4u1's 44.2 µs, FFN 148.3 against 170.6). The other choices above
// stayed the tuner's best or within 2.5% of it.
//
// With 16-bit weights, from two token tiles on, the tokens are the mma's 16-row operand (`swap`,
// name suffix `t`; templates/proj_kernel.cuh says why it saves a move per weight register). The
// H100 (bench/RESULTS.md, "Swapped operands"): the projection at 32 tokens 25.6-26.2 against
// 26.1-27.2 µs (m4s4u2t against m4s4u2, alternated builds), fused at 48 and 64 tokens 38.0-38.4
// against 39.9 (the unfused path's 28-29 µs still wins there), 16 tokens and the FFN level
// (m2s8u1t 23.1-23.5 against m2s8u1 23.3; the tuner, with a clean L2, 23.4 against 23.9).
//
// At four token tiles (17-32 tokens) on sm_90+, a projection with 16-bit weights whose grid stays
// wide runs eight row groups of one warp each, sharing staged activations, in clusters of four
// (`m4s1u2r8c4`: 64 pairs per block, the hidden dimension over four blocks). `ropejit tune` chose
// it at Llama-3-8B's 32 tokens on both GPUs (bench/RESULTS.md, "Row groups sharing staged
// activations"): 25.1 against 26.2-26.5 µs on the H100, 21.3-21.7 against 23.8 on the H200. It
// needs as many blocks as SMs: a narrower projection keeps m4s4u2t and the cluster rule.
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

// The path by token count. The H100 at Llama-3-8B's projection (bench/RESULTS.md): the fused
// kernel takes 27.7 µs at 16 tokens, cuBLAS's GEMM alone 28.9 µs (plus the RMSNorm and RoPE
// launches of the unfused path); at 32 tokens the fused kernel takes 39.9 µs against cuBLAS's
// 28.6 µs. So (then) fused up to 16 tokens, unfused beyond; `ropejit tune --key qkvproj_...`
// measures the crossover of a shape on its GPU and the tuning file overrides this.
//
// e4m3 weights: the fused kernel reads half the bytes, while the unfused path first dequantizes
// the weight chunk by chunk (jit/dequant.hpp) before the same GEMM, which costs it a nearly flat
// 60 µs at the projection's shape. `ropejit tune` on the H100 (bench/RESULTS.md, "e4m3 weights:
// where the unfused path takes over"): projection fused 52.9 against unfused 62.1 µs at 64
// tokens (57.8 with the whole weight in one chunk), 100.3 against 65.7 at 128; the FFN's gate/up
// (hidden 4096, intermediate 14336) fused 229 against ~240 µs at 64 tokens, 120 against 238 at 32.
// So fused up to 64 tokens, unfused beyond. With 16-bit weights the projection runs fused up to
// 32 tokens (the H100 after the loop's rework: 26.5 against 29.5 µs at 32, 41.1 against 29.3 at
// 64), the FFN up to 16 (at 32 its best fused variant and the unfused path are level, 94.7 and
// 94.0 µs). `ropejit tune` races both paths, each checked against float64 first, and its file
// overrides this.
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
// activations, as each GPU's tuner chose at Llama-3-8B's 16 tokens, against the earlier
// `m2s4u1t` (bench/RESULTS.md, "The FFN's default at two tiles"): where an SM has less DRAM
// bandwidth (the H100's 25 GB/s), two groups of two warps (`m2s2u4tr2`: 84.5-85.0 against
// 86.1-86.4 µs; level on the H200); from 30 GB/s per SM (the H200's 37), four groups of one
// warp (`m2s1u4r4`: 63.7-65.3 against 66.5-66.9 µs; 3% slower than `m2s4u1t` on the H100).
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
