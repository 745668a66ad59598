// `ropejit tune` and `ropejit compile --from-tuning`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "api/engine.hpp"
#include "autotune/candidates.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuner.hpp"
#include "autotune/tuning_cache.hpp"
#include "cli/cli.hpp"
#include "cli/presets.hpp"
#include "jit/coverage.hpp"
#include "jit/decode/proj.hpp"
#include "jit/driver.hpp"
#include "jit/family.hpp"
#include "jit/names.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::cli {
namespace {

struct Job {
  Spec spec;
  int32_t q_heads, k_heads;
};

std::string heads_text(const std::vector<int32_t>& heads) {
  std::string out;
  for (int32_t h : heads) out += (out.empty() ? "" : ",") + std::to_string(h);
  return out;
}

// A model (preset or config.json) is tuned for what inference servers call per layer: its
// forward, in-place specs (bshd and thd, implicit positions and position ids, table and computed
// frequencies), those this build has kernels for.
std::vector<Job> jobs_for(const TuneOptions& o) {
  const DType dtype = detail::parse_name<DType>(o.dtype, "--dtype");
  std::vector<Job> jobs;
  std::vector<ModelRope> models;
  for (const std::string& name : o.presets) models.push_back(preset_model(find_preset(name)));
  for (const std::string& file : o.hf_configs) models.push_back(model_from_hf_config_file(file));
  for (const ModelRope& m : models) {
    // MLA's kernel has one variant; its grid follows the call's tokens and heads.
    for (const MlaSpec& s : model_mla_specs(m, dtype))
      std::printf(
          "%s  not tuned: one kernel, launched by the call's shape (ropejit compile "
          "builds it)\n",
          s.key().c_str());
    for (const Spec& s : model_specs(m, dtype)) {
      if (s.direction != Direction::forward || !s.in_place) continue;
      if (const std::string missing = detail::missing_kernel(s); !missing.empty()) {
        std::printf("%s  SKIPPED: %s has no kernel in this build yet\n", s.key().c_str(),
                    missing.c_str());
        continue;
      }
      jobs.push_back({s, m.q_heads, m.kv_heads});
    }
  }
  if (!o.keys.empty() && o.heads.empty()) detail::invalid("--key needs --heads Q[,K]");
  if (!o.heads.empty()) {
    constexpr int32_t kMaxHeads = 65536;  // what a tuning entry may hold
    if (o.heads.size() > 2 || o.heads[0] < 1 || o.heads[0] > kMaxHeads ||
        (o.heads.size() == 2 && (o.heads[1] < 0 || o.heads[1] > kMaxHeads)))
      detail::invalid("--heads (", heads_text(o.heads),
                      ") must be Q or Q,K with 1 <= Q <= ", kMaxHeads,
                      " and 0 <= K <= ", kMaxHeads);
    std::vector<Spec> specs;
    for (const std::string& key : o.keys) {
      try {
        specs.push_back(parse_key(key));
      } catch (const Error& e) {
        const std::string why = e.what();
        detail::invalid("--key: ", why.rfind("ropejit: ", 0) == 0 ? why.substr(9) : why);
      }
    }
    if (o.keys.empty()) {  // the shape options spell one key
      Spec s;
      s.layout = detail::parse_name<Layout>(o.layout, "--layout");
      s.dtype = dtype;
      s.head_dim = o.head_dim;
      s.rotary_dim = o.rotary_dim;
      s.style = detail::parse_name<Style>(o.style, "--style");
      s.positions = detail::parse_name<Positions>(o.positions, "--positions");
      s.freqs = detail::parse_name<Freqs>(o.freqs, "--freqs");
      specs.push_back(s);
    }
    for (const Spec& s : specs)
      jobs.push_back({s.canonical(), o.heads[0], o.heads.size() == 2 ? o.heads[1] : 0});
  }
  if (jobs.empty())
    detail::invalid(
        "tune needs --preset NAME, --hf-config FILE, or --heads Q,K with the shape options or "
        "--key KEY");
  return jobs;
}

std::vector<int64_t> buckets_for(const TuneOptions& o) {
  std::set<int64_t> b;
  for (int64_t t : o.tokens.empty() ? std::vector<int64_t>{1, 16, 64, 256, 4096} : o.tokens) {
    if (t < 1 || t > (int64_t(1) << 20)) detail::invalid("--tokens (", t, ") must be in [1, 2^20]");
    b.insert(detail::token_bucket(t));
  }
  return {b.begin(), b.end()};
}

// The `top` fastest eligible candidates, slowest last, relative to the best.
void print_top(const autotune::TuneReport& r, int32_t top) {
  std::vector<const autotune::CandidateResult*> ok;
  for (const autotune::CandidateResult& c : r.results)
    if (c.rejected.empty()) ok.push_back(&c);
  std::stable_sort(ok.begin(), ok.end(),
                   [](const auto* a, const auto* b) { return a->median_us < b->median_us; });
  for (size_t i = 0; i < ok.size() && i < size_t(top); ++i)
    std::printf("    %-24s %8.2f us  %5.1f%% of copy  %.3fx best\n", ok[i]->config.name().c_str(),
                ok[i]->median_us, 100.0 * r.copy_us / ok[i]->median_us,
                ok[i]->median_us / ok[0]->median_us);
}

// The `top` fastest of the fused variants a path tuner searched, slowest last.
void print_top(const autotune::ProjTuneReport& r, int32_t top) {
  std::vector<std::pair<detail::ProjVariant, double>> t = r.timed;
  std::stable_sort(t.begin(), t.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  for (size_t i = 0; i < t.size() && i < size_t(top); ++i)
    std::printf("    %-24s %8.2f us  %.3fx best\n", t[i].first.name().c_str(), t[i].second,
                t[i].second / t[0].second);
}

// The two path tuners' shared part: the token buckets, the dry run's lines, progress as each
// bucket is timed, the table, the tuning file.
int tune_paths(const TuneOptions& o, const char* what, const std::vector<std::string>& keys,
               const std::function<std::string(size_t, int64_t)>& dry_line,
               const std::function<autotune::ProjTuneReport(size_t, int64_t)>& tune_one) {
  std::set<int64_t> set;
  for (int64_t t : o.tokens.empty() ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                                           1024, 2048, 4096}
                                    : o.tokens) {
    if (t < 1 || t > 65536) detail::invalid("--tokens (", t, ") must be in [1, 65536]");
    set.insert(detail::proj_path_bucket(t));
  }
  const std::vector<int64_t> buckets(set.begin(), set.end());
  if (o.dry_run) {
    for (size_t i = 0; i < keys.size(); ++i)
      for (int64_t b : buckets) std::printf("%s\n", dry_line(i, b).c_str());
    return 0;
  }
  detail::use_primary_context(0);
  api::engine();  // installs the launch policy the unfused paths' steps ask
  const auto t0 = std::chrono::steady_clock::now();
  autotune::TuningCache cache;
  cache.set_fingerprint(autotune::current_fingerprint());
  std::vector<autotune::ProjTuneReport> rows;
  const size_t total = keys.size() * buckets.size();
  for (size_t i = 0; i < keys.size(); ++i)
    for (int64_t b : buckets) {
      const autotune::ProjTuneReport r = tune_one(i, b);
      cache.put(r.best);
      rows.push_back(r);
      const std::string unfused =
          r.unfused_us > 0 ? detail::concat(r.unfused_us, " us") : std::string("none");
      const std::string searched =
          r.candidates > 0 ? detail::concat(" (best of ", r.candidates,
                                            " variants; the heuristic's ", r.heuristic_us, " us)")
                           : std::string();
      std::printf("[%zu/%zu] %s  bucket %lld: fused %s %.2f us%s, unfused %s -> %s%s\n",
                  rows.size(), total, keys[i].c_str(), static_cast<long long>(b),
                  r.variant.name().c_str(), r.fused_us, searched.c_str(), unfused.c_str(),
                  to_string(r.best.path), r.checked ? "" : " (too large for the float64 check)");
      if (o.top > 0) print_top(r, o.top);
      std::fflush(stdout);
    }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "\n| key | tokens | hidden | columns | fused variant | fused us | unfused us | path |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const autotune::ProjTuneReport& r : rows)
    std::printf("| %s | %lld | %lld | %lld | %s%s | %.2f | %s | %s |\n", r.best.key.c_str(),
                static_cast<long long>(r.best.bucket), static_cast<long long>(r.best.hidden),
                static_cast<long long>(r.best.columns), r.variant.name().c_str(),
                r.candidates > 0 ? " (tuned)" : "", r.fused_us,
                r.unfused_us > 0 ? detail::concat(r.unfused_us).c_str() : "-",
                to_string(r.best.path));
  const std::string path = o.out.empty() ? autotune::default_tuning_path() : o.out;
  if (path.empty()) detail::invalid("no tuning file: set --out FILE or ROPEJIT_TUNING_FILE");
  cache.save(path);
  std::printf("\ntuned %zu %s entries in %.1f s; wrote/merged %s\n", rows.size(), what, seconds,
              detail::clipped_path(path).c_str());
  return 0;
}

// A --key argument of a family, parsed; the message names the option and why.
template <class Parse>
auto parse_family_key(const std::string& key, Parse parse, const char* alone) {
  try {
    return parse(key).canonical();
  } catch (const Error& e) {
    const std::string why = e.what();
    detail::invalid("--key: ", why.rfind("ropejit: ", 0) == 0 ? why.substr(9) : why, " (", alone,
                    ")");
  }
}

// A --dry-run line of the projection's or FFN's tuning at one bucket: the heuristic's variant,
// what it races, and the fused variants the tuner tries where the fused path competes, for a
// typical sm_90 part (clusters need one).
std::string fused_dry_line(const std::string& head, const detail::ProjVariant& heuristic,
                           bool fp8_weights) {
  detail::DeviceInfo h100;
  h100.cc = 90;
  h100.sm_count = 132;
  const std::vector<detail::ProjVariant> all =
      autotune::proj_fused_candidates(heuristic, fp8_weights, h100);
  std::string line =
      detail::concat(head, ": fused (", heuristic.name(), ") vs unfused",
                     fp8_weights ? " (e4m3 weights dequantized)" : "", "; ", all.size(),
                     " fused variants where the fused path competes (sm_90):\n   ");
  for (const detail::ProjVariant& v : all) line += " " + v.name();
  return line;
}

// `ropejit tune --key qkvproj_... --heads Q,KV --hidden N`: the projection's path per token
// bucket (fused kernel or RMSNorm -> cuBLASLt GEMM -> RoPE) and the fused kernel's variant,
// written to the tuning file.
int run_tune_proj(const TuneOptions& o) {
  std::vector<QkvProjSpec> specs;
  std::vector<std::string> keys;
  for (const std::string& key : o.keys) {
    specs.push_back(parse_family_key(key, parse_qkv_proj_key,
                                     "projection keys are tuned alone, not with RoPE keys"));
    keys.push_back(specs.back().key());
    if (const std::string why = detail::proj_fused_problem(specs.back()); !why.empty())
      detail::invalid("--key ", keys.back(), " has one path, nothing to tune: ", why);
  }
  if (o.heads.size() != 2 || o.heads[0] < 1 || o.heads[1] < 1 || o.heads[0] > 65536 ||
      o.heads[1] > 65536)
    detail::invalid("--heads (", heads_text(o.heads),
                    ") must be Q,KV (1..65536 each) for a projection key");
  if (o.hidden < 8 || o.hidden % 8 != 0 || o.hidden > (int64_t(1) << 24))
    detail::invalid("--hidden (", o.hidden,
                    ") must be a multiple of 8 in [8, 2^24] for a projection key");
  return tune_paths(
      o, "projection", keys,
      [&](size_t i, int64_t b) {
        const int64_t pairs = int64_t(o.heads[0] + 2 * o.heads[1]) * specs[i].head_dim / 2;
        const detail::ProjShape shape{b, o.hidden, o.heads[0], o.heads[1], pairs};
        return fused_dry_line(detail::concat(keys[i], "  bucket ", b, "  hidden ", o.hidden,
                                             "  heads ", o.heads[0], "/", o.heads[1]),
                              autotune::proj_heuristic(specs[i], shape, {}),
                              specs[i].weights == Weights::e4m3);
      },
      [&](size_t i, int64_t b) {
        return autotune::tune_proj(specs[i], b, o.hidden, o.heads[0], o.heads[1]);
      });
}

// `ropejit tune --key ffnglu_... --hidden N --intermediate I`: the FFN gate/up's path per token
// bucket, written to the tuning file.
int run_tune_ffn(const TuneOptions& o) {
  std::vector<FfnSpec> specs;
  std::vector<std::string> keys;
  for (const std::string& key : o.keys) {
    specs.push_back(parse_family_key(key, parse_ffn_key, "FFN keys are tuned alone"));
    keys.push_back(specs.back().key());
  }
  if (o.hidden < 8 || o.hidden % 8 != 0 || o.hidden > (int64_t(1) << 24))
    detail::invalid("--hidden (", o.hidden,
                    ") must be a multiple of 8 in [8, 2^24] for an FFN key");
  if (o.intermediate < 1 || o.intermediate > (int64_t(1) << 24))
    detail::invalid("--intermediate (", o.intermediate, ") must be in [1, 2^24] for an FFN key");
  if (!o.heads.empty()) detail::invalid("--heads is not used by FFN keys");
  return tune_paths(
      o, "FFN", keys,
      [&](size_t i, int64_t b) {
        const detail::ProjShape shape{b, o.hidden, 0, 0, o.intermediate};
        return fused_dry_line(detail::concat(keys[i], "  bucket ", b, "  hidden ", o.hidden,
                                             "  intermediate ", o.intermediate),
                              autotune::ffn_heuristic(specs[i], shape, {}),
                              specs[i].weights == Weights::e4m3);
      },
      [&](size_t i, int64_t b) {
        return autotune::tune_ffn(specs[i], b, o.hidden, o.intermediate);
      });
}

}  // namespace

int run_tune(const TuneOptions& o) {
  const bool ffn = std::any_of(o.keys.begin(), o.keys.end(), [](const std::string& k) {
    return detail::family_of(k) == detail::Family::ffn_gate_up;
  });
  if (ffn) {
    if (!o.presets.empty() || !o.hf_configs.empty())
      detail::invalid("FFN keys are tuned alone: drop --preset/--hf-config");
    return run_tune_ffn(o);
  }
  if (o.intermediate != 0)
    detail::invalid("--intermediate (", o.intermediate, ") is for FFN keys only");
  const bool proj = std::any_of(o.keys.begin(), o.keys.end(), [](const std::string& k) {
    return detail::family_of(k) == detail::Family::qkv_projection;
  });
  if (proj) {
    if (!o.presets.empty() || !o.hf_configs.empty())
      detail::invalid("projection keys are tuned alone: drop --preset/--hf-config");
    return run_tune_proj(o);
  }
  if (o.hidden != 0) detail::invalid("--hidden (", o.hidden, ") is for projection keys only");
  const std::vector<Job> jobs = jobs_for(o);
  const std::vector<int64_t> buckets = buckets_for(o);
  if (o.dry_run) {
    detail::DeviceInfo h100;  // a typical sm_90 part; legality rules are per device
    h100.cc = 90;
    h100.sm_count = 132;
    h100.memory_gbps = 3352;                 // H100 SXM: the heuristic's one-pass prefill
    h100.max_shared_per_block = 227 * 1024;  // sm_90's opt-in maximum (ring launches)
    for (const Job& j : jobs)
      for (int64_t b : buckets) {
        detail::CallShape shape;
        shape.tokens = b;
        shape.q_heads = j.q_heads;
        shape.k_heads = j.k_heads;
        shape.v_heads = j.spec.cache != KvCache::none ? j.k_heads : 0;  // v goes with k
        const auto cands = autotune::candidates(j.spec, shape, h100);
        std::printf("%s  bucket %lld  heads %d/%d: %zu candidates\n", j.spec.key().c_str(),
                    static_cast<long long>(b), j.q_heads, j.k_heads, cands.size());
        for (const detail::LaunchConfig& c : cands) std::printf("    %s\n", c.name().c_str());
      }
    return 0;
  }
  detail::use_primary_context(0);
  const auto t0 = std::chrono::steady_clock::now();
  autotune::TuningCache cache;
  cache.set_fingerprint(autotune::current_fingerprint());
  struct Row {
    autotune::TuningEntry e;
    double copy_us;
  };
  std::vector<Row> rows;
  const size_t total = jobs.size() * buckets.size();
  for (const Job& j : jobs)
    for (int64_t b : buckets) {
      // Progress on stderr (stdout keeps the results): a prefill bucket of a fused key races
      // hundreds of launches, each checked bit for bit against the default's output.
      const std::string where = detail::concat("[", rows.size() + 1, "/", total, "] bucket ", b);
      const autotune::TuneReport r =
          autotune::tune(j.spec, b, j.q_heads, j.k_heads, [&](const autotune::TuneProgress& p) {
            if (p.done == 0)
              std::fprintf(stderr, "%s: %zu kernel variants ready in %.1f s; timing %zu launches\n",
                           where.c_str(), p.variants, p.compile_s, p.total);
            else if (p.best.empty())
              std::fprintf(stderr, "%s: %zu/%zu launches checked (%.0f s), none eligible yet\n",
                           where.c_str(), p.done, p.total, p.elapsed_s);
            else
              std::fprintf(stderr,
                           "%s: %zu/%zu launches timed (%.0f s), fastest so far %s %.2f us\n",
                           where.c_str(), p.done, p.total, p.elapsed_s, p.best.c_str(), p.best_us);
          });
      cache.put(r.best);
      rows.push_back({r.best, r.copy_us});
      std::printf(
          "[%zu/%zu] %s  bucket %lld: %s %.2f us (default %.2f us), %zu candidates, %d rejected\n",
          rows.size(), total, j.spec.key().c_str(), static_cast<long long>(b),
          r.best.config.name().c_str(), r.best.median_us, r.best.default_us, r.results.size(),
          r.rejected);
      print_top(r, o.top);
      std::fflush(stdout);
    }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "\n| key | bucket | heads | best config | us | GB/s | %% of copy | speedup vs default |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %d/%d | %s | %.2f | %.0f | %.0f%% | %.2fx |\n", r.e.key.c_str(),
                static_cast<long long>(r.e.bucket), r.e.q_heads, r.e.k_heads,
                r.e.config.name().c_str(), r.e.median_us, r.e.gbps,
                100.0 * r.copy_us / r.e.median_us, r.e.default_us / r.e.median_us);
  const std::string path = o.out.empty() ? autotune::default_tuning_path() : o.out;
  if (path.empty()) detail::invalid("no tuning file: set --out FILE or ROPEJIT_TUNING_FILE");
  cache.save(path);
  std::printf("\ntuned %zu entries in %.1f s; wrote/merged %s\n", rows.size(), seconds,
              detail::clipped_path(path).c_str());
  return 0;
}

}  // namespace ropejit::cli
