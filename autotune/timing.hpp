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

// How the L2 is emptied before a timed repetition:
//   write: a memset of the flush buffer. The L2 is left full of dirty lines, so the timed call
//          also pays for writing them back as it evicts them (a step that follows large writes).
//   read:  a read-only pass over the flush buffer. The lines left are clean (a decode step's
//          weight-streaming kernels follow the previous layer's weight reads).
// ROPEJIT_FLUSH=read|write overrides the constructor's choice (for A/B runs).
enum class Flush { write, read };

class Timer {
 public:
  // `flush_bytes` of scratch memory are overwritten (or read) before each repetition so every
  // timed run starts with a cold L2 (0 disables flushing).
  explicit Timer(CUstream stream, size_t flush_bytes = size_t(256) << 20,
                 Flush flush = Flush::write);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Times `work` (which enqueues device work on the stream) `reps` times after `warmup`
  // untimed runs. Each sample covers one call of `work`.
  Timing time(const std::function<void()>& work, int warmup = 3, int reps = 20);

  // Enqueues one read-only pass over `bytes` (a multiple of 16) at `p` on the stream: every
  // byte loaded once through L2, nothing written (the read floor of a weight-streaming kernel).
  void read_pass(CUdeviceptr p, size_t bytes);

  Flush flush() const { return mode_; }

 private:
  CUstream stream_;
  CUevent start_ = nullptr, stop_ = nullptr;
  CUdeviceptr flush_ = 0, sink_ = 0;
  size_t flush_bytes_ = 0;
  Flush mode_ = Flush::write;
  CUfunction read_ = nullptr;
  int read_blocks_ = 0;
};

}  // namespace ropejit::autotune
