// MLA on the GPU: the latent cache row and the query against the float64 reference
// (oracle/mla/mla_workload.cpp) on fresh random inputs; the cache and q_out poisoned, gaps and
// guard bytes checked untouched, padding and out-of-cache slots, positions past the table;
// every axis of the key, DeepSeek-V3's and Kimi K2's shapes, a CUDA graph replay.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "gpu_helpers.hpp"
#include "oracle/mla/mla_workload.hpp"

using namespace ropejit;

namespace {

void run_and_check(const MlaSpec& s, const oracle::MlaSizes& z, const std::string& what) {
  oracle::MlaProblem p(s, z);
  p.upload();
  mla_prepare(s, p.args());
  const oracle::CheckReport r = p.check();
  CHECK_MESSAGE(r.ok, what, ": ", r.mismatches, " wrong of ", r.checked, "; ", r.first_failure);
  CHECK_MESSAGE(r.checked > 0, what);
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("MLA: every axis against float64 (dtype, ranks, rope widths, styles, stores)") {
    testing::use_primary_context();
    // kv_rank past 1024 takes a thread more than one vector of kv_c; rope_dim 320 more pairs
    // than threads.
    const int32_t shapes[][2] = {{512, 64},   {256, 32},  {72, 2},    {128, 64},
                                 {1024, 128}, {1032, 64}, {4096, 16}, {128, 320}};
    int n = 0;
    for (const auto& rp : shapes)
      for (const DType dt : {DType::bf16, DType::f16})
        for (const MlaQuery q : {MlaQuery::in_place, MlaQuery::assemble}) {
          ++n;
          MlaSpec s;
          s.dtype = dt;
          s.kv_rank = rp[0];
          s.rope_dim = rp[1];
          s.style = (n / 4) % 2 ? Style::neox : Style::gptj;
          s.index_type = (n / 2) % 2 ? IndexType::i32 : IndexType::i64;
          s.table_dtype = n % 3 == 0 ? DType::bf16 : DType::f32;
          s.norm = (n / 2) % 3 == 1 ? Norm::none : Norm::rms;
          s.cache_store = (n / 3) % 2 ? Store::e4m3 : Store::same;
          s.query = q;
          if (q == MlaQuery::assemble && n % 5 < 2) s.q_store = Store::e4m3;
          oracle::MlaSizes z;
          z.tokens = 1 + (n * 7) % 23;
          z.heads = n % 6 == 5 ? 0 : 1 + (n * 5) % 17;
          z.cache_slots = z.tokens + 5;
          z.table_rows = 40 + n;
          z.row_gap = n % 4 == 1 ? 8 : 0;
          z.head_gap = n % 4 == 2 ? 3 : 0;
          z.table_gap = n % 5 == 4 ? 3 : 0;
          z.padded = z.tokens > 3 ? 1 : 0;
          z.bad_slots = z.tokens > 5 ? 1 + n % 2 : 0;
          z.off_table = z.tokens > 8 ? 2 : 0;  // one past the table, one negative
          z.seed = uint64_t(8000 + n);
          run_and_check(s, z,
                        s.key() + " tokens " + std::to_string(z.tokens) + " heads " +
                            std::to_string(z.heads));
        }
  }

  TEST_CASE(
      "MLA: scales that multiply, k_pe out or in place, the rope parts' own outputs, blocks") {
    testing::use_primary_context();
    // FlashInfer's and vLLM's interfaces: e4m3 codes of value × scale, rope(k_pe) for every
    // token (padding and skipped slots too), kpe's own cache, rows by token and a page table.
    using Addr = oracle::MlaSizes::Addressing;
    using Kpe = oracle::MlaSizes::KpeOut;
    int n = 0;
    for (const Addr addr : {Addr::slots, Addr::rows_by_token, Addr::page_table})
      for (const Kpe kpe : {Kpe::none, Kpe::own, Kpe::in_place})
        for (const bool cache_pe : {false, true}) {
          ++n;
          MlaSpec s;
          s.dtype = n % 2 ? DType::bf16 : DType::f16;
          s.style = n % 3 ? Style::gptj : Style::neox;
          s.norm = n % 4 == 1 ? Norm::none : Norm::rms;
          s.kv_rank = n % 5 == 2 ? 128 : 512;
          s.cache_store = n % 3 == 1 ? Store::same : Store::e4m3;
          s.query = n % 2 ? MlaQuery::assemble : MlaQuery::in_place;
          if (s.query == MlaQuery::assemble && n % 4 != 3) s.q_store = Store::e4m3;
          s.scale_multiplies = s.cache_store == Store::e4m3 || s.q_store == Store::e4m3;
          oracle::MlaSizes z;
          z.tokens = 3 + (n * 5) % 19;
          z.heads = 1 + n % 16;
          z.cache_slots = z.tokens + 6;
          z.table_rows = 50;
          z.row_gap = n % 3 == 2 ? 8 : 0;
          z.padded = addr == Addr::rows_by_token ? 0 : 1 + n % 2;
          z.bad_slots = addr == Addr::rows_by_token ? 0 : std::min<int64_t>(3, z.tokens - 3);
          z.off_table = z.tokens > 8 ? 2 : 0;
          z.k_pe_out = kpe;
          z.cache_pe = cache_pe;
          z.q_out_pe = cache_pe;  // FlashInfer's outputs: both parts in tensors of their own
          z.addressing = addr;
          z.page_size = n % 2 ? 1 : 4;
          // vLLM's blocks a stride of their own apart (a per-layer view of one cache).
          z.block_size = n % 3 == 0 ? 4 : 0;
          z.block_gap = 24;
          z.cache_scale = 20.0f;  // FlashInfer's scales are reciprocals: × 20 fits e4m3
          z.q_scale = 30.0f;
          if (!s.scale_multiplies) z.cache_scale = z.q_scale = 0.05f;
          z.seed = uint64_t(7000 + n);
          run_and_check(
              s, z, s.key() + " case " + std::to_string(n) + " tokens " + std::to_string(z.tokens));
        }
  }

  TEST_CASE("MLA: model shapes (DeepSeek-V3 at TP 8 and whole, Kimi K2), decode and prefill") {
    testing::use_primary_context();
    for (const int64_t heads : {16, 128, 64})
      for (const int64_t tokens : {1, 64, 300}) {
        MlaSpec s;  // kv_rank 512, rope 64, gptj: DeepSeek's
        s.query = tokens == 1 ? MlaQuery::assemble : MlaQuery::in_place;
        s.cache_store = heads == 64 ? Store::e4m3 : Store::same;
        if (s.query == MlaQuery::assemble && heads == 64) s.q_store = Store::e4m3;
        oracle::MlaSizes z;
        z.tokens = tokens;
        z.heads = heads;
        z.cache_slots = tokens + 16;
        z.table_rows = 4096;
        z.seed = uint64_t(heads * 1000 + tokens);
        run_and_check(
            s, z,
            s.key() + " heads " + std::to_string(heads) + " tokens " + std::to_string(tokens));
      }
  }

  TEST_CASE("MLA: a prefill's query blocks of several tokens (a partial last one)") {
    testing::use_primary_context();
    // Enough tokens that a query block takes several (jit/mla/mla.cpp, make_mla_params), a
    // count that leaves the last block short, positions off the table and slots outside the
    // cache among them; q_pe aligned (16-byte vectors) and not (a gap of 3 elements a head).
    int n = 0;
    for (const Style style : {Style::gptj, Style::neox})
      for (const int64_t head_gap : {0, 3}) {
        MlaSpec s;
        s.style = style;
        s.query = ++n % 2 ? MlaQuery::in_place : MlaQuery::assemble;
        oracle::MlaSizes z;
        z.tokens = 4099;
        z.heads = 16;
        z.cache_slots = z.tokens + 16;
        z.table_rows = 4096;
        z.head_gap = head_gap;
        z.padded = 3;
        z.bad_slots = 2;
        z.off_table = 2;
        z.seed = uint64_t(9000 + n);
        run_and_check(s, z, s.key() + " head gap " + std::to_string(head_gap));
      }
  }

  TEST_CASE("MLA: the cache alone, and the query alone") {
    testing::use_primary_context();
    MlaSpec s;
    oracle::MlaSizes z;
    z.heads = 0;  // the latent cache row only
    z.tokens = 9;
    z.padded = 2;
    z.bad_slots = 1;
    run_and_check(s, z, "cache only");
    z = oracle::MlaSizes{};
    z.with_cache = false;  // q_pe only: the cache untouched, nothing counted
    s.query = MlaQuery::assemble;
    run_and_check(s, z, "query only");
  }

  TEST_CASE("MLA: a decode step captured in a CUDA graph and replayed") {
    testing::use_primary_context();
    MlaSpec s;
    s.query = MlaQuery::assemble;
    s.cache_store = Store::e4m3;
    s.q_store = Store::e4m3;
    oracle::MlaSizes z;
    z.tokens = 8;
    z.heads = 16;
    oracle::MlaProblem p(s, z);
    p.upload();
    mla_prepare(s, p.args());  // the key's first use, outside the capture
    p.upload();                // fresh outputs: the replay alone must produce them
    const detail::Driver& d = detail::driver();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    testing::capture_and_replay(stream, [&] { mla_prepare(s, p.args(stream)); });
    const oracle::CheckReport r = p.check();
    CHECK_MESSAGE(r.ok, r.first_failure);
    CHECK(r.checked > 0);
    d.StreamDestroy(stream);
  }
}
