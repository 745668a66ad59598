// e4m3 weights for the unfused paths' GEMMs: out[n][k] = dtype(code[n][k] · scale[n]), the code
// widened exactly (e4m3_widen.cuh, as the fused kernel decodes it), multiplied by its row's
// scale in fp32 and rounded once to the dtype: torch's `(w.float() * scale[:, None]).to(dtype)`.
// Each thread converts 16 codes (one 16-byte load, two 16-byte stores); rows past gridDim.y
// loop.
#pragma once
#include "dequant_params.cuh"
#include "e4m3_widen.cuh"

namespace ropejit_dev {

template <class Cfg>
struct DequantKernel {
  typedef Pack<Cfg::kDType, 8> Out;

  // The two values of a widened pair as floats (lo: the lower code).
  static __device__ __forceinline__ void unpack(u32 pair, float* lo, float* hi) {
    if (Cfg::kDType == kBF16) {
      *lo = __uint_as_float(pair << 16);
      *hi = __uint_as_float(pair & 0xffff0000u);
    } else {
      *lo = Elem<kF16>::load(u16(pair & 0xffffu));
      *hi = Elem<kF16>::load(u16(pair >> 16));
    }
  }

  static __device__ void run(const DequantParams& p) {
    const long long col = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (col >= p.cols) return;
    for (long long row = blockIdx.y; row < p.rows; row += gridDim.y) {
      const uint4 codes = __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(p.codes) +
                                                               row * p.codes_stride + col));
      const float s = __ldg(p.scale + row);
      const u32 words[4] = {codes.x, codes.y, codes.z, codes.w};
      Out half[2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v[4];
        // Codes 0 and 1 of the word, then 2 and 3, each in the high byte of a 16-bit half.
        unpack(widen_e4m3_pair<Cfg::kDType>(__byte_perm(words[j], 0u, 0x1404)), &v[0], &v[1]);
        unpack(widen_e4m3_pair<Cfg::kDType>(__byte_perm(words[j], 0u, 0x3424)), &v[2], &v[3]);
#pragma unroll
        for (int m = 0; m < 4; ++m) half[j / 2].set((j % 2) * 4 + m, __fmul_rn(v[m], s));
      }
      char* dst = static_cast<char*>(p.out) + (row * p.cols + col) * 2;
      half[0].store(dst);
      half[1].store(dst + 16);
    }
  }
};

}  // namespace ropejit_dev
