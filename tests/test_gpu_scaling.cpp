// Frequency scaling variants and mRoPE on the GPU: the kernels' computed cos/sin against the
// variants' float64 definitions up to position 2^20, and whole calls (plain and fused) against
// the float64 reference with poisoned outputs and guard bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "gpu_helpers.hpp"
#include "jit/scaling.hpp"
#include "oracle/workload.hpp"

using namespace ropejit;
using detail::check;

namespace {

const Freqs kVariants[] = {Freqs::linear, Freqs::dynamic_ntk, Freqs::llama3, Freqs::yarn,
                           Freqs::longrope};

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("scaled variants: computed cos/sin within 2.5e-7 of float64 up to position 2^20") {
    testing::use_primary_context();
    const detail::Driver& d = detail::driver();
    constexpr int64_t kTokens = 2048, kDim = 128;
    for (Freqs freqs : kVariants) {
      Spec s;
      s.dtype = DType::f32;
      s.head_dim = kDim;
      s.positions = Positions::ids;
      s.freqs = freqs;
      // A workload only for its scaling parameters (the variant's typical values).
      oracle::Workload params(s, testing::dense_sizes(1, 1, 1, 0));
      const Args defaults = params.args();
      const std::vector<double> inv =
          detail::inverse_frequencies(freqs, kDim, defaults.base, defaults.scaling, "args.scaling");
      const double attention =
          detail::attention_factor(freqs, kDim, defaults.scaling, "args.scaling");
      // Pairs (1, 0) rotate to (cos, sin) * attention: the output is the kernel's cos/sin.
      std::vector<float> q(size_t(kTokens * kDim), 0.0f);
      std::vector<int64_t> ids(kTokens);
      for (int64_t t = 0; t < kTokens; ++t) {
        ids[size_t(t)] = (int64_t(1) << 20) - 1 - t * 53;
        for (int64_t i = 0; i < kDim / 2; ++i) q[size_t(t * kDim + i)] = 1.0f;
      }
      CUdeviceptr dq = 0, dids = 0;
      check(d.MemAlloc(&dq, q.size() * 4), "cuMemAlloc");
      check(d.MemAlloc(&dids, ids.size() * 8), "cuMemAlloc");
      check(d.MemcpyHtoD(dq, q.data(), q.size() * 4), "upload");
      check(d.MemcpyHtoD(dids, ids.data(), ids.size() * 8), "upload");
      Args a = defaults;
      a.batch = 1;
      a.seq_len = kTokens;
      a.q = contiguous(Layout::bshd, reinterpret_cast<void*>(dq), 1, kTokens, 1, kDim);
      a.k = Tensor{};
      a.position_ids = reinterpret_cast<void*>(dids);
      apply(s, a);
      check(d.MemcpyDtoH(q.data(), dq, q.size() * 4), "download");
      double worst = 0;
      for (int64_t t = 0; t < kTokens; ++t)
        for (int64_t i = 0; i < kDim / 2; ++i) {
          const double angle = double(ids[size_t(t)]) * inv[size_t(i)];
          worst = std::max(
              {worst, std::fabs(q[size_t(t * kDim + i)] - std::cos(angle) * attention),
               std::fabs(q[size_t(t * kDim + kDim / 2 + i)] - std::sin(angle) * attention)});
        }
      MESSAGE(to_string(freqs), ": largest error ", worst, " (attention factor ", attention, ")");
      CHECK(worst <= (2.5e-7 + 0x1p-23) * attention);
      d.MemFree(dq);
      d.MemFree(dids);
    }
  }

  // Every frequency variant, mRoPE, layout and dtype against the float64 reference, plain and
  // fused: the cases in `range`.
  void scaled_matrix(testing::CaseRange range) {
    testing::use_primary_context();
    int n = 0, failed = 0, run = 0;
    for (Freqs freqs : {Freqs::computed, Freqs::linear, Freqs::dynamic_ntk, Freqs::llama3,
                        Freqs::yarn, Freqs::longrope, Freqs::table})
      for (Positions positions : {Positions::ids, Positions::mrope})
        for (Layout layout : {Layout::bshd, Layout::thd, Layout::sbhd})
          for (int variant = 0; variant < 4; ++variant) {
            if (!range.take(++n)) continue;
            ++run;
            Spec s;
            s.layout = layout;
            s.freqs = freqs;
            s.positions = positions;
            s.dtype = variant == 1 ? DType::f16 : variant == 2 ? DType::f32 : DType::bf16;
            s.style = variant == 3 ? Style::gptj : Style::neox;
            s.head_dim = variant == 2 ? 80 : 128;
            s.rotary_dim = variant == 2 ? 32 : variant == 3 ? 64 : 128;
            s.in_place = variant != 1;
            s.index_type = n % 2 ? IndexType::i32 : IndexType::i64;
            s.table_width = n % 3 == 0 ? TableWidth::full : TableWidth::half;
            if (variant == 0) {  // a Qwen2-VL style step: QK-norm and a paged cache too
              s.norm = Norm::rms;
              s.cache = KvCache::paged;
            }
            oracle::Sizes z = testing::dense_sizes(2, 5, 4, 2);
            z.seq_lens = {3, 6, 1};
            z.padding_tokens = n % 2 ? 2 : 0;
            z.max_position = freqs == Freqs::table ? 300 : (int64_t(1) << 20) - 1;
            z.mrope_interleaved = n % 4 == 1;
            z.seed = 7000 + uint64_t(n);
            oracle::Workload w(s, z);
            w.upload();
            std::string failure;
            try {
              apply(w.spec(), w.args());
              const oracle::CheckReport r = w.check();
              if (!r.ok) failure = r.first_failure;
            } catch (const std::exception& e) {
              failure = e.what();
            }
            if (!failure.empty()) {
              ++failed;
              FAIL_CHECK(w.spec().key(), ": ", failure);
            }
          }
    MESSAGE(run, " scaled / mRoPE cases, ", failed, " failed");
  }

  TEST_CASE("scaled variants and mRoPE match the float64 reference, plain and fused, cases 1-56" *
            doctest::test_suite("long")) {
    scaled_matrix({1, 56});
  }
  TEST_CASE("scaled variants and mRoPE match the float64 reference, plain and fused, cases 57-112" *
            doctest::test_suite("long")) {
    scaled_matrix({57, 112});
  }
  TEST_CASE("scaled variants and mRoPE match the float64 reference, plain and fused, cases 113 on" *
            doctest::test_suite("long")) {
    scaled_matrix({113});
  }
}
