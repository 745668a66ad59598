// Row-major GEMMs through cuBLASLt, loaded with dlopen on first use like the driver, so that
// every binary still starts without a GPU. The decode block's unfused path (RMSNorm key ->
// GEMM -> RoPE key) uses it where a tensor-core GEMM beats the fused projection kernel.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

// D[m][n] = A[m][k] · B[n][k]ᵀ, every matrix row major with its leading dimension (elements
// between rows), A, B and D of `dtype` (bf16 or f16), fp32 accumulation, one rounding to D.
// This is torch's F.linear(A, B) with B the weight.
struct GemmCall {
  DType dtype = DType::bf16;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  void* workspace = nullptr;  // cuBLASLt's scratch (may be null with 0 bytes)
  size_t workspace_bytes = 0;
  CUstream stream = nullptr;
};

// "" when cuBLASLt is loaded and usable, else why not (the library or an entry point is
// missing). Loads it on the first call: ROPEJIT_CUBLASLT (a path) when set, else
// libcublasLt.so.<major of this build> from the loader's path, next to the NVRTC library this
// build links, then under /usr/local/cuda/lib64.
const std::string& gemm_unavailable();

// The library's version (e.g. 130001) or 0 when it could not be loaded.
size_t gemm_library_version();

// Runs `call` on call.stream in the current context `ctx` (the algorithm is chosen once per
// shape, leading dimensions, pointer alignment and workspace size, and remembered). Safe inside
// a CUDA graph capture. Throws Error(no_driver) when cuBLASLt is unavailable and Error(driver)
// with cuBLASLt's status when it refuses the call.
void gemm(CUcontext ctx, const GemmCall& call);

// Creates cuBLASLt's handle for `ctx` (current) ahead of a graph capture.
void gemm_prepare(CUcontext ctx);

}  // namespace ropejit::detail
