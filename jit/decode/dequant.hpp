// e4m3 weights on the unfused paths (QKV projection and FFN gate/up): cuBLASLt's FP8 GEMMs take
// FP8 activations, so each chunk of weight rows is first widened to the activation dtype with
// its row's scale applied, W'[n][k] = dtype(fp32(code · scale[n])) (torch's dequantization,
// `(w.float() * scale[:, None]).to(dtype)`), into the workspace, and the GEMM of that chunk
// follows. A chunk is the whole weight up to kDequantChunkBytes: fewer, larger GEMMs run faster
// (bench/history/2026-11-26.md, "e4m3 weights: where the unfused path takes over"), and the cap
// keeps the workspace bounded for the FFN's larger weights. The kernel is its own key
// (templates/dequant_kernel.cuh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "jit/render.hpp"
#include "templates/dequant_params.cuh"

namespace ropejit::detail {

constexpr size_t kDequantChunkBytes = size_t(64) << 20;
constexpr int32_t kDequantThreads = 256;
constexpr int32_t kDequantCodesPerThread = 16;

// Weight rows a chunk holds: as many rows of `hidden` elements as kDequantChunkBytes takes (a
// multiple of 8 from 8 on, so that the GEMM's output columns of a chunk start 16-byte aligned;
// at least one). A weight with fewer rows is one chunk.
int64_t dequant_chunk_rows(DType dtype, int64_t hidden);
// A chunk's bytes in a workspace for a weight of `rows` rows (the most any of the call's GEMMs
// dequantizes), 256-byte aligned (0 for 16-bit weights): min(rows, dequant_chunk_rows) rows, so
// at most kDequantChunkBytes (a row past it: one row).
size_t dequant_workspace_bytes(DType dtype, Weights weights, int64_t hidden, int64_t rows);

// The kernel's key ("dequant_e4m3_bf16") and its one variant's name.
std::string dequant_key(DType dtype);
constexpr const char* kDequantVariant = "v16";
RenderedKernel render_dequant(DType dtype);

// `rows` rows of `cols` codes (`stride` bytes apart) and their scales -> out, contiguous.
ropejit_dev::DequantParams make_dequant_params(const void* codes, int64_t stride,
                                               const float* scale, void* out, int64_t rows,
                                               int64_t cols);
// The launch's grid: column blocks (x) by rows (y, at most 65535; the kernel loops beyond).
unsigned dequant_grid_x(int64_t cols);
unsigned dequant_grid_y(int64_t rows);

}  // namespace ropejit::detail
