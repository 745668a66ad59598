// Validation of a call's arguments against its spec, and the kernel argument block.
#pragma once

#include "jit/launch_config.hpp"
#include "templates/rope_params.cuh"

namespace ropejit::detail {

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
// Reads no device memory. A call with zero tokens is valid and returns tokens == 0.
CallShape check_call(const Spec& canonical, const Args& args);

// The kernel argument block for a checked call: plain kernels take its `rope` part, fused
// kernels all of it.
ropejit_dev::FusedParams make_params(const Spec& canonical, const Args& args,
                                     const CallShape& shape);

}  // namespace ropejit::detail
