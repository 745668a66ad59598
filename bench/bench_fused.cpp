// Fused rows: a Qwen3-style step (packed QKV -> per-head RMSNorm -> RoPE -> q written, k and v
// appended to a paged cache), in bf16 and with FP8 e4m3 q and cache (static scales, or dynamic
// ones per token and head), against (a) a device copy
// of the bytes the fused call moves and (b) the floor of the unfused sequence: each separate
// pass (QK-norm, RoPE, quantize q, cache append) timed as a device copy of exactly the bytes
// that pass must move, the best any implementation of that pass could do. Decode sizes run
// under CUDA-graph replay (the copies too), prefill sizes with events; all in the same run.
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "bench/bench_common.hpp"
#include "oracle/workload.hpp"

namespace ropejit::bench {
namespace {

struct FusedCase {
  std::string name;
  Spec spec;
  oracle::Sizes sizes;
};

FusedCase qwen3_step(int64_t tokens, bool fp8, bool dynamic = false) {
  FusedCase c;
  c.name = std::string(dynamic ? "qwen3_fp8dyn_t"
                       : fp8   ? "qwen3_fp8_t"
                               : "qwen3_bf16_t") +
           std::to_string(tokens);
  Spec& s = c.spec;
  s.layout = Layout::thd;
  s.positions = Positions::ids;
  s.norm = Norm::rms;
  s.fusion = Fusion::q;
  s.cache = KvCache::paged;
  if (fp8) {
    s.in_place = false;
    s.out_store = dynamic ? Store::e4m3_dynamic : Store::e4m3;
    s.cache_store = s.out_store;
  }
  oracle::Sizes& z = c.sizes;
  // Decode: one token per sequence; prefill: sequences of 1024 tokens.
  const int64_t per_seq = tokens <= 256 ? 1 : 1024;
  z.seq_lens.assign(size_t((tokens + per_seq - 1) / per_seq), per_seq);
  z.q_heads = 32;
  z.k_heads = 8;
  z.packed_qkv = true;
  z.page_size = 16;
  z.max_position = 8191;
  z.out_quant_scale = 8.0f;
  z.k_quant_scale = 8.0f;
  z.v_quant_scale = 8.0f;
  return c;
}

// The Qwen3 bf16 step with stages taken out, to see what each costs at decode sizes: RoPE alone
// (the plain kernel on the packed rows), + the per-head norm (fused kernel, no cache), + the
// paged append (no norm), and all of it (the qwen3 row).
FusedCase qwen3_stage(int64_t tokens, bool norm, bool cache) {
  FusedCase c = qwen3_step(tokens, false);
  c.name = std::string("stage_") + (norm ? "norm" : "rope") + (cache ? "_cache" : "") + "_t" +
           std::to_string(tokens);
  if (!norm) c.spec.norm = Norm::none;
  if (!cache) {
    c.spec.cache = KvCache::none;
    c.spec.fusion = Fusion::qk;
  }
  return c;
}

// The bytes of each unfused pass: QK-norm (read and write q, k), RoPE (the same), quantize q
// (read q, write FP8 q and, dynamic, its scales; FP8 only), cache append (read k, v; write them
// into the cache, and dynamic, their scales).
std::vector<int64_t> unfused_passes(const FusedCase& c, int64_t tokens) {
  const int64_t d = c.spec.head_dim, e = detail::element_bytes(c.spec.dtype);
  const int64_t q = tokens * c.sizes.q_heads * d, k = tokens * c.sizes.k_heads * d;
  const bool fp8 = is_fp8(c.spec.out_store);
  const bool dynamic = c.spec.out_store == Store::e4m3_dynamic;
  const int64_t scales = dynamic ? tokens * c.sizes.q_heads * 4 : 0;
  const int64_t cache_scales = dynamic ? 2 * tokens * c.sizes.k_heads * 4 : 0;
  std::vector<int64_t> passes = {2 * (q + k) * e, 2 * (q + k) * e};
  if (fp8) passes.push_back(q * e + q + scales);
  passes.push_back(2 * k * e + 2 * k * (is_fp8(c.spec.cache_store) ? 1 : e) + cache_scales);
  return passes;
}

void run_fused(benchmark::State& state, const FusedCase& c) {
  oracle::Workload w(c.spec, c.sizes);
  w.upload();  // before args(): device pointers exist only after the upload
  const Args args = w.args(g_stream);
  if (!checked_first(state, w, c.spec, args)) return;
  const std::vector<int64_t> passes = unfused_passes(c, w.tokens());
  double unfused_us = 0;
  const detail::Driver& d = detail::driver();
  if (w.tokens() <= 256) {
    // Graph replay, per call: the fused call, and the unfused floor's copies as graph nodes.
    std::vector<double> fused;
    {
      const CallGraph graph([&] { apply(c.spec, args); });
      autotune::Timer timer(g_stream, 0);
      for (auto _ : state) {
        const double us = graph.us_per_call(timer);
        state.SetIterationTime(us * 1e-6);
        fused.push_back(us);
      }
    }
    int64_t largest = w.bytes_moved() / 2;
    for (int64_t b : passes) largest = std::max(largest, b / 2);
    CUdeviceptr src = 0, dst = 0;
    detail::check(d.MemAlloc(&src, size_t(largest)), "cuMemAlloc");
    detail::check(d.MemAlloc(&dst, size_t(largest)), "cuMemAlloc");
    std::vector<double> copies, one_copy;
    {
      const CallGraph graph([&] {
        for (int64_t b : passes) d.MemcpyDtoDAsync(dst, src, size_t(b / 2), g_stream);
      });
      const CallGraph same_bytes(
          [&] { d.MemcpyDtoDAsync(dst, src, size_t(w.bytes_moved() / 2), g_stream); });
      autotune::Timer timer(g_stream, 0);
      for (int i = 0; i < 200; ++i) {
        copies.push_back(graph.us_per_call(timer));
        one_copy.push_back(same_bytes.us_per_call(timer));
      }
    }
    state.counters["copy_us"] = median(one_copy);
    d.MemFree(src);
    d.MemFree(dst);
    unfused_us = median(copies);
    state.counters["median_us"] = median(fused);
  } else {
    time_against_copy(state, w.bytes_moved(), [&] { apply(c.spec, args); });
    for (int64_t b : passes) unfused_us += copy_median_us(b);
  }
  state.counters["unfused_floor_us"] = unfused_us;
  state.counters["speedup_vs_unfused"] = unfused_us / state.counters["median_us"];
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bytes_moved());
  const auto [cfg, regs] = api::engine().planned(c.spec, args);
  state.SetLabel(w.spec().key() + " " + cfg.name() + " " + std::to_string(regs) + "regs");
}

}  // namespace

void register_fused_benchmarks() {
  static std::vector<FusedCase> all;
  for (bool fp8 : {false, true})
    for (int64_t t : {1, 16, 64, 256, 4096, 32768}) all.push_back(qwen3_step(t, fp8));
  for (int64_t t : {1, 64, 256, 4096, 32768}) all.push_back(qwen3_step(t, true, true));
  for (int64_t t : {1, 64})
    for (const auto& [norm, cache] : {std::pair{false, false}, {true, false}, {false, true}})
      all.push_back(qwen3_stage(t, norm, cache));
  for (const FusedCase& c : all) {
    int64_t tokens = 0;
    for (int64_t n : c.sizes.seq_lens) tokens += n;
    benchmark::RegisterBenchmark(("fused/" + c.name).c_str(), run_fused, c)
        ->UseManualTime()
        ->Iterations(tokens <= 256 ? 200 : 50)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace ropejit::bench
