// GPU tests of the tuner and the tuning policy.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "api/engine.hpp"
#include "autotune/candidates.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuner.hpp"
#include "autotune/tuning_cache.hpp"
#include "gpu_helpers.hpp"
#include "oracle/workload.hpp"
#include "test_util.hpp"

using namespace ropejit;
using ropejit::testing::ScopedEnv;

namespace {

using Run = ropejit::testing::CommandResult;
using ropejit::testing::run_command;

std::string temp_file(const char* name) { return ropejit::testing::temp_dir() + "/" + name; }

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("tuner: every candidate reproduces the default output bit for bit" *
            doctest::test_suite("exhaustive")) {
    testing::use_primary_context();
    // 4096 tokens: the persistent-grid candidates (grid-stride variants, "p") are among them.
    const std::pair<const char*, int64_t> cases[] = {
        {"rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip", 64},
        {"rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk_fwd_ip", 4096},
        {"rope_thd_f16_d80_r32_gptj_pos-offset_comp_qk_fwd_oop", 64},
        // q and k are this workload's only buffers, so they are uploaded last: before uploads
        // were awaited, 7 (H100) and 16 (H200) of its candidates here read inputs still in
        // flight and were rejected.
        {"rope_bshd_bf16_d128_r128_neox_pos-offset_comp_qk_fwd_ip", 256},
        // Fused keys: before each candidate the tuner restores, from its device-side copy, the
        // inputs an in-place candidate rotated and the cache every candidate appended to (a
        // restore that missed either would reject candidates here); at 4096 tokens the ring
        // launches with four rows too.
        {"rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-cpaged_fwd_ip", 256},
        {"rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-cpaged-e4m3dyn_"
         "fwd_oop",
         4096}};
    for (const auto& [key, tokens] : cases) {
      const autotune::TuneReport r = autotune::tune(parse_key(key), tokens, 32, 8);
      INFO(key, " at ", tokens, " tokens");
      CHECK(r.rejected == 0);
      CHECK(r.results.size() >= 10);
      size_t persistent = 0;
      for (const autotune::CandidateResult& res : r.results)
        persistent += res.config.kernel.grid_stride;
      CHECK((persistent > 0) == (tokens >= 4096));
      CHECK(r.best.median_us > 0);
      CHECK(r.best.median_us <= r.best.default_us);
      CHECK(r.copy_us > 0);
      MESSAGE(std::string(key), ": ", r.results.size(), " candidates, best ", r.best.config.name(),
              " ", r.best.median_us, " us, default ", r.best.default_us, " us");
    }
  }

  TEST_CASE("a second process uses the tuned entry without re-timing") {
    const std::string file = temp_file("tuning.json");
    const std::string env = "ROPEJIT_TUNING_FILE=" + file + " ";
    const Run tune = run_command(env + ROPEJIT_CLI_PATH +
                                 " tune --heads 32,8 --positions ids --freqs comp --tokens 64");
    INFO(tune.output);
    REQUIRE(tune.status == 0);
    CHECK(tune.output.find(
              "| rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk_fwd_ip | 64 | 32/8 |") !=
          std::string::npos);
    // Frozen mode turns a missing entry into an error, so a passing demo proves the entry was
    // found and used, and that nothing was tuned.
    const Run use = run_command(env + "ROPEJIT_TUNING=frozen " + ROPEJIT_CLI_PATH +
                                " demo --preset llama3-8b --tokens 64");
    INFO(use.output);
    CHECK(use.status == 0);
    CHECK(use.output.find("check vs float64: PASS") != std::string::npos);
    const Run miss = run_command(env + "ROPEJIT_TUNING=frozen " + ROPEJIT_CLI_PATH +
                                 " demo --preset llama3-8b --tokens 300");
    CHECK(miss.status != 0);
    CHECK(miss.output.find("no tuned configuration for") != std::string::npos);
  }

  TEST_CASE("autotune on first use and never during graph capture") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    const std::string file = temp_file("auto.json");
    ScopedEnv path("ROPEJIT_TUNING_FILE", file);  // read when the policy first loads its file
    ScopedEnv autotune("ROPEJIT_AUTOTUNE", "1");
    Spec s;
    s.head_dim = 64;
    s.freqs = Freqs::computed;
    s.in_place = false;
    oracle::Sizes z = testing::dense_sizes(1, 40, 16, 2);
    oracle::Workload w(s, z);
    w.upload();
    const size_t before = autotune::tunings_performed();
    apply(s, w.args());
    CHECK(autotune::tunings_performed() == before + 1);
    const oracle::CheckReport r = w.check();
    CHECK_MESSAGE(r.ok, r.first_failure);

    z.seq_len = 200;  // another bucket: a miss, but inside a capture it must not tune
    oracle::Workload w2(s, z);
    w2.upload();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    testing::capture_and_replay(stream, [&] { apply(s, w2.args(stream)); });
    CHECK(autotune::tunings_performed() == before + 1);
    const oracle::CheckReport r2 = w2.check();
    CHECK_MESSAGE(r2.ok, r2.first_failure);
    d.StreamDestroy(stream);
  }

  TEST_CASE("a key's first use loads the kernels the tuning file names for its other shapes") {
    // A server warms up on prefill, then captures decode into a graph. The decode bucket's
    // tuned kernel is another variant; it must already be loaded, since a capture cannot load
    // a module.
    const CUcontext ctx = testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    const std::string file = temp_file("variants.json");
    ScopedEnv path("ROPEJIT_TUNING_FILE", file);  // read when the policy first loads its file
    Spec s;
    s.positions = Positions::ids;
    s.in_place = false;  // replays are then idempotent
    const Spec c = s.canonical();
    const detail::DeviceInfo& dev = api::engine().device_info(ctx);
    detail::CallShape decode;
    decode.tokens = 50;
    decode.q_heads = 32;
    decode.k_heads = 8;
    // A kernel that only the tuning file names (not one of the heuristic's two).
    const std::vector<detail::KernelVariant> own = detail::default_variants(c, 16);
    std::optional<detail::LaunchConfig> other;
    for (const detail::LaunchConfig& cand : autotune::candidates(c, decode, dev))
      if (std::find(own.begin(), own.end(), cand.kernel) == own.end()) {
        other = cand;
        break;
      }
    REQUIRE(other.has_value());
    autotune::TuningCache cache;
    cache.set_fingerprint(autotune::current_fingerprint());
    autotune::TuningEntry e;
    e.key = c.key();
    e.bucket = detail::token_bucket(decode.tokens);
    e.q_heads = 32;
    e.k_heads = 8;
    e.config = *other;
    e.median_us = 1;
    e.default_us = 1;
    cache.put(e);
    cache.save(file);
    // The policy reads its tuning file once per process; ctest runs each case in its own.
    REQUIRE_MESSAGE(
        autotune::select_config(c, decode, dev, false) == *other,
        "the tuning file was read before this test wrote it: run this case in its own process");

    oracle::Sizes z = testing::dense_sizes(1, 4096, 32, 8);
    oracle::Workload prefill(s, z);
    prefill.upload();
    apply(s, prefill.args());  // the heuristic's kernel, and the tuned decode kernel with it
    const oracle::CheckReport r1 = prefill.check();
    CHECK_MESSAGE(r1.ok, r1.first_failure);
    const detail::EngineStats warm = api::engine().stats();

    z.seq_len = decode.tokens;
    oracle::Workload w(s, z);
    w.upload();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    REQUIRE(w.args(stream).seq_len == decode.tokens);  // the tuned entry's bucket
    testing::capture_and_replay(stream, [&] { CHECK_NOTHROW(apply(s, w.args(stream))); });
    const oracle::CheckReport r2 = w.check();
    CHECK_MESSAGE(r2.ok, r2.first_failure);
    CHECK(api::engine().planned(s, w.args(stream)).first == *other);
    const detail::EngineStats after = api::engine().stats();
    CHECK(after.module_loads == warm.module_loads);
    CHECK(after.nvrtc_compiles + after.disk_hits == warm.nvrtc_compiles + warm.disk_hits);
    d.StreamDestroy(stream);
  }

  TEST_CASE("ropejit tune --preset llama3-8b end to end" * doctest::test_suite("long")) {
    const std::string file = temp_file("llama.json");
    const Run r = run_command("ROPEJIT_TUNING_FILE=" + file + " " + ROPEJIT_CLI_PATH +
                              " tune --preset llama3-8b");
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("| key | bucket | heads | best config |") != std::string::npos);
    CHECK(r.output.find("tuned 40 entries") != std::string::npos);
    // Reported, not asserted: timings are benchmarks (the budget is one minute).
    MESSAGE("ropejit tune --preset llama3-8b took ", r.seconds, " s");
    const Run again = run_command("ROPEJIT_CACHE_DIR=" + file + ".cubins " + ROPEJIT_CLI_PATH +
                                  " compile --from-tuning " + file);
    INFO(again.output);
    CHECK(again.status == 0);
    CHECK(again.output.find("40 tuning entries for NVIDIA") != std::string::npos);
    CHECK(again.output.find(", 0 failed") != std::string::npos);
  }
}
