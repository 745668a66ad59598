// The FFN's gate/up half on the GPU: the fused kernel (projection kernel, GLU epilogue) and the
// unfused path (RMSNorm key -> cuBLASLt -> GLU key) against their float64 references
// (oracle/decode/ffn_workload.cpp) on fresh random inputs, the output poisoned, row gaps and the
// guard after it checked untouched; every variant, the automatic choice, a CUDA graph.
#include <doctest/doctest.h>

#include <string>

#include "api/engine.hpp"
#include "gpu_helpers.hpp"
#include "jit/decode/dequant.hpp"
#include "oracle/decode/ffn_workload.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

void expect_ok(oracle::FfnProblem& p, const std::string& what) {
  const oracle::CheckReport r = p.check();
  CHECK_MESSAGE(r.ok, what, ": ", r.mismatches, " of ", r.checked, " wrong; ", r.first_failure);
  CHECK_MESSAGE(r.checked > 0, what);
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("FFN gate/up: both paths, every dtype, norm and activation against float64") {
    testing::use_primary_context();
    const DType dtypes[] = {DType::bf16, DType::f16};
    const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus};
    const Activation acts[] = {Activation::silu, Activation::gelu_tanh};
    const int64_t tokens[] = {1, 5, 16, 40, 70, 3};
    int n = 0;
    for (const DType dt : dtypes)
      for (const Norm norm : norms)
        for (const Activation act : acts)
          for (const ProjPath path : {ProjPath::fused, ProjPath::unfused}) {
            ++n;
            FfnSpec s{dt, norm, act};
            // e4m3 weights in half the cases, on both paths (odd n fused, even n unfused: the
            // weight dequantized first).
            const bool w8 = (n / 2) % 2 == 0;
            if (w8) s.weights = Weights::e4m3;
            oracle::FfnSizes z;
            z.tokens = tokens[size_t(n) % 6];
            // 264: a partial last 32-element chunk (e4m3: 272, a partial 64-element one).
            z.hidden = n % 2 ? (w8 ? 272 : 264) : 512;
            z.intermediate = n % 3 == 0 ? 100 : 96;  // 100: the GLU kernel's one-element variant
            z.packed = n % 4 != 1;
            z.x_gap = n % 5 == 3 ? 16 : 0;
            z.weight_gap = n % 6 == 4 ? (w8 ? 16 : 8) : 0;
            z.out_gap = n % 7 == 2 ? 6 : 0;
            z.path = path;
            z.seed = uint64_t(3000 + n);
            oracle::FfnProblem p(s, z);
            p.upload();
            ffn_gate_up(s, p.args());
            expect_ok(p, s.key() + " " + to_string(path) + " tokens " + std::to_string(z.tokens) +
                             (z.packed ? " packed" : " separate"));
          }
  }

  TEST_CASE("FFN gate/up, e4m3 weights with row scales: every dtype, norm, activation") {
    testing::use_primary_context();
    const DType dtypes[] = {DType::bf16, DType::f16};
    const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus};
    const Activation acts[] = {Activation::silu, Activation::gelu_tanh};
    const int64_t tokens[] = {1, 5, 16, 40, 64, 3};
    int n = 0;
    for (const DType dt : dtypes)
      for (const Norm norm : norms)
        for (const Activation act : acts) {
          ++n;
          FfnSpec s{dt, norm, act};
          s.weights = Weights::e4m3;
          oracle::FfnSizes z;
          z.tokens = tokens[size_t(n) % 6];
          z.hidden = n % 2 ? 272 : 1024;  // 272: the last 64-element chunk is partial
          z.intermediate = n % 3 == 0 ? 100 : 96;
          z.packed = n % 4 != 1;
          z.x_gap = n % 5 == 3 ? 16 : 0;
          z.weight_gap = n % 6 == 4 ? 16 : 0;
          z.out_gap = n % 7 == 2 ? 6 : 0;
          z.path = ProjPath::fused;
          z.seed = uint64_t(4000 + n);
          oracle::FfnProblem p(s, z);
          p.upload();
          // The automatic choice: fused with e4m3 weights up to 64 tokens (proj_heuristic.cpp;
          // these cases have at most 64).
          FfnArgs automatic = p.args();
          automatic.path = ProjPath::automatic;
          CHECK(ffn_gate_up_path(s, automatic) == ProjPath::fused);
          ffn_gate_up(s, automatic);
          const std::string what = s.key() + " tokens " + std::to_string(z.tokens) +
                                   (z.packed ? " packed" : " separate");
          expect_ok(p, what);
          // A second variant of the same key.
          const FfnSpec c = s.canonical();
          const detail::FfnShape shape = detail::check_ffn_call(c, p.args());
          const int32_t tiles = detail::proj_token_tiles(z.tokens);
          const detail::ProjVariant other{tiles, 2 + n % 3, tiles <= 4 ? 1 + n % 2 : 1};
          p.upload();
          api::decode_engine().launch_ffn(c, p.args(), shape, &other);
          expect_ok(p, what + " " + other.name());
        }
  }

  TEST_CASE("FFN gate/up: every kernel variant (a Llama-3-8B row count, hidden 4096)" *
            doctest::test_suite("exhaustive")) {
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    // Thread-block clusters (sm_90+) split the hidden dimension: a cluster of 4 with each
    // block's split count of 4, every tile count and unroll.
    const int32_t max_cluster = device.cc >= 90 ? 4 : 1;
    const FfnSpec s;
    for (const int64_t tokens : {1, 16}) {
      oracle::FfnSizes z;
      z.tokens = tokens;
      z.hidden = 4096;
      z.intermediate = 1024;
      z.seed = uint64_t(tokens);
      oracle::FfnProblem p(s, z);
      p.upload();
      const FfnSpec c = s.canonical();
      const detail::FfnShape shape = detail::check_ffn_call(c, p.args());
      for (const int32_t tiles : {1, 2, 4, 8})
        for (const int32_t splits : {1, 2, 4, 8})
          for (const int32_t unroll : {1, 2, 4})
            for (int32_t cluster = 1; cluster <= max_cluster; cluster *= 4)
              for (const bool swap : {false, true})     // tokens as the 16-row operand
                for (const int32_t rows : {1, 2, 4}) {  // staged activations from 2
                  if (cluster > 1 && splits != 4) continue;
                  detail::ProjVariant v{tiles, splits, unroll};
                  v.cluster = cluster;
                  v.swap = swap;
                  v.rows = rows;
                  if (!detail::proj_variant_problem(v).empty()) continue;
                  p.upload();
                  api::decode_engine().launch_ffn(c, p.args(), shape, &v);
                  expect_ok(p, s.key() + " " + v.name() + " tokens " + std::to_string(tokens));
                }
    }
  }

  TEST_CASE("FFN gate/up: the automatic path, and a CUDA graph planned during the capture") {
    testing::use_primary_context();
    testing::ScopedEnv off("ROPEJIT_TUNING", "off");  // the heuristic: fused up to 16 tokens
    const FfnSpec s{DType::bf16, Norm::rms, Activation::silu};
    for (const int64_t tokens : {4, 16, 17, 90}) {
      oracle::FfnSizes z;
      z.tokens = tokens;
      z.hidden = 1040;  // a shape no other test plans
      z.intermediate = 136;
      z.path = ProjPath::automatic;
      z.seed = uint64_t(tokens);
      oracle::FfnProblem p(s, z);
      p.upload();
      const ProjPath want = tokens <= 16 ? ProjPath::fused : ProjPath::unfused;
      CHECK(ffn_gate_up_path(s, p.args()) == want);
      ffn_gate_up(s, p.args());
      expect_ok(p, "automatic, tokens " + std::to_string(tokens));
      CHECK_MESSAGE(p.matched() == want, tokens, " tokens");
      FfnArgs bare = p.args();
      bare.workspace = nullptr;
      bare.workspace_bytes = 0;
      p.upload();
      ffn_gate_up(s, bare);
      expect_ok(p, "automatic without workspace, tokens " + std::to_string(tokens));
      CHECK(p.matched() == ProjPath::fused);
    }
    // A new key warmed at one token, then captured at 64 (unfused: plan, GEMM algorithm and the
    // GLU launch made inside the capture), replayed.
    const FfnSpec g{DType::f16, Norm::rms_one_plus, Activation::gelu_tanh};
    oracle::FfnSizes z;
    z.tokens = 1;
    z.hidden = 520;
    z.intermediate = 88;
    z.path = ProjPath::automatic;
    oracle::FfnProblem warm(g, z);
    warm.upload();
    ffn_gate_up(g, warm.args());
    expect_ok(warm, "warm-up");
    z.tokens = 64;
    oracle::FfnProblem p(g, z);
    p.upload();
    const detail::Driver& d = detail::driver();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, 0), "cuStreamCreate");
    testing::capture_and_replay(
        stream, [&] { ffn_gate_up(g, p.args(stream)); }, 2);
    expect_ok(p, "graph replay at 64 tokens");
    CHECK(p.matched() == ProjPath::unfused);
    d.StreamDestroy(stream);
  }

  TEST_CASE("FFN gate/up, e4m3 weights on the unfused path: the weight dequantized in chunks") {
    // Rows of 16400 elements: 2040 dequantized rows per chunk of the workspace (64 MiB). Merged,
    // the 2560 gate and up rows take two chunks, the first ending inside the up half; separate,
    // each half is one chunk. Against float64 with the dequantization's roundings.
    testing::use_primary_context();
    REQUIRE(detail::dequant_chunk_rows(DType::bf16, 16400) == 2040);
    int n = 0;
    for (const DType dt : {DType::bf16, DType::f16})
      for (const bool packed : {true, false}) {
        ++n;
        FfnSpec s{dt, n % 2 ? Norm::rms : Norm::none,
                  n % 2 ? Activation::silu : Activation::gelu_tanh};
        s.weights = Weights::e4m3;
        oracle::FfnSizes z;
        z.tokens = 2 + n;
        z.hidden = 16400;
        z.intermediate = 1280;
        z.packed = packed;
        z.weight_gap = n == 4 ? 16 : 0;
        z.path = ProjPath::unfused;
        z.seed = uint64_t(4500 + n);
        oracle::FfnProblem p(s, z);
        p.upload();
        ffn_gate_up(s, p.args());
        expect_ok(p, s.key() + (packed ? " merged" : " separate"));
      }
  }

  TEST_CASE("ropejit tune --key ffnglu_...: the path per token bucket into the tuning file") {
    const std::string file = testing::temp_dir() + "/ffn_tuning.json";
    const std::string key = "ffnglu_bf16_nrms_silu";
    const testing::CommandResult r =
        testing::run_command(std::string(ROPEJIT_CLI_PATH) + " tune --key " + key +
                             " --hidden 512 --intermediate 256 --tokens 4,64 --out " + file);
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("[2/2] " + key + "  bucket 64: fused ") != std::string::npos);
    CHECK(r.output.find("| " + key + " | 4 | 512 | 512 |") != std::string::npos);
    CHECK(testing::read_file(file).find("\"ffnglu_bf16_nrms_silu\"") != std::string::npos);
    CHECK(r.output.find("bucket 4: fused m1") != std::string::npos);
    CHECK(r.output.find("variants; the heuristic's") != std::string::npos);
    CHECK(testing::read_file(file).find("\"variant\"") != std::string::npos);
  }
}
