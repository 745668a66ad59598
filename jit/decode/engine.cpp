#include "jit/decode/engine.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>

#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/launching.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::detail {

DecodeEngine& DecodeEngine::instance() {
  static DecodeEngine engine;
  return engine;
}

DecodeEngine::DecodeEngine() : core_(Engine::instance()) {}

DecodePolicy& DecodeEngine::policy() const {
  DecodePolicy* p = policy_.load(std::memory_order_acquire);
  if (!p)
    fail(ErrorCode::internal,
         "no decode launch policy is installed: call through the public API (api/), which "
         "installs autotune's");
  return *p;
}

size_t DecodeEngine::ProjPlanKeyHash::operator()(const ProjPlanKey& k) const {
  const QkvProjSpec& s = k.spec;
  uint64_t h = std::hash<const void*>()(k.ctx);
  hash_mix(h, uint64_t(s.dtype) | uint64_t(s.style) << 4 | uint64_t(s.positions) << 8 |
                  uint64_t(s.index_type) << 12 | uint64_t(s.freqs) << 16 |
                  uint64_t(s.table_dtype) << 20 | uint64_t(s.table_width) << 24 |
                  uint64_t(s.norm) << 28);
  hash_mix(h, uint64_t(uint32_t(s.head_dim)) << 32 | uint32_t(s.rotary_dim));
  hash_mix(h, uint64_t(k.bucket));
  hash_mix(h, uint64_t(k.hidden));
  hash_mix(h, uint64_t(uint32_t(k.q_heads)) << 32 | uint32_t(k.kv_heads));
  return size_t(h);
}

size_t DecodeEngine::FfnPlanKeyHash::operator()(const FfnPlanKey& k) const {
  uint64_t h = std::hash<const void*>()(k.ctx);
  hash_mix(h, uint64_t(k.spec.dtype) | uint64_t(k.spec.norm) << 8 | uint64_t(k.spec.act) << 16 |
                  uint64_t(k.spec.weights) << 24);
  hash_mix(h, uint64_t(k.bucket));
  hash_mix(h, uint64_t(k.hidden));
  hash_mix(h, uint64_t(k.intermediate));
  return size_t(h);
}

size_t DecodeEngine::NormPlanKeyHash::operator()(const NormPlanKey& k) const {
  uint64_t h = std::hash<const void*>()(k.ctx);
  hash_mix(h, uint64_t(k.spec.dtype) | uint64_t(k.spec.norm) << 8 |
                  uint64_t(k.spec.residual) << 16 | uint64_t(uint32_t(k.vecs)) << 32);
  return size_t(h);
}

void DecodeEngine::load_norm(CUcontext ctx, const RmsNormSpec& ns, const void* x,
                             const void* weight, int64_t hidden, CUstream stream) {
  RmsNormArgs n;
  n.rows = 1;
  n.hidden = hidden;
  n.x = x;
  n.weight = weight;
  n.out = const_cast<void*>(x);  // checked only, never launched
  const NormShape norm_shape = check_norm_call(ns, n);
  core_.named_function(
      ctx, ns.key(), norm_shape.variant.name(), stream, [&]() -> const CacheEntry& {
        return image(ns, norm_shape.variant, target_for(core_.device_info(ctx).cc));
      });
}

GemmCall DecodeEngine::normalized_operand(const RmsNormSpec& ns, bool normalize, int64_t tokens,
                                          int64_t hidden, const void* x, int64_t x_stride,
                                          const void* weight, double eps, void* workspace,
                                          void* stream) {
  GemmCall g;
  g.dtype = ns.dtype;
  g.m = tokens;
  g.k = hidden;
  g.a = x;
  g.lda = x_stride == 0 ? hidden : x_stride;
  if (!normalize) return g;
  RmsNormArgs n;
  n.rows = tokens;
  n.hidden = hidden;
  n.x = x;
  n.x_stride = g.lda;
  n.weight = weight;
  n.norm_eps = eps;
  n.out = workspace;
  n.out_stride = hidden;
  n.stream = stream;
  rms_norm(ns, n);
  g.a = workspace;
  g.lda = hidden;
  return g;
}

bool DecodeEngine::unfused_ready(CUcontext ctx, const std::string& key) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return unfused_ready_.count(concat(static_cast<const void*>(ctx), '/', key)) != 0;
}

void DecodeEngine::prepare_once(CUcontext ctx, const std::string& key,
                                const std::function<void()>& prepare) {
  if (unfused_ready(ctx, key)) return;
  try {
    prepare();
  } catch (const Error& e) {
    // The fused path does not need any of it: warn, and keep the unfused path off while
    // capturing (outside a capture a later call prepares what it needs).
    warn_once("unfused-prepare:" + key,
              concat("ropejit: the unfused path of ", key, " could not be prepared (", e.what(),
                     "); calls inside a CUDA graph capture run fused (or, for a key without a "
                     "fused kernel, fail there)"));
    return;
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  unfused_ready_.insert(concat(static_cast<const void*>(ctx), '/', key));
}

bool DecodeEngine::take_unfused(CUcontext ctx, const std::string& key, CUstream stream,
                                const std::function<void()>& plan_steps) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE && !unfused_ready(ctx, key)) return false;
  try {
    plan_steps();  // every step's launch decided before any is launched
  } catch (const Error& e) {
    warn_once(
        "unfused-plan:" + key,
        concat("ropejit: ", key, " runs fused where the unfused path was chosen (", e.what(), ")"));
    return false;
  }
  return true;
}

const CacheEntry& DecodeEngine::dequant_image(DType dtype, const std::string& target,
                                              std::string* path) {
  return core_.image_by(
      dequant_key(dtype) + "__" + kDequantVariant + "@" + target, target,
      [&] { return render_dequant(dtype); }, path);
}

const DecodeEngine::LoadedFunction& DecodeEngine::dequant_function(CUcontext ctx, DType dtype,
                                                                   CUstream stream) {
  return core_.named_function(ctx, dequant_key(dtype), kDequantVariant, stream,
                              [&]() -> const CacheEntry& {
                                return dequant_image(dtype, target_for(core_.device_info(ctx).cc));
                              });
}

void DecodeEngine::weight_gemm(CUcontext ctx, GemmCall g, const LoadedFunction* dequant,
                               const void* weight, int64_t wstride, const float* scale,
                               int64_t rows, void* d, void* chunk) {
  if (!dequant) {
    g.n = rows;
    g.b = weight;
    g.ldb = wstride;
    g.d = d;
    return gemm(ctx, g);
  }
  // The kernel's 16-code vectors: rows of a multiple of 16 codes, 16-byte aligned (check_hidden
  // and check_matrix saw to both).
  if (g.k % kDequantCodesPerThread != 0 || wstride % 16 != 0 ||
      reinterpret_cast<uintptr_t>(weight) % 16 != 0)
    fail(ErrorCode::internal, "e4m3 weights of ", g.k, " codes per row, ", wstride, " apart, at ",
         weight, ": not 16-byte vectors");
  const int64_t per_chunk = dequant_chunk_rows(g.dtype, g.k);
  const int64_t elem = element_bytes(g.dtype);
  for (int64_t first = 0; first < rows; first += per_chunk) {
    const int64_t n = std::min(per_chunk, rows - first);
    // Launched in stream order (not programmatically): it overwrites the chunk the previous
    // chunk's GEMM reads.
    ropejit_dev::DequantParams p = make_dequant_params(
        static_cast<const char*>(weight) + first * wstride, wstride, scale + first, chunk, n, g.k);
    void* kernel_args[] = {&p};
    const KernelLaunch k{dequant->fn,
                         {dequant_grid_x(g.k), dequant_grid_y(n), 1},
                         {unsigned(kDequantThreads), 1, 1},
                         0,
                         g.stream};
    launch_kernel(k, kernel_args, false);
    g.n = n;
    g.b = chunk;
    g.ldb = g.k;
    g.d = static_cast<char*>(d) + first * elem;
    gemm(ctx, g);
  }
}

// RMSNorm, also the unfused paths' first step.

const CacheEntry& DecodeEngine::image(const RmsNormSpec& c, const NormVariant& variant,
                                      const std::string& target, std::string* path) {
  return core_.image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

void DecodeEngine::rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args) {
  const RmsNormSpec c = spec.canonical();
  const NormShape shape = check_norm_call(c, args);
  if (shape.rows == 0) return;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const NormPlanKey key{ctx, c, shape.variant.vecs};
  const LoadedFunction* fn = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const auto it = norm_plans_.find(key);
    if (it != norm_plans_.end()) fn = it->second;
  }
  if (!fn) {
    fn = &core_.named_function(
        ctx, c.key(), shape.variant.name(), stream, [&]() -> const CacheEntry& {
          return image(c, shape.variant, target_for(core_.device_info(ctx).cc));
        });
    std::unique_lock<std::shared_mutex> lock(mutex_);
    norm_plans_.emplace(key, fn);
  }
  ropejit_dev::NormParams params = make_norm_params(c, args);
  void* kernel_args[] = {&params};
  check(d.LaunchKernel(fn->fn, unsigned(shape.rows), 1, 1, unsigned(kNormThreads), 1, 1, 0, stream,
                       kernel_args, nullptr),
        "cuLaunchKernel");
}

}  // namespace ropejit::detail
