// The fused keys on the GPU: QK-norm -> RoPE -> FP8 -> KV-cache append against the float64
// reference of the whole chain, with poisoned outputs, guard bytes after every allocation and
// after every cache page, every cache byte the call does not address checked unchanged, FP8
// bits compared exactly (up to the fp32 rounding boundary, see oracle/reference.cpp), and the
// skipped-token counter checked.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuner.hpp"
#include "autotune/tuning_cache.hpp"
#include "gpu_helpers.hpp"
#include "jit/call.hpp"
#include "oracle/workload.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

struct Case {
  Spec spec;
  oracle::Sizes sizes;
};

// Deterministic spread over the fused axes crossed with the plain ones: every value of every
// axis many times, in changing company (a mixed-radix counter with coprime strides).
std::vector<Case> fused_cases() {
  const int dims[][2] = {{64, 64},  {72, 72},  {80, 32},   {96, 96},   {128, 128},
                         {128, 64}, {192, 64}, {256, 256}, {512, 512}, {256, 64}};
  const Layout layouts[] = {Layout::bshd, Layout::sbhd, Layout::bhsd, Layout::thd};
  const DType dtypes[] = {DType::bf16, DType::f16, DType::f32};
  const Positions positions[] = {Positions::ids, Positions::offset, Positions::seq_offsets};
  const Norm norms[] = {Norm::rms, Norm::none, Norm::rms_one_plus, Norm::rms_all_heads};
  const KvCache caches[] = {KvCache::paged, KvCache::none, KvCache::slots, KvCache::contiguous};
  std::vector<Case> out;
  for (uint64_t n = 0; n < 480; ++n) {
    Case c;
    Spec& s = c.spec;
    s.layout = layouts[n % 4];
    s.dtype = dtypes[(n / 4) % 3];
    const int* dim = dims[(n * 7) % 10];
    s.head_dim = dim[0];
    s.rotary_dim = dim[1];
    s.style = (n / 3) % 2 ? Style::gptj : Style::neox;
    s.positions = positions[(n * 5 / 2) % 3];
    s.index_type = n % 5 < 2 ? IndexType::i32 : IndexType::i64;
    s.freqs = (n / 2) % 2 ? Freqs::computed : Freqs::table;
    s.table_width = n % 7 < 3 ? TableWidth::half : TableWidth::full;
    s.table_dtype = n % 11 < 5 ? DType::f32 : DType::bf16;
    s.norm = norms[(n / 5) % 4];
    s.cache = caches[(n / 7) % 4];
    s.cache_store = s.cache == KvCache::none ? Store::same : Store((n / 3) % 3);
    s.fusion = s.cache != KvCache::none && (n / 11) % 2 ? Fusion::q : Fusion::qk;
    // In place, out of place, out of place in e4m3 (static, dynamic scales).
    const int output = int((n / 13) % 4);
    s.in_place = output == 0;
    s.out_store = output < 2 ? Store::same : Store(output - 1);
    if (!s.fused()) s.norm = Norm::rms;
    oracle::Sizes& z = c.sizes;
    z.seed = 1000 + n;
    z.batch = 2;
    z.seq_len = 3 + int64_t(n % 4);  // odd and even token counts
    z.seq_lens = {3, 5, 1};
    z.padding_tokens = n % 3 == 0 ? 2 : 0;
    z.q_heads = int32_t(2 + n % 5);  // 2..6: GQA ratios, a single kv head
    z.k_heads = n % 6 == 0 ? 2 : 1;
    z.packed_qkv = n % 3 == 1;
    z.head_gap = n % 5 == 2 ? 8 : 0;
    z.with_v = n % 9 != 4;
    z.page_size = n % 4 == 0 ? 1 : n % 4 == 1 ? 4 : 16;
    z.cache_hnd = n % 2 == 1;
    z.bad_tokens = n % 8 == 3 ? 1 : 0;
    z.padding_slots = n % 5 == 1 ? 2 : 0;
    z.norm_eps = n % 2 ? 1e-6 : 1e-5;
    // Power-of-two scales keep value * scale exact in fp32; others exercise the rounding.
    z.out_quant_scale = n % 3 == 0 ? 4.0f : 17.3f;
    z.k_quant_scale = n % 4 == 0 ? 2.0f : 8.7f;
    z.v_quant_scale = n % 4 == 1 ? 0.5f : 31.0f;
    if (s.freqs == Freqs::computed) {
      z.position_offset = (int64_t(1) << 20) - 8;
      z.max_position = (int64_t(1) << 20) - 1;
      z.base = n % 2 ? 10000.0 : 1000000.0;
    } else {
      z.position_offset = int64_t(n % 17);
      z.max_position = 200;
    }
    out.push_back(c);
  }
  return out;
}

// One case through the heuristic's launch, again through the prefill kernel with two heads per
// thread and two tokens per block, and through the one-head kernel with the token's heads dealt
// over blocks of one or two rows (head groups; each block then computes the token's cache
// placement, and a skipped token must still be counted once). Each launch that is legal for
// the case. Returns "" or the first failure.
std::string run_case(const Case& c, const detail::DeviceInfo& device) {
  oracle::Workload w(c.spec, c.sizes);
  w.upload();
  apply(w.spec(), w.args());
  oracle::CheckReport r = w.check();
  if (!r.ok) return r.first_failure + " (" + std::to_string(r.mismatches) + " mismatches)";
  const Spec s = w.spec().canonical();
  const Args args = w.args();
  const detail::CallShape shape = detail::check_call(s, args);
  const int32_t heads = shape.q_heads + shape.k_heads + shape.v_heads;
  detail::LaunchConfig two;
  two.kernel = detail::prefill_variant(s, shape.align_bytes, shape.table_align);
  two.rows = std::max(1, (heads + 1) / 2);
  two.tokens_per_block = 2;
  detail::LaunchConfig grouped;
  grouped.kernel = detail::decode_variant(s, shape.align_bytes, shape.table_align);
  grouped.rows = 1 + int32_t(c.sizes.seed % 2);
  grouped.head_groups = (heads + grouped.rows - 1) / grouped.rows;
  for (const detail::LaunchConfig& cfg : {two, grouped}) {
    if (!detail::illegal_reason(s, shape, cfg, device).empty()) continue;
    w.upload();
    api::engine().launch(s, args, shape, &cfg);
    r = w.check();
    if (!r.ok)
      return cfg.name() + ": " + r.first_failure + " (" + std::to_string(r.mismatches) +
             " mismatches)";
  }
  return "";
}

// The sizes the prefill-sized cases below share: `tokens` in two sequences of unequal length,
// positions within a 4096-row table, FP8 scales (a power of two for q, others for the cache), a
// computed-frequency base.
void prefill_sizes(const Spec& s, int64_t tokens, oracle::Sizes* z) {
  z->batch = 2;
  z->seq_len = tokens / 2;
  z->seq_lens = {tokens / 2 - 9, tokens / 2 + 9};
  z->max_position = 4095;
  z->out_quant_scale = 4.0f;
  z->k_quant_scale = 8.7f;
  z->v_quant_scale = 0.5f;
  if (s.freqs == Freqs::computed) z->base = 500000.0;
}

// Uploads fresh inputs (outputs poisoned), runs the call through `cfg` (nullptr: apply(), the
// heuristic's launch) and checks it against the float64 chain.
oracle::CheckReport run_checked(oracle::Workload& w, const detail::LaunchConfig* cfg) {
  w.upload();
  if (cfg) {
    const Spec c = w.spec().canonical();
    const Args args = w.args();
    api::engine().launch(c, args, detail::check_call(c, args), cfg);
  } else {
    apply(w.spec(), w.args());
  }
  return w.check();
}

// Runs `cases` on every hardware thread, each case against the float64 chain; one failure
// message per failed case (the first 25).
void run_fused_cases(const std::vector<Case>& cases) {
  testing::use_primary_context();
  std::atomic<size_t> next{0}, failed{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  auto worker = [&] {
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    for (size_t i; (i = next++) < cases.size();) {
      std::string failure;
      try {
        failure = run_case(cases[i], device);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty()) {
        ++failed;
        std::lock_guard<std::mutex> lock(mutex);
        if (failures.size() < 25) failures.push_back(cases[i].spec.key() + ": " + failure);
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures) FAIL_CHECK(f);
  MESSAGE(cases.size(), " fused cases, ", failed.load(), " failed");
  CHECK(failed == 0);
}

}  // namespace

TEST_SUITE("gpu") {
  // Exhaustive (ctest -L exhaustive, tests/CMakeLists.txt): the default run checks the spread
  // below.
  TEST_CASE("fused: norm, RoPE, FP8 and KV-cache append match the float64 chain" *
            doctest::test_suite("exhaustive")) {
    run_fused_cases(fused_cases());
  }

  // The default run's fused cases, and what bench/run_gpu.sh runs under compute-sanitizer with
  // the plain matrix's spread: every 12th fused case (every norm, cache mode and store, both
  // outputs, heads wider than a warp).
  TEST_CASE("sanitizer subset: a spread of the fused cases") {
    std::vector<Case> subset;
    const std::vector<Case> all = fused_cases();
    for (size_t i = 0; i < all.size(); i += 12) subset.push_back(all[i]);
    run_fused_cases(subset);
  }

  // Dynamic FP8 scales on heads wider than a warp: a head's amax then crosses warps through
  // shared memory (row_reduce's block path, two barriers), once per head of a two-head thread,
  // between a pass's heads and with the next pass's heads loaded ahead. The covering matrix's
  // "two" launch is illegal for most such cases (too many rows for 256 threads), so here: the
  // two-head prefill kernel at every legal launch of one or two rows and one or two tokens per
  // block, and the heuristic's launch at a decode size above 64 tokens (the same kernel over a
  // token's heads) and at a prefill size.
  TEST_CASE("fused: dynamic FP8 scales on heads wider than a warp, two heads per thread" *
            doctest::test_suite("long")) {
    testing::use_primary_context();
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    struct Head {
      DType dtype;
      int32_t dim, rotary;
      Style style;
    };
    // 64 lanes (f32 d256 gptj, bf16 d512 gptj, f32 d512 neox, partial rotary) and 128 (f32 d512
    // gptj): two and four warps per head.
    const Head heads[] = {{DType::f32, 256, 256, Style::gptj},
                          {DType::bf16, 512, 512, Style::gptj},
                          {DType::f32, 512, 512, Style::neox},
                          {DType::f16, 512, 256, Style::gptj},
                          {DType::f32, 512, 512, Style::gptj}};
    int n = 0;
    for (const Head& h : heads)
      for (const Norm norm : {Norm::rms, Norm::none, Norm::rms_all_heads})
        for (const bool q_dynamic : {true, false}) {
          ++n;
          Spec s;
          s.layout = n % 2 ? Layout::thd : Layout::bshd;
          s.dtype = h.dtype;
          s.head_dim = h.dim;
          s.rotary_dim = h.rotary;
          s.style = h.style;
          s.positions = Positions::ids;
          s.freqs = n % 3 == 0 ? Freqs::computed : Freqs::table;
          s.norm = norm;
          s.fusion = Fusion::qk;
          s.cache = n % 4 == 1 ? KvCache::slots : KvCache::paged;
          s.cache_store = q_dynamic && n % 3 == 1 ? Store::e4m3 : Store::e4m3_dynamic;
          s.in_place = false;
          s.out_store = q_dynamic ? Store::e4m3_dynamic : Store::same;
          oracle::Sizes z;
          z.seed = uint64_t(4400 + n);
          // A decode size above 64 tokens, or a prefill size (above 4 blocks per SM).
          const int64_t tokens = n % 2 ? 100 : 4 * int64_t(device.sm_count) + 72;
          z.q_heads = 4 + n % 3;
          z.k_heads = 2;
          z.packed_qkv = n % 3 == 2;
          z.page_size = n % 2 ? 16 : 5;
          z.cache_hnd = n % 4 == 2;
          z.bad_tokens = n % 5 == 0 ? 1 : 0;
          prefill_sizes(s, tokens, &z);
          const std::string what = s.key() + " tokens " + std::to_string(tokens);
          oracle::Workload w(s, z);
          oracle::CheckReport r = run_checked(w, nullptr);
          CHECK_MESSAGE(r.ok, what, " (heuristic): ", r.first_failure);
          const Spec c = w.spec().canonical();
          const Args args = w.args();
          const detail::CallShape shape = detail::check_call(c, args);
          int launches = 0;
          for (const int32_t rows : {1, 2})
            for (const int32_t tokens_per_block : {1, 2}) {
              detail::LaunchConfig cfg;
              cfg.kernel = detail::prefill_variant(c, shape.align_bytes, shape.table_align);
              REQUIRE(cfg.kernel.heads_per_thread == 2);
              cfg.rows = rows;
              cfg.tokens_per_block = tokens_per_block;
              if (!detail::illegal_reason(c, shape, cfg, device).empty()) continue;
              ++launches;
              r = run_checked(w, &cfg);
              CHECK_MESSAGE(r.ok, what, " ", cfg.name(), ": ", r.first_failure, " (", r.mismatches,
                            " mismatches)");
              CHECK(r.checked > 0);
            }
          // One row and one token per block is legal for every head here but where a norm over
          // all heads needs every q and k head in one pass (then the heuristic's launch only).
          if (norm != Norm::rms_all_heads) CHECK_MESSAGE(launches > 0, what);
        }
  }

  // The ring of passes loaded ahead (cp.async into shared memory): every depth, in the
  // 128-thread bound and the 256-thread one, with one to three rows, so that a token makes from
  // two to five passes (the slots wrap, and the prologue's copies can reach past the last pass),
  // one or four tokens per block, and persistent grids whose blocks loop over tokens (the slots
  // are reused by the next token); 256 threads of four slots ask for more than 48 KB. Norms,
  // gptj pairs, partial rotary (tail lanes), fp32 (four-element vectors), FP8 outputs and caches.
  void ring_forms(testing::CaseRange range) {
    testing::use_primary_context();
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    struct Form {
      DType dtype;
      int32_t dim, rotary;
      Norm norm;
      Store out, cache_store;
      KvCache cache;
    };
    const Form forms[] = {
        {DType::bf16, 128, 128, Norm::rms, Store::e4m3_dynamic, Store::e4m3_dynamic,
         KvCache::paged},
        {DType::bf16, 128, 64, Norm::rms_one_plus, Store::e4m3, Store::e4m3, KvCache::slots},
        {DType::f16, 64, 64, Norm::none, Store::same, Store::same, KvCache::paged},
        {DType::f32, 128, 128, Norm::rms, Store::same, Store::e4m3_dynamic, KvCache::contiguous},
        {DType::bf16, 256, 256, Norm::rms, Store::e4m3_dynamic, Store::same, KvCache::none},
    };
    int n = 0;
    for (const Form& f : forms) {
      if (!range.take(++n)) continue;
      Spec s;
      s.layout = n % 2 ? Layout::thd : Layout::bshd;
      s.dtype = f.dtype;
      s.head_dim = f.dim;
      s.rotary_dim = f.rotary;
      s.style = n % 3 == 2 ? Style::gptj : Style::neox;
      s.positions = Positions::ids;
      s.freqs = n % 4 == 3 ? Freqs::computed : Freqs::table;
      s.norm = f.norm;
      s.fusion = f.cache == KvCache::none ? Fusion::qk : (n % 2 ? Fusion::q : Fusion::qk);
      s.cache = f.cache;
      s.cache_store = f.cache_store;
      s.in_place = false;
      s.out_store = f.out;
      oracle::Sizes z;
      z.seed = uint64_t(5100 + n);
      // More tokens than one persistent block per SM covers: those blocks loop.
      const int64_t tokens = 4 * int64_t(device.sm_count) + 72;
      z.q_heads = 5 + n % 2;
      z.k_heads = 2;
      z.with_v = f.cache != KvCache::none;
      z.packed_qkv = n % 2 == 0;
      z.page_size = n % 2 ? 16 : 5;
      z.cache_hnd = n % 3 == 1;
      z.bad_tokens = n % 3 == 0 ? 1 : 0;
      prefill_sizes(s, tokens, &z);
      const std::string what = s.key() + " tokens " + std::to_string(tokens);
      oracle::Workload w(s, z);
      oracle::CheckReport r = run_checked(w, nullptr);
      CHECK_MESSAGE(r.ok, what, " (heuristic): ", r.first_failure);
      const Spec c = w.spec().canonical();
      const Args args = w.args();
      const detail::CallShape shape = detail::check_call(c, args);
      const detail::LaunchConfig heuristic = autotune::heuristic_config(c, shape, device);
      CHECK_MESSAGE(heuristic.kernel.ring == detail::kPrefillRing, what, " ", heuristic.name());
      int launches = 0;
      for (const int32_t ring : {2, 3, 4})
        for (const int32_t threads : {128, 256})
          for (const int32_t rows : {1, 2, 3})
            for (const int32_t tokens_per_block : {1, 4})
              for (const int32_t persistent : {0, 1}) {
                detail::LaunchConfig cfg;
                cfg.kernel = detail::prefill_variant(c, shape.align_bytes, shape.table_align);
                REQUIRE(cfg.kernel.heads_per_thread == 2);
                cfg.kernel.ring = ring;
                cfg.kernel.max_threads = threads;
                cfg.kernel.narrow = shape.narrow;
                cfg.rows = rows;
                cfg.tokens_per_block = tokens_per_block;
                detail::set_persistent(cfg, persistent);
                // Keep the count of launches down: persistent grids at one token per block.
                if (persistent && tokens_per_block > 1) continue;
                if (!detail::illegal_reason(c, shape, cfg, device).empty()) continue;
                ++launches;
                r = run_checked(w, &cfg);
                CHECK_MESSAGE(r.ok, what, " ", cfg.name(), ": ", r.first_failure, " (",
                              r.mismatches, " mismatches)");
                CHECK(r.checked > 0);
              }
      CHECK_MESSAGE(launches >= 12, what, ": ", launches, " legal ring launches");
    }
  }

  TEST_CASE("fused: the ring of passes loaded ahead, every depth, wrapping and looping, forms 1-2" *
            doctest::test_suite("long")) {
    ring_forms({1, 2});
  }
  TEST_CASE(
      "fused: the ring of passes loaded ahead, every depth, wrapping and looping, forms 3 on" *
      doctest::test_suite("long")) {
    ring_forms({3});
  }

  TEST_CASE("fused: a Qwen3-style decode step into an FP8 paged cache, captured and replayed") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    Spec s;
    s.layout = Layout::thd;
    s.positions = Positions::ids;
    s.norm = Norm::rms;
    s.fusion = Fusion::q;
    s.in_place = false;
    s.out_store = Store::e4m3;
    s.cache = KvCache::paged;
    s.cache_store = Store::e4m3;
    oracle::Sizes z;
    z.seq_lens = {1, 1, 1, 1};  // four sequences decoding one token each
    z.q_heads = 32;
    z.k_heads = 8;
    z.packed_qkv = true;
    z.out_quant_scale = 8.0f;
    z.k_quant_scale = 16.0f;
    z.v_quant_scale = 16.0f;
    oracle::Workload w(s, z);
    w.upload();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    apply(s, w.args(stream));  // first use outside the capture prepares every kernel
    detail::check(d.StreamSynchronize(stream), "warm-up");
    w.upload();
    const detail::EngineStats before = api::engine().stats();
    testing::capture_and_replay(stream, [&] { apply(s, w.args(stream)); });
    const oracle::CheckReport r = w.check();
    CHECK_MESSAGE(r.ok, r.first_failure);
    const detail::EngineStats after = api::engine().stats();
    CHECK(after.module_loads == before.module_loads);
    d.StreamDestroy(stream);
  }

  TEST_CASE("fused: a key first used with 64-bit offsets then captured with 32-bit loads nothing") {
    // A fused key's first use prepares both offset widths of its kernels, so a graph capture of
    // a call of the other width finds them loaded. A key no other case uses.
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    Spec s;
    s.layout = Layout::thd;
    s.dtype = DType::f16;
    s.head_dim = 80;
    s.rotary_dim = 32;
    s.style = Style::gptj;
    s.positions = Positions::ids;
    s.norm = Norm::rms_one_plus;
    s.in_place = false;
    s.cache = KvCache::slots;
    oracle::Sizes z;
    z.seq_lens = {1, 1, 1};
    z.q_heads = 8;
    z.k_heads = 2;
    oracle::Workload w(s, z);
    w.upload();
    CUstream stream = nullptr;
    detail::check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    const Args narrow = w.args(stream);
    // The same call with a page stride of 2^31 bytes (one page, so nothing lies beyond the
    // allocation; slots past it are skipped) takes 64-bit offsets.
    Args wide = narrow;
    wide.cache.pages = 1;
    wide.cache.stride_page = (int64_t(1) << 31) / 2;
    const Spec c = s.canonical();
    REQUIRE(detail::check_call(c, narrow).narrow);
    REQUIRE_FALSE(detail::check_call(c, wide).narrow);
    const detail::EngineStats first = api::engine().stats();
    apply(s, wide);
    detail::check(d.StreamSynchronize(stream), "first use");
    const detail::EngineStats before = api::engine().stats();
    CHECK(before.module_loads > first.module_loads);  // the key was new here
    w.upload();
    testing::capture_and_replay(stream, [&] { apply(s, narrow); });
    const oracle::CheckReport r = w.check();
    CHECK_MESSAGE(r.ok, r.first_failure);
    CHECK(api::engine().stats().module_loads == before.module_loads);
    d.StreamDestroy(stream);
  }

  TEST_CASE("fused: out-of-range slots and pages are skipped and counted, negative slots skipped") {
    testing::use_primary_context();
    for (KvCache cache : {KvCache::slots, KvCache::paged, KvCache::contiguous}) {
      Spec s;
      s.cache = cache;
      s.norm = Norm::rms;
      oracle::Sizes z = testing::dense_sizes(3, 7, 4, 2);
      z.bad_tokens = 3;
      z.padding_slots = 2;
      oracle::Workload w(s, z);
      w.upload();
      apply(w.spec(), w.args());
      const oracle::CheckReport r = w.check();  // the counter is one of the outputs
      CHECK_MESSAGE(r.ok, to_string(cache), ": ", r.first_failure);
    }
  }

  TEST_CASE("fused: malformed sequence tables in device memory are skipped and counted") {
    // Page tables, sequence lengths and slots the host cannot read: empty, reversed and
    // overflowing page ranges (a start of INT_MIN), ranges past the index array, last-page
    // lengths of 0 and past the page, lengths of -1, INT_MIN and INT_MAX, slots of INT64_MAX and
    // INT64_MIN. Every cache byte the reference does not write is checked unchanged (guards after
    // each page included), and the counter against the reference, which must count something.
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    for (KvCache cache : {KvCache::slots, KvCache::paged, KvCache::contiguous})
      for (Layout layout : {Layout::thd, Layout::bshd})
        for (int32_t hostile = 1; hostile <= oracle::hostile_tables(cache); ++hostile) {
          Spec s;
          s.layout = layout;
          s.cache = cache;
          s.norm = Norm::rms;
          s.cache_store = hostile % 2 ? Store::e4m3 : Store::same;
          oracle::Sizes z = testing::dense_sizes(3, 5, 4, 2);
          z.seq_lens = {4, 2, 5};
          z.page_size = hostile % 3 == 0 ? 1 : 4;
          z.hostile_table = hostile;
          oracle::Workload w(s, z);
          w.upload();
          const Args a = w.args();
          apply(w.spec(), a);
          const oracle::CheckReport r = w.check();
          INFO(to_string(cache), " ", to_string(layout), " table ", hostile);
          CHECK_MESSAGE(r.ok, r.first_failure);
          int32_t skipped = -1;
          detail::check(d.MemcpyDtoH(&skipped, reinterpret_cast<CUdeviceptr>(a.cache.skipped), 4),
                        "download the counter");
          // A negative slot is padding: not written, not counted.
          const bool padding = cache == KvCache::slots && hostile == 2;
          CHECK(padding ? skipped == 0 : skipped > 0);
        }
  }

  TEST_CASE("ropejit tune --key (a fused key): every bucket's entry is written and selected") {
    // The tuner times a fused key with the narrow variant its buffers allow; the entries must
    // still be written (the flag is each call's, not the file's) and a call then uses them.
    const std::string file = testing::temp_dir() + "/fused_tuning.json";
    const std::string key =
        "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-oe4m3-cpaged-e4m3_fwd_oop";
    const testing::CommandResult r =
        testing::run_command(std::string(ROPEJIT_CLI_PATH) + " tune --key " + key +
                             " --heads 8,2 --tokens 1 64 --out " + file + " 2>&1");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("invalid") == std::string::npos);
    // Progress on stderr once each bucket's kernels are ready, before its launches are timed.
    for (const char* bucket : {"[1/2] bucket 1: ", "[2/2] bucket 64: "}) {
      const size_t at = r.output.find(bucket);
      REQUIRE_MESSAGE(at != std::string::npos, bucket);
      const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
      CHECK_MESSAGE(line.find("kernel variants ready in") != std::string::npos, line);
      CHECK_MESSAGE(line.find(" launches") != std::string::npos, line);
    }
    testing::use_primary_context();
    const autotune::TuningCache tuned =
        autotune::TuningCache::load(file, autotune::current_fingerprint());
    CHECK(tuned.warnings().empty());
    for (const int64_t bucket : {int64_t(1), int64_t(64)}) {
      const autotune::TuningEntry* e = tuned.find(key, bucket, 8, 2);
      REQUIRE_MESSAGE(e != nullptr, "bucket ", bucket);
      // A call of that bucket, whose offsets fit, is given the entry's launch with 32-bit
      // offsets.
      detail::CallShape shape;
      shape.tokens = bucket;
      shape.q_heads = 8;
      shape.k_heads = 2;
      shape.v_heads = 2;
      shape.narrow = true;
      testing::ScopedEnv path("ROPEJIT_TUNING_FILE", file);
      const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
      detail::LaunchConfig want = e->config;
      want.kernel.narrow = true;
      CHECK(autotune::select_config(parse_key(key).canonical(), shape, device, false) == want);
    }
  }
}
