// Shared by the GPU test files: make device 0's primary context current on this thread.
#pragma once

#include "jit/driver.hpp"

namespace ropejit::testing {

inline CUcontext use_primary_context() { return detail::use_primary_context(0); }

}  // namespace ropejit::testing
