// RMSNorm over the last dimension, one block per row (the decode block's standalone norm):
//   out = x / sqrt(mean(x²) + eps) · w      (or · (1 + w), Gemma)
// in fp32 and rounded once. With a residual, x + residual is formed first (fp32, rounded once
// to the dtype), written back to `residual`, and that rounded sum is what is normalized (as
// vLLM's fused_add_rms_norm). Each thread holds kVecs 16-byte vectors of the row in registers
// between the statistics and the output, so the row is read once.
#pragma once
#include "norm_params.cuh"
#include "rope_types.cuh"

namespace ropejit_dev {

template <class Cfg>
struct NormKernel {
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  enum : int { kPer = 16 / int(sizeof(Raw)), kVecs = Cfg::kVecs };
  typedef Pack<Cfg::kDType, kPer> Vec;

  static __device__ void run(const NormParams& p) {
    __shared__ float warp_sums[32];
    __shared__ float total;
    const long long row = blockIdx.x;
    const int tid = int(threadIdx.x);
    const long long vectors = p.hidden / kPer;
    const char* xr = static_cast<const char*>(p.x) + row * p.x_stride * (long long)sizeof(Raw);
    char* rr = Cfg::kResidual ? static_cast<char*>(p.residual) +
                                    row * p.residual_stride * (long long)sizeof(Raw)
                              : nullptr;
    Vec v[kVecs];
    float sumsq = 0.0f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const long long at = (long long)i * blockDim.x + tid;
      if (at >= vectors) continue;
      v[i].load(xr + at * 16);
      if (Cfg::kResidual) {
        Vec r;
        r.load(rr + at * 16);
#pragma unroll
        for (int e = 0; e < kPer; ++e) v[i].set(e, v[i].get(e) + r.get(e));
        v[i].store(rr + at * 16);
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const float f = v[i].get(e);
        sumsq = fmaf(f, f, sumsq);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sumsq += __shfl_xor_sync(0xffffffffu, sumsq, o);
    if ((tid & 31) == 0) warp_sums[tid >> 5] = sumsq;
    __syncthreads();
    if (tid < 32) {
      float s = tid < int(blockDim.x + 31) / 32 ? warp_sums[tid] : 0.0f;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (tid == 0) total = s;
    }
    __syncthreads();
    const float rstd = 1.0f / sqrtf(total / float(p.hidden) + p.eps);
    char* out = static_cast<char*>(p.out) + row * p.out_stride * (long long)sizeof(Raw);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const long long at = (long long)i * blockDim.x + tid;
      if (at >= vectors) continue;
      Vec w;
      w.load_ro(static_cast<const char*>(p.w) + at * 16);
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const float wf = Cfg::kOnePlus ? 1.0f + w.get(e) : w.get(e);
        v[i].set(e, (v[i].get(e) * rstd) * wf);
      }
      v[i].store(out + at * 16);
    }
  }
};

}  // namespace ropejit_dev
