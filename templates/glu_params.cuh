// Argument block of the GLU kernel (templates/glu_kernel.cuh), shared by the host
// (jit/ffn.cpp) and the generated kernels. Plain C types only.
#pragma once

namespace ropejit_dev {

struct GluParams {
  const void* gate;  // [rows][cols], row stride gate_stride
  const void* up;    // [rows][cols], row stride up_stride
  void* out;         // [rows][cols], row stride out_stride
  long long rows;
  long long cols;
  long long gate_stride;
  long long up_stride;
  long long out_stride;
};

}  // namespace ropejit_dev
