// Model presets for `ropejit compile` / `ropejit tune`: head counts, dims and RoPE base.
#pragma once

#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::cli {

struct Preset {
  std::string name;
  int32_t q_heads;
  int32_t kv_heads;
  int32_t head_dim;
  int32_t rotary_dim;
  double base;
  std::string note;
};

const std::vector<Preset>& presets();
// Throws Error naming the known presets when `name` is not one.
const Preset& find_preset(const std::string& name);

// The specs a deployment of `p` typically calls: bshd and thd; offset and int64 position ids;
// fp32 half-width table and computed frequencies; forward and backward; in and out of place.
std::vector<Spec> preset_specs(const Preset& p, DType dtype);

}  // namespace ropejit::cli
