// MLA on the CPU: spec validation and golden keys, the key parser, call checks naming each bad
// argument (nothing launched), and NVRTC compilation of the kernel for sm_80 and sm_90 over the
// key's axes.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "jit/family.hpp"
#include "jit/mla/mla.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

using testing::contains;
using testing::error_of;

// A valid decode call on made-up device addresses (nothing is dereferenced when checking).
struct Fake {
  MlaSpec spec;
  MlaArgs args;
  explicit Fake(MlaQuery query = MlaQuery::in_place) {
    spec.query = query;
    args.tokens = 4;
    args.heads = 16;
    args.kv_c = reinterpret_cast<const void*>(0x100000);
    args.k_pe = reinterpret_cast<const void*>(0x200000);
    args.norm_weight = reinterpret_cast<const void*>(0x300000);
    args.cache = reinterpret_cast<void*>(0x400000);
    args.cache_slots = 64;
    args.slots = reinterpret_cast<const int64_t*>(0x500000);
    args.q_pe = reinterpret_cast<void*>(0x600000);
    if (query == MlaQuery::assemble) {
      args.q_nope = reinterpret_cast<const void*>(0x700000);
      args.q_out = reinterpret_cast<void*>(0x800000);
    }
    args.position_ids = reinterpret_cast<const void*>(0x900000);
    args.cos = reinterpret_cast<const void*>(0xa00000);
    args.sin = reinterpret_cast<const void*>(0xb00000);
    args.table_rows = 4096;
  }
  // The library's own call check, without the launch a valid call would make on a GPU host.
  std::string error() const {
    return error_of([&] { detail::check_mla_call(spec.canonical(), args); });
  }
};

}  // namespace

TEST_CASE("MLA keys: golden keys, the parser round-trips them and rejects others") {
  MlaSpec s;
  CHECK(s.key() == "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip");
  s.dtype = DType::f16;
  s.kv_rank = 256;
  s.rope_dim = 32;
  s.style = Style::neox;
  s.index_type = IndexType::i32;
  s.table_dtype = DType::bf16;
  s.norm = Norm::none;
  s.cache_store = Store::e4m3;
  s.query = MlaQuery::assemble;
  s.q_store = Store::e4m3;
  CHECK(s.key() == "mla_f16_r256_p32_neox_ids-i32_tab-bf16_nnone_ce4m3_qasm-e4m3");
  CHECK(parse_mla_key(s.key()) == s);
  CHECK(parse_mla_key(MlaSpec{}.key()) == MlaSpec{});
  s.scale_multiplies = true;  // FlashInfer's scales
  CHECK(s.key() == "mla_f16_r256_p32_neox_ids-i32_tab-bf16_nnone_ce4m3_qasm-e4m3_smul");
  CHECK(parse_mla_key(s.key()) == s);
  CHECK(contains(
      error_of([] { parse_mla_key("mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip_smul"); }),
      "spec.scale_multiplies is set but no store is e4m3"));
  CHECK(contains(
      error_of([] { parse_mla_key("mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qip_smu"); }),
      "is not an MLA key"));
  CHECK(contains(error_of([] { parse_mla_key("mla_bf16_r512"); }), "is not an MLA key"));
  CHECK(contains(
      error_of([] { parse_mla_key("mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip-e4m3"); }),
      "spec.q_store (e4m3) needs spec.query assemble"));
  CHECK(contains(
      error_of([] { parse_mla_key("mla_bf16_r0512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip"); }),
      "not canonical"));
  CHECK(contains(
      error_of([] { parse_mla_key("mla_bf16_r512_p64_gptj_pos-i64_tab-f32_nrms_csame_qip"); }),
      "is not an MLA key"));
  CHECK(detail::family_of(MlaSpec{}.key()) == detail::Family::mla);
}

TEST_CASE("MLA specs: each bad field is named") {
  auto err = [](const std::function<void(MlaSpec&)>& edit) {
    MlaSpec s;
    edit(s);
    return error_of([&] { s.validate(); });
  };
  CHECK(contains(err([](MlaSpec& s) { s.dtype = DType::f32; }), "spec.dtype (f32)"));
  CHECK(contains(err([](MlaSpec& s) { s.kv_rank = 100; }),
                 "spec.kv_rank (100) must be a multiple of 8"));
  CHECK(contains(err([](MlaSpec& s) { s.kv_rank = 8192; }), "spec.kv_rank (8192)"));
  CHECK(contains(err([](MlaSpec& s) { s.rope_dim = 63; }), "spec.rope_dim (63) must be even"));
  CHECK(contains(err([](MlaSpec& s) { s.norm = Norm::rms_one_plus; }), "must be none or rms"));
  CHECK(contains(err([](MlaSpec& s) { s.cache_store = Store::e4m3_dynamic; }),
                 "spec.cache_store (e4m3dyn)"));
  CHECK(contains(err([](MlaSpec& s) { s.query = MlaQuery(7); }),
                 "spec.query (7) is not a known value"));
  CHECK(err([](MlaSpec& s) {
          s.query = MlaQuery::assemble;
          s.q_store = Store::e4m3;
        }).empty());
}

TEST_CASE("MLA calls: each bad argument is named before anything runs") {
  CHECK(Fake().error().empty());
  CHECK(Fake(MlaQuery::assemble).error().empty());
  auto err = [](const std::function<void(Fake&)>& edit, MlaQuery q = MlaQuery::in_place) {
    Fake f(q);
    edit(f);
    return f.error();
  };
  CHECK(contains(err([](Fake& f) { f.args.tokens = -1; }), "args.tokens (-1)"));
  CHECK(contains(err([](Fake& f) { f.args.heads = -2; }), "args.heads (-2)"));
  CHECK(contains(err([](Fake& f) {
                   f.args.cache = nullptr;
                   f.args.heads = 0;
                 }),
                 "would do nothing"));
  CHECK(contains(err([](Fake& f) { f.args.position_ids = nullptr; }), "args.position_ids is null"));
  CHECK(contains(err([](Fake& f) { f.args.cos = nullptr; }), "args.cos is null"));
  CHECK(contains(err([](Fake& f) { f.args.cache_slots = 0; }), "args.cache_slots (0)"));
  CHECK(contains(err([](Fake& f) { f.args.cache_stride = 100; }),
                 "args.cache_stride (100) is smaller than a row (576"));
  CHECK(contains(err([](Fake& f) { f.args.kv_c = reinterpret_cast<const void*>(0x100008); }),
                 "args.kv_c (0x100008) is not 16-byte aligned"));
  CHECK(contains(err([](Fake& f) { f.args.kv_c_stride = 516; }),
                 "args.kv_c kv_c_stride (516) is not a multiple of 8"));
  CHECK(contains(err([](Fake& f) { f.args.norm_weight = nullptr; }), "args.norm_weight is null"));
  CHECK(contains(err([](Fake& f) { f.args.norm_eps = -1; }), "norm_eps"));
  CHECK(contains(err([](Fake& f) { f.spec.cache_store = Store::e4m3; }), "args.cache_scale"));
  CHECK(contains(err([](Fake& f) { f.args.q_pe = nullptr; }), "args.q_pe is null"));
  CHECK(contains(err([](Fake& f) { f.args.q_out = nullptr; }, MlaQuery::assemble),
                 "args.q_out is null"));
  CHECK(contains(err([](Fake& f) { f.args.q_nope = nullptr; }, MlaQuery::assemble),
                 "args.q_nope is null"));
  CHECK(contains(err([](Fake& f) { f.spec.q_store = Store::e4m3; }, MlaQuery::assemble),
                 "args.q_scale"));
  // The query's output over the latent cache: refused.
  CHECK(contains(err([](Fake& f) { f.args.q_out = f.args.cache; }, MlaQuery::assemble),
                 "overlap in memory"));
  CHECK(contains(err([](Fake& f) { f.args.q_pe = const_cast<void*>(f.args.kv_c); }),
                 "overlap in memory"));
  // A small input inside a written output: refused too.
  CHECK(contains(err([](Fake& f) { f.args.position_ids = f.args.q_pe; }), "overlap in memory"));
  CHECK(contains(err([](Fake& f) { f.args.slots = static_cast<const int64_t*>(f.args.cache); }),
                 "overlap in memory"));
  // k_pe rotated in place or into k_pe_out, the rope part's own cache, the three addressings.
  CHECK(err([](Fake& f) { f.args.k_pe_out = const_cast<void*>(f.args.k_pe); }).empty());
  CHECK(contains(err([](Fake& f) {
                   f.args.k_pe_out = const_cast<void*>(f.args.k_pe);
                   f.args.k_pe_out_stride = 128;
                 }),
                 "args.k_pe_out is args.k_pe (in place) but args.k_pe_out_stride (128)"));
  CHECK(contains(err([](Fake& f) { f.args.k_pe_out = const_cast<void*>(f.args.kv_c); }),
                 "overlap in memory"));
  CHECK(contains(err([](Fake& f) {
                   f.args.cache = nullptr;
                   f.args.k_pe_out = reinterpret_cast<void*>(0xc00000);
                 }),
                 "args.k_pe_out is set but args.cache is null"));
  CHECK(err([](Fake& f) {
          f.args.cache_pe = reinterpret_cast<void*>(0xd00000);
          f.args.cache_stride = 512;
        }).empty());
  CHECK(contains(err([](Fake& f) { f.args.cache_stride = 512; }),
                 "args.cache_stride (512) is smaller than a row (576"));
  CHECK(contains(err([](Fake& f) {
                   f.args.cache_pe = reinterpret_cast<void*>(0xd00000);
                   f.args.cache_pe_stride = 32;
                 }),
                 "args.cache_pe_stride (32) is smaller than a row (64"));
  CHECK(contains(err([](Fake& f) { f.args.rows_by_token = true; }), "not 2"));
  CHECK(contains(err([](Fake& f) { f.args.slots = nullptr; }), "give exactly one, not 0"));
  CHECK(err([](Fake& f) {
          f.args.slots = nullptr;
          f.args.rows_by_token = true;
        }).empty());
  CHECK(contains(err([](Fake& f) {
                   f.args.slots = nullptr;
                   f.args.rows_by_token = true;
                   f.args.cache_slots = 3;
                 }),
                 "args.cache_slots (3) is less than args.tokens (4)"));
  auto paged = [](Fake& f) {
    f.args.slots = nullptr;
    f.args.kv_indices = reinterpret_cast<const int32_t*>(0xe00000);
    f.args.kv_indptr = reinterpret_cast<const int32_t*>(0xe10000);
    f.args.batch_indices = reinterpret_cast<const int32_t*>(0xe20000);
    f.args.page_positions = reinterpret_cast<const int32_t*>(0xe30000);
    f.args.batch = 2;
    f.args.num_indices = 8;
    f.args.page_size = 16;
  };
  CHECK(err(paged).empty());
  CHECK(contains(err([&](Fake& f) {
                   paged(f);
                   f.args.page_size = 0;
                 }),
                 "args.page_size (0)"));
  CHECK(contains(err([&](Fake& f) {
                   paged(f);
                   f.args.batch_indices = nullptr;
                 }),
                 "args.batch_indices is null"));
  CHECK(contains(err([&](Fake& f) {
                   paged(f);
                   f.args.kv_indptr = reinterpret_cast<const int32_t*>(0xe10002);
                 }),
                 "args.kv_indptr (0xe10002) is not 4-byte aligned"));
  CHECK(contains(err([&](Fake& f) {
                   paged(f);
                   f.args.page_positions = static_cast<const int32_t*>(f.args.cache);
                 }),
                 "overlap in memory"));
  // Blocks of cache rows a stride of their own apart.
  CHECK(err([](Fake& f) {
          f.args.cache_block_size = 16;
          f.args.cache_block_stride = 16 * 576 + 64;
        }).empty());
  CHECK(err([](Fake& f) { f.args.cache_block_size = 16; }).empty());  // 0: the block's rows
  CHECK(contains(err([](Fake& f) { f.args.cache_block_size = 5; }),
                 "args.cache_block_size (5) must be 0 or divide args.cache_slots (64)"));
  CHECK(contains(err([](Fake& f) { f.args.cache_block_stride = 9280; }),
                 "args.cache_block_stride (9280) or cache_pe_block_stride (0) is set but"));
  CHECK(contains(err([](Fake& f) {  // blocks over each other
                   f.args.cache_block_size = 16;
                   f.args.cache_block_stride = 8 * 576;
                 }),
                 "cache_block_stride"));
  // One tensor's columns: kv_c and k_pe split from one projection, k_pe rotated in place.
  CHECK(err([](Fake& f) {
          f.args.kv_c_stride = 576;
          f.args.k_pe = static_cast<const char*>(f.args.kv_c) + 512 * 2;
          f.args.k_pe_stride = 576;
          f.args.k_pe_out = const_cast<void*>(f.args.k_pe);
          f.args.k_pe_out_stride = 576;
        }).empty());
  CHECK(contains(err([](Fake& f) {  // k_pe's columns inside kv_c's
                   f.args.kv_c_stride = 576;
                   f.args.k_pe = static_cast<const char*>(f.args.kv_c) + 448 * 2;
                   f.args.k_pe_stride = 576;
                   f.args.k_pe_out = const_cast<void*>(f.args.k_pe);
                   f.args.k_pe_out_stride = 576;
                 }),
                 "overlap in memory"));
  // No tokens: nothing to check past the counts, nothing runs.
  CHECK(err([](Fake& f) {
          f.args.tokens = 0;
          f.args.cache = nullptr;
        }).empty());
}

TEST_CASE("MLA's grid covers every cache row and every query head of every token once") {
  // The block walk the kernel does (templates/mla_kernel.cuh, run): cache rows a warp each,
  // then tiles of tokens_per_block tokens by heads_per_block heads.
  struct Case {
    int64_t tokens, heads;
    int sms;
    bool cache;
    MlaQuery query;
  };
  const Case cases[] = {
      {1, 16, 132, true, MlaQuery::assemble},    {3, 17, 132, true, MlaQuery::in_place},
      {64, 16, 132, true, MlaQuery::assemble},   {300, 128, 132, false, MlaQuery::in_place},
      {4096, 16, 132, true, MlaQuery::in_place}, {32771, 16, 114, true, MlaQuery::in_place},
      {5000, 1, 132, true, MlaQuery::assemble},  {7, 0, 132, true, MlaQuery::in_place},
      {2, 3000, 1, true, MlaQuery::assemble}};
  for (const Case& k : cases) {
    Fake f(k.query);
    f.args.tokens = k.tokens;
    f.args.heads = k.heads;
    if (!k.cache) f.args.cache = nullptr;
    unsigned blocks = 0;
    const ropejit_dev::MlaParams p =
        detail::make_mla_params(f.spec.canonical(), f.args, k.sms, &blocks);
    const std::string what =
        "tokens " + std::to_string(k.tokens) + " heads " + std::to_string(k.heads);
    CHECK_MESSAGE(p.cache_blocks == (k.cache ? (k.tokens + 3) / 4 : 0), what);
    std::vector<int> rows(size_t(k.tokens), 0), heads(size_t(k.tokens * k.heads), 0);
    for (int64_t b = 0; b < p.cache_blocks; ++b)
      for (int64_t w = 0; w < detail::kMlaWarps; ++w)
        if (b * detail::kMlaWarps + w < k.tokens) ++rows[size_t(b * detail::kMlaWarps + w)];
    for (int64_t qb = 0; qb < int64_t(blocks) - p.cache_blocks; ++qb) {
      const int64_t t0 = qb / p.head_groups * p.tokens_per_block,
                    h0 = qb % p.head_groups * p.heads_per_block;
      for (int64_t t = t0; t < std::min<int64_t>(t0 + p.tokens_per_block, k.tokens); ++t)
        for (int64_t h = h0; h < std::min<int64_t>(h0 + p.heads_per_block, k.heads); ++h)
          ++heads[size_t(t * k.heads + h)];
    }
    for (int r : rows) CHECK_MESSAGE(r == (k.cache ? 1 : 0), what);
    for (int h : heads) CHECK_MESSAGE(h == 1, what);
    if (k.heads == 0) CHECK_MESSAGE(int64_t(blocks) == p.cache_blocks, what);
    // Decode spreads a step's heads; prefill gives a block several tokens.
    if (k.tokens == 1 && k.heads == 16) CHECK_MESSAGE(p.head_groups == 16, what);
    if (k.tokens == 4096) CHECK_MESSAGE(p.tokens_per_block > 1, what);
  }
  // The grid's block count stays in range at the largest token count.
  Fake f;
  f.args.tokens = (int64_t(1) << 30) + 1;
  CHECK(contains(error_of([&] { detail::check_mla_call(f.spec.canonical(), f.args); }),
                 "args.tokens (1073741825) must be in [0, 1073741824]"));
}

TEST_CASE("MLA keys compile for sm_80 and sm_90 over their axes") {
  std::vector<MlaSpec> specs(7);
  specs[6].cache_store = Store::e4m3;
  specs[6].query = MlaQuery::assemble;
  specs[6].q_store = Store::e4m3;
  specs[6].scale_multiplies = true;
  specs[1].dtype = DType::f16;
  specs[1].style = Style::neox;
  specs[1].index_type = IndexType::i32;
  specs[2].cache_store = Store::e4m3;
  specs[2].query = MlaQuery::assemble;
  specs[2].q_store = Store::e4m3;
  specs[3].kv_rank = 72;
  specs[3].rope_dim = 2;
  specs[3].norm = Norm::none;
  specs[3].table_dtype = DType::bf16;
  specs[4].kv_rank = 4096;
  specs[4].rope_dim = 512;
  specs[4].query = MlaQuery::assemble;
  specs[5].kv_rank = 128;
  specs[5].rope_dim = 64;
  specs[5].table_dtype = DType::f16;
  specs[5].query = MlaQuery::assemble;
  for (const MlaSpec& s : specs)
    for (const char* arch : {"sm_80", "sm_90"}) {
      std::vector<std::string> paths;
      CHECK_MESSAGE(error_of([&] { paths = precompile(s, arch); }) == "", s.key(), " ", arch);
      CHECK_MESSAGE(paths.size() == 1u, s.key(), " ", arch);
    }
  // The entry the engine looks up is the one rendered.
  const detail::RenderedKernel r = detail::render(specs[2].canonical());
  CHECK(r.entry == detail::entry_name(specs[2].key(), detail::mla_variant_name()));
  CHECK(contains(r.source, r.entry + "("));
  const std::string source = r.source;
  CHECK(contains(source, "kCacheE4m3 = true"));
  CHECK(contains(source, "kAssemble = true"));
  CHECK(contains(source, "kRank = 512"));
}
