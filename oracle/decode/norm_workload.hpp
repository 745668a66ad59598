// An RMSNorm problem (RmsNormSpec) that owns its data: random rows, device buffers with the
// output poisoned and guard bytes, and the float64 reference (the residual sum's bits exactly).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "oracle/device_buffers.hpp"
#include "oracle/workload.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

struct NormSizes {
  int64_t rows = 3;
  int64_t hidden = 4096;
  int64_t gap = 0;        // extra elements after every row of x, residual and out
  bool in_place = false;  // out is x
  double eps = 1e-6;
  double x_scale = 1.0;
  uint64_t seed = 1;
};

class NormProblem {
 public:
  NormProblem(const RmsNormSpec& spec, const NormSizes& sizes);
  NormProblem(const NormProblem&) = delete;
  NormProblem& operator=(const NormProblem&) = delete;

  void upload();
  RmsNormArgs args(void* stream = nullptr) const;
  CheckReport check();
  // Bytes a launch must move: x read, out written (and the residual read and written).
  int64_t bytes_moved() const;

 private:
  using Buffer = DeviceBuffers::Buffer;
  Buffer& add(std::vector<uint8_t> host);

  RmsNormSpec spec_;
  NormSizes sizes_;
  int64_t stride_ = 0;
  DeviceBuffers buffers_;
  Buffer* x_ = nullptr;
  Buffer* residual_ = nullptr;
  Buffer* w_ = nullptr;
  Buffer* out_ = nullptr;               // x_ when in place
  std::vector<double> want_, tol_;      // out rows (hidden each)
  std::vector<uint8_t> want_residual_;  // the residual buffer's expected bytes
};

}  // namespace ropejit::oracle
