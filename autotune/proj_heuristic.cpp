// The QKV projection's launch choice (templates/proj_kernel.cuh). Blocks own 8 column pairs
// over the whole hidden dimension, so a Llama-3-8B projection (6144 columns) runs 384 blocks;
// four warps split the hidden dimension, enough 16-byte weight loads in flight per SM to
// stream the weights at memory speed. Token tiles follow the call (8 tokens each, up to 64 per
// block), and the loop unroll shrinks as tiles grow, keeping the loaded activations in
// registers (token_tiles x unroll <= 8).
#include "autotune/policy.hpp"

namespace ropejit::autotune {
namespace {

detail::ProjVariant variant_for_tiles(int32_t tiles) {
  detail::ProjVariant v;
  v.token_tiles = tiles;
  v.splits = tiles <= 4 ? 8 : 4;
  v.unroll = 1;
  return v;
}

}  // namespace

detail::ProjVariant proj_heuristic(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                                   const detail::DeviceInfo& device) {
  (void)canonical;
  (void)device;
  return variant_for_tiles(detail::proj_token_tiles(shape.tokens));
}

std::vector<detail::ProjVariant> proj_heuristic_variants(const QkvProjSpec& canonical,
                                                         const detail::DeviceInfo& device) {
  (void)canonical;
  (void)device;
  std::vector<detail::ProjVariant> out;
  for (const int32_t tiles : {1, 2, 4, 8}) out.push_back(variant_for_tiles(tiles));
  return out;
}

}  // namespace ropejit::autotune
