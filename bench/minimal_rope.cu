// The smallest useful RoPE kernel, written for one purpose: the cold-compile floor of a real
// kernel under ropejit's NVRTC options (bench/compile_phases.py --source). bf16, neox, head_dim
// 128, one head of q per thread, fp32 half tables indexed by int64 position ids; no k, no
// strides, no bounds beyond the token and head counts. Never launched.
struct MinimalParams {
  const unsigned short* q;
  unsigned short* out;
  const long long* positions;
  const float* cos;
  const float* sin;
  long long tokens;
  int heads;
};

extern "C" __global__ void __launch_bounds__(512)
    minimal_rope(const __grid_constant__ MinimalParams p) {
  const long long t = blockIdx.x;
  const int head = threadIdx.y, chunk = threadIdx.x;  // 8 pairs per thread
  if (t >= p.tokens || head >= p.heads) return;
  const long long at = (t * p.heads + head) * 128 + chunk * 8;
  uint4 lo = *reinterpret_cast<const uint4*>(p.q + at);
  uint4 hi = *reinterpret_cast<const uint4*>(p.q + at + 64);
  const long long row = __ldg(p.positions + t) * 64 + chunk * 8;
  unsigned short* a = reinterpret_cast<unsigned short*>(&lo);
  unsigned short* b = reinterpret_cast<unsigned short*>(&hi);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float x = __uint_as_float(unsigned(a[j]) << 16),
                y = __uint_as_float(unsigned(b[j]) << 16);
    const float c = __ldg(p.cos + row + j), s = __ldg(p.sin + row + j);
    const float u = fmaf(x, c, -y * s), v = fmaf(y, c, x * s);
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(a[j]) : "f"(u));
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b[j]) : "f"(v));
  }
  *reinterpret_cast<uint4*>(p.out + at) = lo;
  *reinterpret_cast<uint4*>(p.out + at + 64) = hi;
}
