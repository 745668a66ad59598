// Element storage types and 2..16-byte vector access for the generated kernels.
// NVRTC finds no headers by default, so fp16/bf16 conversions are written in PTX here
// instead of pulling in cuda_fp16.h / cuda_bf16.h.
#pragma once
#include "rope_fp8.cuh"

namespace ropejit_dev {

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// Programmatic dependent launch (sm_90+): a kernel the host launched right behind a producer
// (the unfused projection's GEMM, say) with the programmatic-serialization attribute may start
// while that grid finishes; this waits until the producer's writes are visible. Launched
// without the attribute, or compiled for an older target, it returns at once.
__device__ __forceinline__ void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets a kernel launched behind this one as a programmatic dependent launch be scheduled once
// every block of this grid has started (its own griddepcontrol.wait still waits for this grid
// to finish and its writes to be visible). At a RoPE kernel's entry, right after
// wait_for_producer(): the next call of a decode step then starts while this one runs, and
// the blocks it places only fill room that this grid's last wave leaves.
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Activation dtypes (their values are ropejit::DType's), then the FP8 storage format.
enum : int { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3 };

template <int kDType>
struct Elem;

template <>
struct Elem<kF32> {
  typedef float Raw;
  static __device__ __forceinline__ Raw nan() { return __int_as_float(0x7fc00000); }
  static __device__ __forceinline__ float load(Raw r) { return r; }
  static __device__ __forceinline__ Raw store(float f) { return f; }
};

template <>
struct Elem<kF16> {
  typedef u16 Raw;
  static __device__ __forceinline__ Raw nan() { return u16(0x7e00u); }
  static __device__ __forceinline__ float load(Raw r) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(r));
    return f;
  }
  static __device__ __forceinline__ Raw store(float f) {
    Raw r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
  }
};

template <>
struct Elem<kBF16> {
  typedef u16 Raw;
  static __device__ __forceinline__ Raw nan() { return u16(0x7fc0u); }
  static __device__ __forceinline__ float load(Raw r) { return __uint_as_float(u32(r) << 16); }
  static __device__ __forceinline__ Raw store(float f) {
#if __CUDA_ARCH__ >= 800
    Raw r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#else
    // Round to nearest even by integer arithmetic; NaN stays a quiet NaN.
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return u16(0x7fc0u | (u >> 16 & 0x8000u));
    u += 0x7fffu + ((u >> 16) & 1u);
    return u16(u >> 16);
#endif
  }
};

// FP8 e4m3, store only (values are already scaled): saturating, nearest even.
template <>
struct Elem<kE4M3> {
  typedef unsigned char Raw;
  static __device__ __forceinline__ Raw store(float f) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
    return Raw(r & 0xffu);
#else
    return e4m3_from_float_soft(f);
#endif
  }
};

// Two floats -> their two e4m3 codes in one 16-bit word, `lo`'s in the low byte: one
// conversion for the pair where the GPU has it (sm_89+), element by element elsewhere.
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return u32(e4m3_from_float_soft(lo)) | (u32(e4m3_from_float_soft(hi)) << 8);
#endif
}

// The machine word that moves kBytes at once; kBytes is 1, 2, 4, 8 or 16.
template <int kBytes>
struct Word;
template <>
struct Word<1> {
  typedef unsigned char type;
};
template <>
struct Word<2> {
  typedef u16 type;
};
template <>
struct Word<4> {
  typedef u32 type;
};
template <>
struct Word<8> {
  typedef uint2 type;
};
template <>
struct Word<16> {
  typedef uint4 type;
};

// N elements of one dtype viewed as one aligned machine word, so a load or store is a
// single LDG/STG of sizeof(Raw) * N bytes.
template <int kDType, int N>
union Pack {
  typedef typename Elem<kDType>::Raw Raw;
  typedef typename Word<int(sizeof(Raw)) * N>::type W;
  W w;
  Raw v[N];

  __device__ __forceinline__ void load(const void* p) { w = *static_cast<const W*>(p); }
  // Read-only data (tables): through the non-coherent texture path.
  __device__ __forceinline__ void load_ro(const void* p) { w = __ldg(static_cast<const W*>(p)); }
  __device__ __forceinline__ void store(void* p) const { *static_cast<W*>(p) = w; }
  __device__ __forceinline__ u32 word_at(int j) const {
    if constexpr (sizeof(W) == 16)
      return j == 0 ? w.x : j == 1 ? w.y : j == 2 ? w.z : w.w;
    else if constexpr (sizeof(W) == 8)
      return j == 0 ? w.x : w.y;
    else
      return u32(w);
  }
  __device__ __forceinline__ float get(int i) const {
    // bf16 pairs from their 32-bit word: the high element by a mask, one instruction, where
    // the u16 element took an extract and a shift (8 of a decode thread's ~130 instructions).
    if (kDType == kBF16 && int(sizeof(W)) >= 4) {
      const u32 word = word_at(i >> 1);
      return __uint_as_float((i & 1) ? (word & 0xffff0000u) : (word << 16));
    }
    return Elem<kDType>::load(v[i]);
  }
  __device__ __forceinline__ void set(int i, float f) { v[i] = Elem<kDType>::store(f); }
  // Every element a quiet NaN, written a 32-bit word at a time (2- and 4-byte dtypes).
  __device__ __forceinline__ void poison() {
    u32 bits;
    if constexpr (sizeof(Raw) == 2)
      bits = u32(Elem<kDType>::nan()) * 0x10001u;
    else
      bits = __float_as_uint(Elem<kDType>::nan());
    u32* words = reinterpret_cast<u32*>(&w);
#pragma unroll
    for (int j = 0; j < int(sizeof(W)) / 4; ++j) words[j] = bits;
  }
};

}  // namespace ropejit_dev
