// CUDA-event timing with L2 flushing.
#include "autotune/timing.hpp"

#include <algorithm>

#include "jit/driver.hpp"

namespace ropejit::autotune {

Timer::Timer(CUstream stream, size_t flush_bytes) : stream_(stream), flush_bytes_(flush_bytes) {
  const detail::Driver& d = detail::driver();
  detail::check(d.EventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  detail::check(d.EventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
  if (flush_bytes_)
    detail::check(d.MemAlloc(&flush_, flush_bytes_), "cuMemAlloc (L2 flush buffer)");
}

Timer::~Timer() {
  const detail::Driver& d = detail::driver();
  d.EventDestroy(start_);
  d.EventDestroy(stop_);
  if (flush_) d.MemFree(flush_);
}

Timing Timer::time(const std::function<void()>& work, int warmup, int reps) {
  const detail::Driver& d = detail::driver();
  for (int i = 0; i < warmup; ++i) work();
  Timing t;
  for (int i = 0; i < reps; ++i) {
    if (flush_) {
      // A memset of a buffer larger than L2 evicts the previous repetition's data.
      detail::check(d.MemsetD8Async(flush_, uint8_t(i), flush_bytes_, stream_),
                    "cuMemsetD8Async (L2 flush)");
    }
    detail::check(d.EventRecord(start_, stream_), "cuEventRecord");
    work();
    detail::check(d.EventRecord(stop_, stream_), "cuEventRecord");
    detail::check(d.EventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    detail::check(d.EventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    t.samples_us.push_back(double(ms) * 1000.0);
  }
  std::vector<double> sorted = t.samples_us;
  std::sort(sorted.begin(), sorted.end());
  t.min_us = sorted.front();
  t.median_us = sorted.size() % 2
                    ? sorted[sorted.size() / 2]
                    : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  return t;
}

}  // namespace ropejit::autotune
