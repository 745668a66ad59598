// The CUDA Driver API, loaded with dlopen("libcuda.so.1") on first GPU use so that every
// binary starts (and renders, compiles, caches) on machines without a driver.
#pragma once

#include <cuda.h>

#include <string>

namespace ropejit::detail {

struct Driver {
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetName)(char*, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetDevice)(CUdevice*);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext*);
  CUresult (*PointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncGetAttribute)(int*, CUfunction_attribute, CUfunction);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  // Used by tests, the demo and benchmarks (which own their buffers), not by apply().
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream*, unsigned int);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*StreamEndCapture)(CUstream, CUgraph*);
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  CUresult (*EventCreate)(CUevent*, unsigned int);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*CtxSynchronize)();
};

// The loaded driver, initialized (cuInit) once. Throws Error(no_driver) with one clear
// message when libcuda.so.1 is absent or no device is usable.
const Driver& driver();

// Same as driver() but reports the problem instead of throwing (for `ropejit info`).
const Driver* try_driver(std::string* why);

// Throws Error(driver) naming `what` when `r` is not CUDA_SUCCESS.
void check(CUresult r, const char* what);

}  // namespace ropejit::detail
