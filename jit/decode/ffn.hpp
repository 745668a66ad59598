// The FFN's gate/up half (FfnSpec): call checking, the argument blocks and rendering of the
// fused kernel (the projection kernel with its GLU epilogue, templates/proj_kernel.cuh) and of
// the unfused path's GLU kernel (templates/glu_kernel.cuh). The engine compiles, caches and
// launches them; autotune/ chooses the variant and the path.
#pragma once

#include <cstdint>
#include <string>

#include "jit/decode/proj.hpp"
#include "jit/render.hpp"
#include "templates/glu_params.cuh"

namespace ropejit::detail {

struct FfnShape {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  // The projection kernel's view: one column pair per output column (gate row, up row).
  ProjShape proj() const { return ProjShape{tokens, hidden, 0, 0, intermediate}; }
};

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
FfnShape check_ffn_call(const FfnSpec& canonical, const FfnArgs& args);

ropejit_dev::ProjParams make_ffn_params(const FfnSpec& canonical, const FfnArgs& args,
                                        const FfnShape& shape);

RenderedKernel render(const FfnSpec& canonical, const ProjVariant& variant);

// The unfused path: RMSNorm key -> GEMM(s) into the workspace -> the GLU kernel. Its workspace
// holds the normalized activation (none without a norm), the gate and up products
// ([tokens][2 intermediate]), with e4m3 weights a chunk of dequantized weight rows
// (jit/decode/dequant.hpp), each 256-byte aligned, then cuBLASLt's scratch.
size_t ffn_product_bytes(const FfnSpec& canonical, int64_t tokens, int64_t intermediate);
size_t ffn_workspace_bytes(const FfnSpec& canonical, int64_t tokens, int64_t hidden,
                           int64_t intermediate);
// "" when a checked call can take the unfused path, else why not, starting with the argument's
// name (rows the RMSNorm key takes; with `need_workspace`, the workspace).
std::string ffn_split_problem(const FfnSpec& canonical, const FfnArgs& args, const FfnShape& shape,
                              bool need_workspace);

// The GLU kernel: its key ("glu_bf16_silu") and variant (elements per thread: 8 when every
// row start is 16-byte aligned, else 1).
constexpr int32_t kGluThreads = 256;
struct GluVariant {
  int32_t vec = 8;
  std::string name() const { return "v" + std::to_string(vec); }
};
std::string glu_key(const FfnSpec& canonical);
RenderedKernel render_glu(const FfnSpec& canonical, const GluVariant& variant);

}  // namespace ropejit::detail
