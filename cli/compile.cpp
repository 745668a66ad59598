// `ropejit compile`: kernels into the disk cache without a GPU, from presets, keys or a tuning
// file, one line per kernel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "api/engine.hpp"
#include "autotune/tuning_cache.hpp"
#include "cli/cli.hpp"
#include "cli/presets.hpp"
#include "jit/coverage.hpp"
#include "jit/decode/proj.hpp"
#include "jit/family.hpp"
#include "jit/names.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::cli {
namespace {

struct Kernel {
  Spec spec;
  detail::KernelVariant variant;
  std::string target;  // "sm_90"
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The default variants (aligned q/k and tables) of every key, for every target: what a key's
// first use prepares, and what `precompile()` builds.
std::vector<Kernel> default_kernels(const std::vector<Spec>& specs,
                                    const std::vector<std::string>& targets) {
  std::vector<Kernel> out;
  for (const std::string& target : targets)
    for (const Spec& s : specs)
      for (const detail::KernelVariant& v : detail::default_variants(s, 16))
        out.push_back({s, v, target});
  return out;
}

// Every kernel a tuning file names, and its keys' defaults (a key's first use prepares those
// too, for the shapes the file does not cover), for the file's GPU or the given targets.
std::vector<Kernel> tuning_file_kernels(const std::string& file,
                                        const std::vector<std::string>& targets,
                                        std::string* about) {
  const autotune::TuningCache cache = autotune::TuningCache::load_as_tuned(file);
  const autotune::Fingerprint& fp = cache.fingerprint();
  std::vector<std::string> chosen = targets;
  if (chosen.empty()) {
    chosen.push_back(detail::target_for(fp.cc));
    if (const std::string note = detail::target_note(fp.cc); !note.empty())
      std::fprintf(stderr, "ropejit: compile: the tuning file's GPU: %s\n", note.c_str());
  }
  std::vector<Kernel> out;
  std::set<std::string> seen;
  auto add = [&](const Spec& s, const detail::KernelVariant& v, const std::string& target) {
    if (seen.insert(s.key() + "__" + v.name() + "@" + target).second) out.push_back({s, v, target});
  };
  for (const std::string& target : chosen) {
    for (const autotune::TuningEntry& e : cache.entries())
      add(parse_key(e.key), e.config.kernel, target);
    for (const autotune::TuningEntry& e : cache.entries())
      for (const detail::KernelVariant& v : detail::default_variants(parse_key(e.key), 16))
        add(parse_key(e.key), v, target);
  }
  *about = detail::concat(cache.entries().size(), " tuning entries for ", fp.gpu_name, " (sm_",
                          fp.cc, ")");
  return out;
}

// Compiles `kernels` on up to `threads` threads (fewer when the system gives fewer), printing
// one line per kernel as it finishes. Returns the number that failed.
size_t compile_all(const std::vector<Kernel>& kernels, unsigned threads) {
  std::mutex mutex;
  size_t next = 0, failures = 0;
  auto worker = [&] {
    for (;;) {
      const Kernel* k = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (next == kernels.size()) return;
        k = &kernels[next++];
      }
      const auto start = std::chrono::steady_clock::now();
      std::string line;
      try {
        std::string path;
        api::engine().image(k->spec, k->variant, k->target, &path);
        line = detail::concat(k->target, "  ", k->spec.key(), "  ", k->variant.name(), "  ",
                              ms_since(start), " ms  ", path.empty() ? "(memory only)" : path);
      } catch (const Error& e) {
        line = detail::concat(k->target, "  ", k->spec.key(), "  ", k->variant.name(),
                              "  FAILED: ", e.what());
        std::lock_guard<std::mutex> lock(mutex);
        ++failures;
      }
      std::lock_guard<std::mutex> lock(mutex);
      std::puts(line.c_str());
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // the system gives no more threads: work with those it gave
    }
  }
  if (pool.empty()) worker();  // not even one: compile on this thread
  for (std::thread& t : pool) t.join();
  return failures;
}

}  // namespace

namespace {

// What one `compile` run builds: the plain and fused RoPE kernels, the decode families' keys
// (every kernel each can launch) and the tuned variants a tuning file names for them.
struct CompilePlan {
  std::vector<Kernel> kernels;
  std::vector<QkvProjSpec> proj_specs;
  std::vector<FfnSpec> ffn_specs;
  std::vector<RmsNormSpec> norm_specs;
  std::vector<MlaSpec> mla_specs;
  std::vector<std::pair<QkvProjSpec, detail::ProjVariant>> proj_tuned;
  std::vector<std::pair<FfnSpec, detail::ProjVariant>> ffn_tuned;
  std::vector<std::string> decode_archs;  // the decode families' targets, as given
  std::string about;                      // "12 keys", "40 tuning entries for ..."
};

// The kernels a tuning file names: its RoPE entries and their keys' defaults, its projection
// and FFN entries' keys and the variants they name.
CompilePlan plan_from_tuning(const CompileOptions& o, const std::vector<std::string>& targets) {
  CompilePlan p;
  p.decode_archs = o.archs;
  p.kernels = tuning_file_kernels(o.from_tuning, targets, &p.about);
  const autotune::TuningCache cache = autotune::TuningCache::load_as_tuned(o.from_tuning);
  if (p.decode_archs.empty())
    p.decode_archs.push_back(detail::concat("sm_", cache.fingerprint().cc));
  std::set<std::string> keys, variants;
  for (const autotune::ProjTuningEntry& e : cache.proj_entries()) {
    detail::ProjVariant v;
    const bool tuned = !e.variant.empty() && detail::parse_proj_variant(e.variant, &v) &&
                       variants.insert(e.key + " " + e.variant).second;  // each once
    if (detail::family_of(e.key) == detail::Family::ffn_gate_up) {
      const FfnSpec f = parse_ffn_key(e.key);
      if (keys.insert(e.key).second) p.ffn_specs.push_back(f);
      if (tuned) p.ffn_tuned.emplace_back(f, v);
    } else {
      const QkvProjSpec q = parse_qkv_proj_key(e.key);
      if (keys.insert(e.key).second) p.proj_specs.push_back(q);
      if (tuned) p.proj_tuned.emplace_back(q, v);
    }
  }
  if (!cache.proj_entries().empty())
    p.about += detail::concat(" and ", cache.proj_entries().size(), " projection entries");
  return p;
}

// Adds `key` to the plan by its family; a RoPE key asked for by name must have a kernel.
void add_key(const std::string& key, CompilePlan* p, std::vector<Spec>* specs) {
  switch (detail::family_of(key)) {
    case detail::Family::qkv_projection:
      p->proj_specs.push_back(parse_qkv_proj_key(key));
      return;
    case detail::Family::ffn_gate_up:
      p->ffn_specs.push_back(parse_ffn_key(key));
      return;
    case detail::Family::rms_norm:
      p->norm_specs.push_back(parse_rms_norm_key(key));
      return;
    case detail::Family::mla:
      p->mla_specs.push_back(parse_mla_key(key));
      return;
    case detail::Family::dequant:
      detail::invalid("key '", key,
                      "': the e4m3 dequantization kernel is compiled with the "
                      "e4m3-weight projection and FFN keys that use it, not by itself");
    case detail::Family::rope: {
      const Spec s = parse_key(key);
      detail::require_kernel(s);  // asked for by name: an error, not a skip
      specs->push_back(s);
      return;
    }
  }
}

// The kernels of --preset, --hf-config and --key: each RoPE spec's default variants per target
// (specs this build has no kernel for are listed as skipped), and the decode families' keys.
CompilePlan plan_from_models_and_keys(const CompileOptions& o, std::vector<std::string>* targets) {
  CompilePlan p;
  p.decode_archs = o.archs;
  const DType dtype = detail::parse_name<DType>(o.dtype, "--dtype");
  std::vector<ModelRope> models;
  for (const std::string& name : o.presets) models.push_back(preset_model(find_preset(name)));
  for (const std::string& file : o.hf_configs) {
    models.push_back(model_from_hf_config_file(file));
    std::printf("%s: %s\n", detail::clipped_path(file).c_str(), describe(models.back()).c_str());
  }
  std::vector<Spec> specs, skipped;
  for (const ModelRope& m : models) {
    for (const Spec& s : model_specs(m, dtype))
      (detail::missing_kernel(s).empty() ? specs : skipped).push_back(s);
    for (const MlaSpec& s : model_mla_specs(m, dtype)) p.mla_specs.push_back(s);
  }
  for (const std::string& key : o.keys) add_key(key, &p, &specs);
  const size_t decode_keys =
      p.proj_specs.size() + p.ffn_specs.size() + p.norm_specs.size() + p.mla_specs.size();
  if (specs.empty() && skipped.empty() && decode_keys == 0)
    detail::invalid(
        "compile needs --preset NAME, --hf-config FILE, --key KEY or --from-tuning FILE");
  if (targets->empty()) targets->push_back("sm_90");
  for (const Spec& s : skipped)
    std::printf("%s  SKIPPED: %s has no kernel in this build yet\n", s.key().c_str(),
                detail::missing_kernel(s).c_str());
  p.kernels = default_kernels(specs, *targets);
  p.about = detail::concat(specs.size() + decode_keys, " keys");
  if (!skipped.empty()) p.about += detail::concat(" (", skipped.size(), " skipped)");
  return p;
}

// Every kernel each decode-family key can launch, per target, one line per key. Returns the
// number of failures; adds the kernels to `*built`.
size_t precompile_decode_keys(const CompilePlan& p, size_t* built) {
  size_t failures = 0;
  auto precompile_family = [&](const auto& family) {
    for (const auto& s : family)
      for (const std::string& arch : p.decode_archs) {
        try {
          const size_t n = precompile(s, arch).size();
          *built += n;
          std::printf("%s: %zu kernels for %s\n", s.key().c_str(), n, arch.c_str());
        } catch (const Error& e) {
          std::fprintf(stderr, "%s (%s): %s\n", s.key().c_str(), arch.c_str(), e.what());
          ++failures;
        }
      }
  };
  precompile_family(p.proj_specs);
  precompile_family(p.ffn_specs);
  precompile_family(p.norm_specs);
  precompile_family(p.mla_specs);
  return failures;
}

// The tuned fused variants of the projection and FFN entries, in parallel (the engine compiles
// each once). Returns the number of failures; adds the kernels to `*built`.
size_t build_tuned_decode_variants(const CompilePlan& p, size_t* built) {
  std::vector<std::pair<std::string, std::future<void>>> builds;
  detail::DecodeEngine& decode = api::decode_engine();
  for (const std::string& arch : p.decode_archs) {
    const int cc = detail::parse_arch(arch, "--arch");
    const std::string target = detail::target_for(cc);
    auto add = [&](const std::string& key, const detail::ProjVariant& v, auto build) {
      const std::string what = key + " " + v.name() + " (" + arch + ")";
      if (v.cluster > 1 && cc < 90)  // tuned on sm_90+; this target has no clusters
        std::printf("%s: tuned variant SKIPPED: thread-block clusters need sm_90\n", what.c_str());
      else
        builds.emplace_back(what, build());
    };
    for (const auto& t : p.proj_tuned)
      add(t.first.key(), t.second,
          [&] { return decode.image_async(t.first.canonical(), t.second, target); });
    for (const auto& t : p.ffn_tuned)
      add(t.first.key(), t.second,
          [&] { return decode.image_async(t.first.canonical(), t.second, target); });
  }
  size_t failures = 0;
  for (auto& [what, f] : builds) {
    try {
      f.get();
      ++*built;
      std::printf("%s: tuned variant\n", what.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: %s\n", what.c_str(), e.what());
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int run_compile(const CompileOptions& o) {
  const bool from_tuning = !o.from_tuning.empty();
  if (from_tuning && (!o.presets.empty() || !o.keys.empty() || !o.hf_configs.empty()))
    detail::invalid(
        "--from-tuning takes the keys from the tuning file; drop --preset, --hf-config and --key");
  std::vector<std::string> targets;
  for (const std::string& arch : o.archs) {
    const int cc = detail::parse_arch(arch, "--arch");
    targets.push_back(detail::target_for(cc));
    // Asked for by name: say when NVRTC builds something else.
    if (const std::string note = detail::target_note(cc); !note.empty())
      std::fprintf(stderr, "ropejit: compile: --arch %s\n", note.c_str());
  }
  CompilePlan plan =
      from_tuning ? plan_from_tuning(o, targets) : plan_from_models_and_keys(o, &targets);
  if (plan.decode_archs.empty()) plan.decode_archs.push_back("sm_90");
  for (const Kernel& k : plan.kernels)
    detail::compile_options(k.target);  // bad ROPEJIT_NVRTC_FLAGS: once
  detail::Engine& engine = api::engine();
  const detail::EngineStats before = engine.stats();
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned threads = o.jobs ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  size_t failures = compile_all(plan.kernels, threads);
  size_t decode_kernels = 0;
  failures += precompile_decode_keys(plan, &decode_kernels);
  failures += build_tuned_decode_variants(plan, &decode_kernels);
  const detail::EngineStats after = engine.stats();
  const size_t compiled = after.nvrtc_compiles - before.nvrtc_compiles;
  std::printf("%s: %zu kernels in %.2f s: %zu compiled, %zu from the disk cache, %zu failed\n",
              plan.about.c_str(), plan.kernels.size() + decode_kernels, ms_since(t0) / 1000,
              compiled, after.disk_hits - before.disk_hits, failures);
  if (engine.disk().read_only() && compiled == 0) {
    std::printf("the disk cache is read-only and held every kernel\n");
  } else if (!engine.disk().enabled()) {
    std::fprintf(stderr,
                 "ropejit: compile: nothing was saved: the disk cache is off (%s); set "
                 "ROPEJIT_CACHE_DIR to a directory of yours\n",
                 engine.disk().status().c_str());
    return 1;
  }
  return failures ? 1 : 0;
}

}  // namespace ropejit::cli
