// The decode engine's FFN gate/up: its images, plans, the fused launch and the unfused path.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>

#include "jit/decode/engine.hpp"
#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launching.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::detail {

const CacheEntry& DecodeEngine::image(const FfnSpec& c, const ProjVariant& variant,
                                      const std::string& target, std::string* path) {
  check_cluster_target(variant, target);
  return core_.image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

std::future<void> DecodeEngine::image_async(const FfnSpec& c, const ProjVariant& variant,
                                            const std::string& target, std::string* path) {
  return on_another_thread([this, c, variant, target, path] { image(c, variant, target, path); });
}

const CacheEntry& DecodeEngine::glu_image(const FfnSpec& c, const GluVariant& variant,
                                          const std::string& target, std::string* path) {
  return core_.image_by(
      glu_key(c) + "__" + variant.name() + "@" + target, target,
      [&] { return render_glu(c, variant); }, path);
}

const DecodeEngine::LoadedFunction& DecodeEngine::ffn_function(CUcontext ctx, const FfnSpec& c,
                                                               const ProjVariant& variant,
                                                               CUstream stream) {
  return core_.named_function(ctx, c.key(), variant.name(), stream, [&]() -> const CacheEntry& {
    return image(c, variant, target_for(core_.device_info(ctx).cc));
  });
}

const DecodeEngine::LoadedFunction& DecodeEngine::glu_function(CUcontext ctx, const FfnSpec& c,
                                                               const GluVariant& variant,
                                                               CUstream stream) {
  return core_.named_function(ctx, glu_key(c), variant.name(), stream, [&]() -> const CacheEntry& {
    return glu_image(c, variant, target_for(core_.device_info(ctx).cc));
  });
}

const DecodeEngine::ProjPlan& DecodeEngine::ffn_plan(CUcontext ctx, const FfnSpec& c,
                                                     const FfnArgs& args, const FfnShape& shape,
                                                     CUstream stream) {
  const FfnPlanKey key{ctx, c, proj_path_bucket(shape.tokens), shape.hidden, shape.intermediate};
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const auto it = ffn_plans_.find(key);
    if (it != ffn_plans_.end()) return it->second;
  }
  const DeviceInfo& device = core_.device_info(ctx);
  if (device.cc < 80)
    invalid("the FFN's gate/up (", c.key(), ") needs tensor cores of compute capability 8.0 or ",
            "newer; this GPU is sm_", device.cc);
  const ProjShape view = shape.proj();
  const ProjVariant chosen = policy().choose_ffn(c, view, device);
  if (const std::string why = proj_variant_problem(chosen, c.weights == Weights::e4m3);
      !why.empty())
    fail(ErrorCode::internal, "policy chose ", chosen.name(), " for ", c.key(), ": ", why);
  const ProjPath path = policy().choose_ffn_path(c, view, device);
  if (path != ProjPath::fused && path != ProjPath::unfused)
    fail(ErrorCode::internal, "policy chose path ", int(path), " for ", c.key());
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  std::vector<ProjVariant> all;
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE) all = policy().ffn_variants(c, device);
  if (std::find(all.begin(), all.end(), chosen) == all.end()) all.push_back(chosen);
  const std::string target = target_for(device.cc);
  std::vector<std::future<void>> compiling;
  for (const ProjVariant& v : all) compiling.push_back(image_async(c, v, target));
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE && gemm_unavailable().empty() &&
      ffn_split_problem(c, args, shape, false).empty())
    prepare_once(ctx, c.key(), [&] { prepare_ffn_unfused(ctx, c, args, shape, stream); });
  for (std::future<void>& f : compiling) f.get();
  const LoadedFunction* fn = nullptr;
  for (const ProjVariant& v : all) {
    const LoadedFunction& loaded = ffn_function(ctx, c, v, stream);
    if (v == chosen) fn = &loaded;
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  return ffn_plans_.emplace(key, ProjPlan{path, chosen, fn}).first->second;
}

void DecodeEngine::prepare_ffn_unfused(CUcontext ctx, const FfnSpec& c, const FfnArgs& args,
                                       const FfnShape& shape, CUstream stream) {
  if (c.norm != Norm::none)
    load_norm(ctx, RmsNormSpec{c.dtype, c.norm, false}, args.x, args.norm_weight, shape.hidden,
              stream);
  for (const int32_t vec : {8, 1}) glu_function(ctx, c, GluVariant{vec}, stream);
  if (c.weights == Weights::e4m3) dequant_function(ctx, c.dtype, stream);
  gemm_prepare(ctx);
}

void DecodeEngine::ffn_gate_up(const FfnSpec& spec, const FfnArgs& args) {
  const FfnSpec c = spec.canonical();
  const FfnShape shape = check_ffn_call(c, args);
  if (shape.tokens == 0) return;
  if (args.path == ProjPath::unfused) return launch_ffn_unfused(c, args, shape);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const ProjPlan& p = ffn_plan(ctx, c, args, shape, stream);
  if (args.path == ProjPath::automatic && p.path == ProjPath::unfused &&
      gemm_unavailable().empty() && ffn_split_problem(c, args, shape, true).empty() &&
      take_unfused(ctx, c.key(), stream, [] {}))
    return launch_ffn_unfused(c, args, shape);
  ropejit_dev::ProjParams params = make_ffn_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(p.fn->fn, shape.proj(), p.variant, stream, kernel_args);
}

ProjPath DecodeEngine::ffn_gate_up_path(const FfnSpec& spec, const FfnArgs& args,
                                        bool ignore_workspace) {
  const FfnSpec c = spec.canonical();
  FfnArgs probe = args;
  if (probe.path == ProjPath::unfused) probe.path = ProjPath::automatic;
  const FfnShape shape = check_ffn_call(c, probe);
  if (args.path == ProjPath::unfused)
    if (const std::string why = ffn_split_problem(c, args, shape, !ignore_workspace); !why.empty())
      invalid(why, " (args.path is unfused)");
  if (args.path != ProjPath::automatic) return args.path;
  if (shape.tokens == 0) return ProjPath::fused;
  CUcontext ctx = nullptr;
  const ContextScope scope(driver(), &ctx, args.x, "args.x");
  const ProjPlan& p = ffn_plan(ctx, c, args, shape, static_cast<CUstream>(args.stream));
  if (p.path == ProjPath::unfused && gemm_unavailable().empty() &&
      ffn_split_problem(c, args, shape, !ignore_workspace).empty())
    return ProjPath::unfused;
  return ProjPath::fused;
}

void DecodeEngine::launch_ffn(const FfnSpec& c, const FfnArgs& args, const FfnShape& shape,
                              const ProjVariant* requested) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  ProjVariant variant;
  const LoadedFunction* fn = nullptr;
  if (requested) {
    if (const std::string why = proj_variant_problem(*requested, c.weights == Weights::e4m3);
        !why.empty())
      invalid("projection variant ", requested->name(), " is not legal: ", why);
    if (core_.device_info(ctx).cc < 80)
      invalid("the FFN's gate/up (", c.key(), ") needs compute capability 8.0 or newer");
    variant = *requested;
    fn = &ffn_function(ctx, c, variant, stream);
  } else {
    const ProjPlan& p = ffn_plan(ctx, c, args, shape, stream);
    variant = p.variant;
    fn = p.fn;
  }
  ropejit_dev::ProjParams params = make_ffn_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(fn->fn, shape.proj(), variant, stream, kernel_args);
}

void DecodeEngine::launch_ffn_unfused(const FfnSpec& c, const FfnArgs& args,
                                      const FfnShape& shape) {
  if (const std::string why = ffn_split_problem(c, args, shape, true); !why.empty()) invalid(why);
  if (!gemm_unavailable().empty()) fail(ErrorCode::no_driver, gemm_unavailable());
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  if (core_.device_info(ctx).cc < 80)
    invalid("the FFN's gate/up (", c.key(), ") needs compute capability 8.0 or newer");
  CUstream stream = static_cast<CUstream>(args.stream);
  const int64_t elem = element_bytes(c.dtype);
  const int64_t I = shape.intermediate;
  char* workspace = static_cast<char*>(args.workspace);
  const size_t norm_bytes = norm_workspace_bytes(c.dtype, c.norm, shape.tokens, shape.hidden);
  const size_t product_bytes = ffn_product_bytes(c, shape.tokens, I);
  const size_t chunk_bytes =
      dequant_workspace_bytes(c.dtype, c.weights, shape.hidden, 2 * shape.intermediate);
  // Every kernel the path launches after the RMSNorm is loaded before it.
  const int64_t out_stride = args.out_stride == 0 ? I : args.out_stride;
  const bool wide =
      I % 8 == 0 && out_stride % 8 == 0 && reinterpret_cast<uintptr_t>(args.out) % 16 == 0;
  const GluVariant variant{wide ? 8 : 1};
  const LoadedFunction& glu = glu_function(ctx, c, variant, stream);
  const LoadedFunction* dequant =
      c.weights == Weights::e4m3 ? &dequant_function(ctx, c.dtype, stream) : nullptr;

  // 1. RMSNorm into the workspace (rounded once to the dtype).
  GemmCall g = normalized_operand(RmsNormSpec{c.dtype, c.norm, false}, c.norm != Norm::none,
                                  shape.tokens, shape.hidden, args.x, args.x_stride,
                                  args.norm_weight, args.norm_eps, workspace, args.stream);
  // 2. gate and up products, [tokens][2I] in the workspace: one GEMM when the weights are the
  // two halves of one tensor (vLLM's gate_up_proj), else one each.
  // With e4m3 weights, merged also means merged scales (up_scale = gate_scale + I).
  char* products = workspace + norm_bytes;
  char* chunk = products + product_bytes;  // e4m3 weights: dequantized rows
  g.workspace = chunk + chunk_bytes;
  g.workspace_bytes = args.workspace_bytes - norm_bytes - product_bytes - chunk_bytes;
  g.stream = stream;
  g.ldd = 2 * I;
  const bool w8 = c.weights == Weights::e4m3;
  const int64_t wstride = args.weight_stride == 0 ? shape.hidden : args.weight_stride;
  const int64_t welem = w8 ? 1 : elem;
  if (args.up_weight == static_cast<const char*>(args.gate_weight) + I * wstride * welem &&
      (!w8 || args.up_scale == args.gate_scale + I)) {
    weight_gemm(ctx, g, dequant, args.gate_weight, wstride, args.gate_scale, 2 * I, products,
                chunk);
  } else {
    weight_gemm(ctx, g, dequant, args.gate_weight, wstride, args.gate_scale, I, products, chunk);
    weight_gemm(ctx, g, dequant, args.up_weight, wstride, args.up_scale, I, products + I * elem,
                chunk);
  }
  // 3. out = act(gate) · up.
  ropejit_dev::GluParams p{};
  p.gate = products;
  p.up = products + I * elem;
  p.out = args.out;
  p.rows = shape.tokens;
  p.cols = I;
  p.gate_stride = p.up_stride = 2 * I;
  p.out_stride = out_stride;
  void* kernel_args[] = {&p};
  const int64_t per_block = int64_t(kGluThreads) * variant.vec;
  const KernelLaunch k{glu.fn,
                       {unsigned((I + per_block - 1) / per_block),
                        unsigned(std::min<int64_t>(shape.tokens, 65535)), 1},
                       {unsigned(kGluThreads), 1, 1},
                       0,
                       stream};
  launch_kernel(k, kernel_args,
                programmatic_launch(core_.device_info(ctx).image_cc));  // behind the GEMM
}

}  // namespace ropejit::detail
