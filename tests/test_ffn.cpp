// The FFN's gate/up half on the CPU: spec validation and golden keys, call checks naming each
// bad argument, the unfused path's workspace, NVRTC compilation of the fused kernel (the
// projection kernel with its GLU epilogue) and of the GLU kernel for sm_80 and sm_90, and the
// float64 references' tolerances.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "jit/decode/ffn.hpp"
#include "jit/nvrtc.hpp"
#include "oracle/decode/ffn_workload.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

using testing::contains;
using testing::error_of;

// A valid call on made-up device addresses (nothing is dereferenced when checking).
struct Fake {
  FfnSpec spec;
  FfnArgs args;
  Fake() {
    args.tokens = 4;
    args.hidden = 256;
    args.intermediate = 96;
    args.x = reinterpret_cast<void*>(0x10000000);
    args.gate_weight = reinterpret_cast<void*>(0x20000000);
    args.up_weight = reinterpret_cast<void*>(0x20000000 + 96 * 256 * 2);
    args.norm_weight = reinterpret_cast<void*>(0x30000000);
    args.out = reinterpret_cast<void*>(0x40000000);
  }
  std::string check() const {
    return error_of([&] { detail::check_ffn_call(spec.canonical(), args); });
  }
};

}  // namespace

TEST_CASE("FFN spec: validation, golden keys, round trip") {
  FfnSpec s;
  CHECK(s.key() == "ffnglu_bf16_nrms_silu");
  s.dtype = DType::f16;
  s.norm = Norm::rms_one_plus;
  s.act = Activation::gelu_tanh;
  CHECK(s.key() == "ffnglu_f16_nrms1p_gelutanh");
  CHECK(parse_ffn_key(s.key()) == s);
  s.norm = Norm::none;
  CHECK(parse_ffn_key(s.key()) == s);
  s.weights = Weights::e4m3;
  CHECK(s.key() == "ffnglu_f16_nnone_gelutanh_we4m3");
  CHECK(parse_ffn_key(s.key()) == s);
  s.weights = Weights(3);
  CHECK(contains(error_of([&] { s.validate(); }), "spec.weights (3)"));
  s = FfnSpec{};
  s.dtype = DType::f32;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.dtype (f32)"));
  s = FfnSpec{};
  s.norm = Norm::rms_all_heads;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.norm (rmsall)"));
  s = FfnSpec{};
  s.act = Activation(5);
  CHECK(contains(error_of([&] { s.validate(); }), "spec.act (5) is not a known value"));
  for (const char* bad :
       {"ffnglu_bf16_nrms", "ffnglu_bf16_rms_silu", "ffnglu_f32_nrms_silu", "ffnglu_bf16_nrms_relu",
        "qkvproj_bf16_nrms_silu", "ffnglu_bf16_nrms_silu_wsame", "ffnglu_bf16_nrms_silu_e4m3",
        "ffnglu_bf16_nrms_silu_we4m3_x"})
    CHECK_MESSAGE(!error_of([&] { parse_ffn_key(bad); }).empty(), bad);
  CHECK(std::string(to_string(Activation::gelu_tanh)) == "gelutanh");
}

TEST_CASE("FFN calls: every bad argument is named, a good one passes") {
  CHECK(Fake{}.check().empty());
  struct Bad {
    const char* expect;
    std::function<void(Fake&)> edit;
  };
  const std::vector<Bad> cases = {
      {"args.tokens (-1)", [](Fake& f) { f.args.tokens = -1; }},
      {"args.hidden (12)", [](Fake& f) { f.args.hidden = 12; }},
      {"args.intermediate (0)", [](Fake& f) { f.args.intermediate = 0; }},
      {"args.x is null", [](Fake& f) { f.args.x = nullptr; }},
      {"args.gate_weight (0x20000008) is not 16-byte aligned",
       [](Fake& f) { f.args.gate_weight = reinterpret_cast<void*>(0x20000008); }},
      {"args.up_weight is null", [](Fake& f) { f.args.up_weight = nullptr; }},
      {"args.weight_stride (128) is smaller than a row",
       [](Fake& f) { f.args.weight_stride = 128; }},
      {"args.norm_weight is null but spec.norm is rms",
       [](Fake& f) { f.args.norm_weight = nullptr; }},
      {"args.norm_eps (-1)", [](Fake& f) { f.args.norm_eps = -1; }},
      {"args.out is null", [](Fake& f) { f.args.out = nullptr; }},
      {"args.out (0x40000001) is not aligned",
       [](Fake& f) { f.args.out = reinterpret_cast<void*>(0x40000001); }},
      {"args.out_stride (90) is smaller than a row", [](Fake& f) { f.args.out_stride = 90; }},
      {"args.out and args.x overlap", [](Fake& f) { f.args.out = const_cast<void*>(f.args.x); }},
      {"args.out and args.up_weight overlap",
       [](Fake& f) { f.args.out = static_cast<char*>(const_cast<void*>(f.args.up_weight)) + 64; }},
      {"args.path (3) is not a known value", [](Fake& f) { f.args.path = ProjPath(3); }},
      {"args.workspace is null; the unfused path needs",
       [](Fake& f) { f.args.path = ProjPath::unfused; }},
      {"args.workspace_bytes (100) is smaller than the",
       [](Fake& f) {
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = 100;
       }},
      {"args.workspace (0x80000040) is not 256-byte aligned",
       [](Fake& f) {
         f.args.workspace = reinterpret_cast<void*>(0x80000040);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"args.workspace and args.out overlap",
       [](Fake& f) {
         f.args.workspace = reinterpret_cast<void*>(0x3ff00000);
         f.args.workspace_bytes = size_t(2) << 20;
       }},
  };
  for (const Bad& b : cases) {
    Fake f;
    b.edit(f);
    const std::string why = f.check();
    CHECK_MESSAGE(contains(why, b.expect), std::string(b.expect), " -> '", why, "'");
  }
  // e4m3 weights: one byte per element, a scale per row of each; the unfused path dequantizes
  // them into its workspace.
  auto fp8 = [](Fake& f) {
    f.spec.weights = Weights::e4m3;
    f.args.up_weight = reinterpret_cast<void*>(0x20000000 + 96 * 256);
    f.args.gate_scale = reinterpret_cast<const float*>(0x50000000);
    f.args.up_scale = f.args.gate_scale + 96;
  };
  const std::vector<Bad> fp8_cases = {
      {"args.hidden (264) must be a multiple of 16", [](Fake& f) { f.args.hidden = 264; }},
      {"args.gate_scale is null but spec.weights is e4m3",
       [](Fake& f) { f.args.gate_scale = nullptr; }},
      {"args.up_scale (0x50000182) is not aligned to its 4-byte floats",
       [](Fake& f) { f.args.up_scale = reinterpret_cast<const float*>(0x50000182); }},
      {"args.out and args.up_scale overlap",
       [](Fake& f) { f.args.out = const_cast<float*>(f.args.up_scale) + 8; }},
      {"args.workspace is null; the unfused path needs",
       [](Fake& f) { f.args.path = ProjPath::unfused; }},
      {"args.workspace_bytes (33558528) is smaller than the",
       [](Fake& f) {
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         // enough for 16-bit weights, not for the 98304 bytes of dequantized rows besides
         f.args.workspace_bytes = (size_t(32) << 20) + 4096;
       }},
  };
  {
    Fake f;
    fp8(f);
    CHECK(f.check().empty());
  }
  for (const Bad& b : fp8_cases) {
    Fake f;
    fp8(f);
    b.edit(f);
    const std::string why = f.check();
    CHECK_MESSAGE(contains(why, b.expect), std::string(b.expect), " -> '", why, "'");
  }
  {
    Fake f;
    fp8(f);
    f.args.path = ProjPath::unfused;
    f.args.workspace = reinterpret_cast<void*>(0x80000000);
    f.args.workspace_bytes = ffn_gate_up_workspace_bytes(f.spec, f.args);
    CHECK(f.check().empty());
    CHECK(ffn_gate_up_path(f.spec, f.args) == ProjPath::unfused);
  }
  Fake f;
  f.spec.norm = Norm::none;
  f.args.norm_weight = nullptr;
  CHECK(f.check().empty());
  f = Fake{};
  f.args.tokens = 0;
  CHECK(f.check().empty());
  f = Fake{};
  f.args.path = ProjPath::unfused;
  f.args.workspace = reinterpret_cast<void*>(0x80000000);
  f.args.workspace_bytes = ffn_gate_up_workspace_bytes(f.spec, f.args);
  CHECK(f.check().empty());
  // The path query does not look at the workspace, and needs no GPU for a forced path.
  f.args.workspace = nullptr;
  f.args.workspace_bytes = 0;
  CHECK(ffn_gate_up_path(f.spec, f.args) == ProjPath::unfused);
  // Checked before the driver is touched.
  f.args.hidden = 12;
  CHECK(contains(error_of([&] { ffn_gate_up(f.spec, f.args); }), "args.hidden (12)"));
}

TEST_CASE("FFN heuristic: four warps at one token tile, staged row groups at two (16-bit)") {
  detail::DeviceInfo h100;
  h100.cc = 90;
  h100.sm_count = 132;
  h100.memory_gbps = 3352.3;
  const FfnSpec bf16 = FfnSpec{}.canonical();
  FfnSpec fp8 = bf16;
  fp8.weights = Weights::e4m3;
  auto pick = [&](const FfnSpec& s, int64_t tokens) {
    return autotune::ffn_heuristic(s, detail::ProjShape{tokens, 4096, 0, 0, 14336}, h100).name();
  };
  CHECK(pick(bf16, 1) == "m1s4u2");
  CHECK(pick(bf16, 9) == "m2s2u4tr2");  // two row groups sharing staged activations
  CHECK(pick(bf16, 16) == "m2s2u4tr2");
  // From 30 GB/s of DRAM per SM (the H200's 37), four groups of one warp; unknown bandwidth
  // (0: MIG, or no attribute) takes the H100's choice.
  detail::DeviceInfo h200 = h100;
  h200.memory_gbps = 4916.7;
  detail::DeviceInfo unknown = h100;
  unknown.memory_gbps = 0;
  const detail::ProjShape sixteen{16, 4096, 0, 0, 14336};
  CHECK(autotune::ffn_heuristic(bf16, sixteen, h200).name() == "m2s1u4r4");
  CHECK(autotune::ffn_heuristic(bf16, sixteen, unknown).name() == "m2s2u4tr2");
  CHECK(autotune::ffn_heuristic(fp8, sixteen, h200).name() == "m2s2u2w");  // e4m3: as before
  CHECK(autotune::ffn_heuristic_variants(bf16, h200)[1].name() == "m2s1u4r4");
  CHECK(pick(bf16, 32) == "m4s8u1t");
  CHECK(pick(bf16, 64) == "m8s4u1t");
  CHECK(pick(fp8, 1) == "m1s8u2");
  CHECK(pick(fp8, 16) == "m2s2u2w");  // e4m3 codes in 64-element chunks
  CHECK(pick(fp8, 32) == "m4s4u1w");
  CHECK(pick(fp8, 64) == "m4s2u1w");  // four tiles per block from 33 tokens, two rows at 64
  // The prepared set holds each tile count's choice, all legal.
  for (const FfnSpec& s : {bf16, fp8}) {
    const std::vector<detail::ProjVariant> all = autotune::ffn_heuristic_variants(s, h100);
    REQUIRE(all.size() == 4);
    for (const detail::ProjVariant& v : all)
      CHECK_MESSAGE(detail::proj_variant_problem(v, s.weights == Weights::e4m3).empty(), v.name());
    CHECK(all[0].name() == pick(s, 1));
  }
}

TEST_CASE("FFN: the unfused path's workspace size") {
  Fake f;
  // 4 x 256 bf16 normalized (2048 bytes) + 4 x 192 bf16 products (1536 -> 1536) + 32 MiB.
  CHECK(ffn_gate_up_workspace_bytes(f.spec, f.args) == 2048 + 1536 + (size_t(32) << 20));
  f.spec.norm = Norm::none;
  f.args.tokens = 1;  // 384 product bytes, rounded up to 512
  CHECK(ffn_gate_up_workspace_bytes(f.spec, f.args) == 512 + (size_t(32) << 20));
  f.args.intermediate = 0;
  CHECK(contains(error_of([&] { ffn_gate_up_workspace_bytes(f.spec, f.args); }),
                 "args.intermediate (0)"));
  // e4m3 weights: also a chunk of dequantized rows, here the whole merged weight (2 x 96 rows of
  // 256: 98304 bytes).
  f = Fake{};
  f.spec.weights = Weights::e4m3;
  CHECK(ffn_gate_up_workspace_bytes(f.spec, f.args) ==
        2048 + 1536 + 2 * 96 * 256 * 2 + (size_t(32) << 20));
}

TEST_CASE("FFN: a workspace size past size_t is refused, naming the counts") {
  Fake f;
  // 2^40 tokens x 2^24 bf16 elements is 2^65 bytes: it used to wrap to a small size, no error.
  f.args.tokens = int64_t(1) << 40;
  f.args.hidden = int64_t(1) << 24;
  CHECK(contains(error_of([&] { ffn_gate_up_workspace_bytes(f.spec, f.args); }),
                 "args.tokens (1099511627776) x args.hidden (16777216) x 2 bytes (the normalized "
                 "activation) overflows size_t"));
  f.spec.norm = Norm::none;  // the products alone: 2^40 x 2 x 2^24 x 2 bytes
  f.args.intermediate = int64_t(1) << 24;
  CHECK(contains(error_of([&] { ffn_gate_up_workspace_bytes(f.spec, f.args); }),
                 "args.tokens (1099511627776) x 2 x args.intermediate (16777216) x 2 bytes (the "
                 "gate/up products) overflows size_t"));
  // Each part fits, their sum with cuBLASLt's scratch does not.
  f.args.hidden = 8;
  f.args.intermediate = 2;
  f.args.tokens = int64_t((SIZE_MAX - 255) / 8);
  CHECK(contains(error_of([&] { ffn_gate_up_workspace_bytes(f.spec, f.args); }),
                 "the unfused path's workspace for args.tokens (" + std::to_string(f.args.tokens) +
                     "), args.hidden (8) and args.intermediate (2) overflows size_t"));
}

TEST_CASE("FFN keys compile for sm_80 and sm_90 (fused variants and the GLU kernels)") {
  const FfnSpec specs[] = {FfnSpec{},
                           FfnSpec{DType::f16, Norm::rms_one_plus, Activation::gelu_tanh},
                           FfnSpec{DType::bf16, Norm::none, Activation::gelu_tanh},
                           FfnSpec{DType::bf16, Norm::rms, Activation::silu, Weights::e4m3},
                           FfnSpec{DType::f16, Norm::none, Activation::gelu_tanh, Weights::e4m3}};
  for (const FfnSpec& s : specs)
    for (const char* arch : {"sm_80", "sm_90"}) {
      std::vector<std::string> paths;
      CHECK_NOTHROW(paths = precompile(s, arch));
      // The fused variants, the unfused path's two GLU kernels, and with e4m3 weights its
      // dequantization kernel.
      CHECK_MESSAGE(paths.size() == (s.weights == Weights::e4m3 ? 7u : 6u), s.key(), " ", arch);
      if (api::engine().disk().enabled())
        for (const std::string& path : paths) CHECK_MESSAGE(!path.empty(), s.key(), " ", arch);
    }
  const std::string source = detail::render(FfnSpec{}, detail::ProjVariant{1, 8, 1}).source;
  CHECK(contains(source, "kGlu = true"));
  CHECK(contains(source, "kAct = 0,"));
  CHECK(contains(detail::render_glu(FfnSpec{}, detail::GluVariant{8}).source, "kVec = 8"));
  CHECK(contains(error_of([&] { precompile(FfnSpec{}, "sm_75"); }), "needs sm_80 or newer"));
}

TEST_CASE("FFN references: tolerances stay within a few roundings of the output") {
  // A tolerance far above the output's rounding would let a wrong kernel pass.
  for (const ProjPath path : {ProjPath::fused, ProjPath::unfused})
    for (const Activation act : {Activation::silu, Activation::gelu_tanh}) {
      FfnSpec s;
      s.act = act;
      oracle::FfnSizes z;
      z.tokens = 2;
      z.hidden = 512;
      z.intermediate = 64;
      z.path = path;
      oracle::FfnProblem p(s, z);
      const auto& e = p.expected(path);
      REQUIRE(e.value.size() == 128);
      double typical = 0, scale = 0;
      for (const double v : e.value) scale += v * v;
      scale = std::sqrt(scale / double(e.value.size()));
      for (size_t i = 0; i < e.value.size(); ++i)
        typical += e.tol[i] / std::max(std::fabs(e.value[i]), 0.1 * scale);
      typical /= double(e.value.size());
      // bf16's own rounding is 0.0039; the unfused path rounds the products once more.
      CHECK_MESSAGE(typical < (path == ProjPath::fused ? 0.02 : 0.05), to_string(path), " ",
                    to_string(act), " ", typical);
      CHECK(
          p.expected(path == ProjPath::fused ? ProjPath::unfused : ProjPath::fused).value.empty());
    }
}
