// The decode block's QKV projection on the GPU: RMSNorm -> QKV GEMM -> RoPE against the float64
// reference (oracle/decode/proj_workload.cpp) on fresh random inputs, outputs poisoned, guard
// bytes after every output and gaps between heads checked untouched; every variant, every axis.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuner.hpp"
#include "autotune/tuning_cache.hpp"
#include "gpu_helpers.hpp"
#include "jit/decode/dequant.hpp"
#include "jit/errors.hpp"
#include "oracle/decode/ffn_workload.hpp"
#include "oracle/decode/norm_workload.hpp"
#include "oracle/decode/proj_workload.hpp"
#include "oracle/numbers.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

void expect_ok(oracle::ProjProblem& p, const std::string& what) {
  const oracle::CheckReport r = p.check();
  CHECK_MESSAGE(r.ok, what, ": ", r.mismatches, " of ", r.checked, " wrong; ", r.first_failure);
  CHECK_MESSAGE(r.checked > 0, what);
}

QkvProjSpec spec_of(DType dtype, int32_t d, int32_t r, Style style, Positions pos, Freqs freqs,
                    Norm norm) {
  QkvProjSpec s;
  s.dtype = dtype;
  s.head_dim = d;
  s.rotary_dim = r;
  s.style = style;
  s.positions = pos;
  s.freqs = freqs;
  s.norm = norm;
  return s;
}

// The n-th case of a covering matrix over head size, dtype and norm: style, positions,
// frequencies, head counts, output packing and the gaps vary with n. The caller sets hidden,
// the weight gap, the path and the seed.
struct MatrixCase {
  QkvProjSpec spec;
  oracle::ProjSizes sizes;
};
template <size_t N>
MatrixCase matrix_case(int n, const int32_t (&d)[2], DType dt, Norm norm,
                       const int64_t (&tokens)[N]) {
  const Style style = n % 2 ? Style::gptj : Style::neox;
  const Positions pos = (n / 2) % 2 ? Positions::offset : Positions::ids;
  const Freqs fr = (n / 3) % 2 ? Freqs::computed : Freqs::table;
  MatrixCase m{spec_of(dt, d[0], d[1], style, pos, fr, norm), {}};
  oracle::ProjSizes& z = m.sizes;
  z.tokens = tokens[size_t(n) % N];
  z.q_heads = 3 + n % 3;
  z.kv_heads = 1 + n % 2;
  z.packed_out = n % 3 != 1;  // one tensor (one GEMM unfused), or one per output
  z.x_gap = n % 5 == 3 ? 16 : 0;
  z.position_offset = pos == Positions::offset ? 17 * n : 0;
  z.bad_positions = pos == Positions::ids && fr == Freqs::table ? 2 : 0;
  return m;
}

// The library's call (and, when `fused_only`, the check that it takes the fused path), then
// another split of the hidden dimension and unroll of the same key on the same problem, and the
// same with staged activations (4 or 2 row groups, where legal), each checked against float64.
void check_call_and_variant(oracle::ProjProblem& p, const QkvProjSpec& s, int32_t splits,
                            int32_t unroll, bool fused_only, const std::string& what) {
  p.upload();
  if (fused_only) CHECK(qkv_projection_path(s, p.args()) == ProjPath::fused);
  qkv_projection(s, p.args());
  expect_ok(p, what);
  const QkvProjSpec c = s.canonical();
  const detail::ProjShape shape = detail::check_proj_call(c, p.args());
  const int32_t tiles = detail::proj_token_tiles(p.sizes().tokens);
  const detail::ProjVariant other{tiles, splits, tiles <= 4 ? unroll : 1};
  p.upload();
  api::decode_engine().launch_proj(c, p.args(), shape, &other);
  expect_ok(p, what + " " + other.name());
  const bool fp8 = s.weights == Weights::e4m3;
  for (const int32_t rows : {4, 2}) {
    detail::ProjVariant staged{tiles, splits, tiles <= 2 ? 2 : 1};
    staged.rows = rows;
    staged.swap = !fp8 && tiles >= 2 && splits % 2 == 0;
    if (!detail::proj_variant_problem(staged, fp8).empty()) continue;
    p.upload();
    api::decode_engine().launch_proj(c, p.args(), shape, &staged);
    expect_ok(p, what + " " + staged.name());
    break;
  }
}

// The key's first use outside a capture (`warm_tokens` of the same shape, another seed), then a
// call of `z` captured in a CUDA graph and replayed twice, each checked against float64. Returns
// the path the replay's result matched.
ProjPath warm_then_capture(const QkvProjSpec& s, const oracle::ProjSizes& z, int64_t warm_tokens,
                           const std::string& what) {
  oracle::ProjSizes w = z;
  w.tokens = warm_tokens;
  w.seed = z.seed + 1;
  oracle::ProjProblem warm(s, w);
  warm.upload();
  qkv_projection(s, warm.args());
  expect_ok(warm, what + ", warm-up");
  oracle::ProjProblem p(s, z);
  p.upload();
  const detail::Driver& d = detail::driver();
  CUstream stream = nullptr;
  detail::check(d.StreamCreate(&stream, 0), "cuStreamCreate");
  testing::capture_and_replay(
      stream, [&] { qkv_projection(s, p.args(stream)); }, 2);
  expect_ok(p, what + ", graph replay");
  d.StreamDestroy(stream);
  return p.matched();
}

using testing::CaseRange;

// Dims and tokens shared by the two chunk matrices (a chunk's sequences, the unfused path).
const int32_t kCacheDims[][2] = {{128, 128}, {64, 32}, {80, 80}};
const int64_t kCacheTokens[] = {3, 16, 40, 64, 130};

// The cases of "projection: every axis" in `range`: the matrix is split over three test
// cases.
void proj_every_axis(CaseRange range) {
  testing::use_primary_context();
  const int32_t dims[][2] = {{128, 128}, {64, 32}, {80, 80}, {96, 64}, {256, 256}, {512, 128}};
  const DType dtypes[] = {DType::bf16, DType::f16};
  const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus};
  const int64_t tokens[] = {1, 3, 8, 13, 29, 64, 70};
  int n = 0;
  for (const auto& d : dims)
    for (const DType dt : dtypes)
      for (const Norm norm : norms) {
        if (!range.take(++n)) continue;
        auto [s, z] = matrix_case(n, d, dt, norm, tokens);
        if (s.freqs == Freqs::table) {
          s.table_dtype = n % 3 == 0 ? DType::bf16 : DType::f32;
          s.table_width = n % 4 == 1 ? TableWidth::full : TableWidth::half;
          s.index_type = n % 5 == 0 ? IndexType::i32 : IndexType::i64;
        }
        z.hidden = n % 2 ? 264 : 512;  // 264: the last 32-element chunk is partial
        z.out_head_gap = n % 4 == 2 ? 8 : 0;
        z.weight_gap = n % 6 == 4 ? 8 : 0;
        z.bias = n % 3 == 1;  // Qwen2's q/k/v biases
        z.seed = uint64_t(1000 + n);
        oracle::ProjProblem p(s, z);
        check_call_and_variant(
            p, s, 2 + n % 3, 1 + n % 2, false,
            s.key() + " tokens " + std::to_string(z.tokens) + (z.bias ? " bias" : ""));
      }
}

// The cases of "projection, e4m3 weights with column scales: every axis" in `range`.
void proj_e4m3_every_axis(CaseRange range) {
  testing::use_primary_context();
  const int32_t dims[][2] = {{128, 128}, {64, 32}, {80, 80}, {256, 256}};
  const DType dtypes[] = {DType::bf16, DType::f16};
  const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus};
  const int64_t tokens[] = {1, 5, 16, 29, 64};
  int n = 0;
  for (const auto& d : dims)
    for (const DType dt : dtypes)
      for (const Norm norm : norms) {
        if (!range.take(++n)) continue;
        auto [s, z] = matrix_case(n, d, dt, norm, tokens);
        s.weights = Weights::e4m3;
        z.hidden = n % 2 ? 272 : 1024;  // 272: the last 64-element chunk is partial
        z.out_head_gap = n % 4 == 2 ? 8 : 0;
        z.weight_gap = n % 6 == 4 ? 16 : 0;
        z.bias = n % 4 == 0;
        z.seed = uint64_t(3000 + n);
        oracle::ProjProblem p(s, z);
        check_call_and_variant(
            p, s, 2 + n % 3, 1 + n % 2, true,
            s.key() + " tokens " + std::to_string(z.tokens) + (z.bias ? " bias" : ""));
      }
}

// The cases of "projection with a KV cache (slots, paged, contiguous)" in `range`.
void proj_cache_rows(CaseRange range) {
  // k (rotated) and v into each token's cache row, in the dtype or e4m3, against the float64
  // reference; padded slots (-1) not written; rows outside the cache (a slot past the end, a
  // bad last_page_len or page number, a full sequence) not written and counted; every cache
  // byte outside the tokens' rows (gaps, other rows, the guard) still poisoned; with
  // cache_only the k and v outputs untouched too.
  testing::use_primary_context();
  const int32_t dims[][2] = {{128, 128}, {64, 32}, {80, 80}};
  const int64_t tokens[] = {1, 7, 16, 40, 64};
  int n = 0;
  for (const auto& d : dims)
    for (const DType dt : {DType::bf16, DType::f16})
      for (const Store store : {Store::same, Store::e4m3})
        for (const Weights w : {Weights::same, Weights::e4m3}) {
          if (!range.take(++n)) continue;
          const Norm norm = n % 3 == 0 ? Norm::none : n % 3 == 1 ? Norm::rms : Norm::rms_one_plus;
          auto [s, z] = matrix_case(n, d, dt, norm, tokens);
          s.weights = w;
          const KvCache modes[] = {KvCache::slots, KvCache::paged, KvCache::contiguous};
          s.cache = modes[(n / 2) % 3];  // against the norm (n % 3)
          s.cache_store = store;
          z.hidden = n % 2 ? 272 : 512;
          z.cache_page_size = n % 4 == 0 ? 1 : n % 4 == 1 ? 16 : 5;
          z.cache_slot_gap = n % 4 == 1 ? 16 : 0;
          z.cache_only = n % 5 == 2;
          z.padded_slots = z.tokens > 2 ? 1 + n % 2 : 0;
          z.bad_slots = z.tokens > 4 ? 1 + n % 3 : 0;
          z.bias = n % 5 == 1;
          z.seed = uint64_t(7000 + n);
          oracle::ProjProblem p(s, z);
          // Up to 32 tokens the automatic path is the fused one (beyond, it would be the
          // unfused one given a workspace; without one it runs fused).
          check_call_and_variant(p, s, 1 + n % 4, 1 + n % 2, z.tokens <= 32,
                                 s.key() + " tokens " + std::to_string(z.tokens) + " page " +
                                     std::to_string(z.cache_page_size) +
                                     (z.cache_only ? " cache only" : "") + (z.bias ? " bias" : ""));
        }
}

// The cases of "projection with a KV cache: a chunk's sequences" in `range`.
void proj_cache_chunks(CaseRange range) {
  // Several new tokens per sequence (cu_seqlens, some sequences empty) into a paged cache
  // (the sequence's last positions after the append, across page boundaries) or a contiguous
  // one (rows from seq_lens on; tokens past the row skipped and counted), fused; every other
  // cache byte untouched.
  testing::use_primary_context();
  testing::ScopedEnv off("ROPEJIT_TUNING",
                         "off");  // the heuristic: unfused from 33 tokens (e4m3: 65)
  int n = 0;
  for (const auto& d : kCacheDims)
    for (const DType dt : {DType::bf16, DType::f16})
      for (const Store store : {Store::same, Store::e4m3})
        for (const KvCache mode : {KvCache::paged, KvCache::contiguous}) {
          if (!range.take(++n)) continue;
          const Norm norm = n % 3 == 0 ? Norm::none : n % 3 == 1 ? Norm::rms : Norm::rms_one_plus;
          auto [s, z] = matrix_case(n, d, dt, norm, kCacheTokens);
          s.cache = mode;
          s.cache_store = store;
          s.weights = n % 4 == 3 ? Weights::e4m3 : Weights::same;
          z.hidden = n % 2 ? 272 : 512;
          z.cache_sequences = 1 + n % 5;
          z.cache_page_size = mode == KvCache::contiguous ? (n % 3 == 0 ? 16 : 160)
                                                          : (n % 3 == 0   ? 1
                                                             : n % 3 == 1 ? 16
                                                                          : 5);
          z.cache_slot_gap = n % 4 == 1 ? 16 : 0;
          z.bad_slots = n % 3;
          z.seed = uint64_t(9000 + n);
          oracle::ProjProblem p(s, z);
          check_call_and_variant(p, s, 1 + n % 4, 1 + n % 2, z.tokens <= 32,
                                 s.key() + " chunk of " + std::to_string(z.tokens) + " in " +
                                     std::to_string(z.cache_sequences) + " sequences, page " +
                                     std::to_string(z.cache_page_size));
        }
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("projection, unfused path (RMSNorm -> cuBLASLt GEMM -> RoPE): every axis") {
    testing::use_primary_context();
    const int32_t dims[][2] = {{128, 128}, {64, 32}, {80, 80}, {96, 64}, {256, 256}};
    const DType dtypes[] = {DType::bf16, DType::f16};
    const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus};
    const int64_t tokens[] = {1, 17, 64, 3, 130};
    int n = 0;
    for (const auto& d : dims)
      for (const DType dt : dtypes)
        for (const Norm norm : norms) {
          ++n;
          auto [s, z] = matrix_case(n, d, dt, norm, tokens);
          if (s.freqs == Freqs::table) {
            s.table_dtype = n % 3 == 0 ? DType::bf16 : DType::f32;
            s.table_width = n % 4 == 1 ? TableWidth::full : TableWidth::half;
            s.index_type = n % 5 == 0 ? IndexType::i32 : IndexType::i64;
          }
          z.hidden = n % 2 ? 264 : 512;
          z.weight_gap = n % 6 == 4 ? 8 : 0;
          // e4m3 weights, dequantized into the workspace before the GEMM (rows 16 bytes apart).
          if (n % 4 == 2) {
            s.weights = Weights::e4m3;
            z.weight_gap *= 2;
          }
          z.path = ProjPath::unfused;
          z.seed = uint64_t(2000 + n);
          oracle::ProjProblem p(s, z);
          p.upload();
          qkv_projection(s, p.args());
          expect_ok(p, s.key() + " unfused, tokens " + std::to_string(z.tokens) +
                           (z.packed_out ? " packed" : " three outputs"));
        }
  }

  TEST_CASE("projection: the automatic path follows the heuristic, the workspace and the layout") {
    testing::use_primary_context();
    testing::ScopedEnv off("ROPEJIT_TUNING", "off");  // the heuristic: fused up to 32 tokens
    const QkvProjSpec s =
        spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::table, Norm::rms);
    for (const int64_t tokens : {8, 32, 33, 64, 200}) {
      oracle::ProjSizes z;
      z.tokens = tokens;
      z.hidden = 1032;  // a shape no other test plans
      z.q_heads = 6;
      z.kv_heads = 2;
      z.path = ProjPath::automatic;
      z.seed = uint64_t(tokens);
      oracle::ProjProblem p(s, z);
      p.upload();
      const ProjPath want = tokens <= 32 ? ProjPath::fused : ProjPath::unfused;
      CHECK(qkv_projection_path(s, p.args()) == want);
      qkv_projection(s, p.args());
      expect_ok(p, "automatic, tokens " + std::to_string(tokens));
      CHECK_MESSAGE(p.matched() == want, tokens, " tokens");
      // Without a workspace the call runs fused, whatever the choice.
      QkvProjArgs bare = p.args();
      bare.workspace = nullptr;
      bare.workspace_bytes = 0;
      p.upload();
      qkv_projection(s, bare);
      expect_ok(p, "automatic without workspace, tokens " + std::to_string(tokens));
      CHECK(p.matched() == ProjPath::fused);
    }
    // Outputs with gaps between heads cannot be a GEMM's rows: fused, and unfused is refused.
    oracle::ProjSizes z;
    z.tokens = 64;
    z.hidden = 1032;
    z.q_heads = 6;
    z.kv_heads = 2;
    z.out_head_gap = 8;
    z.path = ProjPath::automatic;
    oracle::ProjProblem p(s, z);
    p.upload();
    CHECK(qkv_projection_path(s, p.args()) == ProjPath::fused);
    qkv_projection(s, p.args());
    expect_ok(p, "automatic with head gaps");
    CHECK(p.matched() == ProjPath::fused);
    QkvProjArgs forced = p.args();
    forced.path = ProjPath::unfused;
    CHECK_THROWS_WITH_AS(qkv_projection(s, forced),
                         doctest::Contains("args.q.stride_head (136) is not head_dim (128)"),
                         Error);
  }

  TEST_CASE("projection: the unfused path inside a CUDA graph, planned during the capture") {
    testing::use_primary_context();
    testing::ScopedEnv off("ROPEJIT_TUNING", "off");
    const QkvProjSpec s =
        spec_of(DType::f16, 64, 64, Style::gptj, Positions::offset, Freqs::computed, Norm::rms);
    oracle::ProjSizes z;
    z.tokens = 96;  // a new bucket whose plan, GEMM algorithm and RoPE plan are made in capture
    z.hidden = 776;
    z.q_heads = 8;
    z.kv_heads = 4;
    z.position_offset = 40;
    z.path = ProjPath::automatic;
    // The key's first use at one token: fused, and prepares the unfused path.
    CHECK(warm_then_capture(s, z, 1, "96 tokens") == ProjPath::unfused);
    // e4m3 weights on the unfused path, forced (automatic is fused at 40 tokens): the first use at
    // one token loads the dequantization kernel; 40 tokens are then captured: the 2048 rows (28 q
    // and 2 + 2 kv heads of 64) of 16400 codes take two chunks of the workspace (2040 rows and 8),
    // each a dequantization launch and a GEMM planned in the capture.
    QkvProjSpec s8 = s;
    s8.weights = Weights::e4m3;
    z.tokens = 40;
    z.hidden = 16400;
    z.q_heads = 28;
    z.kv_heads = 2;
    z.path = ProjPath::unfused;
    CHECK(warm_then_capture(s8, z, 1, "e4m3 weights, 40 tokens") == ProjPath::unfused);
  }

  TEST_CASE("ropejit tune --key qkvproj_...: the path per token bucket into the tuning file" *
            doctest::test_suite("long")) {
    const std::string file = testing::temp_dir() + "/proj_tuning.json";
    const std::string key = "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms";
    const testing::CommandResult r =
        testing::run_command(std::string(ROPEJIT_CLI_PATH) + " tune --key " + key +
                             " --heads 4,2 --hidden 512 --tokens 8,64 --top 3 --out " + file);
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("[2/2] " + key + "  bucket 64: fused ") != std::string::npos);
    CHECK(r.output.find("| " + key + " | 8 | 512 | 1024 |") != std::string::npos);
    const std::string text = testing::read_file(file);
    CHECK(text.find("\"projections\"") != std::string::npos);
    CHECK(text.find("\"unfused_us\"") != std::string::npos);
    // Where the fused kernel competes (8 tokens of this small shape), its variants were searched
    // and the winner recorded; a call then launches it.
    CHECK(r.output.find("bucket 8: fused m1") != std::string::npos);
    CHECK(r.output.find("variants; the heuristic's") != std::string::npos);
    // --top: the three fastest of the searched variants under the bucket's line, the best first.
    CHECK(r.output.find("us  1.000x best\n") != std::string::npos);
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    const autotune::TuningCache tuned =
        autotune::TuningCache::load(file, autotune::current_fingerprint());
    const autotune::ProjTuningEntry* e = tuned.find_proj(key, 8, 512, 1024);
    REQUIRE(e != nullptr);
    REQUIRE_FALSE(e->variant.empty());
    detail::ProjVariant v;
    REQUIRE(detail::parse_proj_variant(e->variant, &v));
    testing::ScopedEnv path("ROPEJIT_TUNING_FILE", file);
    const QkvProjSpec c = QkvProjSpec{}.canonical();
    CHECK(autotune::select_proj_variant(c, detail::ProjShape{5, 512, 4, 2, 512}, device) == v);
    // e4m3 weights: both paths raced too (the unfused one dequantizes the weight first); the
    // fused kernel's variants searched where it competes.
    const std::string fp8_file = testing::temp_dir() + "/proj_tuning_fp8.json";
    const testing::CommandResult r8 = testing::run_command(
        std::string(ROPEJIT_CLI_PATH) + " tune --key " + key + "_we4m3 --heads 4,2 --hidden 512 " +
        "--tokens 1,64 --out " + fp8_file);
    INFO(r8.output);
    REQUIRE(r8.status == 0);
    CHECK(r8.output.find("unfused none") == std::string::npos);
    const std::string fp8_text = testing::read_file(fp8_file);
    CHECK(fp8_text.find("\"variant\"") != std::string::npos);
    CHECK(fp8_text.find("\"unfused_us\": 0") == std::string::npos);
  }

  TEST_CASE("projection: every axis against float64 (norms, styles, rotary, tables), cases 1-12" *
            doctest::test_suite("long")) {
    proj_every_axis({1, 12});
  }
  TEST_CASE("projection: every axis against float64 (norms, styles, rotary, tables), cases 13-24" *
            doctest::test_suite("long")) {
    proj_every_axis({13, 24});
  }
  TEST_CASE("projection: every axis against float64 (norms, styles, rotary, tables), cases 25 on" *
            doctest::test_suite("long")) {
    proj_every_axis({25});
  }

  TEST_CASE("projection, e4m3 weights with column scales: every axis against float64, cases 1-12" *
            doctest::test_suite("long")) {
    proj_e4m3_every_axis({1, 12});
  }
  TEST_CASE("projection, e4m3 weights with column scales: every axis against float64, cases 13 on" *
            doctest::test_suite("long")) {
    proj_e4m3_every_axis({13});
  }

  TEST_CASE("projection, e4m3 weights on the unfused path: the weight dequantized in chunks") {
    // Rows of 16400 elements (the RMSNorm key takes up to 32768): a chunk of the workspace holds
    // 2040 dequantized rows (64 MiB of 32800-byte rows, a multiple of 8), so the 3072 rows of 40 q
    // and 4 + 4 kv heads of 64 take two chunks, the second partial, its GEMM writing from column
    // 2040 on; three outputs take one GEMM each (q's 2560 rows: two chunks). Against float64 with
    // the dequantization's roundings.
    testing::use_primary_context();
    REQUIRE(detail::dequant_chunk_rows(DType::bf16, 16400) == 2040);
    int n = 0;
    for (const DType dt : {DType::bf16, DType::f16})
      for (const bool packed : {true, false}) {
        ++n;
        QkvProjSpec s = spec_of(dt, 64, 64, n % 2 ? Style::neox : Style::gptj, Positions::ids,
                                Freqs::table, n % 2 ? Norm::rms : Norm::none);
        s.weights = Weights::e4m3;
        oracle::ProjSizes z;
        z.tokens = 3 + n;
        z.hidden = 16400;
        z.q_heads = 40;
        z.kv_heads = 4;
        z.packed_out = packed;
        z.weight_gap = n == 3 ? 16 : 0;
        z.path = ProjPath::unfused;
        z.seed = uint64_t(2500 + n);
        oracle::ProjProblem p(s, z);
        p.upload();
        qkv_projection(s, p.args());
        expect_ok(p, s.key() + (packed ? " packed" : " three outputs"));
      }
  }

  TEST_CASE(
      "projection with a KV cache (slots, paged, contiguous), other bytes untouched, cases 1-8" *
      doctest::test_suite("long")) {
    proj_cache_rows({1, 8});
  }
  TEST_CASE(
      "projection with a KV cache (slots, paged, contiguous), other bytes untouched, cases 9-16" *
      doctest::test_suite("long")) {
    proj_cache_rows({9, 16});
  }
  TEST_CASE(
      "projection with a KV cache (slots, paged, contiguous), other bytes untouched, cases 17 on" *
      doctest::test_suite("long")) {
    proj_cache_rows({17});
  }

  TEST_CASE("projection with a dynamic FP8 cache (e4m3dyn): the unfused path's scales per head" *
            doctest::test_suite("long")) {
    // No fused kernel: every call runs RMSNorm -> GEMM -> the fused RoPE key, which computes
    // each written row's and head's scale (amax / 448) and stores the codes. Against float64:
    // each scale within the amax the reference's tolerance allows, each code within the
    // tolerance at the multiplier the stored scale implies, every other cache and scale byte
    // untouched, the skipped counter; one token (a decode step) to a chunk's sequences.
    testing::use_primary_context();
    const int32_t dims[][2] = {{128, 128}, {64, 32}};
    const int64_t tokens[] = {1, 5, 40};
    int n = 0;
    for (const auto& d : dims)
      for (const DType dt : {DType::bf16, DType::f16})
        for (const KvCache mode : {KvCache::slots, KvCache::paged, KvCache::contiguous})
          for (const bool chunk : {false, true}) {
            if (chunk && mode == KvCache::slots) continue;
            ++n;
            const Norm norm = n % 3 == 0 ? Norm::none : n % 3 == 1 ? Norm::rms : Norm::rms_one_plus;
            auto [s, z] = matrix_case(n, d, dt, norm, tokens);
            s.positions = Positions::ids;  // the unfused path's RoPE step places tokens by ids
            z.position_offset = 0;
            s.cache = mode;
            s.cache_store = Store::e4m3_dynamic;
            if (n % 3 == 2) s.weights = Weights::e4m3;
            z.hidden = n % 2 ? 272 : 512;
            z.cache_sequences = chunk ? 1 + n % 4 : 0;
            z.cache_page_size = mode == KvCache::contiguous ? (chunk ? 160 : 8) : 16;
            z.padded_slots = mode == KvCache::slots && z.tokens > 2 ? 1 : 0;
            z.bad_slots = z.tokens > 4 ? 1 : 0;
            z.path = n % 2 ? ProjPath::unfused : ProjPath::automatic;
            z.seed = uint64_t(9800 + n);
            oracle::ProjProblem p(s, z);
            p.upload();
            const std::string what =
                s.key() + " tokens " + std::to_string(z.tokens) + (chunk ? " in sequences" : "");
            CHECK_MESSAGE(qkv_projection_path(s, p.args()) == ProjPath::unfused, what);
            qkv_projection(s, p.args());
            expect_ok(p, what);
            CHECK_MESSAGE(p.matched() == ProjPath::unfused, what);
            // The fused path, and a call without a workspace, are refused before anything runs.
            QkvProjArgs fused = p.args();
            fused.path = ProjPath::fused;
            CHECK_THROWS_WITH_AS(qkv_projection(s, fused),
                                 doctest::Contains("args.path is fused, but spec.cache_store "
                                                   "(e4m3dyn)"),
                                 Error);
            QkvProjArgs bare = p.args();
            bare.path = ProjPath::automatic;
            bare.workspace = nullptr;
            bare.workspace_bytes = 0;
            CHECK_THROWS_WITH_AS(qkv_projection(s, bare),
                                 doctest::Contains("has the unfused path only"), Error);
          }
    // Inside a CUDA graph: the key's first use (outside) prepares the unfused path; a new token
    // bucket is then planned during the capture.
    QkvProjSpec s =
        spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::table, Norm::rms);
    s.cache = KvCache::paged;
    s.cache_store = Store::e4m3_dynamic;
    oracle::ProjSizes z;
    z.tokens = 24;
    z.hidden = 512;
    z.q_heads = 4;
    z.kv_heads = 2;
    z.path = ProjPath::automatic;
    CHECK(warm_then_capture(s, z, 1, "e4m3dyn cache, 24 tokens") == ProjPath::unfused);
  }

  TEST_CASE("projection with a KV cache: a chunk's sequences (cu_seqlens), cases 1-8" *
            doctest::test_suite("long")) {
    proj_cache_chunks({1, 8});
  }
  TEST_CASE("projection with a KV cache: a chunk's sequences (cu_seqlens), cases 9-16" *
            doctest::test_suite("long")) {
    proj_cache_chunks({9, 16});
  }
  TEST_CASE("projection with a KV cache: a chunk's sequences (cu_seqlens), cases 17 on" *
            doctest::test_suite("long")) {
    proj_cache_chunks({17});
  }

  // The unfused path (GEMM, then the fused RoPE key appending k and v) with every addressing,
  // a decode step's and a chunk's, in the dtype and e4m3, forced and automatic; every other
  // cache byte untouched: the cases in `range`.
  void proj_unfused_cache(CaseRange range) {
    testing::use_primary_context();
    testing::ScopedEnv off("ROPEJIT_TUNING",
                           "off");  // the heuristic: unfused from 33 tokens (e4m3: 65)
    int n = 0;
    for (const auto& d : kCacheDims)
      for (const DType dt : {DType::bf16, DType::f16})
        for (const KvCache mode : {KvCache::slots, KvCache::paged, KvCache::contiguous})
          for (const bool chunk : {false, true}) {
            if (chunk && mode == KvCache::slots) continue;
            if (!range.take(++n)) continue;
            const Norm norm = n % 3 == 0 ? Norm::none : n % 3 == 1 ? Norm::rms : Norm::rms_one_plus;
            auto [s, z] = matrix_case(n, d, dt, norm, kCacheTokens);
            s.positions = Positions::ids;  // offsets: the fused path only, with these caches
            z.position_offset = 0;
            s.cache = mode;
            s.cache_store = n % 2 ? Store::e4m3 : Store::same;
            z.tokens = n % 3 == 0 ? 40 : n % 3 == 1 ? 64 : 130;
            // e4m3 weights where the unfused path is forced, and at 130 tokens automatic (the
            // heuristic keeps them fused up to 64; 16-bit weights up to 32).
            if ((n % 2 == 1 && n % 3 != 0) || n % 3 == 2) s.weights = Weights::e4m3;
            z.hidden = n % 2 ? (s.weights == Weights::e4m3 ? 272 : 264) : 512;
            z.packed_out = n % 4 != 1;
            z.cache_sequences = chunk ? 2 + n % 4 : 0;
            z.cache_page_size = mode == KvCache::contiguous ? (chunk ? 160 : 8) : 16;
            z.padded_slots = mode == KvCache::slots ? 2 : 0;
            z.bad_slots = 1 + n % 2;
            z.path = n % 2 ? ProjPath::unfused : ProjPath::automatic;
            z.seed = uint64_t(9500 + n);
            oracle::ProjProblem p(s, z);
            p.upload();
            const std::string what = s.key() + " unfused, tokens " + std::to_string(z.tokens) +
                                     (chunk ? " in sequences" : "");
            CHECK_MESSAGE(qkv_projection_path(s, p.args()) == ProjPath::unfused, what);
            qkv_projection(s, p.args());
            expect_ok(p, what);
            CHECK_MESSAGE(p.matched() == ProjPath::unfused, what);
          }
  }

  TEST_CASE("projection with a KV cache: the unfused path, every addressing, cases 1-15" *
            doctest::test_suite("long")) {
    proj_unfused_cache({1, 15});
  }

  TEST_CASE("projection with a KV cache: the unfused path, cases 16 on, and a chunk in a graph" *
            doctest::test_suite("long")) {
    proj_unfused_cache({16});
    testing::ScopedEnv off("ROPEJIT_TUNING", "off");
    // A chunk into a paged cache inside a CUDA graph: the key warmed at the chunk's shape
    // (which prepares the unfused path's RoPE step for thd), then captured and replayed.
    QkvProjSpec s =
        spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::table, Norm::rms);
    s.cache = KvCache::paged;
    s.cache_store = Store::e4m3;
    oracle::ProjSizes z;
    z.tokens = 96;
    z.hidden = 1024;
    z.q_heads = 8;
    z.kv_heads = 2;
    z.cache_sequences = 3;
    z.path = ProjPath::automatic;
    z.seed = 77;
    CHECK(warm_then_capture(s, z, 96, "paged chunk") == ProjPath::unfused);
  }

  TEST_CASE("projection, e4m3 weights: every code decodes exactly, in every variant (bits)" *
            doctest::test_suite("exhaustive")) {
    // Token m is one-hot at k = m, so each output is one weight code times its column's scale
    // (1 or 2^-3: exact in bf16 and f16), and every position is 0 (cos 1, sin 0: the rotation
    // is exact). Column n of token m holds code (n + 7 m) mod 256, so every code meets every
    // token; the two NaN codes are replaced by 0. The outputs' bits are compared exactly (a zero
    // of either sign for the zero codes), and a poisoned guard after them must stay untouched.
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    constexpr int64_t kTokens = 128, kHidden = 128, kD = 64, kQ = 2, kKv = 1;
    constexpr int64_t kColumns = (kQ + 2 * kKv) * kD;  // 256
    constexpr size_t kGuard = 256;
    std::vector<uint8_t> w(static_cast<size_t>(kColumns * kHidden));
    auto code_at = [](int64_t n, int64_t k) {
      const int c = int((n + 7 * k) % 256);
      return uint8_t(c == 0x7f || c == 0xff ? 0 : c);
    };
    for (int64_t n = 0; n < kColumns; ++n)
      for (int64_t k = 0; k < kHidden; ++k) w[size_t(n * kHidden + k)] = code_at(n, k);
    std::vector<float> scale(static_cast<size_t>(kColumns));
    for (int64_t n = 0; n < kColumns; ++n) scale[size_t(n)] = n % 3 == 1 ? 0.125f : 1.0f;
    const std::vector<int64_t> ids(size_t(kTokens), 0);
    testing::DeviceBuffer dw(w.size()), dscale(scale.size() * 4), dids(ids.size() * 8);
    detail::check(d.MemcpyHtoD(dw.ptr, w.data(), w.size()), "cuMemcpyHtoD");
    detail::check(d.MemcpyHtoD(dscale.ptr, scale.data(), scale.size() * 4), "cuMemcpyHtoD");
    detail::check(d.MemcpyHtoD(dids.ptr, ids.data(), ids.size() * 8), "cuMemcpyHtoD");
    for (const DType dt : {DType::bf16, DType::f16}) {
      QkvProjSpec s = spec_of(dt, kD, kD, Style::neox, Positions::ids, Freqs::computed, Norm::none);
      s.weights = Weights::e4m3;
      auto bits_of = [&](double v) {
        return dt == DType::bf16 ? oracle::bf16_bits(v) : oracle::f16_bits(v);
      };
      std::vector<uint16_t> x(size_t(kTokens * kHidden), bits_of(0.0));
      for (int64_t m = 0; m < kTokens; ++m) x[size_t(m * kHidden + m % kHidden)] = bits_of(1.0);
      const size_t out_bytes = size_t(kTokens * kColumns) * 2;
      testing::DeviceBuffer dx(x.size() * 2), dout(out_bytes + kGuard);
      detail::check(d.MemcpyHtoD(dx.ptr, x.data(), x.size() * 2), "cuMemcpyHtoD");
      QkvProjArgs a;
      a.tokens = kTokens;
      a.hidden = kHidden;
      a.q_heads = kQ;
      a.kv_heads = kKv;
      a.x = dx.get();
      a.weight = dw.get();
      a.weight_scale = static_cast<const float*>(dscale.get());
      a.position_ids = dids.get();
      char* out = static_cast<char*>(dout.get());
      a.q = Tensor{out, kQ, 0, kColumns, kD};
      a.k = Tensor{out + kQ * kD * 2, kKv, 0, kColumns, kD};
      a.v = Tensor{out + (kQ + kKv) * kD * 2, kKv, 0, kColumns, kD};
      auto run_and_compare = [&](const detail::ProjVariant* v, const std::string& what) {
        std::vector<uint8_t> got(out_bytes + kGuard, 0xff);
        detail::check(d.MemcpyHtoD(dout.ptr, got.data(), got.size()), "cuMemcpyHtoD");
        if (v) {
          const QkvProjSpec c = s.canonical();
          api::decode_engine().launch_proj(c, a, detail::check_proj_call(c, a), v);
        } else {
          qkv_projection(s, a);
        }
        detail::check(d.CtxSynchronize(), "kernel");
        detail::check(d.MemcpyDtoH(got.data(), dout.ptr, got.size()), "cuMemcpyDtoH");
        int64_t wrong = 0;
        std::string first;
        for (int64_t m = 0; m < kTokens; ++m)
          for (int64_t n = 0; n < kColumns; ++n) {
            const uint8_t code = code_at(n, m % kHidden);
            const uint16_t want = bits_of(oracle::e4m3_value(code) * double(scale[size_t(n)]));
            uint16_t have = 0;
            std::memcpy(&have, got.data() + size_t(m * kColumns + n) * 2, 2);
            const bool zero = (want & 0x7fff) == 0 && (have & 0x7fff) == 0;
            if (have != want && !zero && wrong++ == 0) {
              char line[96];
              std::snprintf(line, sizeof line, "code 0x%02x: bits 0x%04x, expected 0x%04x",
                            unsigned(code), unsigned(have), unsigned(want));
              first = detail::concat("token ", m, " column ", n, " ", line);
            }
          }
        CHECK_MESSAGE(wrong == 0, what, ": ", wrong, " wrong; ", first);
        CHECK_MESSAGE(std::all_of(got.begin() + long(out_bytes), got.end(),
                                  [](uint8_t b) { return b == 0xff; }),
                      what, ": the guard after the outputs was written");
      };
      run_and_compare(nullptr, s.key() + " default");
      for (const int32_t tiles : {1, 2, 4, 8})
        for (const int32_t splits : {1, 2, 4, 8})
          for (const int32_t unroll : {1, 2, 4})
            for (const bool wide : {false, true})     // 64-element chunks at 2 and 4 tiles
              for (const int32_t rows : {1, 2, 4}) {  // staged activations from 2
                detail::ProjVariant v{tiles, splits, unroll};
                v.wide = wide;
                v.rows = rows;
                if (!detail::proj_variant_problem(v, true).empty()) continue;
                run_and_compare(&v, s.key() + " " + v.name());
              }
    }
  }

  TEST_CASE("projection: every kernel variant gives a correct result (Llama-3-8B shape)" *
            doctest::test_suite("exhaustive")) {
    testing::use_primary_context();
    const QkvProjSpec s =
        spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::table, Norm::rms);
    for (const int64_t tokens : {1, 16, 64}) {
      oracle::ProjSizes z;
      z.tokens = tokens;
      z.hidden = 4096;
      z.q_heads = 32;
      z.kv_heads = 8;
      z.seed = uint64_t(tokens);
      oracle::ProjProblem p(s, z);
      p.upload();  // device pointers exist from here
      const QkvProjSpec c = s.canonical();
      const detail::ProjShape shape = detail::check_proj_call(c, p.args());
      for (const int32_t tiles : {1, 2, 4, 8})
        for (const int32_t splits : {1, 2, 4, 8})
          for (const int32_t unroll : {1, 2, 4})
            for (const bool swap : {false, true})        // tokens as the 16-row operand
              for (const int32_t rows : {1, 2, 4, 8}) {  // staged activations from 2
                detail::ProjVariant v{tiles, splits, unroll};
                v.swap = swap;
                v.rows = rows;
                if (!detail::proj_variant_problem(v).empty()) continue;
                p.upload();
                api::decode_engine().launch_proj(c, p.args(), shape, &v);
                expect_ok(p, s.key() + " " + v.name() + " tokens " + std::to_string(tokens));
              }
      p.upload();
      qkv_projection(s, p.args());  // the heuristic's choice
      expect_ok(p, s.key() + " default, tokens " + std::to_string(tokens));
    }
  }

  TEST_CASE("projection: thread-block clusters split the hidden dimension (sm_90)") {
    // Each block of a cluster sums a slice of the hidden dimension; the finisher adds the
    // cluster's partial sums (and the norm's Σx²) from distributed shared memory. Every
    // cluster size over dtypes, norms, e4m3 weights, a KV cache, 1-64 tokens and hidden sizes
    // that leave some slices empty (272) or uneven, against float64. (The FFN's clusters: in
    // test_gpu_ffn.cpp's every-variant case.)
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    if (device.cc < 90) {
      MESSAGE("skipped: thread-block clusters need sm_90 (this GPU is sm_", device.cc, ")");
      return;
    }
    const int32_t dims[][2] = {{128, 128}, {64, 32}};
    const int64_t tokens[] = {1, 9, 16, 40, 64};
    int n = 0;
    for (const auto& d : dims)
      for (const DType dt : {DType::bf16, DType::f16})
        for (const Weights w : {Weights::same, Weights::e4m3})
          for (const int32_t cluster : {2, 4, 8}) {
            ++n;
            const Norm norm = n % 3 == 0 ? Norm::none : n % 3 == 1 ? Norm::rms : Norm::rms_one_plus;
            auto [s, z] = matrix_case(n, d, dt, norm, tokens);
            s.weights = w;
            if (n % 4 == 2) s.cache = KvCache::slots;
            z.hidden = n % 3 == 0 ? 272 : n % 3 == 1 ? 1024 : 4096;
            z.seed = uint64_t(8000 + n);
            oracle::ProjProblem p(s, z);
            p.upload();
            const QkvProjSpec c = s.canonical();
            const detail::ProjShape shape = detail::check_proj_call(c, p.args());
            const int32_t tiles = detail::proj_token_tiles(z.tokens);
            detail::ProjVariant v{tiles, 1 << (n % 4), tiles == 1 ? 1 + n % 2 : 1};
            v.cluster = cluster;
            // e4m3 codes in 64-element chunks at 2 and 4 tiles, every other such case.
            v.wide = w == Weights::e4m3 && (tiles == 2 || tiles == 4) && n % 2 == 0;
            // Tokens as the 16-row operand (16-bit weights, two tiles or more), every other case.
            v.swap = w == Weights::same && tiles >= 2 && n % 2 == 1;
            // Staged activations (two row groups) where legal, every third case.
            detail::ProjVariant staged = v;
            staged.rows = 2;
            if (n % 3 == 2 && detail::proj_variant_problem(staged, w == Weights::e4m3).empty())
              v = staged;
            REQUIRE(detail::proj_variant_problem(v, w == Weights::e4m3).empty());
            api::decode_engine().launch_proj(c, p.args(), shape, &v);
            expect_ok(p, s.key() + " " + v.name() + " tokens " + std::to_string(z.tokens) +
                             " hidden " + std::to_string(z.hidden));
          }
    // The library's own choices, each against float64: at a tensor-parallel shard (80 column
    // blocks) a cluster; Llama-3-8B at 17-32 tokens staged row groups in clusters of four, where
    // the GPU has at most as many SMs as that grid's 192 blocks.
    {
      testing::ScopedEnv off("ROPEJIT_TUNING", "off");
      const QkvProjSpec s =
          spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::table, Norm::rms);
      struct Shape {
        int64_t tokens, hidden;
        int32_t q_heads, kv_heads;
      };
      const Shape shapes[] = {{1, 8192, 8, 1},
                              {16, 8192, 8, 1},
                              {17, 4096, 32, 8},
                              {24, 4096, 32, 8},
                              {32, 4096, 32, 8}};
      for (const Shape& h : shapes) {
        oracle::ProjSizes z;
        z.tokens = h.tokens;
        z.hidden = h.hidden;
        z.q_heads = h.q_heads;
        z.kv_heads = h.kv_heads;
        z.seed = uint64_t(90 + h.tokens);
        oracle::ProjProblem p(s, z);
        p.upload();
        const detail::ProjShape shape = detail::check_proj_call(s.canonical(), p.args());
        const detail::ProjVariant v = autotune::proj_heuristic(s.canonical(), shape, device);
        if (h.hidden == 8192) CHECK_MESSAGE(v.cluster > 1, v.name());
        if (h.hidden == 4096 && device.sm_count <= 192) CHECK_MESSAGE(v.rows == 8, v.name());
        qkv_projection(s, p.args());
        expect_ok(p, s.key() + " default (" + v.name() + ") tokens " + std::to_string(h.tokens));
      }
    }
  }

  TEST_CASE("projection: large activations, tiny eps, and a CUDA graph replay") {
    testing::use_primary_context();
    const QkvProjSpec s =
        spec_of(DType::bf16, 128, 128, Style::neox, Positions::ids, Freqs::computed, Norm::rms);
    oracle::ProjSizes z;
    z.tokens = 5;
    z.hidden = 1024;
    z.x_scale = 300.0;  // rstd is tiny; x·w is large: bf16 keeps the range
    z.norm_eps = 0;
    z.max_position = (int64_t(1) << 20) - 1;
    oracle::ProjProblem p(s, z);
    p.upload();
    qkv_projection(s, p.args());  // warms the key outside the capture
    expect_ok(p, "large activations");
    p.upload();
    const detail::Driver& d = detail::driver();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, 0), "cuStreamCreate");
    testing::capture_and_replay(
        stream, [&] { qkv_projection(s, p.args(stream)); }, 3);
    expect_ok(p, "graph replay");
    d.StreamDestroy(stream);
  }
}

TEST_SUITE("gpu") {
  TEST_CASE("RMSNorm: every dtype, norm, residual and row length against float64") {
    testing::use_primary_context();
    int n = 0;
    for (const DType t : {DType::bf16, DType::f16, DType::f32})
      for (const Norm norm : {Norm::rms, Norm::rms_one_plus})
        for (const bool residual : {false, true})
          for (const int64_t hidden : {8, 72, 2048, 4104, 8192}) {
            ++n;
            const RmsNormSpec s{t, norm, residual};
            oracle::NormSizes z;
            z.rows = n % 4 == 0 ? 1 : 37;
            z.hidden = hidden;
            z.gap = n % 3 == 0 ? 8 : 0;
            z.in_place = n % 5 == 2;
            z.x_scale = n % 7 == 0 ? 100.0 : 1.0;
            z.seed = uint64_t(n);
            oracle::NormProblem p(s, z);
            p.upload();
            rms_norm(s, p.args());
            const oracle::CheckReport r = p.check();
            CHECK_MESSAGE(r.ok, s.key(), " hidden ", hidden, ": ", r.mismatches, " of ", r.checked,
                          " wrong; ", r.first_failure);
          }
    // The longest rows each dtype takes (16 vectors per thread).
    for (const DType t : {DType::bf16, DType::f32}) {
      const RmsNormSpec s{t, Norm::rms, true};
      oracle::NormSizes z;
      z.rows = 3;
      z.hidden = t == DType::f32 ? 16384 : 32768;
      oracle::NormProblem p(s, z);
      p.upload();
      rms_norm(s, p.args());
      const oracle::CheckReport r = p.check();
      CHECK_MESSAGE(r.ok, s.key(), ": ", r.first_failure);
    }
  }
}
