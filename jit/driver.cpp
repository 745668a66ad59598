// Lazy loading of libcuda.so.1. Entry points are resolved through cuGetProcAddress with this
// build's CUDA_VERSION, which picks the ABI version (_v2, ...) that matches cuda.h.
#include "jit/driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "jit/errors.hpp"

namespace ropejit::detail {
namespace {

struct Loaded {
  Driver driver{};
  std::string error;  // empty when usable
};

#define ROPEJIT_STRINGIFY(x) #x
#define ROPEJIT_ABI_NAME(x) ROPEJIT_STRINGIFY(x)  // expands cuda.h's versioning macros first

Loaded load() {
  Loaded out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    out.error = concat("the CUDA driver (libcuda.so.1) could not be loaded (", why ? why : "?",
                       "); GPU calls need an NVIDIA GPU and driver");
    return out;
  }
  Driver& d = out.driver;
  std::string& e = out.error;
#define ROPEJIT_RESOLVE(name)                                                          \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(lib, ROPEJIT_ABI_NAME(cu##name))); \
  if (!d.name) {                                                                       \
    e = concat("the CUDA driver has no entry point ", ROPEJIT_ABI_NAME(cu##name),      \
               " (driver older than this build's CUDA ", CUDA_VERSION / 1000, ")");    \
    return out;                                                                        \
  }
  ROPEJIT_DRIVER_ENTRY_POINTS(ROPEJIT_RESOLVE)
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

CUcontext use_primary_context(int ordinal) {
  const Driver& d = driver();
  CUdevice dev = 0;
  check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(d.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");  // kept for the process
  check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  std::string why;
  if (const Driver* d = try_driver(&why)) d->GetErrorString(r, &s);
  fail(ErrorCode::driver, what, " failed: ", s ? s : "CUDA error ", int(r));
}

}  // namespace ropejit::detail
