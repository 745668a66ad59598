#include "jit/launching.hpp"

#include <cstdlib>
#include <system_error>

#include "jit/errors.hpp"

namespace ropejit::detail {

// Programmatic dependent launches need kernels compiled for sm_90 or later: their
// griddepcontrol.wait is compiled in for those targets only, so the decision follows the
// target the device's kernels are compiled for (DeviceInfo::image_cc), not the device (an NVRTC
// without sm_90 would give an sm_90 device PTX for an older target, with no wait in it).
// ROPEJIT_PDL=0 turns them off, to compare or to rule them out.
bool programmatic_launch(int image_cc) {
  static const bool allowed = [] {
    const char* env = std::getenv("ROPEJIT_PDL");
    return !(env && std::string(env) == "0");
  }();
  return allowed && image_cc >= 90;
}

int target_cc(const std::string& target) {
  const size_t at = target.find('_');
  return at == std::string::npos ? 0 : std::atoi(target.c_str() + at + 1);
}

void launch_kernel(const KernelLaunch& k, void** kernel_args, bool programmatic) {
  const Driver& d = driver();
  if (!programmatic) {
    check(d.LaunchKernel(k.fn, k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                         k.shared_bytes, k.stream, kernel_args, nullptr),
          "cuLaunchKernel");
    return;
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = k.grid[0];
  config.gridDimY = k.grid[1];
  config.gridDimZ = k.grid[2];
  config.blockDimX = k.block[0];
  config.blockDimY = k.block[1];
  config.blockDimZ = k.block[2];
  config.sharedMemBytes = k.shared_bytes;
  config.hStream = k.stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(d.LaunchKernelEx(&config, k.fn, kernel_args, nullptr), "cuLaunchKernelEx (programmatic)");
}

std::future<void> on_another_thread(std::function<void()> work) {
  try {
    return std::async(std::launch::async, work);
  } catch (const std::system_error&) {
    std::promise<void> done;  // no thread to spare: do it here
    try {
      work();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
    return done.get_future();
  }
}

}  // namespace ropejit::detail
