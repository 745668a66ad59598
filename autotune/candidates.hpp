// The launch configurations the tuner times for one key and call shape.
#pragma once

#include <vector>

#include "jit/launch_config.hpp"

namespace ropejit::autotune {

// Every legal candidate, deduplicated, in a fixed order with the heuristic's choice first:
// heads per thread {1, 2, 4, 8} x block sizes {128, 256, 512} x head rows (all heads in one
// pass, or fewer rows looping) x one-shot or persistent grids. Configurations the device or
// the spec cannot run are pruned, not reported.
std::vector<detail::LaunchConfig> candidates(const Spec& canonical, const detail::CallShape& shape,
                                             const detail::DeviceInfo& device);

}  // namespace ropejit::autotune
