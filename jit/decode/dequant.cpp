// The e4m3 weight dequantization kernel of the unfused paths: chunk sizes, key, rendering and
// argument block.
#include "jit/decode/dequant.hpp"

#include <algorithm>
#include <map>

#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/family.hpp"
#include "jit/launch_config.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {

int64_t dequant_chunk_rows(DType dtype, int64_t hidden) {
  const int64_t per_row = std::max<int64_t>(1, hidden) * element_bytes(dtype);
  int64_t n = int64_t(kDequantChunkBytes) / per_row;
  if (n >= 8) n -= n % 8;
  return std::max<int64_t>(1, n);
}

size_t dequant_workspace_bytes(DType dtype, Weights weights, int64_t hidden, int64_t rows) {
  if (weights != Weights::e4m3 || hidden <= 0 || rows <= 0) return 0;
  const uint64_t bytes = uint64_t(std::min(rows, dequant_chunk_rows(dtype, hidden))) *
                         uint64_t(hidden) * uint64_t(element_bytes(dtype));
  return size_t((bytes + 255) / 256 * 256);
}

std::string dequant_key(DType dtype) {
  return std::string(family_tag(Family::dequant)) + "_e4m3_" + to_string(dtype);
}

RenderedKernel render_dequant(DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    invalid("dtype (", to_string(dtype), ") of e4m3 weights' dequantization must be bf16 or f16");
  return render_entry(dequant_key(dtype), kDequantVariant, "dequant_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(dtype))},
                          {"threads", std::to_string(kDequantThreads)},
                      });
}

ropejit_dev::DequantParams make_dequant_params(const void* codes, int64_t stride,
                                               const float* scale, void* out, int64_t rows,
                                               int64_t cols) {
  ropejit_dev::DequantParams p{};
  p.codes = codes;
  p.scale = scale;
  p.out = out;
  p.rows = rows;
  p.cols = cols;
  p.codes_stride = stride;
  return p;
}

unsigned dequant_grid_x(int64_t cols) {
  const int64_t per_block = int64_t(kDequantThreads) * kDequantCodesPerThread;
  return unsigned((cols + per_block - 1) / per_block);
}

unsigned dequant_grid_y(int64_t rows) { return unsigned(std::min<int64_t>(rows, 65535)); }

}  // namespace ropejit::detail
