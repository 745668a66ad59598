// CUDA-event timing with L2 flushing.
#include "autotune/timing.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "jit/driver.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::autotune {
namespace {

// Each thread loads four independent 16-byte vectors per step (grid-stride) through L2 and
// folds them into one word, stored only if it equals a value it never takes (which keeps the
// loads without writing anything).
const char* const kReadPass = R"(
extern "C" __global__ void __launch_bounds__(256)
ropejit_read_pass(const uint4* p, unsigned long long n, unsigned* sink) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}
)";

// The read pass, compiled by NVRTC once per context (timing only; not part of the disk cache).
CUfunction read_pass_function() {
  static std::mutex mutex;
  static std::map<CUcontext, CUfunction> functions;
  const detail::Driver& d = detail::driver();
  CUcontext ctx = nullptr;
  detail::check(d.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  const std::lock_guard<std::mutex> lock(mutex);
  CUfunction& f = functions[ctx];
  if (f) return f;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  detail::check(d.CtxGetDevice(&dev), "cuCtxGetDevice");
  detail::check(d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                "cuDeviceGetAttribute");
  detail::check(d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                "cuDeviceGetAttribute");
  const detail::CompileResult cr = detail::compile(kReadPass, "read_pass.cu", "read_pass",
                                                   detail::target_for(major * 10 + minor));
  CUmodule module = nullptr;  // kept for the process's lifetime, like the engine's modules
  detail::check(d.ModuleLoadData(&module, cr.image.data()), "cuModuleLoadData (read pass)");
  detail::check(d.ModuleGetFunction(&f, module, "ropejit_read_pass"),
                "cuModuleGetFunction (read pass)");
  return f;
}

Flush flush_mode(Flush requested) {
  const char* e = std::getenv("ROPEJIT_FLUSH");
  if (e && std::strcmp(e, "read") == 0) return Flush::read;
  if (e && std::strcmp(e, "write") == 0) return Flush::write;
  return requested;
}

}  // namespace

Timer::Timer(CUstream stream, size_t flush_bytes, Flush flush)
    : stream_(stream), flush_bytes_(flush_bytes), mode_(flush_mode(flush)) {
  const detail::Driver& d = detail::driver();
  detail::check(d.EventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  detail::check(d.EventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
  if (flush_bytes_) {
    detail::check(d.MemAlloc(&flush_, flush_bytes_), "cuMemAlloc (L2 flush buffer)");
    // The read flush reads the buffer as it is: give it defined contents once (the write flush
    // writes it before every repetition).
    if (mode_ == Flush::read)
      detail::check(d.MemsetD8(flush_, 0, flush_bytes_), "cuMemsetD8 (L2 flush buffer)");
  }
}

void Timer::read_pass(CUdeviceptr p, size_t bytes) {
  const detail::Driver& d = detail::driver();
  if (!read_) {
    read_ = read_pass_function();
    CUdevice dev = 0;
    int sms = 0;
    detail::check(d.CtxGetDevice(&dev), "cuCtxGetDevice");
    detail::check(d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                  "cuDeviceGetAttribute");
    read_blocks_ = 8 * sms;  // 2048 threads per SM, each with four loads in flight
    if (!sink_) detail::check(d.MemAlloc(&sink_, 4), "cuMemAlloc (read pass)");
  }
  unsigned long long n = bytes / 16;
  void* params[] = {&p, &n, &sink_};
  detail::check(
      d.LaunchKernel(read_, unsigned(read_blocks_), 1, 1, 256, 1, 1, 0, stream_, params, nullptr),
      "cuLaunchKernel (read pass)");
}

Timer::~Timer() {
  const detail::Driver& d = detail::driver();
  d.EventDestroy(start_);
  d.EventDestroy(stop_);
  if (flush_) d.MemFree(flush_);
  if (sink_) d.MemFree(sink_);
}

Timing Timer::time(const std::function<void()>& work, int warmup, int reps) {
  const detail::Driver& d = detail::driver();
  for (int i = 0; i < warmup; ++i) work();
  Timing t;
  for (int i = 0; i < reps; ++i) {
    if (flush_ && mode_ == Flush::read) {
      read_pass(flush_, flush_bytes_);  // a buffer larger than L2, read: clean lines left
    } else if (flush_) {
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
