// The CUDA Driver API, loaded with dlopen("libcuda.so.1") on first GPU use so that every
// binary starts (and renders, compiles, caches) on machines without a driver.
#pragma once

#include <cuda.h>

#include <string>

namespace ropejit::detail {

// Each entry point has exactly the prototype cuda.h declares for this CUDA_VERSION, and is
// looked up by the ABI name cuda.h maps it to (cuMemAlloc -> cuMemAlloc_v2, ...).
// cuGetProcAddress is not used on purpose: it returns the newest version of a symbol, whose
// signature can differ from the header's (CUDA 13: cuCtxSynchronize -> _v2(CUcontext)).
// clang-format off
#define ROPEJIT_DRIVER_ENTRY_POINTS(X) \
  X(Init) X(DriverGetVersion) X(GetErrorString) X(DeviceGetCount) X(DeviceGet) X(DeviceGetName)   \
  X(DeviceGetAttribute) X(DevicePrimaryCtxRetain) X(CtxGetCurrent) X(CtxSetCurrent)               \
  X(CtxGetDevice) X(CtxPushCurrent) X(CtxPopCurrent) X(PointerGetAttribute) X(ModuleLoadData)     \
  X(ModuleGetFunction) X(FuncGetAttribute) X(LaunchKernel) X(StreamIsCapturing) X(MemAlloc)       \
  X(MemFree) X(MemcpyHtoD) X(MemcpyDtoH) X(MemcpyDtoDAsync) X(MemsetD8) X(MemsetD8Async)          \
  X(StreamCreate) X(StreamDestroy) X(StreamSynchronize) X(StreamBeginCapture)                     \
  X(StreamEndCapture) X(GraphInstantiateWithFlags) X(GraphLaunch) X(GraphExecDestroy)             \
  X(GraphDestroy) X(EventCreate) X(EventDestroy) X(EventRecord) X(EventSynchronize)               \
  X(EventElapsedTime) X(CtxSynchronize) X(LaunchKernelEx) X(FuncSetAttribute)
// clang-format on

struct Driver {
#define ROPEJIT_DECLARE(name) decltype(&cu##name) name;  // NOLINT(bugprone-macro-parentheses)
  ROPEJIT_DRIVER_ENTRY_POINTS(ROPEJIT_DECLARE)
#undef ROPEJIT_DECLARE
};

// The loaded driver, initialized (cuInit) once. Throws Error(no_driver) with one clear
// message when libcuda.so.1 is absent or no device is usable.
const Driver& driver();

// Same as driver() but reports the problem instead of throwing (for `ropejit info`).
const Driver* try_driver(std::string* why);

// Makes the primary context of device `ordinal` current on the calling thread (tools, tests
// and benchmarks that own their buffers; apply() itself uses whatever context is current).
CUcontext use_primary_context(int ordinal = 0);

// Throws Error(driver) naming `what` when `r` is not CUDA_SUCCESS.
void check(CUresult r, const char* what);

}  // namespace ropejit::detail
