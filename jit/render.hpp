// Key + kernel variant -> CUDA source (the entry template with its constants bound).
#pragma once

#include <string>

#include "jit/launch_config.hpp"

namespace ropejit::detail {

struct RenderedKernel {
  std::string key;     // Spec::key()
  std::string entry;   // extern "C" symbol, unique per key and variant
  std::string source;  // translation unit handed to NVRTC (includes embedded headers)
};

// The kernel's C symbol: the key with '-' spelled 'Z' (keys have no capitals, so the
// mapping is one-to-one), then "__" and the variant.
std::string entry_name(const std::string& key, const KernelVariant& variant);

RenderedKernel render(const Spec& canonical, const KernelVariant& variant);

}  // namespace ropejit::detail
