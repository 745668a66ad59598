// Shared by the GPU test files: make device 0's primary context current on this thread.
#pragma once

#include "jit/driver.hpp"

namespace ropejit::testing {

inline CUcontext use_primary_context() {
  const detail::Driver& d = detail::driver();
  static CUcontext ctx = [&] {
    CUdevice dev = 0;
    detail::check(d.DeviceGet(&dev, 0), "cuDeviceGet");
    CUcontext c = nullptr;
    detail::check(d.DevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
    return c;
  }();
  detail::check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

}  // namespace ropejit::testing
