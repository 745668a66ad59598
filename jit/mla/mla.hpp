// MLA keys (MlaSpec): call checking, the argument block and rendering. The engine compiles,
// caches and launches them like the other families (jit/mla/engine.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "jit/render.hpp"
#include "ropejit/ropejit.hpp"
#include "templates/mla_params.cuh"

namespace ropejit::detail {

// Threads per block (one block per token).
constexpr int32_t kMlaThreads = 128;

// The kernel's variant name (its entry is entry_name(key, this)): what render() writes and the
// engine looks up.
std::string mla_variant_name();

// Throws Error(invalid_argument) naming the first bad argument; nothing is launched then.
void check_mla_call(const MlaSpec& canonical, const MlaArgs& args);

ropejit_dev::MlaParams make_mla_params(const MlaSpec& canonical, const MlaArgs& args);

RenderedKernel render(const MlaSpec& canonical);

}  // namespace ropejit::detail
