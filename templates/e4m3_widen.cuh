// e4m3 weight codes widened to a 16-bit operand dtype exactly, shared by the fused projection
// kernel (proj_kernel.cuh), which feeds them to its tensor cores, and the unfused paths'
// dequantization kernel (dequant_kernel.cuh): both paths decode a code alike.
#pragma once
#include "rope_types.cuh"

namespace ropejit_dev {

// Four e4m3 codes (one 32-bit word, code 0 lowest) -> two words of two operand-dtype values
// each (lo: codes 0 and 1), exactly. The code's sign and its seven exponent-mantissa bits are
// placed in the 16-bit format's fields (bf16: 8 exponent bits, f16: 5) so that the pattern is
// the value times 2^-120 (bf16) or 2^-8 (f16), e4m3 subnormals landing on the format's own
// subnormals; one packed multiply by 2^120 or 2^8 (exact: the value is representable) then
// gives the value. The NaN codes (0x7f, 0xff) read as +-480: weights are finite.
template <int kDType>
__device__ __forceinline__ u32 widen_e4m3_pair(u32 spread) {
  u32 r;
  if (kDType == kBF16) {
    const u32 bits = (spread & 0x80008000u) | ((spread >> 4) & 0x07f007f0u);
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));
  } else {
    const u32 bits = (spread & 0x80008000u) | ((spread >> 1) & 0x3f803f80u);
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(0x5c005c00u), "r"(0x80008000u));
  }
  return r;
}

}  // namespace ropejit_dev
