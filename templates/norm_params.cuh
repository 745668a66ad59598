// Argument block of the RMSNorm kernels (templates/norm_kernel.cuh), shared by the host
// (jit/norm.cpp) and the generated kernels. Plain C types only.
#pragma once

namespace ropejit_dev {

struct NormParams {
  const void* x;
  void* residual;  // null without a residual
  const void* w;
  void* out;
  long long x_stride;
  long long residual_stride;
  long long out_stride;
  long long rows;
  long long hidden;  // a multiple of the vector's elements
  float eps;
  int pad_;
};

}  // namespace ropejit_dev
