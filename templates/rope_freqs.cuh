// cos/sin for one chunk of rotary pairs at one position: read from a table, or computed in
// the kernel with the angle reduced in float64 so that large positions keep full accuracy.
#pragma once
#include "rope_types.cuh"

namespace ropejit_dev {

// Turns (angle / 2π) that pair `pair` advances per position: base^(-2 pair / R) / 2π, in
// float64. float32 angles lose ~1e-2 absolute at position 2^20 (an fp32 angle there is only
// good to 2^20 * 2^-24 = 0.06 rad before rounding its sine); the
// reduction below needs the product position * turns good to ~1e-10 turns, which float64
// gives up to positions near 2^33.
template <int kRotaryDim>
__device__ __forceinline__ double turns_per_position(int pair, double log2_base) {
  const double exponent = -(2.0 * pair / kRotaryDim) * log2_base;
  return exp2(exponent) * 0.15915494309189533577;  // 1 / (2π)
}

// sin and cos of 2π·turns, within ~1.2e-7 absolute of the float64 values: the fractional
// turn is split into a float head and tail; sincospif evaluates the head (max 1 ulp error,
// no range reduction needed for |x| <= 1) and a first-order term adds the tail.
__device__ __forceinline__ void sincos_turns(double turns, float* s, float* c) {
  const double r = turns - rint(turns);  // exact; r in [-0.5, 0.5]
  const float hi = float(r);
  const float lo = float(r - double(hi));
  float sh, ch;
  sincospif(2.0f * hi, &sh, &ch);
  const float d = 6.28318530717958647692f * lo;  // |d| < 2^-24 · π, so d^2 terms vanish
  *s = fmaf(d, ch, sh);
  *c = fmaf(-d, sh, ch);
}

template <int kTableDType>
__device__ __forceinline__ float table_load(const void* base, long long index) {
  typedef typename Elem<kTableDType>::Raw Raw;
  return Elem<kTableDType>::load(__ldg(static_cast<const Raw*>(base) + index));
}

}  // namespace ropejit_dev
