// The llama table key's kernel written out by hand, flat: the same work as the heuristic's
// v8h2t512 kernel for rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip (q and
// k, two heads per thread per pass, strides, position ids, out-of-table NaN), without the
// templates' layers. For bench/compile_phases.py --source: how much of a cold compile the
// template structure costs, against bench/minimal_rope.cu (one q head, no strides). Never
// launched.
#include "rope_params.cuh"
using namespace ropejit_dev;
__device__ __forceinline__ float bf(unsigned short r) { return __uint_as_float(unsigned(r) << 16); }
__device__ __forceinline__ unsigned short tobf(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
extern "C" __global__ void __launch_bounds__(512) flat_rope(const __grid_constant__ RopeParams p) {
  const int chunk = threadIdx.x;
  const long long t = (long long)blockIdx.x * blockDim.z + threadIdx.z;
  const int total = p.q.heads + p.k.heads;
  if (t >= p.tokens || int(threadIdx.y) >= total) return;
  const unsigned b = unsigned(t) / unsigned(p.seq_len);
  const long long s = t - (long long)b * p.seq_len;
  const char* qin = (const char*)p.q.in + (b * p.q.stride_batch + s * p.q.stride_seq) * 2;
  const char* kin = (const char*)p.k.in + (b * p.k.stride_batch + s * p.k.stride_seq) * 2;
  const long long qh = p.q.stride_head * 2, kh = p.k.stride_head * 2;
  const int col = chunk * 16;
  float cs[8], sn[8];
  bool first = true;
  for (int h0 = threadIdx.y; h0 < total; h0 += 2 * blockDim.y) {
    uint4 lo[2], hi[2];
    const char* src[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = h0 + j * blockDim.y;
      const bool is_k = h >= p.q.heads;
      src[j] = (is_k ? kin + (h - p.q.heads) * kh : qin + h * qh) + col;
      if (h < total) {
        lo[j] = *(const uint4*)src[j];
        hi[j] = *(const uint4*)(src[j] + 128);
      }
    }
    if (first) {
      const long long pos = __ldg((const long long*)p.positions + b * p.seq_len + s);
      const bool inside = pos >= 0 && pos < p.table_rows;
      const float* c = (const float*)p.cos + (inside ? pos : 0) * p.table_stride + chunk * 8;
      const float* sp = (const float*)p.sin + (inside ? pos : 0) * p.table_stride + chunk * 8;
      float4 c0 = __ldg((const float4*)c), c1 = __ldg((const float4*)c + 1);
      float4 s0 = __ldg((const float4*)sp), s1 = __ldg((const float4*)sp + 1);
      cs[0] = c0.x;
      cs[1] = c0.y;
      cs[2] = c0.z;
      cs[3] = c0.w;
      cs[4] = c1.x;
      cs[5] = c1.y;
      cs[6] = c1.z;
      cs[7] = c1.w;
      sn[0] = s0.x;
      sn[1] = s0.y;
      sn[2] = s0.z;
      sn[3] = s0.w;
      sn[4] = s1.x;
      sn[5] = s1.y;
      sn[6] = s1.z;
      sn[7] = s1.w;
      if (!inside)
        for (int j = 0; j < 8; ++j) cs[j] = sn[j] = __int_as_float(0x7fc00000);
      first = false;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = h0 + j * blockDim.y;
      if (h >= total) continue;
      unsigned short* a = (unsigned short*)&lo[j];
      unsigned short* c = (unsigned short*)&hi[j];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x = bf(a[e]), y = bf(c[e]);
        a[e] = tobf(fmaf(x, cs[e], -y * sn[e]));
        c[e] = tobf(fmaf(y, cs[e], x * sn[e]));
      }
      *(uint4*)src[j] = lo[j];
      *(uint4*)(src[j] + 128) = hi[j];
    }
  }
}
