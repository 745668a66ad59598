// What every kernel family's launch path shares: the current context for a call's pointers,
// one kernel launch (programmatic where asked), a target's compute capability, work on another
// thread, and the hash mixing of the plan caches' keys.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <future>
#include <string>

#include "jit/driver.hpp"
#include "jit/errors.hpp"

namespace ropejit::detail {

// One kernel launch: function, grid, block, dynamic shared memory, stream.
struct KernelLaunch {
  CUfunction fn;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  CUstream stream;
};

// Whether launches of kernels compiled for `image_cc` are programmatic dependent launches
// (jit/launching.cpp says when).
bool programmatic_launch(int image_cc);

// The target's compute capability: "sm_90" -> 90, "compute_100" -> 100.
int target_cc(const std::string& target);

// Launches `k`; `programmatic` lets it start while the stream's previous kernel finishes (the
// kernel waits for that grid's writes at entry: wait_for_producer in templates/rope_types.cuh).
void launch_kernel(const KernelLaunch& k, void** kernel_args, bool programmatic);

// `work` on another thread, or on this one when no thread can be created; the future carries
// its outcome.
std::future<void> on_another_thread(std::function<void()> work);

// Makes the primary context of the device owning `ptr` current for the scope of one call,
// when the calling thread has no current context.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext* ctx, const void* ptr, const char* name = "args.q.data")
      : d_(d) {
    check(d.CtxGetCurrent(ctx), "cuCtxGetCurrent");
    if (*ctx) return;
    int ordinal = 0;
    if (d.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
      invalid(name, " (", ptr, ") is not device memory and no CUDA context is current");
    CUdevice dev = 0;
    check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
    check(d.DevicePrimaryCtxRetain(ctx, dev), "cuDevicePrimaryCtxRetain");
    check(d.CtxPushCurrent(*ctx), "cuCtxPushCurrent");
    pushed_ = true;
  }
  ~ContextScope() {
    CUcontext ignored = nullptr;
    if (pushed_) d_.CtxPopCurrent(&ignored);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const Driver& d_;
  bool pushed_ = false;
};

inline void hash_mix(uint64_t& h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
}

}  // namespace ropejit::detail
