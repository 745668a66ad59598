// The decode engine's QKV projection: its images, plans, the fused launch and the unfused path.
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

const CacheEntry& DecodeEngine::image(const QkvProjSpec& c, const ProjVariant& variant,
                                      const std::string& target, std::string* path) {
  check_cluster_target(variant, target);
  return core_.image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

std::future<void> DecodeEngine::image_async(const QkvProjSpec& c, const ProjVariant& variant,
                                            const std::string& target, std::string* path) {
  return on_another_thread([this, c, variant, target, path] { image(c, variant, target, path); });
}

const DecodeEngine::LoadedFunction& DecodeEngine::proj_function(CUcontext ctx, const QkvProjSpec& c,
                                                                const ProjVariant& variant,
                                                                CUstream stream) {
  return core_.named_function(ctx, c.key(), variant.name(), stream, [&]() -> const CacheEntry& {
    return image(c, variant, target_for(core_.device_info(ctx).cc));
  });
}

const DecodeEngine::ProjPlan& DecodeEngine::proj_plan(CUcontext ctx, const QkvProjSpec& c,
                                                      const QkvProjArgs& args,
                                                      const ProjShape& shape, CUstream stream) {
  const ProjPlanKey key{
      ctx, c, proj_path_bucket(shape.tokens), shape.hidden, shape.q_heads, shape.kv_heads};
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const auto it = proj_plans_.find(key);
    if (it != proj_plans_.end()) return it->second;  // nodes never move or die
  }
  const DeviceInfo& device = core_.device_info(ctx);
  if (device.cc < 80)
    invalid("the QKV projection (", c.key(), ") needs tensor cores of compute capability 8.0 or ",
            "newer; this GPU is sm_", device.cc);
  const ProjVariant chosen = policy().choose_proj(c, shape, device);
  if (const std::string why = proj_variant_problem(chosen, c.weights == Weights::e4m3);
      !why.empty())
    fail(ErrorCode::internal, "policy chose ", chosen.name(), " for ", c.key(), ": ", why);
  const ProjPath path = policy().choose_proj_path(c, shape, device);
  if (path != ProjPath::fused && path != ProjPath::unfused)
    fail(ErrorCode::internal, "policy chose path ", int(path), " for ", c.key());
  // Every variant the policy may pick for the key is compiled now, concurrently, and loaded,
  // so a later token count never compiles (nor loads a module inside a graph capture); the
  // unfused path's kernels too, where this call could take it.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  std::vector<ProjVariant> all;
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE) all = policy().proj_variants(c, shape, device);
  if (std::find(all.begin(), all.end(), chosen) == all.end()) all.push_back(chosen);
  const std::string target = target_for(device.cc);
  std::vector<std::future<void>> compiling;
  for (const ProjVariant& v : all) compiling.push_back(image_async(c, v, target));
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE && gemm_unavailable().empty() &&
      proj_split_problem(c, args, shape, false).empty())
    prepare_once(ctx, proj_unfused_key(c, args),
                 [&] { prepare_unfused(ctx, c, args, shape, stream); });
  for (std::future<void>& f : compiling) f.get();  // rethrows a compile error
  const LoadedFunction* fn = nullptr;
  for (const ProjVariant& v : all) {
    const LoadedFunction& loaded = proj_function(ctx, c, v, stream);
    if (v == chosen) fn = &loaded;
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  return proj_plans_.emplace(key, ProjPlan{path, chosen, fn}).first->second;
}

void DecodeEngine::prepare_unfused(CUcontext ctx, const QkvProjSpec& c, const QkvProjArgs& args,
                                   const ProjShape& shape, CUstream stream) {
  if (c.norm != Norm::none)
    load_norm(ctx, proj_norm_spec(c), args.x, args.norm_weight, shape.hidden, stream);
  // The RoPE key's kernels the policy may pick at this alignment, loaded without choosing a
  // launch (so nothing is tuned or looked up in the tuning file here).
  const Spec rs = proj_rope_spec(c, args).canonical();
  const CallShape rope_shape = check_call(rs, proj_rope_args(c, args));
  core_.load_variants(ctx, rs, rope_shape, stream);
  if (c.weights == Weights::e4m3) dequant_function(ctx, c.dtype, stream);
  gemm_prepare(ctx);  // cuBLASLt's handle for the context
}

// Keys without a fused kernel (proj_fused_problem) take the unfused path at every size; a call
// that cannot take it, or asks for the fused path, is refused with both reasons.
static void check_unfused_only(const QkvProjSpec& c, const QkvProjArgs& args,
                               const ProjShape& shape, bool need_workspace) {
  const std::string fused = proj_fused_problem(c);
  if (fused.empty()) return;
  if (args.path == ProjPath::fused) invalid("args.path is fused, but ", fused);
  if (const std::string why = proj_split_problem(c, args, shape, need_workspace); !why.empty())
    invalid(why, " (", c.key(), " has the unfused path only: ", fused, ")");
}

void DecodeEngine::qkv_projection(const QkvProjSpec& spec, const QkvProjArgs& args) {
  const QkvProjSpec c = spec.canonical();
  const ProjShape shape = check_proj_call(c, args);
  check_unfused_only(c, args, shape, shape.tokens > 0);
  if (shape.tokens == 0) return;
  if (args.path == ProjPath::unfused || !proj_fused_problem(c).empty())
    return launch_proj_unfused(c, args, shape);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const ProjPlan& p = proj_plan(ctx, c, args, shape, stream);
  if (args.path == ProjPath::automatic && p.path == ProjPath::unfused &&
      gemm_unavailable().empty() && proj_split_problem(c, args, shape, true).empty() &&
      take_unfused(ctx, proj_unfused_key(c, args), stream,
                   [&] { core_.planned(proj_rope_spec(c, args), proj_rope_args(c, args)); }))
    return launch_proj_unfused(c, args, shape);
  launch_fused(*p.fn, p.variant, c, args, shape, stream);
}

ProjPath DecodeEngine::qkv_projection_path(const QkvProjSpec& spec, const QkvProjArgs& args,
                                           bool ignore_workspace) {
  const QkvProjSpec c = spec.canonical();
  QkvProjArgs probe = args;  // a forced unfused call is checked below, its workspace as asked
  if (probe.path == ProjPath::unfused) probe.path = ProjPath::automatic;
  const ProjShape shape = check_proj_call(c, probe);
  check_unfused_only(c, args, shape, !ignore_workspace);
  if (!proj_fused_problem(c).empty()) return ProjPath::unfused;
  if (args.path == ProjPath::unfused)
    if (const std::string why = proj_split_problem(c, args, shape, !ignore_workspace); !why.empty())
      invalid(why, " (args.path is unfused)");
  if (args.path != ProjPath::automatic) return args.path;
  if (shape.tokens == 0) return ProjPath::fused;
  CUcontext ctx = nullptr;
  const ContextScope scope(driver(), &ctx, args.x, "args.x");
  const ProjPlan& p = proj_plan(ctx, c, args, shape, static_cast<CUstream>(args.stream));
  if (p.path == ProjPath::unfused && gemm_unavailable().empty() &&
      proj_split_problem(c, args, shape, !ignore_workspace).empty())
    return ProjPath::unfused;
  return ProjPath::fused;
}

void DecodeEngine::launch_proj(const QkvProjSpec& c, const QkvProjArgs& args,
                               const ProjShape& shape, const ProjVariant* requested) {
  if (const std::string why = proj_fused_problem(c); !why.empty())
    invalid(c.key(), " has no fused kernel: ", why);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  if (!requested) {
    const ProjPlan& p = proj_plan(ctx, c, args, shape, stream);
    return launch_fused(*p.fn, p.variant, c, args, shape, stream);
  }
  if (const std::string why = proj_variant_problem(*requested, c.weights == Weights::e4m3);
      !why.empty())
    invalid("projection variant ", requested->name(), " is not legal: ", why);
  if (core_.device_info(ctx).cc < 80)
    invalid("the QKV projection (", c.key(), ") needs compute capability 8.0 or newer");
  launch_fused(proj_function(ctx, c, *requested, stream), *requested, c, args, shape, stream);
}

void DecodeEngine::launch_fused(const LoadedFunction& fn, const ProjVariant& variant,
                                const QkvProjSpec& c, const QkvProjArgs& args,
                                const ProjShape& shape, CUstream stream) {
  ropejit_dev::ProjParams params = make_proj_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(fn.fn, shape, variant, stream, kernel_args);
}

void DecodeEngine::launch_proj_unfused(const QkvProjSpec& c, const QkvProjArgs& args,
                                       const ProjShape& shape) {
  if (const std::string why = proj_split_problem(c, args, shape, true); !why.empty()) invalid(why);
  if (!gemm_unavailable().empty()) fail(ErrorCode::no_driver, gemm_unavailable());
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  if (core_.device_info(ctx).cc < 80)
    invalid("the QKV projection (", c.key(), ") needs compute capability 8.0 or newer");
  CUstream stream = static_cast<CUstream>(args.stream);
  // A key without a fused kernel has no plan whose first use prepares this path: its first call
  // outside a capture does, once.
  if (!proj_fused_problem(c).empty()) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    check(d.StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
    if (capture == CU_STREAM_CAPTURE_STATUS_NONE)
      prepare_once(ctx, proj_unfused_key(c, args),
                   [&] { prepare_unfused(ctx, c, args, shape, stream); });
  }
  const int64_t elem = element_bytes(c.dtype);
  char* workspace = static_cast<char*>(args.workspace);
  const size_t norm_bytes = proj_norm_bytes(c, shape.tokens, shape.hidden);
  const size_t chunk_bytes = proj_chunk_bytes(c, shape.hidden, shape.q_heads, shape.kv_heads);
  // The RoPE step's launch is decided first, and the dequantization kernel of e4m3 weights
  // loaded: a refusal (ROPEJIT_TUNING=frozen without its entry, say) then comes before anything
  // is written.
  core_.planned(proj_rope_spec(c, args), proj_rope_args(c, args));
  const LoadedFunction* dequant =
      c.weights == Weights::e4m3 ? &dequant_function(ctx, c.dtype, stream) : nullptr;

  // 1. RMSNorm into the workspace (rounded once to the dtype, as torch's module does).
  GemmCall g = normalized_operand(proj_norm_spec(c), c.norm != Norm::none, shape.tokens,
                                  shape.hidden, args.x, args.x_stride, args.norm_weight,
                                  args.norm_eps, workspace, args.stream);
  char* chunk = workspace + norm_bytes;  // e4m3 weights: dequantized rows
  g.workspace = chunk + chunk_bytes;
  g.workspace_bytes = args.workspace_bytes - norm_bytes - chunk_bytes;
  g.stream = stream;

  // 2. The projection: one GEMM when q, k and v are heads of one packed tensor, else one each.
  const int64_t wstride = args.weight_stride == 0 ? shape.hidden : args.weight_stride;
  const int64_t welem = c.weights == Weights::e4m3 ? 1 : elem;
  const int64_t D = c.head_dim;
  const Tensor* outs[3] = {&args.q, &args.k, &args.v};
  const int64_t heads[3] = {shape.q_heads, shape.kv_heads, shape.kv_heads};
  auto row_stride = [&](const Tensor& t, int64_t n) {
    return shape.tokens > 1 ? t.stride_seq : std::max(t.stride_seq, n);
  };
  const char* q0 = static_cast<const char*>(args.q.data);
  const bool packed = args.k.data == q0 + shape.q_heads * D * elem &&
                      args.v.data == q0 + (shape.q_heads + shape.kv_heads) * D * elem &&
                      args.k.stride_seq == args.q.stride_seq &&
                      args.v.stride_seq == args.q.stride_seq;
  if (packed) {
    const int64_t rows = (shape.q_heads + 2 * shape.kv_heads) * D;
    g.ldd = row_stride(args.q, rows);
    weight_gemm(ctx, g, dequant, args.weight, wstride, args.weight_scale, rows, args.q.data, chunk);
  } else {
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = heads[i] * D;
      g.ldd = row_stride(*outs[i], rows);
      weight_gemm(ctx, g, dequant, static_cast<const char*>(args.weight) + row * wstride * welem,
                  wstride, args.weight_scale ? args.weight_scale + row : nullptr, rows,
                  outs[i]->data, chunk);
      row += rows;
    }
  }

  // 3. RoPE in place on q and k (one launch, overlapping the GEMM's end where it can).
  core_.apply(proj_rope_spec(c, args), proj_rope_args(c, args));
}

}  // namespace ropejit::detail
