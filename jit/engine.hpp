// The JIT engine: compiled images (memory -> disk -> NVRTC), modules per CUDA context, and
// RoPE's launch path; the decode families build on it (jit/decode/engine.hpp). One
// process-wide instance; every method is thread-safe.
#pragma once

#include <cuda.h>

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "jit/call.hpp"
#include "jit/disk_cache.hpp"
#include "jit/launch_config.hpp"
#include "jit/launch_policy.hpp"
#include "jit/render.hpp"

namespace ropejit::detail {

// Where an image came from, for `ropejit info`, tests and benchmarks.
struct EngineStats {
  size_t nvrtc_compiles = 0;
  size_t disk_hits = 0;
  size_t memory_hits = 0;
  size_t module_loads = 0;
};

class Engine {
 public:
  static Engine& instance();

  // The public apply(): validate, pick a configuration, launch. Every RoPE launch (plain or
  // fused) is a programmatic dependent launch where the GPU has them (programmatic_launch()):
  // the kernel may be scheduled while the stream's previous kernel finishes and waits for its
  // writes at entry.
  void apply(const Spec& spec, const Args& args);

  // Launches a checked call with `cfg`, or with the policy's choice when `cfg` is null (the
  // tuner and benchmarks pass explicit configurations; illegal ones throw).
  void launch(const Spec& canonical, const Args& args, const CallShape& shape,
              const LaunchConfig* cfg);

  // Compiled image for a target ("sm_90" / "compute_90"), from memory, disk or NVRTC. Needs
  // no GPU. Returns the entry and sets `path` to its disk-cache file ("" when memory-only).
  const CacheEntry& image(const Spec& canonical, const KernelVariant& variant,
                          const std::string& target, std::string* path = nullptr);

  // image() on another thread (on this one when no thread can be created); the future
  // carries its outcome. `path`, when given, must outlive the future.
  std::future<void> image_async(const Spec& canonical, const KernelVariant& variant,
                                const std::string& target, std::string* path = nullptr);

  // Facts about the GPU owning `ctx`, which must be current (cached per context).
  const DeviceInfo& device_info(CUcontext ctx);

  // The configuration apply() launches this call with, and its kernel's registers per
  // thread (benchmarks and tests report it). Plans it like apply() does, launching nothing.
  std::pair<LaunchConfig, int> planned(const Spec& spec, const Args& args);

  // Installs the policy that chooses launch configurations (api/ installs autotune's before
  // the first call; `policy` must outlive the engine). Calls without an explicit configuration
  // fail until one is installed.
  void set_policy(LaunchPolicy* policy) { policy_.store(policy, std::memory_order_release); }

  DiskCache& disk() { return disk_; }
  EngineStats stats() const;
  // Drops in-memory images and modules' lookup entries (tests of the disk path).
  void clear_memory_cache();

  // What every kernel family builds on (jit/decode/engine.hpp's families among them).
  struct LoadedFunction {
    CUfunction fn = nullptr;
    int max_threads = 0;
    int regs = 0;  // per thread
  };
  // Any family's compiled image by its identity (key, variant, target): memory -> disk ->
  // NVRTC on `render()`'s source.
  const CacheEntry& image_by(const std::string& ident, const std::string& target,
                             const std::function<RenderedKernel()>& render, std::string* path);
  // Any family's function by key and variant name in `ctx`, loaded once from `image()`.
  const LoadedFunction& named_function(CUcontext ctx, const std::string& key,
                                       const std::string& variant, CUstream stream,
                                       const std::function<const CacheEntry&()>& image);
  // Loads every kernel the policy may pick for this RoPE key at this call's alignment, without
  // choosing a launch (nothing is tuned or looked up in the tuning file): the decode families'
  // unfused paths prepare their RoPE step with it.
  void load_variants(CUcontext ctx, const Spec& canonical, const CallShape& shape, CUstream stream);

 private:
  Engine();

  struct ImageSlot;
  struct FunctionSlot;
  struct FunctionKey {
    CUcontext ctx;
    Spec spec;
    KernelVariant variant;
    bool operator==(const FunctionKey& o) const {
      return ctx == o.ctx && spec == o.spec && variant == o.variant;
    }
  };
  struct FunctionKeyHash {
    size_t operator()(const FunctionKey& k) const;
  };

  // Loads the function `entry()` of `image()` into `slot`, once, in the current context
  // (refused during a graph capture; `what()` names the kernel in that message).
  void load_once(FunctionSlot* slot, CUstream stream, const std::function<std::string()>& what,
                 const std::function<const CacheEntry&()>& image,
                 const std::function<std::string()>& entry, int shared_optin = 0);

  // What a call without an explicit configuration launches: decided once per context, key,
  // token bucket, head counts and alignment (the policy may read the tuning file or tune).
  struct PlanKey {
    CUcontext ctx;
    Spec spec;
    int64_t bucket;
    int32_t q_heads, k_heads, v_heads, align, table_align;
    bool narrow;
    bool operator==(const PlanKey& o) const {
      return ctx == o.ctx && spec == o.spec && bucket == o.bucket && q_heads == o.q_heads &&
             k_heads == o.k_heads && v_heads == o.v_heads && align == o.align &&
             table_align == o.table_align && narrow == o.narrow;
    }
  };
  struct PlanKeyHash {
    size_t operator()(const PlanKey& k) const;
  };
  // Everything a cached call needs, found with one lookup; checked once when it is made.
  struct Plan {
    LaunchConfig cfg;
    const LoadedFunction* fn;
    const DeviceInfo* device;
    unsigned block_x = 0;       // chunks per head vector
    unsigned shared_bytes = 0;  // dynamic shared memory
  };
  Plan make_plan(CUcontext ctx, const Spec& canonical, const CallShape& shape,
                 const LaunchConfig& cfg, const DeviceInfo& device, CUstream stream);
  // The plan of a call: a remembered one, or chosen by the policy (choose_config), with the
  // policy's other variants for the key compiled and loaded alongside (sibling_variants,
  // load_siblings), then remembered.
  const Plan& plan(CUcontext ctx, const Spec& canonical, const CallShape& shape, CUstream stream);
  const Plan* find_plan(const PlanKey& key);
  LaunchPolicy& policy() const;
  LaunchConfig choose_config(const Spec& canonical, const CallShape& shape,
                             const DeviceInfo& device, bool capturing);
  std::vector<KernelVariant> sibling_variants(const Spec& canonical, const CallShape& shape,
                                              const DeviceInfo& device,
                                              const KernelVariant& chosen);
  void load_siblings(CUcontext ctx, const Spec& canonical,
                     const std::vector<KernelVariant>& siblings,
                     std::vector<std::future<void>>& compiling, const std::string& target,
                     CUstream stream);
  const LoadedFunction& function(CUcontext ctx, const Spec& canonical, const KernelVariant& variant,
                                 CUstream stream);
  // Whether image() was already asked for this variant (compiled, loaded, or under way).
  bool image_requested(const Spec& canonical, const KernelVariant& variant,
                       const std::string& target) const;
  // Whether preparing this image as another shape's kernel failed before (not tried again).
  bool sibling_failed(const std::string& ident) const;

  std::atomic<LaunchPolicy*> policy_{nullptr};
  DiskCache disk_;
  mutable std::mutex images_mutex_;
  std::unordered_map<std::string, std::shared_ptr<ImageSlot>> images_;
  mutable std::shared_mutex functions_mutex_;
  std::unordered_map<FunctionKey, std::unique_ptr<FunctionSlot>, FunctionKeyHash> functions_;
  mutable std::mutex failed_mutex_;
  std::unordered_set<std::string> failed_siblings_;
  mutable std::shared_mutex named_mutex_;  // named_functions_
  std::unordered_map<std::string, std::unique_ptr<FunctionSlot>> named_functions_;
  std::shared_mutex plans_mutex_;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
  std::shared_mutex devices_mutex_;
  std::unordered_map<CUcontext, DeviceInfo> devices_;
  mutable std::mutex stats_mutex_;
  EngineStats stats_;
};

}  // namespace ropejit::detail
