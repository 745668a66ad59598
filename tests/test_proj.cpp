// The decode block's QKV projection without a GPU: spec validation, keys, variants, call
// checking (every bad argument named, nothing launched) and NVRTC compilation for sm_80 and
// sm_90.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "jit/decode/dequant.hpp"
#include "jit/decode/proj.hpp"
#include "jit/nvrtc.hpp"
#include "oracle/decode/proj_workload.hpp"
#include "test_util.hpp"

using namespace ropejit;
using detail::ProjVariant;

namespace {

using testing::contains;
using testing::error_of;

// A valid call on made-up device addresses (nothing is dereferenced when checking): x, weight
// and norm weight, then a packed [tokens][q + 2 kv][d] output, ids and tables, far apart.
struct Fake {
  QkvProjSpec spec;
  QkvProjArgs args;
  Fake() {
    args.tokens = 4;
    args.hidden = 256;
    args.q_heads = 4;
    args.kv_heads = 2;
    args.x = reinterpret_cast<void*>(0x10000000);
    args.weight = reinterpret_cast<void*>(0x20000000);
    args.norm_weight = reinterpret_cast<void*>(0x30000000);
    char* out = reinterpret_cast<char*>(0x40000000);
    const int64_t row = 8 * 128;
    args.q = Tensor{out, 4, 0, row, 128};
    args.k = Tensor{out + 4 * 128 * 2, 2, 0, row, 128};
    args.v = Tensor{out + 6 * 128 * 2, 2, 0, row, 128};
    args.position_ids = reinterpret_cast<void*>(0x50000000);
    args.cos = reinterpret_cast<void*>(0x60000000);
    args.sin = reinterpret_cast<void*>(0x70000000);
    args.table_rows = 4096;
  }
  std::string check() const {
    return error_of([&] { detail::check_proj_call(spec.canonical(), args); });
  }
};

}  // namespace

TEST_CASE("projection variants: names parse back, and nothing else does") {
  int n = 0;
  for (const int32_t tiles : {1, 2, 4, 8})
    for (int32_t splits = 1; splits <= 8; ++splits)
      for (const int32_t unroll : {1, 2, 4})
        for (const int32_t cluster : {1, 2, 4, 8})
          for (const bool wide : {false, true})
            for (const bool swap : {false, true})
              for (const int32_t rows : {1, 2, 4, 8}) {
                detail::ProjVariant v{tiles, splits, unroll};
                v.cluster = cluster;
                v.wide = wide;
                v.swap = swap;
                v.rows = rows;
                detail::ProjVariant back;
                REQUIRE_MESSAGE(detail::parse_proj_variant(v.name(), &back), v.name());
                CHECK(back == v);
                ++n;
              }
  CHECK(n == 6144);
  detail::ProjVariant v;
  for (const char* bad :
       {"",         "m",         "m1",         "m1s4",       "m1s4u",    "m1s4u2c",   "m1s4u2c1",
        "m01s4u2",  "m1s4u2x",   "s4m1u2",     "m1s4u2c4c4", "m-1s4u2",  "m1s4u200",  "M1S4U2",
        "m2s4u1ww", "m2s4u1c4w", "m2s4uw1",    "m2s4u1tw",   "m2s4u1tt", "m2s4u1c2t", "m2s4u1r1",
        "m2s4u1r",  "m2s4u1rt",  "m2s4u1r4r4", "m2s4u1c2r4", "m2s4u1r04"})
    CHECK_FALSE_MESSAGE(detail::parse_proj_variant(bad, &v), bad);
  // Parsed but illegal: proj_variant_problem's to say.
  REQUIRE(detail::parse_proj_variant("m3s9u3c3", &v));
  CHECK_FALSE(detail::proj_variant_problem(v).empty());
  // wide: e4m3 weights at two or four token tiles, within the register rule; compiled for
  // fewer resident blocks.
  REQUIRE(detail::parse_proj_variant("m2s8u1w", &v));
  CHECK(v.wide);
  CHECK(detail::proj_variant_problem(v, true).empty());
  CHECK(contains(detail::proj_variant_problem(v, false), "wide (64-element chunks of e4m3"));
  CHECK(v.min_blocks(true) == 2);
  REQUIRE(detail::parse_proj_variant("m4s4u1w", &v));
  CHECK(detail::proj_variant_problem(v, true).empty());
  CHECK(v.min_blocks(true) == 3);
  // swap: 16-bit weights at two token tiles or more (the 16-row operand takes two).
  REQUIRE(detail::parse_proj_variant("m2s8u1t", &v));
  CHECK(v.swap);
  CHECK(detail::proj_variant_problem(v).empty());
  CHECK(contains(detail::proj_variant_problem(v, true), "swap (tokens as the 16-row operand)"));
  REQUIRE(detail::parse_proj_variant("m1s8u2t", &v));
  CHECK(contains(detail::proj_variant_problem(v), "swap needs 2, 4 or 8 token tiles"));
  REQUIRE(detail::parse_proj_variant("m2s8u1wtc2", &v));
  CHECK(v.wide);
  CHECK(v.swap);
  CHECK(v.cluster == 2);
  REQUIRE(detail::parse_proj_variant("m4s4u4w", &v));
  CHECK(contains(detail::proj_variant_problem(v, true), "must be <= 16"));
  for (const char* other : {"m1s8u1w", "m8s4u1w"}) {
    REQUIRE(detail::parse_proj_variant(other, &v));
    CHECK(contains(detail::proj_variant_problem(v, true), "wide needs 2 or 4 token tiles"));
  }
  // rows: row groups sharing staged activations, 32-element chunks, at most 8 warps, whole
  // vectors per thread, 32 KB of shared memory.
  REQUIRE(detail::parse_proj_variant("m8s2u1tr4c2", &v));
  CHECK(v.rows == 4);
  CHECK(v.swap);
  CHECK(v.cluster == 2);
  CHECK(v.threads() == 256);
  CHECK(v.min_blocks() == 2);
  CHECK(detail::proj_variant_problem(v).empty());
  REQUIRE(detail::parse_proj_variant("m8s2u1r4", &v));
  CHECK(detail::proj_variant_problem(v, true).empty());  // e4m3: 8 codes per lane from 2 tiles
  REQUIRE(detail::parse_proj_variant("m1s8u2r2", &v));
  CHECK(contains(detail::proj_variant_problem(v, true), "needs 32-element chunks"));
  REQUIRE(detail::parse_proj_variant("m4s4u1wr2", &v));
  CHECK(contains(detail::proj_variant_problem(v, true), "needs 32-element chunks"));
  REQUIRE(detail::parse_proj_variant("m8s4u1r4", &v));
  CHECK(contains(detail::proj_variant_problem(v), "splits (4) x rows (4) must be <= 8"));
  REQUIRE(detail::parse_proj_variant("m2s1u1r4", &v));
  CHECK(contains(detail::proj_variant_problem(v), "must be a multiple of rows (4)"));
  REQUIRE(detail::parse_proj_variant("m8s4u2r2", &v));
  CHECK(contains(detail::proj_variant_problem(v), "65536 bytes of shared memory"));
  v = detail::ProjVariant{8, 2, 1};
  v.rows = 3;
  CHECK(contains(detail::proj_variant_problem(v), "rows (3) must be 1, 2, 4 or 8"));
}

TEST_CASE("projection spec: validation names the field and value") {
  QkvProjSpec s;
  CHECK(error_of([&] { s.validate(); }).empty());
  s.dtype = DType::f32;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.dtype (f32)"));
  s = QkvProjSpec{};
  s.head_dim = 72;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.head_dim (72) must be a multiple of 16"));
  s = QkvProjSpec{};
  s.rotary_dim = 33;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.rotary_dim (33)"));
  s = QkvProjSpec{};
  s.positions = Positions::seq_offsets;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.positions (seqoff)"));
  s = QkvProjSpec{};
  s.freqs = Freqs::llama3;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.freqs (llama3)"));
  s = QkvProjSpec{};
  s.norm = Norm::rms_all_heads;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.norm (rmsall)"));
  s = QkvProjSpec{};
  s.style = Style(7);
  CHECK(contains(error_of([&] { s.validate(); }), "spec.style (7) is not a known value"));
}

TEST_CASE("projection keys: golden strings, canonical form, round trip") {
  QkvProjSpec s;
  CHECK(s.key() == "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms");
  s.positions = Positions::offset;
  s.index_type = IndexType::i32;  // unused with offsets: canonical form resets it
  s.freqs = Freqs::computed;
  s.table_dtype = DType::bf16;  // unused with computed frequencies
  s.norm = Norm::rms_one_plus;
  s.dtype = DType::f16;
  s.style = Style::gptj;
  s.rotary_dim = 64;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  s.weights = Weights::e4m3;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_we4m3");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  s.cache = KvCache::slots;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_we4m3_cslots");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  s.cache_store = Store::e4m3;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_we4m3_cslots-e4m3");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  s.weights = Weights::same;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_cslots-e4m3");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  // A dynamic FP8 cache: a key without a fused kernel (the unfused path computes the scales).
  s.cache_store = Store::e4m3_dynamic;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_cslots-e4m3dyn");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  CHECK(contains(detail::proj_fused_problem(s.canonical()), "spec.cache_store (e4m3dyn)"));
  CHECK(contains(error_of([&] {
                   detail::render(s.canonical(), ProjVariant{1, 8, 2});
                 }),
                 "has no fused kernel: spec.cache_store (e4m3dyn)"));
  s.cache = KvCache::paged;  // offset positions: the unfused path's RoPE step cannot place them
  CHECK(contains(error_of([&] { s.validate(); }),
                 "spec.cache_store (e4m3dyn) with a paged cache needs spec.positions ids"));
  s.cache = KvCache::slots;
  s.cache_store = Store::e4m3;
  CHECK(detail::proj_fused_problem(s.canonical()).empty());
  s.cache_store = Store::same;
  s.cache = KvCache::paged;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_cpaged");
  CHECK(parse_qkv_proj_key(s.key()) == s.canonical());
  s.cache = KvCache::contiguous;
  CHECK(s.key() == "qkvproj_f16_d128_r64_gptj_pos-offset_comp_nrms1p_ccont");
  s.cache = KvCache(9);
  CHECK(contains(error_of([&] { s.validate(); }), "spec.cache (9)"));
  s.cache = KvCache::none;
  s.cache_store = Store::e4m3;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.cache_store (e4m3) needs a KV cache"));
  s.cache_store = Store::same;
  s.weights = Weights(7);
  CHECK(contains(error_of([&] { s.validate(); }), "spec.weights (7)"));
  for (const char* bad : {"qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half", "rope_bf16_d128",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_wsame",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_e4m3",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cslots_we4m3",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cpages",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cslots-same",
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cslots-e4m3-x",
                          "qkvproj_bf16_d128_r128_neox_pos-offset-i64_comp_nrms",  // not canonical
                          "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32_nrms",
                          "qkvproj_bf16_d72_r72_neox_pos-ids-i64_comp_nrms"})
    CHECK_MESSAGE(!error_of([&] { parse_qkv_proj_key(bad); }).empty(), bad);
}

TEST_CASE("projection variants: names, legality, token tiles") {
  ProjVariant v;
  CHECK(v.name() == "m1s4u2");
  CHECK(detail::proj_variant_problem(v).empty());
  v.token_tiles = 3;
  CHECK(contains(detail::proj_variant_problem(v), "token_tiles (3)"));
  v = ProjVariant{};
  v.splits = 9;
  CHECK(contains(detail::proj_variant_problem(v), "splits (9)"));
  v = ProjVariant{8, 4, 4};
  CHECK(contains(detail::proj_variant_problem(v), "registers"));
  // e4m3 with one tile reads 64-element chunks (twice the activations); more tiles 32.
  CHECK(detail::proj_variant_problem(ProjVariant{2, 8, 4}, true).empty());
  CHECK(detail::proj_variant_problem(ProjVariant{1, 8, 4}, true).empty());
  CHECK(contains(detail::proj_variant_problem(ProjVariant{8, 4, 4}, true), "registers"));
  // Thread-block clusters: 1, 2, 4 or 8 blocks, named by a suffix; sm_90 only.
  v = ProjVariant{1, 8, 2};
  CHECK(v.name() == "m1s8u2");
  v.cluster = 4;
  CHECK(v.name() == "m1s8u2c4");
  CHECK(detail::proj_variant_problem(v).empty());
  v.cluster = 3;
  CHECK(contains(detail::proj_variant_problem(v), "cluster (3) must be 1, 2, 4 or 8"));
  v.cluster = 2;
  CHECK(
      contains(error_of([&] { api::decode_engine().image(QkvProjSpec{}.canonical(), v, "sm_80"); }),
               "cluster (2) needs thread-block clusters, sm_90 or newer (target sm_80)"));
  CHECK_NOTHROW(api::decode_engine().image(QkvProjSpec{}.canonical(), v, "sm_90"));
  CHECK(contains(error_of([&] { api::decode_engine().image(FfnSpec{}.canonical(), v, "sm_80"); }),
                 "needs thread-block clusters"));
  {  // The heuristic's cluster: only for grids smaller than the GPU, only on sm_90+.
    detail::DeviceInfo h100;
    h100.cc = 90;
    h100.sm_count = 132;
    detail::ProjShape shard;  // Llama-3-70B at TP 8: 10 heads of 128, 640 pairs, 80 blocks
    shard.tokens = 1;
    shard.hidden = 8192;
    shard.q_heads = 8;
    shard.kv_heads = 1;
    shard.pairs = 640;
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), shard, h100).name() == "m1s8u2c4");
    shard.tokens = 16;
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), shard, h100).name() == "m2s8u1tc4");
    detail::DeviceInfo a100 = h100;
    a100.cc = 80;
    a100.sm_count = 108;
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), shard, a100).cluster == 1);
    // Every variant the heuristic can pick at the shard's columns is prepared together (none
    // with clusters before sm_90 or without a shape).
    std::vector<std::string> names;
    for (const ProjVariant& pv :
         autotune::proj_heuristic_variants(QkvProjSpec{}.canonical(), shard, h100))
      names.push_back(pv.name());
    CHECK(names == std::vector<std::string>{"m1s8u2", "m1s8u2c4", "m2s8u1t", "m2s8u1tc4", "m4s4u2t",
                                            "m4s4u2tc4", "m8s4u1t", "m8s4u1tc4"});
    CHECK(autotune::proj_heuristic_variants(QkvProjSpec{}.canonical(), shard, a100).size() == 4);
    CHECK(autotune::proj_heuristic_variants(QkvProjSpec{}.canonical(), detail::ProjShape{}, h100)
              .size() == 4);
    detail::ProjShape llama = shard;  // 384 blocks
    llama.pairs = 3072;
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), llama, h100).name() == "m2s8u1t");
    llama.tokens = 32;  // sm_90, 48 blocks of 64 pairs x 4: eight staged row groups, clusters
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), llama, h100).name() == "m4s1u2r8c4");
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), llama, a100).name() == "m4s4u2t");
    shard.tokens = 32;  // too narrow for it: 10 blocks x 4
    CHECK(autotune::proj_heuristic(QkvProjSpec{}.canonical(), shard, h100).name() == "m4s4u2tc4");
    names.clear();
    for (const ProjVariant& pv :
         autotune::proj_heuristic_variants(QkvProjSpec{}.canonical(), llama, h100))
      names.push_back(pv.name());
    CHECK(names ==
          std::vector<std::string>{"m1s8u2", "m2s8u1t", "m4s4u2t", "m4s1u2r8c4", "m8s4u1t"});
    QkvProjSpec fp8 = QkvProjSpec{}.canonical();
    fp8.weights = Weights::e4m3;
    llama.tokens = 32;  // e4m3 weights: never staged (64-element chunks)
    CHECK(autotune::proj_heuristic(fp8, llama, h100).rows == 1);
    llama.tokens = 64;  // e4m3: four tiles per block (two rows), two warps of wide chunks
    CHECK(autotune::proj_heuristic(fp8, llama, h100).name() == "m4s2u1w");
    for (const ProjVariant& pv : autotune::proj_heuristic_variants(fp8, llama, h100))
      CHECK_MESSAGE(detail::proj_variant_problem(pv, true).empty(), pv.name());
  }
  CHECK(ProjVariant{1, 8, 1}.min_blocks(true) == 3);
  CHECK(ProjVariant{2, 8, 1}.min_blocks(true) == 4);
  // 16-bit weights: three blocks per SM at two and eight tiles in the projection, not the FFN.
  CHECK(ProjVariant{1, 8, 2}.min_blocks() == 4);
  CHECK(ProjVariant{2, 8, 1}.min_blocks() == 3);
  CHECK(ProjVariant{2, 8, 1}.min_blocks(false, true) == 4);
  CHECK(ProjVariant{4, 8, 1}.min_blocks() == 2);
  CHECK(ProjVariant{8, 4, 1}.min_blocks() == 3);
  CHECK(ProjVariant{8, 4, 1}.min_blocks(false, true) == 4);
  CHECK(ProjVariant{8, 4, 1}.min_blocks(true) == 4);
  CHECK(detail::proj_token_tiles(1) == 1);
  CHECK(detail::proj_token_tiles(8) == 1);
  CHECK(detail::proj_token_tiles(9) == 2);
  CHECK(detail::proj_token_tiles(17) == 4);
  CHECK(detail::proj_token_tiles(33) == 8);
  CHECK(detail::proj_token_tiles(4096) == 8);
  detail::ProjShape shape;
  shape.tokens = 100;
  shape.pairs = 3072;
  CHECK(detail::proj_grid_x(shape, ProjVariant{}) == 384);
  ProjVariant staged{8, 2, 1};
  staged.rows = 4;  // 32 pairs per block
  CHECK(detail::proj_grid_x(shape, staged) == 96);
  shape.pairs = 3073;
  CHECK(detail::proj_grid_x(shape, staged) == 97);
  CHECK(detail::proj_grid_y(shape, ProjVariant{8, 4, 1}) == 2);
}

TEST_CASE("projection calls: every bad argument is named, a good one passes") {
  CHECK(Fake{}.check().empty());
  Fake biased;  // [(4 + 2 * 2) * 128] biases: any element-aligned address
  biased.args.bias = reinterpret_cast<void*>(0x30100002);
  CHECK(biased.check().empty());
  struct Bad {
    const char* expect;
    std::function<void(Fake&)> edit;
  };
  const std::vector<Bad> cases = {
      {"args.tokens (-1)", [](Fake& f) { f.args.tokens = -1; }},
      {"args.hidden (12)", [](Fake& f) { f.args.hidden = 12; }},
      {"args.q_heads (0)", [](Fake& f) { f.args.q_heads = 0; }},
      {"args.kv_heads (0)", [](Fake& f) { f.args.kv_heads = 0; }},
      {"args.x is null", [](Fake& f) { f.args.x = nullptr; }},
      {"args.x (0x10000008) is not 16-byte aligned",
       [](Fake& f) { f.args.x = reinterpret_cast<void*>(0x10000008); }},
      {"args.x_stride (128) is smaller than a row", [](Fake& f) { f.args.x_stride = 128; }},
      {"args.x_stride (260) is not a multiple of 8", [](Fake& f) { f.args.x_stride = 260; }},
      {"args.weight is null", [](Fake& f) { f.args.weight = nullptr; }},
      {"args.weight_stride (260) is not", [](Fake& f) { f.args.weight_stride = 260; }},
      {"args.norm_weight is null but spec.norm is rms",
       [](Fake& f) { f.args.norm_weight = nullptr; }},
      {"args.norm_eps (-1)", [](Fake& f) { f.args.norm_eps = -1; }},
      {"args.bias (0x30100001) is not aligned to its 2-byte elements",
       [](Fake& f) { f.args.bias = reinterpret_cast<void*>(0x30100001); }},
      {"args.q and args.bias overlap",
       [](Fake& f) { f.args.bias = static_cast<char*>(f.args.q.data) + 1024; }},
      {"args.bias is set: the unfused path's GEMM takes no bias",
       [](Fake& f) {
         f.args.bias = reinterpret_cast<void*>(0x30100000);
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"args.norm_eps (1e+300)", [](Fake& f) { f.args.norm_eps = 1e300; }},
      {"args.x: 4 rows of 4611686018427387904 elements overflow",
       [](Fake& f) { f.args.x_stride = int64_t(1) << 62; }},
      {"args.q.heads (3) must be 4", [](Fake& f) { f.args.q.heads = 3; }},
      {"args.v.data is null", [](Fake& f) { f.args.v.data = nullptr; }},
      {"args.k.stride_head (64) makes rows overlap", [](Fake& f) { f.args.k.stride_head = 64; }},
      {"args.q and args.k overlap",
       [](Fake& f) { f.args.k.data = static_cast<char*>(f.args.q.data) + 2 * 128 * 2; }},
      {"args.q and args.x overlap", [](Fake& f) { f.args.q.data = const_cast<void*>(f.args.x); }},
      {"args.v and args.weight overlap",
       [](Fake& f) { f.args.v.data = static_cast<char*>(const_cast<void*>(f.args.weight)) + 64; }},
      {"args.position_ids is null", [](Fake& f) { f.args.position_ids = nullptr; }},
      {"args.table_rows (0)", [](Fake& f) { f.args.table_rows = 0; }},
      {"args.cos is null", [](Fake& f) { f.args.cos = nullptr; }},
      {"args.base (1)",
       [](Fake& f) {
         f.spec.freqs = Freqs::computed;
         f.args.base = 1.0;
       }},
      {"args.position_offset (-5)",
       [](Fake& f) {
         f.spec.positions = Positions::offset;
         f.args.position_offset = -5;
       }},
      {"args.path (7) is not a known value", [](Fake& f) { f.args.path = ProjPath(7); }},
      {"args.workspace is null; the unfused path needs 33556480 bytes",
       [](Fake& f) { f.args.path = ProjPath::unfused; }},
      {"args.workspace_bytes (4096) is smaller than the 33556480 bytes",
       [](Fake& f) {
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = 4096;
       }},
      {"args.k.stride_head (136) is not head_dim (128)",
       [](Fake& f) {
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = size_t(64) << 20;
         f.args.k = Tensor{reinterpret_cast<void*>(0x48000000), 2, 0, 2 * 136, 136};
       }},
      {"args.workspace (0x80000010) is not 256-byte aligned",
       [](Fake& f) {
         f.args.workspace = reinterpret_cast<void*>(0x80000010);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"args.workspace and args.x overlap",
       [](Fake& f) {
         f.args.workspace = reinterpret_cast<void*>(0x0f000000);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"args.workspace and args.q overlap",
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
  // A KV cache (slots): k and v also go to pages of 16 slots, 2 heads of 128.
  auto cached = [](Fake& f) {
    f.spec.cache = KvCache::slots;
    KvCacheArgs& kc = f.args.cache;
    kc.k = reinterpret_cast<void*>(0x90000000);
    kc.v = reinterpret_cast<void*>(0xa0000000);
    kc.pages = 8;
    kc.page_size = 16;
    kc.stride_page = 16 * 256;
    kc.stride_slot = 256;
    kc.stride_head = 128;
    kc.slot_mapping = reinterpret_cast<const int64_t*>(0xb0000000);
  };
  const std::vector<Bad> cache_cases = {
      {"args.cache.pages (0) must be >= 1", [](Fake& f) { f.args.cache.pages = 0; }},
      {"args.cache.page_size (0) must be >= 1", [](Fake& f) { f.args.cache.page_size = 0; }},
      {"args.cache.v is null: the projection appends k and v",
       [](Fake& f) { f.args.cache.v = nullptr; }},
      {"args.cache.k.data is null", [](Fake& f) { f.args.cache.k = nullptr; }},
      {"args.cache.slot_mapping is null but spec.cache is slots",
       [](Fake& f) { f.args.cache.slot_mapping = nullptr; }},
      {"args.cache.slot_mapping (0xb0000004) is not aligned",
       [](Fake& f) { f.args.cache.slot_mapping = reinterpret_cast<const int64_t*>(0xb0000004); }},
      {"args.cache.skipped (0xc0000002) is not 4-byte aligned",
       [](Fake& f) { f.args.cache.skipped = reinterpret_cast<int32_t*>(0xc0000002); }},
      {"args.cache.k_quant_scale (0) must be a finite number > 0",
       [](Fake& f) {
         f.spec.cache_store = Store::e4m3;
         f.args.cache.k_quant_scale = 0;
       }},
      {"args.q and args.cache.v overlap", [](Fake& f) { f.args.cache.v = f.args.q.data; }},
      {"args.cache.k and args.cache.v overlap",
       [](Fake& f) { f.args.cache.v = static_cast<char*>(f.args.cache.k) + 64; }},
      {"args.q and args.cache.slot_mapping overlap",  // an input under an output
       [](Fake& f) { f.args.cache.slot_mapping = static_cast<const int64_t*>(f.args.q.data); }},
      {"args.k.data is null (the cache only): the unfused path's GEMM writes k and v",
       [](Fake& f) {
         f.args.k.data = f.args.v.data = nullptr;
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"args.cu_seqlens is given but spec.cache is slots",
       [](Fake& f) {
         f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
         f.args.batch = 2;
       }},
  };
  {
    // With k and v written too, a slots cache takes the unfused path (the fused RoPE key
    // appends after the GEMM).
    Fake f;
    cached(f);
    f.args.path = ProjPath::unfused;
    f.args.workspace = reinterpret_cast<void*>(0x80000000);
    f.args.workspace_bytes = size_t(64) << 20;
    CHECK(f.check().empty());
    const QkvProjSpec c = f.spec.canonical();
    const Spec rs = detail::proj_rope_spec(c, f.args);
    CHECK(rs.cache == KvCache::slots);
    CHECK(rs.layout == Layout::bshd);
    CHECK(detail::proj_rope_args(c, f.args).seq_len == 4);
  }
  {
    Fake f;
    f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
    f.args.batch = 2;
    CHECK(contains(f.check(), "args.cu_seqlens is given but spec.cache is none"));
  }
  {
    // A dynamic FP8 cache: the unfused path only, its RoPE step checking the scales. Path
    // queries need no GPU for such a key.
    Fake f;
    cached(f);
    f.spec.cache_store = Store::e4m3_dynamic;
    f.args.cache.k_scales = reinterpret_cast<float*>(0xd0000000);
    f.args.cache.v_scales = reinterpret_cast<float*>(0xd1000000);
    f.args.cache.scale_stride_page = 16 * 2;
    f.args.cache.scale_stride_slot = 2;
    f.args.cache.scale_stride_head = 1;
    CHECK(f.check().empty());
    CHECK(qkv_projection_path(f.spec, f.args) == ProjPath::unfused);
    f.args.path = ProjPath::fused;
    CHECK(contains(error_of([&] { qkv_projection_path(f.spec, f.args); }),
                   "args.path is fused, but spec.cache_store (e4m3dyn)"));
    f.args.path = ProjPath::automatic;
    f.args.cache.v_scales = nullptr;
    CHECK(contains(f.check(), "args.cache.v_scales.data is null"));
    // The scales are written: they overlap no input or output.
    f.args.cache.v_scales = static_cast<float*>(const_cast<void*>(f.args.x));
    CHECK(contains(f.check(), "args.cache.v_scales and args.x overlap"));
    f.args.cache.v_scales = reinterpret_cast<float*>(f.args.cache.k_scales) + 8;
    CHECK(contains(f.check(), "args.cache.k_scales and args.cache.v_scales overlap"));
    // A call without a workspace is refused before the driver is touched, with both reasons.
    f.args.cache.v_scales = reinterpret_cast<float*>(0xd1000000);
    const std::string why = error_of([&] { qkv_projection(f.spec, f.args); });
    CHECK_MESSAGE(contains(why, "args.workspace is null; the unfused path needs"), why);
    CHECK_MESSAGE(contains(why, "has the unfused path only: spec.cache_store (e4m3dyn)"), why);
  }
  {
    Fake f;
    cached(f);
    CHECK(f.check().empty());
    f.args.k.data = f.args.v.data = nullptr;  // the cache only
    CHECK(f.check().empty());
    f.spec.cache = KvCache::none;
    CHECK(contains(f.check(), "args.k.data is null"));
  }
  for (const Bad& b : cache_cases) {
    Fake f;
    cached(f);
    b.edit(f);
    const std::string why = f.check();
    CHECK_MESSAGE(contains(why, b.expect), std::string(b.expect), " -> '", why, "'");
  }
  // Paged (each token the newest of its sequence) and contiguous addressing.
  auto paged = [&](Fake& f) {
    cached(f);
    f.spec.cache = KvCache::paged;
    f.args.cache.slot_mapping = nullptr;
    f.args.cache.indptr = reinterpret_cast<const int32_t*>(0xb1000000);
    f.args.cache.indices = reinterpret_cast<const int32_t*>(0xb2000000);
    f.args.cache.last_page_len = reinterpret_cast<const int32_t*>(0xb3000000);
    f.args.cache.num_indices = 8;
  };
  auto contiguous = [&](Fake& f) {
    cached(f);
    f.spec.cache = KvCache::contiguous;
    f.args.cache.slot_mapping = nullptr;
    f.args.cache.seq_lens = reinterpret_cast<const int32_t*>(0xb4000000);
  };
  {
    Fake f;
    paged(f);
    CHECK(f.check().empty());
    f = Fake{};
    contiguous(f);
    CHECK(f.check().empty());
  }
  const std::vector<std::pair<std::string, std::function<void(Fake&)>>> addressing = {
      {"args.cache.indptr is null but spec.cache is paged",
       [&](Fake& f) {
         paged(f);
         f.args.cache.indptr = nullptr;
       }},
      {"args.cache.last_page_len (0xb3000002) is not aligned",
       [&](Fake& f) {
         paged(f);
         f.args.cache.last_page_len = reinterpret_cast<const int32_t*>(0xb3000002);
       }},
      {"args.cache.num_indices (-1)",
       [&](Fake& f) {
         paged(f);
         f.args.cache.num_indices = -1;
       }},
      {"args.cache.page_size (2147483648) must be below 2^31 for a paged cache",
       [&](Fake& f) {
         paged(f);
         f.args.cache.pages = 1;
         f.args.cache.page_size = int64_t(1) << 31;
       }},
      {"args.q and args.cache.indices overlap",
       [&](Fake& f) {
         paged(f);
         f.args.cache.indices = static_cast<const int32_t*>(f.args.q.data);
       }},
      {"args.cache.seq_lens is null but spec.cache is cont",
       [&](Fake& f) {
         contiguous(f);
         f.args.cache.seq_lens = nullptr;
       }},
      {"args.cache.pages (2) holds fewer sequences than args.tokens (4)",
       [&](Fake& f) {
         contiguous(f);
         f.args.cache.pages = 2;
       }},
      {"args.cache.pages (8) holds fewer sequences than args.batch (9)",
       [&](Fake& f) {
         contiguous(f);
         f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
         f.args.batch = 9;
       }},
      {"args.cu_seqlens (0xb5000002) is not aligned",
       [&](Fake& f) {
         paged(f);
         f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000002);
         f.args.batch = 2;
       }},
      {"args.batch (0) must be in [1, 2^31 - 1) with args.cu_seqlens",
       [&](Fake& f) {
         paged(f);
         f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
       }},
      {"args.q and args.cu_seqlens overlap",
       [&](Fake& f) {
         paged(f);
         f.args.cu_seqlens = static_cast<const int32_t*>(f.args.q.data);
         f.args.batch = 2;
       }},
      {"with a paged cache and no args.cu_seqlens: the unfused path's RoPE step takes a decode",
       [&](Fake& f) {
         paged(f);
         f.spec.positions = Positions::offset;
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
      {"with args.cu_seqlens: the unfused path's RoPE step places a chunk's tokens by position",
       [&](Fake& f) {
         contiguous(f);
         f.spec.positions = Positions::offset;
         f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
         f.args.batch = 2;
         f.args.path = ProjPath::unfused;
         f.args.workspace = reinterpret_cast<void*>(0x80000000);
         f.args.workspace_bytes = size_t(64) << 20;
       }},
  };
  {
    // The unfused path's RoPE step: the fused key with the cache, a sequence per token for a
    // decode step, thd over cu_seqlens for a chunk.
    Fake f;
    paged(f);
    f.args.path = ProjPath::unfused;
    f.args.workspace = reinterpret_cast<void*>(0x80000000);
    f.args.workspace_bytes = size_t(64) << 20;
    CHECK(f.check().empty());
    const QkvProjSpec c = f.spec.canonical();
    CHECK(detail::proj_rope_spec(c, f.args).layout == Layout::bshd);
    CHECK(detail::proj_rope_args(c, f.args).batch == 4);
    CHECK(detail::proj_rope_args(c, f.args).seq_len == 1);
    CHECK(detail::proj_rope_args(c, f.args).q.stride_batch == 8 * 128);
    f.args.cu_seqlens = reinterpret_cast<const int32_t*>(0xb5000000);
    f.args.batch = 3;
    CHECK(f.check().empty());
    CHECK(detail::proj_rope_spec(c, f.args).layout == Layout::thd);
    CHECK(detail::proj_rope_args(c, f.args).batch == 3);
    CHECK(detail::proj_rope_args(c, f.args).seq_len == 4);
    CHECK(detail::proj_unfused_key(c, f.args) != detail::proj_unfused_key(c, Fake{}.args));
  }
  for (const auto& [expect, edit] : addressing) {
    Fake f;
    edit(f);
    const std::string why = f.check();
    CHECK_MESSAGE(contains(why, expect), expect, " -> '", why, "'");
  }
  // Without a norm its weight may be anything.
  Fake f;
  f.spec.norm = Norm::none;
  f.args.norm_weight = nullptr;
  CHECK(f.check().empty());
  // Zero tokens: valid, nothing to check in the outputs.
  f = Fake{};
  f.args.tokens = 0;
  CHECK(f.check().empty());
  // The unfused path with its workspace; an automatic call with gaps between heads is valid
  // (it runs fused) but the unfused path says why it cannot take it.
  f = Fake{};
  f.args.path = ProjPath::unfused;
  f.args.workspace = reinterpret_cast<void*>(0x80000000);
  f.args.workspace_bytes = qkv_projection_workspace_bytes(f.spec, f.args);
  CHECK(f.check().empty());
  f.args.path = ProjPath::automatic;
  f.args.q = Tensor{f.args.q.data, 4, 0, 4 * 136, 136};  // q alone, gaps between heads
  f.args.k = Tensor{reinterpret_cast<void*>(0x44000000), 2, 0, 2 * 128, 128};
  f.args.v = Tensor{reinterpret_cast<void*>(0x46000000), 2, 0, 2 * 128, 128};
  CHECK(f.check().empty());
  const detail::ProjShape shape = detail::check_proj_call(f.spec.canonical(), f.args);
  CHECK(contains(detail::proj_split_problem(f.spec.canonical(), f.args, shape, true),
                 "args.q.stride_head (136) is not head_dim (128)"));
}

TEST_CASE("projection: the unfused path refuses what its RoPE step would, before launching") {
  // Offset positions past the table: the fused kernel writes NaN there, the RoPE key refuses
  // the call, so the unfused path must be refused up front (an automatic call runs fused).
  Fake f;
  f.spec.positions = Positions::offset;
  f.args.position_offset = 4094;  // tokens 4094..4097 of a 4096-row table
  CHECK(f.check().empty());
  const QkvProjSpec c = f.spec.canonical();
  const detail::ProjShape shape = detail::check_proj_call(c, f.args);
  CHECK(contains(detail::proj_split_problem(c, f.args, shape, false),
                 "the unfused path's RoPE step refuses the call"));
  f.args.path = ProjPath::unfused;
  f.args.workspace = reinterpret_cast<void*>(0x80000000);
  f.args.workspace_bytes = size_t(64) << 20;
  CHECK(contains(f.check(), "the unfused path's RoPE step refuses the call"));
  // The path query does not look at the workspace, and needs no GPU for a forced path.
  Fake g;
  g.args.path = ProjPath::unfused;
  CHECK(qkv_projection_path(g.spec, g.args) == ProjPath::unfused);
  g.args.k = Tensor{reinterpret_cast<void*>(0x48000000), 2, 0, 2 * 136, 136};
  CHECK(contains(error_of([&] { qkv_projection_path(g.spec, g.args); }),
                 "args.k.stride_head (136) is not head_dim (128)"));
  g = Fake{};
  g.args.path = ProjPath::fused;
  CHECK(qkv_projection_path(g.spec, g.args) == ProjPath::fused);
}

TEST_CASE("projection: the unfused path's workspace size") {
  Fake f;
  // 4 tokens x 256 bf16 = 2048 bytes of normalized activation, 256-aligned, + 32 MiB.
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) == 2048 + (size_t(32) << 20));
  f.args.tokens = 3;
  f.args.hidden = 24;  // 144 bytes, rounded up to 256
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) == 256 + (size_t(32) << 20));
  f.spec.norm = Norm::none;  // the GEMM reads x itself
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) == size_t(32) << 20);
  f.args.hidden = 12;
  CHECK(contains(error_of([&] { qkv_projection_workspace_bytes(f.spec, f.args); }),
                 "args.hidden (12)"));
  CHECK(std::string(to_string(ProjPath::unfused)) == "unfused");
  // e4m3 weights add a chunk of dequantized rows: the whole weight ((4 + 2 * 2) heads of 128:
  // 1024 rows) up to as many rows as 64 MiB holds (a multiple of 8).
  f = Fake{};
  f.spec.weights = Weights::e4m3;
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) ==
        2048 + 1024 * 256 * 2 + (size_t(32) << 20));
  f.args.hidden = 4096 * 3;  // 24 KiB rows: 2730 rows -> 2728 fit; the weight's 1024 is one chunk
  CHECK(detail::dequant_chunk_rows(DType::bf16, f.args.hidden) == 2728);
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) ==
        4 * 4096 * 3 * 2 + 1024 * 4096 * 3 * 2 + (size_t(32) << 20));
  f.args.hidden = 65536;  // 128 KiB rows: 512 rows fill the 64 MiB, two chunks
  CHECK(detail::dequant_chunk_rows(DType::bf16, f.args.hidden) == 512);
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) ==
        4 * 65536 * 2 + (size_t(64) << 20) + (size_t(32) << 20));
  // Without heads there are no rows to size the chunk by: refused, naming them.
  f.args.kv_heads = 0;
  CHECK(contains(error_of([&] { qkv_projection_workspace_bytes(f.spec, f.args); }),
                 "args.kv_heads (0) must be in [1, 65536]"));
  // A row past the budget (2^25 bf16 elements: exactly 64 MiB) is a chunk of one row.
  CHECK(detail::dequant_chunk_rows(DType::bf16, int64_t(1) << 24) == 2);
  CHECK(detail::dequant_chunk_rows(DType::bf16, int64_t(1) << 25) == 1);
  CHECK(detail::dequant_chunk_rows(DType::bf16, (int64_t(1) << 25) + 16) == 1);
  CHECK(detail::dequant_chunk_rows(DType::f16, 16) == int64_t(1) << 21);
  CHECK(detail::dequant_workspace_bytes(DType::bf16, Weights::same, 4096, 6144) == 0);
  // Llama-3-8B: the projection's 6144 rows in one chunk; the FFN's 28672 in four of 8192.
  CHECK(detail::dequant_workspace_bytes(DType::bf16, Weights::e4m3, 4096, 6144) ==
        size_t(6144) * 4096 * 2);
  CHECK(detail::dequant_workspace_bytes(DType::bf16, Weights::e4m3, 4096, 28672) == size_t(64)
                                                                                        << 20);
  CHECK(detail::dequant_workspace_bytes(DType::bf16, Weights::e4m3, 4096, 0) == 0);
}

TEST_CASE("projection: a workspace size past size_t is refused, naming the counts") {
  Fake f;
  // 2^40 tokens x 2^24 bf16 elements is 2^65 bytes: it used to wrap to 32 MiB with no error.
  f.args.tokens = int64_t(1) << 40;
  f.args.hidden = int64_t(1) << 24;
  CHECK(contains(error_of([&] { qkv_projection_workspace_bytes(f.spec, f.args); }),
                 "args.tokens (1099511627776) x args.hidden (16777216) x 2 bytes (the normalized "
                 "activation) overflows size_t"));
  // The largest count that fits is sized exactly; the sum with cuBLASLt's scratch is checked too.
  f.args.hidden = 8;
  f.args.tokens = int64_t((SIZE_MAX - 255) / 16);
  CHECK(contains(error_of([&] { qkv_projection_workspace_bytes(f.spec, f.args); }),
                 "the unfused path's workspace for args.tokens (" + std::to_string(f.args.tokens) +
                     ") and args.hidden (8) overflows size_t"));
  f.spec.norm = Norm::none;  // no activation to hold: only the scratch
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) == size_t(32) << 20);
  // Heads the projection never uses (16-bit weights) are not multiplied.
  f.args.q_heads = INT64_MAX;
  f.args.kv_heads = INT64_MAX;
  CHECK(qkv_projection_workspace_bytes(f.spec, f.args) == size_t(32) << 20);
}

TEST_CASE("projection: a call without a driver fails with one clear message, after checking") {
  Fake f;
  f.args.hidden = 12;  // checked before the driver is touched
  CHECK(contains(error_of([&] { qkv_projection(f.spec, f.args); }), "args.hidden (12)"));
}

TEST_CASE("projection keys with a dynamic FP8 cache compile their unfused path's kernels") {
  // No fused kernel: the RMSNorm key's variants, the RoPE step's key (a decode step's, and with a
  // paged or contiguous cache a chunk's), the dequantization of e4m3 weights.
  for (const KvCache mode : {KvCache::slots, KvCache::paged})
    for (const Weights w : {Weights::same, Weights::e4m3}) {
      QkvProjSpec s;
      s.cache = mode;
      s.cache_store = Store::e4m3_dynamic;
      s.weights = w;
      std::vector<std::string> paths;
      CHECK_NOTHROW(paths = precompile(s, "sm_90"));
      const size_t rope = mode == KvCache::paged ? 2u : 1u;  // layouts: bshd, and thd for chunks
      CHECK_MESSAGE(paths.size() >= 5 + rope + (w == Weights::e4m3 ? 1u : 0u), s.key());
    }
}

TEST_CASE("projection keys compile for sm_80 and sm_90 (every default variant)" *
          doctest::test_suite("long")) {
  // A spread over the axes: dtype, head_dim/rotary_dim, style, positions, table formats and
  // computed frequencies, norms.
  struct Row {
    DType dtype;
    int32_t d, r;
    Style style;
    Positions pos;
    IndexType idx;
    Freqs freqs;
    DType table;
    TableWidth width;
    Norm norm;
  };
  const std::vector<Row> rows = {
      {DType::bf16, 128, 128, Style::neox, Positions::ids, IndexType::i64, Freqs::table, DType::f32,
       TableWidth::half, Norm::rms},
      {DType::f16, 64, 32, Style::gptj, Positions::offset, IndexType::i64, Freqs::computed,
       DType::f32, TableWidth::half, Norm::none},
      {DType::bf16, 80, 80, Style::gptj, Positions::ids, IndexType::i32, Freqs::table, DType::bf16,
       TableWidth::full, Norm::rms_one_plus},
      {DType::f16, 256, 64, Style::neox, Positions::ids, IndexType::i64, Freqs::table, DType::f16,
       TableWidth::full, Norm::rms},
      {DType::bf16, 512, 512, Style::neox, Positions::offset, IndexType::i64, Freqs::computed,
       DType::f32, TableWidth::half, Norm::rms_one_plus},
  };
  for (const Row& r : rows) {
    QkvProjSpec s;
    s.dtype = r.dtype;
    s.head_dim = r.d;
    s.rotary_dim = r.r;
    s.style = r.style;
    s.positions = r.pos;
    s.index_type = r.idx;
    s.freqs = r.freqs;
    s.table_dtype = r.table;
    s.table_width = r.width;
    s.norm = r.norm;
    const size_t row = size_t(&r - rows.data());
    if (row == 1 || row == 2) s.weights = Weights::e4m3;  // FP8 weights in both dtypes
    // A KV cache in each addressing, FP8 in one.
    if (row == 2) s.cache = KvCache::slots;
    if (row == 3) s.cache = KvCache::paged;
    if (row == 4) s.cache = KvCache::contiguous;
    if (row == 3) s.cache_store = Store::e4m3;
    for (const char* arch : {"sm_80", "sm_90"}) {
      std::vector<std::string> paths;
      CHECK_NOTHROW(paths = precompile(s, arch));
      // The fused variants, and with e4m3 weights the unfused path's dequantization kernel.
      CHECK_MESSAGE(paths.size() == (s.weights == Weights::e4m3 ? 5u : 4u), s.key(), " ", arch);
      if (api::engine().disk().enabled())  // each variant's cache file was written
        for (const std::string& path : paths) CHECK_MESSAGE(!path.empty(), s.key(), " ", arch);
      // A variant the heuristic does not pick: unrolled, two warps.
      CHECK_NOTHROW(
          api::decode_engine().image(s.canonical(), ProjVariant{4, 2, 2},
                                     detail::target_for(detail::parse_arch(arch, "arch"))));
      // Staged activations: four row groups of two warps (swapped with 16-bit weights).
      ProjVariant staged{4, 2, 1};
      staged.rows = 4;
      staged.swap = s.weights != Weights::e4m3;
      CHECK_NOTHROW(api::decode_engine().image(
          s.canonical(), staged, detail::target_for(detail::parse_arch(arch, "arch"))));
      if (s.weights == Weights::e4m3) {  // 64-element chunks at two tiles
        ProjVariant wide{2, 8, 1};
        wide.wide = true;
        CHECK_NOTHROW(api::decode_engine().image(
            s.canonical(), wide, detail::target_for(detail::parse_arch(arch, "arch"))));
      }
    }
  }
  QkvProjSpec s;
  CHECK(contains(error_of([&] { precompile(s, "sm_75"); }), "needs sm_80 or newer"));
}

TEST_CASE("projection reference: tolerances stay near one rounding of the output") {
  // The float64 reference's tolerance must stay near one rounding of the output, or a test
  // against it could not fail on small errors.
  QkvProjSpec s;
  s.freqs = Freqs::computed;
  s.positions = Positions::offset;
  oracle::ProjSizes z;
  z.tokens = 2;
  z.hidden = 512;
  oracle::ProjProblem p(s, z);
  const auto& e = p.expected();
  double worst = 0, typical = 0;
  for (size_t i = 0; i < e.value.size(); ++i) {
    const double rel = e.tol[i] / std::max(std::fabs(e.value[i]), 1e-3);
    worst = std::max(worst, rel);
    typical += rel;
  }
  typical /= double(e.value.size());
  CHECK(typical < 0.02);  // bf16's own rounding is 0.0039 relative
  CHECK(worst < 2.0);     // near-zero values get the absolute part only
}

TEST_CASE("projection reference, unfused path: within a few roundings of the output") {
  // Three roundings (normalized activation, projection, RoPE) and cuBLASLt's accumulation: the
  // tolerance is wider than the fused path's but still a few bf16 roundings on typical values.
  QkvProjSpec s;
  s.freqs = Freqs::computed;
  s.positions = Positions::offset;
  oracle::ProjSizes z;
  z.tokens = 2;
  z.hidden = 512;
  z.path = ProjPath::unfused;
  oracle::ProjProblem p(s, z);
  const auto& e = p.expected_unfused();
  REQUIRE(e.value.size() == size_t(2 * 8 * 128));
  double typical = 0;
  for (size_t i = 0; i < e.value.size(); ++i)
    typical += e.tol[i] / std::max(std::fabs(e.value[i]), 1e-3);
  typical /= double(e.value.size());
  CHECK(typical < 0.06);
  CHECK(p.expected().value.empty());  // only the path asked for is built
}

TEST_CASE("RMSNorm keys: validation, golden strings, round trip") {
  RmsNormSpec s;
  CHECK(s.key() == "rmsnorm_bf16_nrms");
  s.dtype = DType::f16;
  s.norm = Norm::rms_one_plus;
  s.residual = true;
  CHECK(s.key() == "rmsnorm_f16_nrms1p_res");
  CHECK(parse_rms_norm_key(s.key()) == s);
  CHECK(parse_rms_norm_key("rmsnorm_f32_nrms") == RmsNormSpec{DType::f32, Norm::rms, false});
  for (const char* bad : {"rmsnorm_bf16", "rmsnorm_bf16_nrmsall", "rmsnorm_bf16_nrms_add",
                          "rmsnorm_bf17_nrms", "rope_bf16_nrms"})
    CHECK_MESSAGE(!error_of([&] { parse_rms_norm_key(bad); }).empty(), bad);
  s = RmsNormSpec{};
  s.norm = Norm::none;
  CHECK(contains(error_of([&] { s.validate(); }), "spec.norm (none) must be rms or rms1p"));
}

TEST_CASE("RMSNorm calls: every bad argument is named") {
  const RmsNormSpec spec{DType::bf16, Norm::rms, true};
  auto good = [] {
    RmsNormArgs a;
    a.rows = 4;
    a.hidden = 4096;
    a.x = reinterpret_cast<void*>(0x10000000);
    a.residual = reinterpret_cast<void*>(0x20000000);
    a.weight = reinterpret_cast<void*>(0x30000000);
    a.out = reinterpret_cast<void*>(0x40000000);
    return a;
  };
  auto check = [&](const RmsNormArgs& a) {
    return error_of([&] { detail::check_norm_call(spec, a); });
  };
  CHECK(check(good()).empty());
  CHECK(detail::check_norm_call(spec, good()).variant.vecs == 2);  // 512 vectors, 256 threads
  struct Bad {
    const char* expect;
    std::function<void(RmsNormArgs&)> edit;
  };
  const std::vector<Bad> cases = {
      {"args.rows (-1)", [](RmsNormArgs& a) { a.rows = -1; }},
      {"args.hidden (12) must be a multiple of 8", [](RmsNormArgs& a) { a.hidden = 12; }},
      {"args.hidden (65536)", [](RmsNormArgs& a) { a.hidden = 65536; }},
      {"args.norm_eps (-1)", [](RmsNormArgs& a) { a.norm_eps = -1; }},
      {"args.x is null", [](RmsNormArgs& a) { a.x = nullptr; }},
      {"args.residual is null", [](RmsNormArgs& a) { a.residual = nullptr; }},
      {"args.weight (0x30000002) is not 16-byte aligned",
       [](RmsNormArgs& a) { a.weight = reinterpret_cast<void*>(0x30000002); }},
      {"args.out stride (100) is not a multiple of 8", [](RmsNormArgs& a) { a.out_stride = 100; }},
      {"args.out stride (1024) makes rows overlap", [](RmsNormArgs& a) { a.out_stride = 1024; }},
      {"args.residual and args.out overlap",
       [](RmsNormArgs& a) { a.out = static_cast<char*>(a.residual) + 64; }},
      {"args.x and args.out overlap",
       [](RmsNormArgs& a) { a.out = static_cast<char*>(const_cast<void*>(a.x)) + 16; }},
  };
  for (const Bad& b : cases) {
    RmsNormArgs a = good();
    b.edit(a);
    const std::string why = check(a);
    CHECK_MESSAGE(contains(why, b.expect), std::string(b.expect), " -> '", why, "'");
  }
  RmsNormArgs in_place = good();
  in_place.out = const_cast<void*>(in_place.x);
  CHECK(check(in_place).empty());
}

TEST_CASE("RMSNorm keys compile for sm_80 and sm_90 (every row-length variant)" *
          doctest::test_suite("long")) {
  for (const DType t : {DType::bf16, DType::f16, DType::f32})
    for (const Norm n : {Norm::rms, Norm::rms_one_plus})
      for (const bool res : {false, true}) {
        const RmsNormSpec s{t, n, res};
        for (const char* arch : {"sm_80", "sm_90"}) {
          std::vector<std::string> paths;
          CHECK_NOTHROW(paths = precompile(s, arch));
          CHECK_MESSAGE(paths.size() == 5, s.key(), " ", arch);
          if (api::engine().disk().enabled())
            for (const std::string& path : paths) CHECK_MESSAGE(!path.empty(), s.key(), " ", arch);
        }
      }
}

TEST_CASE("projection and FFN heuristic paths: fused up to 32 / 16 tokens, e4m3 weights up to 64") {
  detail::DeviceInfo h100;
  h100.cc = 90;
  h100.sm_count = 132;
  QkvProjSpec p = QkvProjSpec{}.canonical();
  FfnSpec f = FfnSpec{}.canonical();
  for (const Weights w : {Weights::same, Weights::e4m3}) {
    p.weights = f.weights = w;
    // e4m3 weights: the fused kernel reads half the bytes and wins up to 64 tokens; 16-bit
    // weights: the projection up to 32, the FFN up to 16.
    const int64_t last_proj = w == Weights::e4m3 ? 64 : 32;
    const int64_t last_ffn = w == Weights::e4m3 ? 64 : 16;
    for (const int64_t tokens : {int64_t(1), int64_t(16), int64_t(17), int64_t(32), int64_t(33),
                                 int64_t(64), int64_t(65), int64_t(4096)}) {
      const detail::ProjShape proj{tokens, 4096, 32, 8, (32 + 2 * 8) * 128 / 2};
      CHECK_MESSAGE(autotune::proj_heuristic_path(p, proj, h100) ==
                        (tokens <= last_proj ? ProjPath::fused : ProjPath::unfused),
                    p.key(), " ", tokens);
      const detail::ProjShape ffn{tokens, 4096, 0, 0, 14336};
      CHECK_MESSAGE(autotune::ffn_heuristic_path(f, ffn, h100) ==
                        (tokens <= last_ffn ? ProjPath::fused : ProjPath::unfused),
                    f.key(), " ", tokens);
    }
  }
}
