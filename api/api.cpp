// The public C++ entry points over the engine.
#include <cstdlib>
#include <future>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "jit/coverage.hpp"
#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit {

detail::Engine& api::engine() {
  static detail::Engine& engine = []() -> detail::Engine& {
    detail::Engine& e = detail::Engine::instance();
    e.set_policy(&autotune::tuning_policy());
    return e;
  }();
  return engine;
}

detail::DecodeEngine& api::decode_engine() {
  static detail::DecodeEngine& engine = []() -> detail::DecodeEngine& {
    api::engine();  // the core's policy too: the unfused paths launch RoPE kernels
    detail::DecodeEngine& e = detail::DecodeEngine::instance();
    e.set_policy(&autotune::decode_tuning_policy());
    return e;
  }();
  return engine;
}

void apply(const Spec& spec, const Args& args) { api::engine().apply(spec, args); }

std::vector<std::string> precompile(const Spec& spec, const std::string& arch) {
  const Spec c = spec.canonical();
  detail::require_kernel(c);  // a key whose axis values have no device code yet: refused
  const int cc = detail::parse_arch(arch, "arch");
  // The default kernel variants (prefill and decode) depend on the spec and alignment
  // only; precompile the fully aligned case (q/k and table), which is what contiguous and
  // packed-QKV tensors and the usual tables give.
  // Compiled concurrently, as a key's first use does.
  const std::vector<detail::KernelVariant> variants = detail::default_variants(c, 16);
  const std::string target = detail::target_for(cc);
  std::vector<std::string> paths(variants.size());
  std::vector<std::future<void>> builds;
  for (size_t i = 0; i < variants.size(); ++i)
    builds.push_back(api::engine().image_async(c, variants[i], target, &paths[i]));
  for (std::future<void>& f : builds) f.get();  // rethrows a compile error
  return paths;
}

void qkv_projection(const QkvProjSpec& spec, const QkvProjArgs& args) {
  api::decode_engine().qkv_projection(spec, args);
}

size_t qkv_projection_workspace_bytes(const QkvProjSpec& spec, const QkvProjArgs& args) {
  const QkvProjSpec c = spec.canonical();
  if (args.tokens < 0) detail::invalid("args.tokens (", args.tokens, ") must be >= 0");
  if (args.hidden < 8 || args.hidden % 8 != 0 || args.hidden > (int64_t(1) << 24))
    detail::invalid("args.hidden (", args.hidden, ") must be a multiple of 8 in [8, 2^24]");
  // e4m3 weights: the workspace holds a chunk of their dequantized rows, sized by the heads.
  if (c.weights == Weights::e4m3) detail::check_proj_heads(args.q_heads, args.kv_heads);
  return detail::proj_workspace_bytes(c, args.tokens, args.hidden, args.q_heads, args.kv_heads);
}

ProjPath qkv_projection_path(const QkvProjSpec& spec, const QkvProjArgs& args) {
  return api::decode_engine().qkv_projection_path(spec, args, true);
}

namespace {

// A projection key without a fused kernel (a dynamic FP8 cache): its unfused path's kernels, the
// RMSNorm key's, the RoPE step's key as a decode step and (paged or contiguous caches) as a
// chunk's sequences, and with e4m3 weights the dequantization kernel.
std::vector<std::string> precompile_unfused(const QkvProjSpec& c, const std::string& arch) {
  std::vector<std::string> paths;
  auto add = [&](const std::vector<std::string>& more) {
    paths.insert(paths.end(), more.begin(), more.end());
  };
  if (c.norm != Norm::none) add(precompile(detail::proj_norm_spec(c), arch));
  QkvProjArgs step;
  add(precompile(detail::proj_rope_spec(c, step), arch));
  if (c.cache == KvCache::paged || c.cache == KvCache::contiguous) {
    static const int32_t any_cu_seqlens = 0;  // only whether the call gives them matters here
    step.cu_seqlens = &any_cu_seqlens;
    add(precompile(detail::proj_rope_spec(c, step), arch));
  }
  if (c.weights == Weights::e4m3) {
    paths.emplace_back();
    api::decode_engine().dequant_image(
        c.dtype, detail::target_for(detail::parse_arch(arch, "arch")), &paths.back());
  }
  return paths;
}

}  // namespace

std::vector<std::string> precompile(const QkvProjSpec& spec, const std::string& arch) {
  const QkvProjSpec c = spec.canonical();
  const int cc = detail::parse_arch(arch, "arch");
  if (cc < 80)
    detail::invalid("arch (", arch, "): the QKV projection needs sm_80 or newer (tensor cores)");
  if (!detail::proj_fused_problem(c).empty()) return precompile_unfused(c, arch);
  detail::DeviceInfo device;
  device.cc = cc;
  const std::vector<detail::ProjVariant> variants =
      autotune::proj_heuristic_variants(c, detail::ProjShape{}, device);  // no clusters
  const std::string target = detail::target_for(cc);
  // e4m3 weights: the unfused path's dequantization kernel too.
  const bool w8 = c.weights == Weights::e4m3;
  std::vector<std::string> paths(variants.size() + (w8 ? 1 : 0));
  std::vector<std::future<void>> builds;
  for (size_t i = 0; i < variants.size(); ++i)
    builds.push_back(api::decode_engine().image_async(c, variants[i], target, &paths[i]));
  if (w8)
    builds.push_back(std::async(std::launch::async, [&] {
      api::decode_engine().dequant_image(c.dtype, target, &paths.back());
    }));
  for (std::future<void>& f : builds) f.get();
  return paths;
}

void ffn_gate_up(const FfnSpec& spec, const FfnArgs& args) {
  api::decode_engine().ffn_gate_up(spec, args);
}

size_t ffn_gate_up_workspace_bytes(const FfnSpec& spec, const FfnArgs& args) {
  const FfnSpec c = spec.canonical();
  if (args.tokens < 0) detail::invalid("args.tokens (", args.tokens, ") must be >= 0");
  if (args.hidden < 8 || args.hidden % 8 != 0 || args.hidden > (int64_t(1) << 24))
    detail::invalid("args.hidden (", args.hidden, ") must be a multiple of 8 in [8, 2^24]");
  if (args.intermediate < 1 || args.intermediate > (int64_t(1) << 24))
    detail::invalid("args.intermediate (", args.intermediate, ") must be in [1, 2^24]");
  return detail::ffn_workspace_bytes(c, args.tokens, args.hidden, args.intermediate);
}

ProjPath ffn_gate_up_path(const FfnSpec& spec, const FfnArgs& args) {
  return api::decode_engine().ffn_gate_up_path(spec, args, true);
}

std::vector<std::string> precompile(const FfnSpec& spec, const std::string& arch) {
  const FfnSpec c = spec.canonical();
  const int cc = detail::parse_arch(arch, "arch");
  if (cc < 80)
    detail::invalid("arch (", arch, "): the FFN's gate/up needs sm_80 or newer (tensor cores)");
  detail::DeviceInfo device;
  device.cc = cc;
  const std::vector<detail::ProjVariant> variants = autotune::ffn_heuristic_variants(c, device);
  const std::string target = detail::target_for(cc);
  // The unfused path's GLU kernels too, and with e4m3 weights its dequantization kernel.
  const bool w8 = c.weights == Weights::e4m3;
  std::vector<std::string> paths(variants.size() + 2 + (w8 ? 1 : 0));
  std::vector<std::future<void>> builds;
  for (size_t i = 0; i < variants.size(); ++i)
    builds.push_back(api::decode_engine().image_async(c, variants[i], target, &paths[i]));
  for (const int32_t vec : {8, 1})
    builds.push_back(std::async(std::launch::async, [&, vec] {
      api::decode_engine().glu_image(c, detail::GluVariant{vec}, target,
                                     &paths[variants.size() + (vec == 8 ? 0 : 1)]);
    }));
  if (w8)
    builds.push_back(std::async(std::launch::async, [&] {
      api::decode_engine().dequant_image(c.dtype, target, &paths.back());
    }));
  for (std::future<void>& f : builds) f.get();
  return paths;
}

void rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args) {
  api::decode_engine().rms_norm(spec, args);
}

std::vector<std::string> precompile(const RmsNormSpec& spec, const std::string& arch) {
  const RmsNormSpec c = spec.canonical();
  const std::string target = detail::target_for(detail::parse_arch(arch, "arch"));
  std::vector<std::string> paths(5);
  std::vector<std::future<void>> builds;
  for (int32_t i = 0; i < 5; ++i)
    builds.push_back(std::async(std::launch::async, [&, i] {
      api::decode_engine().image(c, detail::NormVariant{1 << i}, target, &paths[size_t(i)]);
    }));
  for (std::future<void>& f : builds) f.get();
  return paths;
}

void mla_prepare(const MlaSpec& spec, const MlaArgs& args) {
  api::engine();  // the core engine, its policy installed, holds MLA's images and modules
  detail::MlaEngine::instance().mla_prepare(spec, args);
}

std::vector<std::string> precompile(const MlaSpec& spec, const std::string& arch) {
  const MlaSpec c = spec.canonical();
  const std::string target = detail::target_for(detail::parse_arch(arch, "arch"));
  api::engine();
  std::string path;
  detail::MlaEngine::instance().image(c, target, &path);
  return {path};
}

CacheCounts cache_counts() {
  const detail::EngineStats s = api::engine().stats();
  return CacheCounts{s.nvrtc_compiles, s.disk_hits, s.memory_hits, s.module_loads};
}

Info info() {
  Info out;
  out.version = kVersion;
  const detail::NvrtcVersion nv = detail::nvrtc_version();
  out.nvrtc_major = nv.major;
  out.nvrtc_minor = nv.minor;
  detail::DiskCache& disk = api::engine().disk();
  out.cache_dir = disk.dir();
  out.cache_status = disk.status();
  out.cache_entries = disk.count_entries();
  std::string why;
  const detail::Driver* d = detail::try_driver(&why);
  if (!d) {
    out.driver_status = why;
    return out;
  }
  out.driver_status = "ok";
  d->DriverGetVersion(&out.driver_version);
  int count = 0;
  d->DeviceGetCount(&count);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    char name[256] = {};
    int major = 0, minor = 0, sms = 0;
    d->DeviceGet(&dev, i);
    d->DeviceGetName(name, sizeof name, dev);
    d->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    d->DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    out.devices.push_back(detail::concat(name, " (sm_", major, minor, ", ", sms, " SMs)"));
  }
  return out;
}

}  // namespace ropejit
