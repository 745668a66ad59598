// float -> FP8 e4m3 (OCP E4M3FN: bias 7, no infinities, S.1111.111 is NaN, largest finite 448),
// rounding to nearest even and saturating, as PTX's cvt.rn.satfinite.e4m3x2.f32 does on sm_89+.
// The software form below serves older GPUs; it is also compiled on the host by the CPU tests
// (define ROPEJIT_FP8_FN first), which check it against an exact float64 rounding for every
// float class, so both GPUs round alike. Also here, and checked the same way: a dynamic scale's
// amax / 448.
#pragma once

#ifndef ROPEJIT_FP8_FN
#define ROPEJIT_FP8_FN __device__ __forceinline__
#endif

namespace ropejit_dev {

union FloatBits {
  float f;
  unsigned int u;
};

ROPEJIT_FP8_FN unsigned char e4m3_from_float_soft(float f) {
  FloatBits b;
  b.f = f;
  const unsigned int sign = (b.u >> 24) & 0x80u;
  const unsigned int a = b.u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned char)(sign | 0x7fu);   // NaN stays NaN
  if (a >= 0x43e00000u) return (unsigned char)(sign | 0x7eu);  // |f| >= 448 (and inf): 448
  if (a >= 0x3c800000u) {
    // Normal in e4m3 (|f| >= 2^-6): round the 23-bit fraction to 3 bits, ties to even; a carry
    // into the exponent is the correct next binade. Nothing below 448 rounds past 448.
    const unsigned int r = a + 0x7ffffu + ((a >> 20) & 1u);
    return (unsigned char)(sign | ((r >> 20) - (120u << 3)));
  }
  // Subnormal (|f| < 2^-6): multiples of 2^-9. Scaling by 2^9 is exact, and the rounded count
  // of quanta is the encoding itself (8 quanta = 0x08, the smallest normal).
  b.u = a;
  return (unsigned char)(sign | (unsigned int)rintf(b.f * 512.0f));
}

// The dequantization scale of a dynamic FP8 head, amax / 448 rounded to nearest, for amax >=
// 2^-9 (the kernels' floor): the product by the rounded reciprocal (up to 1.15 ulp off), then one
// correction step from its exact remainder. Correct for every such float (nothing is subnormal
// or overflows there; the CPU tests check every significand against float64); an infinite amax
// stays infinite. Five instructions where a rounded division took eight and a branch.
ROPEJIT_FP8_FN float e4m3_scale_of(float amax) {
  const float r = 1.0f / 448.0f;
#ifdef __CUDA_ARCH__
  const float q = __fmul_rn(amax, r);
  const float rounded = __fmaf_rn(__fmaf_rn(-q, 448.0f, amax), r, q);
  return isinf(q) ? q : rounded;
#else
  const float q = amax * r;
  const float rounded = fmaf(fmaf(-q, 448.0f, amax), r, q);
  return __builtin_isinf(q) ? q : rounded;
#endif
}

}  // namespace ropejit_dev
