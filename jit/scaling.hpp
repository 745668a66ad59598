// Frequency scaling variants on the host, in float64: each variant's inverse frequencies and
// attention factor as its published definition gives them, the checks of their parameters, and
// which position row each rotary pair takes under mRoPE. No GPU; kernels and tables use these.
#pragma once

#include <cstdint>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

// Throws Error (invalid_argument) naming the first field of `s` that the variant `freqs` cannot
// use, e.g. "args.scaling.factor (0) must be > 0 for yarn". `where` prefixes field names
// ("args.scaling", "table.scaling"). Fields a variant does not use are not checked. Needs
// rotary_dim even and >= 2 (and > 2 for dynamic_ntk, whose base exponent is R / (R - 2)).
void validate_scaling(Freqs freqs, int32_t rotary_dim, const RopeScaling& s,
                      const char* where = "args.scaling");

// Radians per position of rotary pair i, for i < rotary_dim / 2, for every Freqs value but table
// (which has no frequencies). computed: base^(-2i/R). The scaled variants as validate_scaling()
// accepts them; `base` must be finite and > 1.
std::vector<double> inverse_frequencies(Freqs freqs, int32_t rotary_dim, double base,
                                        const RopeScaling& s, const char* where = "args.scaling");

// What cos and sin are multiplied by: yarn's and longrope's attention factor (an explicit
// s.attention_factor > 0 overrides it), 1 for every other variant.
double attention_factor(Freqs freqs, int32_t rotary_dim, const RopeScaling& s,
                        const char* where = "args.scaling");

// The position row (0 temporal, 1 height, 2 width) of each rotary pair under mRoPE: contiguous
// sections in that order (Qwen2-VL, Qwen2.5-VL), or interleaved pair by pair, T H W T H W ...,
// while the height and width sections last (Qwen3-VL). Throws Error unless the sections are
// >= 0 and sum to rotary_dim / 2.
std::vector<int8_t> mrope_pair_rows(int32_t rotary_dim, const int32_t section[3], bool interleaved);

}  // namespace ropejit::detail
