// The unfused FFN path's epilogue: out = act(gate) · up, elementwise over [rows][cols], in fp32
// on the (already rounded) GEMM outputs and rounded once. kVec elements per thread: 16-byte
// vectors when every row start is 16-byte aligned, else one. Rows past gridDim.y loop.
#pragma once
#include "activation.cuh"
#include "glu_params.cuh"
#include "rope_types.cuh"

namespace ropejit_dev {

template <class Cfg>
struct GluKernel {
  typedef typename Elem<Cfg::kDType>::Raw Raw;
  typedef Pack<Cfg::kDType, Cfg::kVec> Vec;

  static __device__ void run(const GluParams& p) {
    const long long col = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * Cfg::kVec;
    if (col >= p.cols) return;
    for (long long row = blockIdx.y; row < p.rows; row += gridDim.y) {
      const char* g = static_cast<const char*>(p.gate) + (row * p.gate_stride + col) * sizeof(Raw);
      const char* u = static_cast<const char*>(p.up) + (row * p.up_stride + col) * sizeof(Raw);
      char* o = static_cast<char*>(p.out) + (row * p.out_stride + col) * sizeof(Raw);
      Vec gv, uv;
      gv.load(g);
      uv.load(u);
#pragma unroll
      for (int e = 0; e < Cfg::kVec; ++e) gv.set(e, activate<Cfg::kAct>(gv.get(e)) * uv.get(e));
      gv.store(o);
    }
  }
};

}  // namespace ropejit_dev
