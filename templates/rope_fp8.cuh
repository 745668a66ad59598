// float -> FP8 e4m3 (OCP E4M3FN: bias 7, no infinities, S.1111.111 is NaN, largest finite 448),
// rounding to nearest even and saturating, as PTX's cvt.rn.satfinite.e4m3x2.f32 does on sm_89+.
// The software form below serves older GPUs; it is also compiled on the host by the CPU tests
// (define ROPEJIT_FP8_FN first), which check it against an exact float64 rounding for every
// float class, so both GPUs round alike.
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

}  // namespace ropejit_dev
