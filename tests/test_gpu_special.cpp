// GPU cases outside the matrix: cos/sin accuracy at 2^20, offsets beyond 2^31 (plain and fused
// keys, narrow and wide offsets), CUDA graph
// capture, concurrent first use, out-of-table positions, the demo.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "api/engine.hpp"
#include "gpu_helpers.hpp"
#include "oracle/workload.hpp"
#include "test_util.hpp"

using namespace ropejit;
using detail::check;

using testing::DeviceBuffer;

TEST_SUITE("gpu") {
  TEST_CASE("computed cos/sin stay within 2.5e-7 of float64 up to position 2^20") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    constexpr int64_t kTokens = 4096, kDim = 128;
    for (double base : {10000.0, 500000.0}) {
      Spec s;
      s.dtype = DType::f32;
      s.head_dim = kDim;
      s.positions = Positions::ids;
      s.freqs = Freqs::computed;
      // Pairs (1, 0) rotate to (cos, sin): the output is the kernel's cos/sin, unrounded.
      std::vector<float> q(size_t(kTokens * kDim), 0.0f);
      std::vector<int64_t> ids(kTokens);
      for (int64_t t = 0; t < kTokens; ++t) {
        ids[size_t(t)] = (int64_t(1) << 20) - 1 - t * 37;  // 2^20 - 1 down to ~2^20 - 151k
        for (int64_t i = 0; i < kDim / 2; ++i) q[size_t(t * kDim + i)] = 1.0f;
      }
      DeviceBuffer dq(q.size() * 4), dids(ids.size() * 8);
      check(d.MemcpyHtoD(dq.ptr, q.data(), q.size() * 4), "upload");
      check(d.MemcpyHtoD(dids.ptr, ids.data(), ids.size() * 8), "upload");
      Args a;
      a.batch = 1;
      a.seq_len = kTokens;
      a.q = contiguous(Layout::bshd, dq.get(), 1, kTokens, 1, kDim);
      a.position_ids = dids.get();
      a.base = base;
      apply(s, a);
      check(d.CtxSynchronize(), "kernel");
      check(d.MemcpyDtoH(q.data(), dq.ptr, q.size() * 4), "download");
      double worst = 0;
      for (int64_t t = 0; t < kTokens; ++t)
        for (int64_t i = 0; i < kDim / 2; ++i) {
          const double angle = double(ids[size_t(t)]) * std::pow(base, -2.0 * double(i) / kDim);
          worst = std::max(worst, std::fabs(q[size_t(t * kDim + i)] - std::cos(angle)));
          worst = std::max(worst, std::fabs(q[size_t(t * kDim + i + kDim / 2)] - std::sin(angle)));
        }
      MESSAGE("base ", base, ": max |cos/sin - float64| = ", worst);
      CHECK(worst <= 2.5e-7);
    }
  }

  TEST_CASE("element offsets beyond 2^31 (64-bit indexing)") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    // q: 2 sequences x 3 tokens x 1 head x 64 fp32, the second sequence 2^31 + 64 elements
    // (8 GiB) after the first.
    constexpr int64_t kDim = 64, kSeq = 3;
    const int64_t stride_batch = (int64_t(1) << 31) + 64;
    const size_t bytes = size_t(stride_batch + kSeq * kDim) * 4;
    DeviceBuffer buf(bytes);
    Spec s;
    s.dtype = DType::f32;
    s.head_dim = kDim;
    s.freqs = Freqs::computed;
    std::vector<float> rows(size_t(kSeq * kDim));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(std::sin(double(i) * 0.37) + 0.01);
    for (int64_t b = 0; b < 2; ++b)
      check(d.MemcpyHtoD(buf.ptr + CUdeviceptr(b * stride_batch * 4), rows.data(), rows.size() * 4),
            "upload");
    Args a;
    a.batch = 2;
    a.seq_len = kSeq;
    a.q.data = buf.get();
    a.q.heads = 1;
    a.q.stride_batch = stride_batch;
    a.q.stride_seq = kDim;
    a.q.stride_head = kDim;
    a.position_offset = 5;
    apply(s, a);
    check(d.CtxSynchronize(), "kernel");
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<float> got(rows.size());
      check(d.MemcpyDtoH(got.data(), buf.ptr + CUdeviceptr(b * stride_batch * 4), got.size() * 4),
            "download");
      double worst = 0;
      for (int64_t t = 0; t < kSeq; ++t)
        for (int64_t i = 0; i < kDim / 2; ++i) {
          const double angle = double(t + 5) * std::pow(10000.0, -2.0 * double(i) / kDim);
          const double x = rows[size_t(t * kDim + i)], y = rows[size_t(t * kDim + i + kDim / 2)];
          worst = std::max(worst, std::fabs(got[size_t(t * kDim + i)] -
                                            (x * std::cos(angle) - y * std::sin(angle))));
          worst = std::max(worst, std::fabs(got[size_t(t * kDim + i + kDim / 2)] -
                                            (y * std::cos(angle) + x * std::sin(angle))));
        }
      INFO("sequence ", b);
      CHECK(worst < 1e-6);
    }
  }

  TEST_CASE("fused keys: caches beyond 2^31 bytes (narrow offsets), q beyond 2^31 elements") {
    // The narrow variant indexes tensors and pages with 32-bit offsets and a page's own offset
    // with 64 bits. Each cache form with the call's rows beyond 2^31 bytes: slots, and a page
    // table, into the last two of 2^20 pages of 4 KiB; a contiguous cache of two sequences with
    // rows of 1.5 GiB, each filled to its end; slots again into the last of 2^21 + 2 pages, whose
    // offset in elements (not only in bytes) is past 2^31. The wide variant then runs a call
    // whose q sequences lie 2^31 + 64 elements (8 GiB) apart.
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    constexpr int64_t kDim = 64, kSeq = 3, kPage = 16, kPoison = 0x7fc0dead;
    struct Form {
      KvCache cache;
      bool narrow;
      int64_t pages;  // slots and paged (a contiguous cache has one per sequence)
    };
    constexpr int64_t kMany = int64_t(1) << 20;
    for (const Form form :
         {Form{KvCache::slots, true, kMany}, Form{KvCache::paged, true, kMany},
          Form{KvCache::contiguous, true, 2}, Form{KvCache::slots, true, 2 * kMany + 2},
          Form{KvCache::slots, false, 2}}) {
      INFO(to_string(form.cache), form.narrow ? " narrow, " : " wide, ", form.pages, " pages");
      Spec s;
      s.dtype = DType::f32;
      s.head_dim = kDim;
      s.freqs = Freqs::computed;
      s.fusion = Fusion::qk;
      s.cache = form.cache;
      const bool contiguous_cache = form.cache == KvCache::contiguous;
      const int64_t pages = form.pages;
      const int64_t page_size = contiguous_cache ? int64_t(3) << 27 >> 6 : kPage;  // slots
      const int64_t page_floats = page_size * kDim;
      const int64_t stride_batch = form.narrow ? kSeq * kDim : (int64_t(1) << 31) + 64;
      DeviceBuffer dq(size_t(stride_batch + kSeq * kDim) * 4), dk(size_t(2 * kSeq * kDim) * 4);
      DeviceBuffer cache(size_t(pages * page_floats) * 4), table(64);
      // Where token t (sequence t / kSeq, index t % kSeq) lands: the first word of its row.
      auto row_of = [&](int64_t t) {
        const int64_t b = t / kSeq, i = t % kSeq;
        switch (form.cache) {
          case KvCache::paged:  // sequence 0 starts the last page, sequence 1 fills the one before
            return b == 0 ? (pages - 1) * page_floats + i * kDim
                          : (pages - 2) * page_floats + (kSeq + i) * kDim;
          case KvCache::contiguous:  // each row's last kSeq slots
            return b * page_floats + (page_size - kSeq + i) * kDim;
          default:  // slots: the last page's first 2 * kSeq slots
            return (pages - 1) * page_floats + t * kDim;
        }
      };
      std::vector<float> q0(size_t(2 * kSeq * kDim)), k0(q0.size());
      for (size_t i = 0; i < q0.size(); ++i) {
        q0[i] = float(std::sin(double(i) * 0.37) + 0.01);
        k0[i] = float(std::cos(double(i) * 0.53) - 0.02);
      }
      for (int64_t b = 0; b < 2; ++b)
        check(d.MemcpyHtoD(dq.ptr + CUdeviceptr(b * stride_batch * 4), &q0[size_t(b * kSeq * kDim)],
                           size_t(kSeq * kDim) * 4),
              "upload q");
      check(d.MemcpyHtoD(dk.ptr, k0.data(), k0.size() * 4), "upload k");
      // Poisoned: the cache's last 2 * kPage slots and every row the call writes.
      const int64_t window = 2 * kPage * kDim, window_at = pages * page_floats - window;
      const std::vector<uint32_t> poison(static_cast<size_t>(window), uint32_t(kPoison));
      check(d.MemcpyHtoD(cache.ptr + CUdeviceptr(window_at * 4), poison.data(), poison.size() * 4),
            "poison");
      for (int64_t t = 0; t < 2 * kSeq; ++t)
        check(d.MemcpyHtoD(cache.ptr + CUdeviceptr(row_of(t) * 4), poison.data(), kDim * 4),
              "poison");
      Args a;
      a.batch = 2;
      a.seq_len = kSeq;
      a.q.data = dq.get();
      a.q.heads = 1;
      a.q.stride_batch = stride_batch;
      a.q.stride_seq = kDim;
      a.q.stride_head = kDim;
      a.k = contiguous(Layout::bshd, dk.get(), 2, kSeq, 1, kDim);
      a.position_offset = 5;
      a.cache.k = cache.get();
      a.cache.pages = pages;
      a.cache.page_size = page_size;
      a.cache.stride_page = page_floats;
      a.cache.stride_slot = kDim;
      a.cache.stride_head = kDim;
      if (form.cache == KvCache::slots) {
        std::vector<int64_t> slots(2 * kSeq);
        for (int64_t t = 0; t < 2 * kSeq; ++t) slots[size_t(t)] = row_of(t) / kDim;
        check(d.MemcpyHtoD(table.ptr, slots.data(), slots.size() * 8), "upload slots");
        a.cache.slot_mapping = reinterpret_cast<const int64_t*>(table.get());
      } else if (form.cache == KvCache::paged) {
        // indptr {0, 1, 2}, indices {last page, the one before}, last_page_len {3, 6}.
        const int32_t words[] = {0, 1, 2, int32_t(pages - 1), int32_t(pages - 2), 3, 6};
        check(d.MemcpyHtoD(table.ptr, words, sizeof(words)), "upload page table");
        const int32_t* w = reinterpret_cast<const int32_t*>(table.get());
        a.cache.indptr = w;
        a.cache.indices = w + 3;
        a.cache.num_indices = 2;
        a.cache.last_page_len = w + 5;
      } else {
        const int32_t lens[] = {int32_t(page_size - kSeq), int32_t(page_size - kSeq)};
        check(d.MemcpyHtoD(table.ptr, lens, sizeof(lens)), "upload lengths");
        a.cache.seq_lens = reinterpret_cast<const int32_t*>(table.get());
      }
      REQUIRE(detail::check_call(s.canonical(), a).narrow == form.narrow);
      apply(s, a);
      check(d.CtxSynchronize(), "kernel");
      std::vector<float> q(q0.size()), k(k0.size());
      for (int64_t b = 0; b < 2; ++b)
        check(d.MemcpyDtoH(&q[size_t(b * kSeq * kDim)], dq.ptr + CUdeviceptr(b * stride_batch * 4),
                           size_t(kSeq * kDim) * 4),
              "download q");
      check(d.MemcpyDtoH(k.data(), dk.ptr, k.size() * 4), "download k");
      double worst = 0;
      for (int64_t t = 0; t < 2 * kSeq; ++t)
        for (int64_t i = 0; i < kDim / 2; ++i) {
          const double angle = double(t % kSeq + 5) * std::pow(10000.0, -2.0 * double(i) / kDim);
          for (const auto& [got, in] : {std::pair{&q, &q0}, std::pair{&k, &k0}}) {
            const size_t lo = size_t(t * kDim + i), hi = lo + kDim / 2;
            const double x = (*in)[lo], y = (*in)[hi];
            worst = std::max(worst,
                             std::fabs((*got)[lo] - (x * std::cos(angle) - y * std::sin(angle))));
            worst = std::max(worst,
                             std::fabs((*got)[hi] - (y * std::cos(angle) + x * std::sin(angle))));
          }
        }
      CHECK(worst < 1e-6);
      // Each token's row holds the rotated k bit for bit; every other word of the window is
      // still poison.
      std::vector<uint32_t> guard(static_cast<size_t>(window)), row(kDim);
      check(d.MemcpyDtoH(guard.data(), cache.ptr + CUdeviceptr(window_at * 4), guard.size() * 4),
            "download cache");
      int64_t wrong = 0;
      for (int64_t t = 0; t < 2 * kSeq; ++t) {
        const int64_t at = row_of(t);
        check(d.MemcpyDtoH(row.data(), cache.ptr + CUdeviceptr(at * 4), kDim * 4), "download row");
        wrong += std::memcmp(row.data(), &k[size_t(t * kDim)], kDim * 4) != 0;
        if (at >= window_at) std::fill_n(&guard[size_t(at - window_at)], kDim, uint32_t(kPoison));
      }
      CHECK(wrong == 0);
      CHECK(std::count(guard.begin(), guard.end(), uint32_t(kPoison)) == window);
    }
  }

  TEST_CASE("a cached call is captured in a CUDA graph and replays correctly") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    Spec s;
    s.in_place = false;  // replays are then idempotent
    s.positions = Positions::ids;
    oracle::Workload w(s, testing::dense_sizes(3, 64, 32, 8));
    w.upload();
    CUstream stream = nullptr;
    check(d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    const Args args = w.args(stream);
    apply(s, args);  // first use loads the module outside the capture
    check(d.StreamSynchronize(stream), "warm-up");
    w.upload();  // re-poison outputs: only the graph writes them now
    testing::capture_and_replay(
        stream,
        [&] {
          for (int i = 0; i < 20; ++i) apply(s, args);
        },
        3);
    const oracle::CheckReport r = w.check();
    CHECK_MESSAGE(r.ok, r.first_failure);

    // A key's first use inside a capture is refused with a clear message, and the capture
    // survives it.
    Spec fresh = s;
    fresh.direction = Direction::backward;
    testing::capture_and_replay(stream, [&] {
      CHECK_THROWS_WITH_AS(apply(fresh, args), doctest::Contains("during CUDA graph capture"),
                           Error);
    });
    d.StreamDestroy(stream);
  }

  TEST_CASE("many threads asking for a new key at once compile it once") {
    testing::use_primary_context();
    Spec s;
    s.head_dim = 112;  // a key nothing else in this process uses
    s.dtype = DType::f16;
    s.freqs = Freqs::computed;
    oracle::Sizes z;
    z.q_heads = 4;
    z.k_heads = 2;
    std::vector<std::unique_ptr<oracle::Workload>> loads;
    for (int i = 0; i < 16; ++i) {
      z.seed = uint64_t(100 + i);
      loads.push_back(std::make_unique<oracle::Workload>(s, z));
      loads.back()->upload();
    }
    const detail::EngineStats before = api::engine().stats();
    std::vector<std::thread> threads;
    std::vector<std::string> errors(loads.size());
    for (size_t i = 0; i < loads.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          testing::use_primary_context();
          apply(s, loads[i]->args());
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (std::thread& t : threads) t.join();
    const detail::EngineStats after = api::engine().stats();
    for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
    // The heuristic's two kernels (prefill and decode), each compiled and loaded once.
    CHECK(after.nvrtc_compiles + after.disk_hits - before.nvrtc_compiles - before.disk_hits == 2);
    CHECK(after.module_loads - before.module_loads == 2);
    for (auto& w : loads) {
      const oracle::CheckReport r = w->check();
      CHECK_MESSAGE(r.ok, r.first_failure);
    }
  }

  TEST_CASE("changing only shapes compiles nothing new") {
    testing::use_primary_context();
    Spec s;
    s.layout = Layout::thd;
    s.positions = Positions::seq_offsets;
    oracle::Sizes z;
    z.seq_lens = {7};
    oracle::Workload first(s, z);
    first.upload();
    apply(s, first.args());
    const detail::EngineStats before = api::engine().stats();
    for (int64_t tokens : {1, 64, 300, 4096}) {
      z.seq_lens = {tokens / 2 + 1, tokens / 2};
      z.q_heads = int32_t(8 + tokens % 5);
      oracle::Workload w(s, z);
      w.upload();
      apply(s, w.args());
      const oracle::CheckReport r = w.check();
      CHECK_MESSAGE(r.ok, r.first_failure);
    }
    const detail::EngineStats after = api::engine().stats();
    CHECK(after.nvrtc_compiles == before.nvrtc_compiles);
    CHECK(after.disk_hits == before.disk_hits);
    CHECK(after.module_loads == before.module_loads);
  }

  TEST_CASE(
      "table positions outside the table poison their token instead of reading out of bounds") {
    testing::use_primary_context();
    Spec s;
    s.positions = Positions::ids;
    s.in_place = false;
    oracle::Sizes z;
    z.max_position = 40;  // ids up to 40 ...
    z.table_rows = 20;    // ... in a 20-row table
    oracle::Workload w(s, z);
    w.upload();
    apply(s, w.args());
    const oracle::CheckReport r = w.check();  // the reference expects NaN for those tokens
    CHECK_MESSAGE(r.ok, r.first_failure);
  }

  TEST_CASE("ropejit demo runs and passes on the GPU") {
    const testing::CommandResult r =
        testing::run_command(ROPEJIT_CLI_PATH " demo --preset llama3-8b --tokens 512");
    const std::string& out = r.output;
    INFO(out);
    CHECK(r.status == 0);
    CHECK(out.find("check vs float64: PASS") != std::string::npos);
    CHECK(out.find("% of copy bandwidth") != std::string::npos);
  }
}
