// An FFN gate/up problem (FfnSpec) that owns its data: random host inputs, device buffers with
// a poisoned output and guard bytes, and float64 references of both paths with tolerances
// derived from their arithmetic. Used by the GPU tests, the benchmark and the tuner.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "oracle/device_buffers.hpp"
#include "oracle/workload.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

struct FfnSizes {
  int64_t tokens = 3;
  int64_t hidden = 256;
  int64_t intermediate = 96;
  int64_t x_gap = 0;       // extra elements after every x row (a multiple of 8)
  int64_t weight_gap = 0;  // extra elements after every weight row (a multiple of 8)
  int64_t out_gap = 0;     // extra elements after every output row, checked untouched
  bool packed = true;      // gate and up as the two halves of one [2I][hidden] tensor
  double norm_eps = 1e-6;
  double x_scale = 1.0;  // activations uniform in [-2, 2] times this
  uint64_t seed = 1;
  ProjPath path = ProjPath::fused;  // as ProjSizes::path
  bool reference = true;
};

class FfnProblem {
 public:
  FfnProblem(const FfnSpec& spec, const FfnSizes& sizes);
  FfnProblem(const FfnProblem&) = delete;
  FfnProblem& operator=(const FfnProblem&) = delete;

  const FfnSpec& spec() const { return spec_; }
  void upload();
  FfnArgs args(void* stream = nullptr) const;
  // Compares every output element with the reference of the path asked for (automatic: either,
  // matched() says which), and every byte around them (row gaps, guard) with the poison.
  CheckReport check();
  ProjPath matched() const { return matched_; }
  CheckReport check_as(ProjPath path);  // as ProjProblem::check_as
  int64_t weight_bytes() const;  // both weights (and e4m3's scales): the fused kernel's floor
  int64_t bytes_moved() const;

  struct Expected {
    std::vector<double> value, tol;
  };
  // The reference of one path ([tokens][intermediate]); empty unless sizes.path asked for it.
  const Expected& expected(ProjPath path) const {
    return path == ProjPath::unfused ? unfused_ : fused_;
  }

 private:
  using Buffer = DeviceBuffers::Buffer;
  Buffer& add(std::vector<uint8_t> host);
  void build_reference(bool unfused, Expected* out);
  CheckReport compare(const Expected& want, const std::vector<uint8_t>& got) const;

  FfnSpec spec_;
  FfnSizes sizes_;
  std::mt19937_64 rng_;
  int64_t x_stride_ = 0, w_stride_ = 0, out_stride_ = 0;
  DeviceBuffers buffers_;
  Buffer* x_ = nullptr;
  Buffer* gate_ = nullptr;   // packed: both halves
  Buffer* up_ = nullptr;     // separate up weight (packed: null)
  Buffer* scale_ = nullptr;  // e4m3 weights: a float per gate row, then one per up row
  Buffer* norm_ = nullptr;
  Buffer* out_ = nullptr;
  Buffer* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  Expected fused_, unfused_;
  ProjPath matched_ = ProjPath::fused;
};

}  // namespace ropejit::oracle
