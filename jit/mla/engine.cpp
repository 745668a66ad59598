#include "jit/mla/engine.hpp"

#include <functional>
#include <mutex>

#include "jit/driver.hpp"
#include "jit/launching.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::detail {

MlaEngine& MlaEngine::instance() {
  static MlaEngine engine;
  return engine;
}

MlaEngine::MlaEngine() : core_(Engine::instance()) {}

size_t MlaEngine::PlanKeyHash::operator()(const PlanKey& k) const {
  const MlaSpec& s = k.spec;
  uint64_t h = std::hash<const void*>()(k.ctx);
  hash_mix(h, uint64_t(uint32_t(s.kv_rank)) << 32 | uint32_t(s.rope_dim));
  hash_mix(h, uint64_t(s.dtype) | uint64_t(s.style) << 4 | uint64_t(s.index_type) << 8 |
                  uint64_t(s.table_dtype) << 12 | uint64_t(s.norm) << 16 |
                  uint64_t(s.cache_store) << 20 | uint64_t(s.query) << 24 |
                  uint64_t(s.q_store) << 28);
  return size_t(h);
}

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
  const PlanKey key{ctx, c};
  Plan plan{nullptr, 1};
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const auto it = plans_.find(key);
    if (it != plans_.end()) plan = it->second;
  }
  if (!plan.fn) {
    // First use in this context: the core engine compiles or loads the key's one kernel.
    const DeviceInfo& device = core_.device_info(ctx);
    plan.fn = &core_.named_function(
        ctx, c.key(), mla_variant_name(), stream,
        [&]() -> const CacheEntry& { return image(c, target_for(device.cc)); });
    plan.sm_count = device.sm_count;
    std::unique_lock<std::shared_mutex> lock(mutex_);
    plans_.emplace(key, plan);
  }
  unsigned blocks = 1;
  ropejit_dev::MlaParams params = make_mla_params(c, args, plan.sm_count, &blocks);
  void* kernel_args[] = {&params};
  check(d.LaunchKernel(plan.fn->fn, blocks, 1, 1, unsigned(kMlaThreads), 1, 1, 0, stream,
                       kernel_args, nullptr),
        "cuLaunchKernel");
}

}  // namespace ropejit::detail
