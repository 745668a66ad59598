// Argument block of the e4m3 weight dequantization kernel (templates/dequant_kernel.cuh),
// shared by the host (jit/dequant.cpp) and the generated kernels. Plain C types only.
#pragma once

namespace ropejit_dev {

struct DequantParams {
  const void* codes;   // [rows][cols] e4m3 codes, rows codes_stride bytes apart (16-byte aligned)
  const float* scale;  // [rows]: each row's dequantization scale
  void* out;           // [rows][cols] of the activation dtype, contiguous
  long long rows;
  long long cols;  // a multiple of 16
  long long codes_stride;
};

}  // namespace ropejit_dev
