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
constexpr int64_t kMlaWarps = kMlaThreads / 32;  // cache rows a block (a warp each)
// 16-byte units a query block takes in one pass (its threads' batches of four).
constexpr int64_t kMlaUnitsPerBlock = 4 * kMlaThreads;

// The kernel's variant name (its entry is entry_name(key, this)): what render() writes and the
// engine looks up.
std::string mla_variant_name();

// Throws Error(invalid_argument) naming the first bad argument; nothing is launched then.
void check_mla_call(const MlaSpec& canonical, const MlaArgs& args);

// The argument block and the grid's y extent (the cache row's block, then the query's blocks of
// heads) for a GPU of `sm_count` SMs.
ropejit_dev::MlaParams make_mla_params(const MlaSpec& canonical, const MlaArgs& args, int sm_count,
                                       unsigned* grid_y);

RenderedKernel render(const MlaSpec& canonical);

}  // namespace ropejit::detail
