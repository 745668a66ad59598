// The `ropejit` command: info, compile, demo.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuning_cache.hpp"
#include "cli/cli.hpp"
#include "cli/presets.hpp"
#include "jit/coverage.hpp"
#include "jit/decode/norm.hpp"
#include "jit/decode/proj.hpp"
#include "jit/family.hpp"
#include "jit/names.hpp"
#include "jit/nvrtc.hpp"
#include "jit/render.hpp"

namespace ropejit::cli {
namespace {}  // namespace

int run_source(const std::string& key, const std::string& hf_config, const std::string& dtype) {
  if (key.empty() == hf_config.empty())
    detail::invalid("source needs a KEY or --hf-config FILE (one of them)");
  const detail::Family family = detail::family_of(key);
  if (family == detail::Family::ffn_gate_up) {  // the FFN's gate/up, its one-token kernel
    const FfnSpec spec = parse_ffn_key(key);
    detail::ProjShape one_token;
    one_token.tokens = 1;
    const detail::ProjVariant v = autotune::ffn_heuristic(spec, one_token, detail::DeviceInfo{});
    std::fputs(detail::render(spec, v).source.c_str(), stdout);
    return 0;
  }
  if (family == detail::Family::qkv_projection) {  // the projection, its one-token kernel
    const QkvProjSpec spec = parse_qkv_proj_key(key);
    detail::ProjShape one_token;
    one_token.tokens = 1;
    const detail::ProjVariant v = autotune::proj_heuristic(spec, one_token, detail::DeviceInfo{});
    std::fputs(detail::render(spec, v).source.c_str(), stdout);
    return 0;
  }
  if (family == detail::Family::mla) {  // MLA: its one kernel
    std::fputs(detail::render(parse_mla_key(key).canonical()).source.c_str(), stdout);
    return 0;
  }
  if (family == detail::Family::rms_norm) {  // RMSNorm: its kernel for the shortest rows
    const RmsNormSpec spec = parse_rms_norm_key(key);
    std::fputs(detail::render(spec.canonical(), detail::NormVariant{}).source.c_str(), stdout);
    return 0;
  }
  const Spec spec = key.empty() ? spec_from_model(model_from_hf_config_file(hf_config),
                                                  detail::parse_name<DType>(dtype, "--dtype"))
                                : parse_key(key);
  detail::require_kernel(spec);  // never print a kernel that would ignore part of the key
  std::fputs(detail::render(spec, detail::prefill_variant(spec, 16)).source.c_str(), stdout);
  return 0;
}

namespace {

int run_info() {
  const Info i = info();
  std::printf("ropejit %s\n", i.version.c_str());
  std::printf("nvrtc        %d.%d\n", i.nvrtc_major, i.nvrtc_minor);
  if (i.driver_version)
    std::printf("driver       CUDA %d.%d\n", i.driver_version / 1000,
                (i.driver_version % 1000) / 10);
  else
    std::printf("driver       none: %s\n", i.driver_status.c_str());
  for (const std::string& d : i.devices) std::printf("gpu          %s\n", d.c_str());
  std::printf("cache dir    %s (%s)\n",
              i.cache_dir.empty() ? "-" : detail::clipped_path(i.cache_dir).c_str(),
              i.cache_status.c_str());
  std::printf("cache files  %zu\n", i.cache_entries);
  const std::string tuning = autotune::default_tuning_path();
  std::printf("tuning file  %s\n",
              tuning.empty() ? "- (off)" : detail::clipped_path(tuning).c_str());
  // The options every compile passes (the target is each GPU's), then the user's.
  std::string options = "--gpu-architecture=<per GPU>";
  for (const std::string& o : detail::base_compile_options()) options += " " + o;
  std::printf("compile opts %s\n", options.c_str());
  try {
    std::string extra;
    for (const std::string& o : detail::user_compile_options())
      extra += (extra.empty() ? "" : " ") + o;
    std::printf("extra opts   %s\n",
                extra.empty() ? "- (ROPEJIT_NVRTC_FLAGS unset)"
                              : (detail::clipped(extra, 256) + " (ROPEJIT_NVRTC_FLAGS)").c_str());
  } catch (const Error& e) {
    std::printf("extra opts   refused, every compile fails: %s\n", e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ropejit: Rotary Position Embedding kernels generated at run time"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(kVersion));

  app.add_subcommand("info", "Library, NVRTC and driver versions, GPUs, kernel cache");

  CompileOptions co;
  co.archs.clear();
  CLI::App* compile =
      app.add_subcommand("compile", "Precompile keys into the disk cache (no GPU needed)");
  compile
      ->add_option(
          "--arch", co.archs,
          "Target architectures, e.g. sm_80,sm_90 (default sm_90, or the tuning file's GPU)")
      ->delimiter(',');
  compile->add_option("--preset", co.presets, "Model preset (repeatable)")->delimiter(',');
  compile->add_option("--hf-config", co.hf_configs,
                      "A model's Hugging Face config.json: its keys, like a preset (repeatable)");
  compile->add_option("--key", co.keys, "Explicit kernel key (repeatable)");
  compile->add_option("--dtype", co.dtype, "q/k dtype for presets: f32, f16, bf16");
  compile->add_option("-j,--jobs", co.jobs, "Compiler threads, 1..256 (default: all cores)")
      ->check(CLI::Range(1, 256));
  compile->add_option("--from-tuning", co.from_tuning,
                      "Precompile every kernel a tuning file names, and its keys' defaults");

  TuneOptions to;
  CLI::App* tune =
      app.add_subcommand("tune", "Time launch configurations on this GPU; write the tuning file");
  tune->add_option("--preset", to.presets, "Model preset (repeatable)")->delimiter(',');
  tune->add_option("--hf-config", to.hf_configs,
                   "A model's Hugging Face config.json, tuned like a preset (repeatable)");
  tune->add_option("--heads", to.heads, "Explicit shape: q heads[,k heads]")->delimiter(',');
  CLI::Option* key = tune->add_option(
      "--key", to.keys,
      "Kernel key(s) to tune with --heads, any axis (out of place, backward, table dtype, ...)");
  // The shape options build one key; --key gives it whole.
  tune->add_option("--head-dim", to.head_dim, "head_dim for --heads")->excludes(key);
  tune->add_option("--rotary-dim", to.rotary_dim, "rotary_dim for --heads (0: head_dim)")
      ->excludes(key);
  tune->add_option("--dtype", to.dtype, "q/k dtype: f32, f16, bf16 (also of presets)")
      ->excludes(key);
  tune->add_option("--layout", to.layout, "bshd, sbhd, bhsd, thd")->excludes(key);
  tune->add_option("--style", to.style, "neox, gptj")->excludes(key);
  tune->add_option("--positions", to.positions, "offset, seqoff, ids")->excludes(key);
  tune->add_option("--freqs", to.freqs, "tab, comp")->excludes(key);
  tune->add_option("--intermediate", to.intermediate,
                   "Intermediate size for FFN keys (--key ffnglu_... --hidden N)");
  tune->add_option("--hidden", to.hidden,
                   "Hidden size for projection keys (--key qkvproj_... --heads Q,KV): times the "
                   "fused kernel against RMSNorm -> cuBLASLt GEMM -> RoPE per token bucket, and "
                   "the fused kernel's launch variants where it competes");
  tune->add_option("--tokens", to.tokens, "Token counts to tune (bucketed to powers of two)")
      ->delimiter(',');
  tune->add_option("--out", to.out, "Tuning file (default: $ROPEJIT_TUNING_FILE or the cache dir)");
  tune->add_flag("--dry-run", to.dry_run, "List the candidates; needs no GPU");
  tune->add_option("--top", to.top, "Also print the N fastest candidates of each entry")
      ->check(CLI::Range(0, 1 << 20));

  std::string source_key, source_config, source_dtype = "bf16";
  CLI::App* source = app.add_subcommand("source", "Print the CUDA source rendered for a key");
  CLI::Option* source_key_opt = source->add_option("key", source_key, "Kernel key");
  source->add_option("--hf-config", source_config, "A model's config.json: its key")
      ->excludes(source_key_opt);
  source->add_option("--dtype", source_dtype, "q/k dtype with --hf-config: f32, f16, bf16");

  DemoOptions demo;
  CLI::App* demo_cmd =
      app.add_subcommand("demo", "JIT, run and check against float64, print times");
  CLI::Option* demo_preset = demo_cmd->add_option("--preset", demo.preset, "Model preset");
  demo_cmd->add_option("--hf-config", demo.hf_config, "A model's Hugging Face config.json")
      ->excludes(demo_preset);
  demo_cmd->add_option("--tokens", demo.tokens, "Tokens (batch 1)");
  demo_cmd->add_option("--dtype", demo.dtype, "q/k dtype: f32, f16, bf16");

  // A first word that names no command gets a message naming it, and every usage error exits 2.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "ropejit: unknown command '%s' (commands: %s; see --help)\n",
                   detail::clipped(argv[1]).c_str(), names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("info")) return run_info();
    if (app.got_subcommand(compile)) return run_compile(co);
    if (app.got_subcommand(tune)) return run_tune(to);
    if (app.got_subcommand(source)) return run_source(source_key, source_config, source_dtype);
    if (app.got_subcommand(demo_cmd)) return run_demo(demo);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}

}  // namespace ropejit::cli

int main(int argc, char** argv) { return ropejit::cli::main(argc, argv); }
