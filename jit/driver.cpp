// Lazy loading of libcuda.so.1. Entry points are resolved through cuGetProcAddress with this
// build's CUDA_VERSION, which picks the ABI version (_v2, ...) that matches cuda.h.
#include "driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "errors.hpp"

namespace ropejit::detail {
namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct Loaded {
  Driver driver{};
  std::string error;  // empty when usable
};

template <class Fn>
bool resolve(GetProcAddress get, const char* name, Fn& fn, std::string* error) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p) {
    *error = concat("the CUDA driver has no entry point ", name, " (driver too old?)");
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

Loaded load() {
  Loaded out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    out.error = concat("the CUDA driver (libcuda.so.1) could not be loaded (", why ? why : "?",
                       "); GPU calls need an NVIDIA GPU and driver");
    return out;
  }
  auto get = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get) {
    out.error = "the CUDA driver is too old: cuGetProcAddress_v2 is missing (need CUDA 12+)";
    return out;
  }
  Driver& d = out.driver;
  std::string& e = out.error;
#define ROPEJIT_RESOLVE(name) \
  if (!resolve(get, "cu" #name, d.name, &e)) return out;
  ROPEJIT_RESOLVE(Init) ROPEJIT_RESOLVE(DriverGetVersion) ROPEJIT_RESOLVE(GetErrorString)
  ROPEJIT_RESOLVE(DeviceGetCount) ROPEJIT_RESOLVE(DeviceGet) ROPEJIT_RESOLVE(DeviceGetName)
  ROPEJIT_RESOLVE(DeviceGetAttribute) ROPEJIT_RESOLVE(DevicePrimaryCtxRetain)
  ROPEJIT_RESOLVE(CtxGetCurrent) ROPEJIT_RESOLVE(CtxSetCurrent) ROPEJIT_RESOLVE(CtxGetDevice)
  ROPEJIT_RESOLVE(CtxPushCurrent) ROPEJIT_RESOLVE(CtxPopCurrent)
  ROPEJIT_RESOLVE(PointerGetAttribute) ROPEJIT_RESOLVE(ModuleLoadData)
  ROPEJIT_RESOLVE(ModuleGetFunction) ROPEJIT_RESOLVE(FuncGetAttribute)
  ROPEJIT_RESOLVE(OccupancyMaxActiveBlocksPerMultiprocessor) ROPEJIT_RESOLVE(LaunchKernel)
  ROPEJIT_RESOLVE(StreamIsCapturing) ROPEJIT_RESOLVE(MemAlloc) ROPEJIT_RESOLVE(MemFree)
  ROPEJIT_RESOLVE(MemcpyHtoD) ROPEJIT_RESOLVE(MemcpyDtoH) ROPEJIT_RESOLVE(MemcpyDtoDAsync)
  ROPEJIT_RESOLVE(MemsetD8) ROPEJIT_RESOLVE(MemsetD8Async) ROPEJIT_RESOLVE(StreamCreate) ROPEJIT_RESOLVE(StreamDestroy)
  ROPEJIT_RESOLVE(StreamSynchronize) ROPEJIT_RESOLVE(StreamBeginCapture)
  ROPEJIT_RESOLVE(StreamEndCapture) ROPEJIT_RESOLVE(GraphInstantiateWithFlags)
  ROPEJIT_RESOLVE(GraphLaunch) ROPEJIT_RESOLVE(GraphExecDestroy) ROPEJIT_RESOLVE(GraphDestroy)
  ROPEJIT_RESOLVE(EventCreate) ROPEJIT_RESOLVE(EventDestroy) ROPEJIT_RESOLVE(EventRecord)
  ROPEJIT_RESOLVE(EventSynchronize) ROPEJIT_RESOLVE(EventElapsedTime)
  ROPEJIT_RESOLVE(CtxSynchronize)
#undef ROPEJIT_RESOLVE
  const CUresult r = d.Init(0);
  if (r != CUDA_SUCCESS) {
    const char* s = nullptr;
    d.GetErrorString(r, &s);
    e = concat("cuInit failed (", s ? s : "unknown error", "): no usable CUDA device");
    return out;
  }
  int count = 0;
  if (d.DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) e = "no CUDA device is visible";
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe one-time initialization
  return l;
}

}  // namespace

const Driver* try_driver(std::string* why) {
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    if (why) *why = l.error;
    return nullptr;
  }
  return &l.driver;
}

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) fail(ErrorCode::no_driver, l.error);
  return l.driver;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  std::string why;
  if (const Driver* d = try_driver(&why)) d->GetErrorString(r, &s);
  fail(ErrorCode::driver, what, " failed: ", s ? s : "CUDA error ", int(r));
}

}  // namespace ropejit::detail
