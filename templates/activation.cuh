// The gated FFN's activations in fp32, shared by the fused projection's GLU epilogue
// (proj_kernel.cuh) and the unfused path's GLU kernel (glu_kernel.cuh): the same arithmetic on
// both paths. expf and tanhf are within a few ulps of the exact functions.
#pragma once

namespace ropejit_dev {

enum : int { kActSilu = 0, kActGeluTanh = 1 };

template <int kAct>
__device__ __forceinline__ float activate(float g) {
  if (kAct == kActSilu) return g / (1.0f + expf(-g));
  const float inner = 0.7978845608028654f * fmaf(0.044715f * g, g * g, g);
  return 0.5f * g * (1.0f + tanhf(inner));
}

}  // namespace ropejit_dev
