// RMSNorm keys (RmsNormSpec): the kernel variant a row length needs, call checking, the
// argument block and rendering. The engine compiles, caches and launches them like the others.
#pragma once

#include <cstdint>
#include <string>

#include "jit/render.hpp"
#include "templates/norm_params.cuh"

namespace ropejit::detail {

// Threads per block (one block per row).
constexpr int32_t kNormThreads = 256;

// 16-byte vectors each thread keeps in registers: 1, 2, 4, 8 or 16 (a power of two covering
// the row). Part of the kernel's name ("v2").
struct NormVariant {
  int32_t vecs = 1;
  std::string name() const;
  friend bool operator==(const NormVariant& a, const NormVariant& b) { return a.vecs == b.vecs; }
};

struct NormShape {
  int64_t rows = 0;
  int64_t hidden = 0;
  NormVariant variant;  // the one the row length needs
};

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
NormShape check_norm_call(const RmsNormSpec& canonical, const RmsNormArgs& args);

ropejit_dev::NormParams make_norm_params(const RmsNormSpec& canonical, const RmsNormArgs& args);

RenderedKernel render(const RmsNormSpec& canonical, const NormVariant& variant);

}  // namespace ropejit::detail
