// The GPU correctness matrix: layout x dtype x head_dim {64, 80, 96, 128, 256} x rotary
// {full, partial} x style x positions x frequency source x in/out of place x direction, each
// against the float64 reference on fresh random data with poisoned outputs and guard bytes.
// Sub-axes (index dtype, table dtype and width, packed QKV views, head gaps, misaligned
// pointers, no k, combined cos_sin_cache) rotate through the cases deterministically.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "gpu_helpers.hpp"
#include "oracle/workload.hpp"

using namespace ropejit;

namespace {

struct Case {
  Spec spec;
  oracle::Sizes sizes;
};

std::vector<Case> matrix_cases() {
  const int dims[5][2] = {{64, 32}, {80, 32}, {96, 24}, {128, 64}, {256, 20}};  // partial widths
  const struct {
    DType dtype;
    TableWidth width;
  } tables[6] = {{DType::f32, TableWidth::half},  {DType::f32, TableWidth::full},
                 {DType::bf16, TableWidth::half}, {DType::f16, TableWidth::full},
                 {DType::bf16, TableWidth::full}, {DType::f16, TableWidth::half}};
  std::vector<Case> out;
  uint64_t n = 0;
  for (Layout layout : {Layout::bshd, Layout::sbhd, Layout::bhsd, Layout::thd})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const auto& dim : dims)
        for (bool partial : {false, true})
          for (Style style : {Style::neox, Style::gptj})
            for (Positions pos : {Positions::offset, Positions::seq_offsets, Positions::ids})
              for (Freqs freqs : {Freqs::table, Freqs::computed})
                for (bool in_place : {true, false})
                  for (Direction dir : {Direction::forward, Direction::backward}) {
                    ++n;
                    Case c;
                    Spec& s = c.spec;
                    s.layout = layout;
                    s.dtype = dtype;
                    s.head_dim = dim[0];
                    s.rotary_dim = partial ? dim[1] : dim[0];
                    s.style = style;
                    s.positions = pos;
                    s.index_type = n % 2 ? IndexType::i32 : IndexType::i64;
                    s.freqs = freqs;
                    s.table_dtype = tables[n % 6].dtype;
                    s.table_width = tables[n % 6].width;
                    s.in_place = in_place;
                    s.direction = dir;
                    oracle::Sizes& z = c.sizes;
                    z.seed = n;
                    z.batch = 2;
                    z.seq_len = 5;  // odd token counts
                    z.seq_lens = {3, 6, 1};
                    z.padding_tokens = n % 3 == 0 ? 2 : 0;
                    z.q_heads = 3;
                    z.k_heads = n % 13 == 4 ? 0 : 1;  // one kv head; sometimes q only
                    z.packed_qkv = n % 3 == 1;
                    // Gaps of one element (pair for gptj) and shifted pointers force the
                    // narrow, unvectorized paths.
                    z.head_gap = n % 5 == 2 ? (style == Style::gptj ? 2 : 1) : n % 5 == 3 ? 8 : 0;
                    z.misalign_elems = n % 11 == 5 ? (style == Style::gptj ? 2 : 1) : 0;
                    z.combined_table = n % 4 == 1;
                    if (freqs == Freqs::computed) {
                      // Long-context positions, where fp32 angles fail (templates/rope_freqs.cuh).
                      z.position_offset = (int64_t(1) << 20) - 8;
                      z.max_position = (int64_t(1) << 20) - 1;
                      z.base = n % 2 ? 10000.0 : 500000.0;
                    } else {
                      z.position_offset = int64_t(n % 17);
                      z.max_position = 300;
                    }
                    out.push_back(c);
                  }
  return out;
}

// Runs `cases` on `threads` threads, each through the heuristic's kernel for its call and again
// through the two-heads-per-thread prefill kernel; checks every result against float64.
void run_cases(const std::vector<Case>& cases, unsigned threads) {
  std::atomic<size_t> next{0}, passed{0}, failed{0}, two_heads{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  auto worker = [&] {
    const detail::DeviceInfo& device = api::engine().device_info(testing::use_primary_context());
    for (size_t i; (i = next++) < cases.size();) {
      std::string failure;
      try {
        oracle::Workload w(cases[i].spec, cases[i].sizes);
        w.upload();
        apply(w.spec(), w.args());  // decode-sized: the one-head kernel, or two when needed
        const oracle::CheckReport r = w.check();
        if (!r.ok) failure = r.first_failure + " (" + std::to_string(r.mismatches) + " mismatches)";
        // The same call through the heuristic's prefill kernel, two heads per thread.
        const Spec c = w.spec().canonical();
        const Args args = w.args();
        const detail::CallShape shape = detail::check_call(c, args);
        detail::LaunchConfig two;
        two.kernel = detail::prefill_variant(c, shape.align_bytes, shape.table_align);
        two.rows = std::max(1, (shape.q_heads + shape.k_heads + 1) / 2);
        if (failure.empty() && detail::illegal_reason(c, shape, two, device).empty()) {
          w.upload();
          api::engine().launch(c, args, shape, &two);
          const oracle::CheckReport r2 = w.check();
          if (!r2.ok)
            failure = two.name() + ": " + r2.first_failure + " (" + std::to_string(r2.mismatches) +
                      " mismatches)";
          else
            ++two_heads;
        }
      } catch (const std::exception& e) {
        failure = cases[i].spec.key() + ": " + e.what();
      }
      if (failure.empty()) {
        ++passed;
      } else {
        ++failed;
        std::lock_guard<std::mutex> lock(mutex);
        if (failures.size() < 25) failures.push_back(failure);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  for (const std::string& f : failures) FAIL_CHECK(f);
  const detail::EngineStats st = api::engine().stats();
  MESSAGE(cases.size(), " cases: ", passed.load(), " passed, ", failed.load(), " failed (",
          two_heads.load(), " also with two heads per thread); ", st.nvrtc_compiles,
          " kernels compiled, ", st.disk_hits, " from the disk cache");
  CHECK(failed == 0);
  CHECK(passed == cases.size());
  CHECK(two_heads == cases.size());
}

}  // namespace

TEST_SUITE("gpu") {
  // Exhaustive (ctest -L exhaustive, tests/CMakeLists.txt): the default run checks the spread
  // below, in which every pair of the matrix's axis values appears.
  TEST_CASE("matrix: every variant matches the float64 reference" *
            doctest::test_suite("exhaustive")) {
    testing::use_primary_context();
    run_cases(matrix_cases(), std::max(2u, std::thread::hardware_concurrency()));
  }

  // The default run's matrix, and what bench/run_gpu.sh runs under compute-sanitizer (memcheck,
  // racecheck, initcheck): every 61st case, in which every pair of values of the nine axes
  // (layout, dtype, head size, rotary width, style, positions, frequencies, in place, direction)
  // appears.
  TEST_CASE("sanitizer subset: a spread of the matrix on two threads") {
    testing::use_primary_context();
    std::vector<Case> subset;
    const std::vector<Case> all = matrix_cases();
    for (size_t i = 0; i < all.size(); i += 61) subset.push_back(all[i]);
    run_cases(subset, 2);
  }
}
