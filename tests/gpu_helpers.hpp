// Shared by the GPU test files: make device 0's primary context current on this thread.
#pragma once

#include <functional>
#include <limits>

#include "jit/driver.hpp"
#include "oracle/workload.hpp"

namespace ropejit::testing {

inline CUcontext use_primary_context() { return detail::use_primary_context(0); }

// The cases numbered first..last (1-based, inclusive) of a matrix, the others skipped with their
// numbers, so that a matrix split over test cases (run side by side: the run's length is its
// longest case) checks the cases, seeds and variants of the whole. The last range is
// open-ended, so that cases added to a matrix land in one of its test cases.
struct CaseRange {
  int first, last = std::numeric_limits<int>::max();
  bool take(int n) const { return n >= first && n <= last; }
};

// A dense-layout workload's sizes: `batch` sequences of `seq_len` tokens, q and k heads.
inline oracle::Sizes dense_sizes(int64_t batch, int64_t seq_len, int32_t q_heads, int32_t k_heads) {
  oracle::Sizes z;
  z.batch = batch;
  z.seq_len = seq_len;
  z.q_heads = q_heads;
  z.k_heads = k_heads;
  return z;
}

// Device memory for one test, freed at the end of its scope.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  explicit DeviceBuffer(size_t bytes) {
    detail::check(detail::driver().MemAlloc(&ptr, bytes), "cuMemAlloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { detail::driver().MemFree(ptr); }
  void* get() const { return reinterpret_cast<void*>(ptr); }
};

// Captures what `calls` enqueues on `stream` into a CUDA graph, replays it `replays` times
// and waits for it.
inline void capture_and_replay(CUstream stream, const std::function<void()>& calls,
                               int replays = 1) {
  const detail::Driver& d = detail::driver();
  detail::check(d.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
                "cuStreamBeginCapture");
  calls();
  CUgraph graph = nullptr;
  detail::check(d.StreamEndCapture(stream, &graph), "cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  detail::check(d.GraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  for (int i = 0; i < replays; ++i) detail::check(d.GraphLaunch(exec, stream), "cuGraphLaunch");
  detail::check(d.StreamSynchronize(stream), "replay");
  d.GraphExecDestroy(exec);
  d.GraphDestroy(graph);
}

}  // namespace ropejit::testing
