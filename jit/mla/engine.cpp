#include "jit/mla/engine.hpp"

#include "jit/driver.hpp"
#include "jit/launching.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::detail {

MlaEngine& MlaEngine::instance() {
  static MlaEngine engine;
  return engine;
}

MlaEngine::MlaEngine() : core_(Engine::instance()) {}

const CacheEntry& MlaEngine::image(const MlaSpec& c, const std::string& target, std::string* path) {
  return core_.image_by(
      c.key() + "@" + target, target, [&] { return render(c); }, path);
}

void MlaEngine::mla_prepare(const MlaSpec& spec, const MlaArgs& args) {
  const MlaSpec c = spec.canonical();
  check_mla_call(c, args);
  if (args.tokens == 0) return;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const void* any = args.cache ? args.cache : args.q_pe;
  const ContextScope scope(d, &ctx, any, args.cache ? "args.cache" : "args.q_pe");
  CUstream stream = static_cast<CUstream>(args.stream);
  // The core engine keeps one loaded function per context, key and name.
  const Engine::LoadedFunction& fn = core_.named_function(
      ctx, c.key(), mla_variant_name(), stream,
      [&]() -> const CacheEntry& { return image(c, target_for(core_.device_info(ctx).cc)); });
  ropejit_dev::MlaParams params = make_mla_params(c, args);
  void* kernel_args[] = {&params};
  check(d.LaunchKernel(fn.fn, unsigned(args.tokens), 1, 1, unsigned(kMlaThreads), 1, 1, 0, stream,
                       kernel_args, nullptr),
        "cuLaunchKernel");
}

}  // namespace ropejit::detail
