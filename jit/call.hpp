// Validation of a call's arguments against its spec, and the kernel argument block.
#pragma once

#include <cstdint>
#include <vector>

#include "jit/launch_config.hpp"
#include "templates/rope_params.cuh"

namespace ropejit::detail {

// Whether the key's frequencies are a scaled variant (per-pair turns from the host's float64
// table), and whether its argument block carries a PairTable (scaled frequencies, or mRoPE's
// per-pair position rows).
inline bool scaled_freqs(const Spec& c) {
  return c.freqs != Freqs::table && c.freqs != Freqs::computed;
}
inline bool needs_pair_table(const Spec& c) {
  return scaled_freqs(c) || c.positions == Positions::mrope;
}

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
// Reads no device memory. A call with zero tokens is valid and returns tokens == 0.
CallShape check_call(const Spec& canonical, const Args& args);

// The per-pair table of a key that needs one (needs_pair_table): each pair's turns per position
// (float64 inverse frequency / 2 pi, as jit/scaling.hpp defines the variant), the attention
// factor, and mRoPE's position row of each pair. Checks the scaling parameters and sections
// (throws Error naming them); remembers the last inputs per thread, so repeated calls cost a
// comparison.
struct PairData {
  std::vector<double> turns;
  double attention = 1.0;
  std::vector<int8_t> rows;
};
const PairData& pair_data(const Spec& canonical, const Args& args);

// The kernel argument block for a checked call: plain kernels take its `rope` part, fused
// kernels all of it.
ropejit_dev::FusedParams make_params(const Spec& canonical, const Args& args,
                                     const CallShape& shape);

}  // namespace ropejit::detail
