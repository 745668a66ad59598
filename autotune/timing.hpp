// Device timing shared by the tuner, `ropejit demo` and bench/: CUDA events around the
// launches only, warm-up first, L2 flushed before every timed repetition, median reported.
#pragma once

#include <cuda.h>

#include <functional>
#include <vector>

namespace ropejit::autotune {

struct Timing {
  double median_us = 0;
  double min_us = 0;
  std::vector<double> samples_us;
};

class Timer {
 public:
  // `flush_bytes` of scratch memory are overwritten before each repetition so every timed
  // run starts with a cold L2 (0 disables flushing).
  explicit Timer(CUstream stream, size_t flush_bytes = size_t(256) << 20);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Times `work` (which enqueues device work on the stream) `reps` times after `warmup`
  // untimed runs. Each sample covers one call of `work`.
  Timing time(const std::function<void()>& work, int warmup = 3, int reps = 20);

 private:
  CUstream stream_;
  CUevent start_ = nullptr, stop_ = nullptr;
  CUdeviceptr flush_ = 0;
  size_t flush_bytes_ = 0;
};

}  // namespace ropejit::autotune
