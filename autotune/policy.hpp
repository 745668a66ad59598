// What jit/ asks autotune/: the launch configuration for a spec and call shape on a device.
#pragma once

#include "launch_config.hpp"

namespace ropejit::autotune {

// The built-in heuristic: widest legal vectors, four heads per thread, 256-thread blocks.
// Its kernel variant depends only on the spec and alignment, never on sizes, so changing
// shapes never compiles anything new.
detail::LaunchConfig heuristic_config(const Spec& canonical, const detail::CallShape& shape,
                                      const detail::DeviceInfo& device);

// The configuration the library launches with (today: the heuristic).
detail::LaunchConfig select_config(const Spec& canonical, const detail::CallShape& shape,
                                   const detail::DeviceInfo& device);

}  // namespace ropejit::autotune
