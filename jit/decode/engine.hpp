// The decode families' engine: the QKV projection, the FFN's gate/up and RMSNorm (and the
// e4m3 weights' dequantization and the cuBLASLt GEMMs of their unfused paths), on the core
// engine's images, modules and RoPE launches (jit/engine.hpp). One process-wide instance;
// every method is thread-safe.
#pragma once

#include <cuda.h>

#include <atomic>
#include <functional>
#include <future>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "jit/decode/dequant.hpp"
#include "jit/decode/ffn.hpp"
#include "jit/decode/gemm.hpp"
#include "jit/decode/norm.hpp"
#include "jit/decode/policy.hpp"
#include "jit/decode/proj.hpp"
#include "jit/engine.hpp"

namespace ropejit::detail {

class DecodeEngine {
 public:
  static DecodeEngine& instance();

  // The decode block's QKV projection (jit/decode/proj.hpp): checked, its variant chosen by the
  // policy once per (context, key, token tiles), compiled and loaded like a RoPE key's kernel.
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

  // The FFN's gate/up (jit/decode/ffn.hpp): as the projection, the same plans by token bucket.
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
  // The unfused paths' dequantization of e4m3 weights (jit/decode/dequant.hpp).
  const CacheEntry& dequant_image(DType dtype, const std::string& target,
                                  std::string* path = nullptr);

  // RMSNorm (jit/decode/norm.hpp): checked; the variant the row length needs, compiled on first
  // use.
  void rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args);
  const CacheEntry& image(const RmsNormSpec& canonical, const NormVariant& variant,
                          const std::string& target, std::string* path = nullptr);

  // Installs the policy that chooses the decode families' variants and paths (api/ installs
  // autotune's before the first call; `policy` must outlive the engine).
  void set_policy(DecodePolicy* policy) { policy_.store(policy, std::memory_order_release); }

 private:
  DecodeEngine();
  using LoadedFunction = Engine::LoadedFunction;
  DecodePolicy& policy() const;

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

  Engine& core_;
  std::atomic<DecodePolicy*> policy_{nullptr};
  mutable std::shared_mutex mutex_;                // *_plans_, unfused_ready_
  std::unordered_set<std::string> unfused_ready_;  // "ctx/key" whose unfused path is prepared
  std::unordered_map<ProjPlanKey, ProjPlan, ProjPlanKeyHash> proj_plans_;
  std::unordered_map<FfnPlanKey, ProjPlan, FfnPlanKeyHash> ffn_plans_;
  std::unordered_map<NormPlanKey, const LoadedFunction*, NormPlanKeyHash> norm_plans_;
};

}  // namespace ropejit::detail
