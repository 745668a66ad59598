// The JIT engine: compiled images (memory -> disk -> NVRTC), modules per CUDA context, and
// the launch path. One process-wide instance; every method is thread-safe.
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
#include "jit/dequant.hpp"
#include "jit/disk_cache.hpp"
#include "jit/ffn.hpp"
#include "jit/gemm.hpp"
#include "jit/launch_config.hpp"
#include "jit/launch_policy.hpp"
#include "jit/norm.hpp"
#include "jit/proj.hpp"

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

  // The decode block's QKV projection (jit/proj.hpp): checked, its variant chosen by the policy
  // once per (context, key, token tiles), compiled and loaded like a RoPE key's kernel.
  void qkv_projection(const QkvProjSpec& spec, const QkvProjArgs& args);
  // The path a call with these arguments takes (args.path, else the policy's choice where the
  // call allows the unfused path; `ignore_workspace`: as if the workspace were given).
  ProjPath qkv_projection_path(const QkvProjSpec& spec, const QkvProjArgs& args,
                               bool ignore_workspace);
  // Launches a checked call's fused kernel with `variant`, or with the policy's choice when it
  // is null.
  void launch_proj(const QkvProjSpec& canonical, const QkvProjArgs& args, const ProjShape& shape,
                   const ProjVariant* variant);
  // Runs a checked call through the unfused path: RMSNorm key into the workspace, cuBLASLt
  // GEMM(s) into q/k/v, the RoPE key in place on q and k.
  void launch_proj_unfused(const QkvProjSpec& canonical, const QkvProjArgs& args,
                           const ProjShape& shape);
  const CacheEntry& image(const QkvProjSpec& canonical, const ProjVariant& variant,
                          const std::string& target, std::string* path = nullptr);
  std::future<void> image_async(const QkvProjSpec& canonical, const ProjVariant& variant,
                                const std::string& target, std::string* path = nullptr);

  // The FFN's gate/up (jit/ffn.hpp): as the projection, the same plans by token bucket.
  void ffn_gate_up(const FfnSpec& spec, const FfnArgs& args);
  ProjPath ffn_gate_up_path(const FfnSpec& spec, const FfnArgs& args, bool ignore_workspace);
  // The fused kernel with `variant` (or the policy's when null), and the unfused path.
  void launch_ffn(const FfnSpec& canonical, const FfnArgs& args, const FfnShape& shape,
                  const ProjVariant* variant);
  void launch_ffn_unfused(const FfnSpec& canonical, const FfnArgs& args, const FfnShape& shape);
  const CacheEntry& image(const FfnSpec& canonical, const ProjVariant& variant,
                          const std::string& target, std::string* path = nullptr);
  std::future<void> image_async(const FfnSpec& canonical, const ProjVariant& variant,
                                const std::string& target, std::string* path = nullptr);
  const CacheEntry& glu_image(const FfnSpec& canonical, const GluVariant& variant,
                              const std::string& target, std::string* path = nullptr);
  // The unfused paths' dequantization of e4m3 weights (jit/dequant.hpp).
  const CacheEntry& dequant_image(DType dtype, const std::string& target,
                                  std::string* path = nullptr);

  // RMSNorm (jit/norm.hpp): checked; the variant the row length needs, compiled on first use.
  void rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args);
  const CacheEntry& image(const RmsNormSpec& canonical, const NormVariant& variant,
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

  struct LoadedFunction {
    CUfunction fn = nullptr;
    int max_threads = 0;
    int regs = 0;  // per thread
  };

  // Any family's compiled image by its identity (key, variant, target): memory -> disk ->
  // NVRTC on `render()`'s source.
  const CacheEntry& image_by(const std::string& ident, const std::string& target,
                             const std::function<RenderedKernel()>& render, std::string* path);
  // Loads the function `entry()` of `image()` into `slot`, once, in the current context
  // (refused during a graph capture; `what()` names the kernel in that message).
  void load_once(FunctionSlot* slot, CUstream stream, const std::function<std::string()>& what,
                 const std::function<const CacheEntry&()>& image,
                 const std::function<std::string()>& entry, int shared_optin = 0);

  // The projection's plans: per context, key, token bucket (proj_path_bucket), hidden size and
  // head counts, the path, the fused kernel's variant and its function.
  struct ProjPlanKey {
    CUcontext ctx;
    QkvProjSpec spec;
    int64_t bucket, hidden;
    int32_t q_heads, kv_heads;
    bool operator==(const ProjPlanKey& o) const {
      return ctx == o.ctx && spec == o.spec && bucket == o.bucket && hidden == o.hidden &&
             q_heads == o.q_heads && kv_heads == o.kv_heads;
    }
  };
  struct ProjPlanKeyHash {
    size_t operator()(const ProjPlanKey& k) const;
  };
  struct ProjPlan {
    ProjPath path;
    ProjVariant variant;
    const LoadedFunction* fn;
  };
  // The unfused path's pieces for this call's key and alignment, prepared outside a capture:
  // the RMSNorm and RoPE kernels loaded, cuBLASLt's handle created.
  void prepare_unfused(CUcontext ctx, const QkvProjSpec& canonical, const QkvProjArgs& args,
                       const ProjShape& shape, CUstream stream);
  // The unfused paths' first step: loads the RMSNorm kernel for rows of `hidden` (no launch),
  // and runs it into the workspace, returning the GEMM's activation operand (x itself when
  // `normalize` is false).
  void load_norm(CUcontext ctx, const RmsNormSpec& ns, const void* x, const void* weight,
                 int64_t hidden, CUstream stream);
  GemmCall normalized_operand(const RmsNormSpec& ns, bool normalize, int64_t tokens, int64_t hidden,
                              const void* x, int64_t x_stride, const void* weight, double eps,
                              void* workspace, void* stream);
  // Runs `prepare` once per context and key (projection or FFN); a failure warns once and
  // leaves the key's unfused path off inside graph captures.
  void prepare_once(CUcontext ctx, const std::string& key, const std::function<void()>& prepare);
  bool unfused_ready(CUcontext ctx, const std::string& key) const;
  // Whether an automatic call chosen unfused takes it: not inside a capture unless prepared,
  // and only when `plan_steps` (deciding the later steps' launches) succeeds.
  bool take_unfused(CUcontext ctx, const std::string& key, CUstream stream,
                    const std::function<void()>& plan_steps);
  void launch_fused(const LoadedFunction& fn, const ProjVariant& variant,
                    const QkvProjSpec& canonical, const QkvProjArgs& args, const ProjShape& shape,
                    CUstream stream);
  const LoadedFunction& proj_function(CUcontext ctx, const QkvProjSpec& canonical,
                                      const ProjVariant& variant, CUstream stream);
  // Any family's function by key and variant name in `ctx`, loaded once from `image()`.
  const LoadedFunction& named_function(CUcontext ctx, const std::string& key,
                                       const std::string& variant, CUstream stream,
                                       const std::function<const CacheEntry&()>& image);

  // RMSNorm's plans: per context, key and variant, the loaded function.
  struct NormPlanKey {
    CUcontext ctx;
    RmsNormSpec spec;
    int32_t vecs;
    bool operator==(const NormPlanKey& o) const {
      return ctx == o.ctx && spec == o.spec && vecs == o.vecs;
    }
  };
  struct NormPlanKeyHash {
    size_t operator()(const NormPlanKey& k) const;
  };
  const ProjPlan& proj_plan(CUcontext ctx, const QkvProjSpec& canonical, const QkvProjArgs& args,
                            const ProjShape& shape, CUstream stream);
  // The FFN's plans: per context, key, token bucket, hidden and intermediate size.
  struct FfnPlanKey {
    CUcontext ctx;
    FfnSpec spec;
    int64_t bucket, hidden, intermediate;
    bool operator==(const FfnPlanKey& o) const {
      return ctx == o.ctx && spec == o.spec && bucket == o.bucket && hidden == o.hidden &&
             intermediate == o.intermediate;
    }
  };
  struct FfnPlanKeyHash {
    size_t operator()(const FfnPlanKey& k) const;
  };
  const ProjPlan& ffn_plan(CUcontext ctx, const FfnSpec& canonical, const FfnArgs& args,
                           const FfnShape& shape, CUstream stream);
  const LoadedFunction& ffn_function(CUcontext ctx, const FfnSpec& canonical,
                                     const ProjVariant& variant, CUstream stream);
  const LoadedFunction& glu_function(CUcontext ctx, const FfnSpec& canonical,
                                     const GluVariant& variant, CUstream stream);
  void prepare_ffn_unfused(CUcontext ctx, const FfnSpec& canonical, const FfnArgs& args,
                           const FfnShape& shape, CUstream stream);
  const LoadedFunction& dequant_function(CUcontext ctx, DType dtype, CUstream stream);
  // An unfused path's GEMM over one weight: D[:, j] = A · W[j]ᵀ for the `rows` rows of `weight`
  // (`wstride` elements of its storage apart) into `d` (row stride g.ldd), g carrying A, K and
  // the stream. With e4m3 weights (`dequant`: the loaded dequantization kernel, looked up before
  // the path's first launch; null for 16-bit weights) chunk by chunk: each chunk of rows
  // dequantized into `chunk` (dequant_workspace_bytes) with `scale`'s rows, then its GEMM into
  // its columns of `d`.
  void weight_gemm(CUcontext ctx, GemmCall g, const LoadedFunction* dequant, const void* weight,
                   int64_t wstride, const float* scale, int64_t rows, void* d, void* chunk);

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
  mutable std::shared_mutex proj_mutex_;           // named_functions_, *_plans_, unfused_ready_
  std::unordered_set<std::string> unfused_ready_;  // "ctx/key" whose unfused path is prepared
  std::unordered_map<std::string, std::unique_ptr<FunctionSlot>> named_functions_;
  std::unordered_map<ProjPlanKey, ProjPlan, ProjPlanKeyHash> proj_plans_;
  std::unordered_map<FfnPlanKey, ProjPlan, FfnPlanKeyHash> ffn_plans_;
  std::unordered_map<NormPlanKey, const LoadedFunction*, NormPlanKeyHash> norm_plans_;
  std::shared_mutex plans_mutex_;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
  std::shared_mutex devices_mutex_;
  std::unordered_map<CUcontext, DeviceInfo> devices_;
  mutable std::mutex stats_mutex_;
  EngineStats stats_;
};

}  // namespace ropejit::detail
