// ropejit benchmarks (Google Benchmark). Device time from CUDA events (manual time) with L2
// flushed before every repetition; every row carries the bytes moved, GB/s, and the median
// of a device-to-device copy of the same bytes timed in the same run (copy_us, pct_copy).
// Correctness is checked against float64 before anything is timed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "autotune/timing.hpp"
#include "bench/bench_common.hpp"
#include "jit/driver.hpp"
#include "jit/nvrtc.hpp"
#include "jit/render.hpp"
#include "oracle/workload.hpp"

using namespace ropejit;
using namespace ropejit::bench;

namespace {

struct Case {
  std::string name;
  Spec spec;
  oracle::Sizes sizes;
};

void run_case(benchmark::State& state, const Case& c) {
  oracle::Workload w(c.spec, c.sizes);
  w.upload();  // before args(): device pointers exist only after the upload
  const Args args = w.args(g_stream);
  if (!checked_first(state, w, c.spec, args)) return;
  time_against_copy(state, w.bytes_moved(), [&] { apply(c.spec, args); });
  const auto [cfg, regs] = api::engine().planned(c.spec, args);
  state.SetLabel(w.spec().key() + " " + cfg.name() + " " + std::to_string(regs) + "regs");
}

// The same-run reference for graph-replayed decode (the "two copies" column of the peers'
// decode table, docs/performance.md#peers-figures-quoted): per call, a device copy of q's bytes
// and one of k's, captured once and replayed.
double graph_copies_us(const Case& c) {
  const detail::Driver& d = detail::driver();
  const size_t per_head = size_t(c.sizes.batch * c.sizes.seq_len) * size_t(c.spec.head_dim) *
                          size_t(detail::element_bytes(c.spec.dtype));
  const size_t qb = per_head * size_t(c.sizes.q_heads), kb = per_head * size_t(c.sizes.k_heads);
  CUdeviceptr src = 0, dst = 0;
  detail::check(d.MemAlloc(&src, qb + kb), "cuMemAlloc");
  detail::check(d.MemAlloc(&dst, qb + kb), "cuMemAlloc");
  std::vector<double> samples;
  {
    const CallGraph graph([&] {
      detail::check(d.MemcpyDtoDAsync(dst, src, qb, g_stream), "capture q copy");
      if (kb) detail::check(d.MemcpyDtoDAsync(dst + qb, src + qb, kb, g_stream), "capture k copy");
    });
    autotune::Timer timer(g_stream, 0);
    for (int i = 0; i < 200; ++i) samples.push_back(graph.us_per_call(timer));
  }
  d.MemFree(src);
  d.MemFree(dst);
  return median(samples);
}

// Decode sizes under graph replay: kGraphCalls calls captured once, replayed, time per call
// (the launch gaps of eager launches excluded, as the peers' decode table in
// docs/performance.md#peers-figures-quoted measures).
void run_graph(benchmark::State& state, const Case& c) {
  oracle::Workload w(c.spec, c.sizes);
  w.upload();
  const Args args = w.args(g_stream);
  apply(c.spec, args);
  detail::check(detail::driver().StreamSynchronize(g_stream), "warm-up");
  std::vector<double> samples;
  {
    const CallGraph graph([&] { apply(c.spec, args); });
    autotune::Timer timer(g_stream, 0);
    for (auto _ : state) {
      const double us = graph.us_per_call(timer);
      state.SetIterationTime(us * 1e-6);
      samples.push_back(us);
    }
  }
  state.counters["us_per_call"] = median(samples);
  state.counters["two_copies_us"] = graph_copies_us(c);
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bytes_moved());
  state.SetLabel(w.spec().key());
}

Case make(const std::string& name, DType dtype, int32_t d, int32_t r, int64_t tokens, int32_t hq,
          int32_t hk, Style style = Style::neox, bool in_place = true, Freqs freqs = Freqs::table,
          Layout layout = Layout::bshd) {
  Case c;
  c.name = name;
  c.spec.dtype = dtype;
  c.spec.head_dim = d;
  c.spec.rotary_dim = r;
  c.spec.style = style;
  c.spec.in_place = in_place;
  c.spec.freqs = freqs;
  c.spec.layout = layout;
  c.spec.positions = Positions::ids;
  c.sizes.batch = 1;
  c.sizes.seq_len = tokens;
  c.sizes.q_heads = hq;
  c.sizes.k_heads = hk;
  c.sizes.max_position = 8191;
  if (layout == Layout::thd) {
    c.sizes.seq_lens.clear();
    int64_t left = tokens, n = 1;
    while (left > 0) {  // uneven sequence lengths
      const int64_t len = std::min(left, 97 * n * n % 1500 + 1);
      c.sizes.seq_lens.push_back(len);
      left -= len;
      ++n;
    }
  }
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int64_t t : {1, 16, 64, 256, 4096, 32768})
    v.push_back(make("llama_bf16_t" + std::to_string(t), DType::bf16, 128, 128, t, 32, 8));
  for (int32_t d : {64, 80, 96, 256})
    v.push_back(make("d" + std::to_string(d), DType::bf16, d, d, 4096, 32, 8));
  v.push_back(make("kv1", DType::bf16, 128, 128, 4096, 32, 1));
  v.push_back(make("fp32", DType::f32, 128, 128, 8192, 32, 8));
  v.push_back(make("fp16", DType::f16, 128, 128, 4096, 64, 0));
  v.push_back(make("gptj", DType::bf16, 128, 128, 4096, 32, 8, Style::gptj));
  v.push_back(make("oop", DType::bf16, 128, 128, 4096, 32, 8, Style::neox, false));
  v.push_back(
      make("computed", DType::bf16, 128, 128, 4096, 32, 8, Style::neox, true, Freqs::computed));
  // The scaled variants next to plain computed frequencies (same shape): the cost of per-pair
  // float64 frequencies from the argument block, and of the attention factor.
  for (Freqs f : {Freqs::linear, Freqs::llama3, Freqs::yarn, Freqs::longrope})
    v.push_back(make(std::string("comp_") + to_string(f), DType::bf16, 128, 128, 4096, 32, 8,
                     Style::neox, true, f));
  v.push_back(make("thd_uneven", DType::bf16, 128, 128, 8192, 32, 8, Style::neox, true,
                   Freqs::table, Layout::thd));
  v.push_back(make("partial_neox20b", DType::bf16, 96, 24, 4096, 64, 64));
  v.push_back(make("prefill_8x4096", DType::bf16, 128, 128, 32768, 32, 8));
  return v;
}

// Host cost of a cached apply() next to a bare cuLaunchKernel of an empty kernel.
void host_overhead(benchmark::State& state, bool bare) {
  const detail::Driver& d = detail::driver();
  static CUfunction empty = [] {
    const detail::CompileResult cr = detail::compile(
        "#include \"rope_params.cuh\"\n"
        "extern \"C\" __global__ void ropejit_empty(const __grid_constant__ "
        "ropejit_dev::RopeParams p) {}\n",
        "empty.cu", "empty", detail::target_for(api::engine().device_info(nullptr).cc));
    CUmodule m = nullptr;
    CUfunction f = nullptr;
    detail::check(detail::driver().ModuleLoadData(&m, cr.image.data()), "load");
    detail::check(detail::driver().ModuleGetFunction(&f, m, "ropejit_empty"), "function");
    return f;
  }();
  Case c = make("decode64", DType::bf16, 128, 128, 64, 32, 8);
  oracle::Workload w(c.spec, c.sizes);
  w.upload();
  const Args args = w.args(g_stream);
  apply(c.spec, args);
  ropejit_dev::RopeParams params{};
  void* kargs[] = {&params};
  int64_t n = 0;
  for (auto _ : state) {
    if (bare)
      d.LaunchKernel(empty, 64, 1, 1, 8, 20, 1, 0, g_stream, kargs, nullptr);
    else
      apply(c.spec, args);
    if (++n % 512 == 0) d.StreamSynchronize(g_stream);  // keep the launch queue from filling
  }
  d.StreamSynchronize(g_stream);
}

// JIT costs: NVRTC start-up, a cold compile, the compiles of a key's first use (the
// heuristic's two kernels at once, as the engine does them), a disk-cache hit, an in-memory hit.
void jit_costs(benchmark::State& state) {
  detail::Engine& e = api::engine();
  const std::string target = detail::target_for(e.device_info(nullptr).cc);
  auto ms = [](auto t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto t0 = std::chrono::steady_clock::now();
  detail::compile("extern \"C\" __global__ void k() {}\n", "warm.cu", "warm", target);
  const double startup = ms(t0);
  // Keys a server compiles; each source gets a unique empty kernel appended so that no cache
  // at any level can answer (ours, or NVRTC's own, which keys on the PTX and so ignores
  // comments): this is the first compile of the key on a machine.
  const char* keys[] = {"rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip",
                        "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk_fwd_ip",
                        "rope_thd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip",
                        "rope_bshd_f16_d64_r64_gptj_pos-offset_tab-f32-half_qk_fwd_oop"};
  const std::string salt =
      "\nextern \"C\" __global__ void ropejit_bench_" +
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "_";
  double cold = 0, cold_max = 0, first_use = 0, disk = 0, memory = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const Spec s = parse_key(keys[n % 4]).canonical();
    const detail::KernelVariant v = detail::prefill_variant(s, 16);
    const detail::RenderedKernel r = detail::render(s, v);
    t0 = std::chrono::steady_clock::now();
    detail::compile(r.source + salt + std::to_string(n) + "() {}\n", r.entry + ".cu", r.key,
                    target);
    const double c = ms(t0);
    cold += c;
    cold_max = std::max(cold_max, c);
    {
      // Both heuristic kernels, concurrently, each made unique again.
      std::vector<std::future<void>> both;
      t0 = std::chrono::steady_clock::now();
      for (const detail::KernelVariant& each : detail::default_variants(s, 16)) {
        const detail::RenderedKernel rk = detail::render(s, each);
        const std::string unique = rk.source + salt + "first_" + std::to_string(n) + "() {}\n";
        both.push_back(std::async(std::launch::async, [unique, rk, &target] {
          detail::compile(unique, rk.entry + ".cu", rk.key, target);
        }));
      }
      for (std::future<void>& f : both) f.get();
      first_use += ms(t0);
    }
    e.image(s, v, target);  // compiled or loaded into the disk cache, then:
    e.clear_memory_cache();
    t0 = std::chrono::steady_clock::now();
    e.image(s, v, target);
    disk += ms(t0);
    t0 = std::chrono::steady_clock::now();
    e.image(s, v, target);
    memory += ms(t0);
    ++n;
  }
  state.counters["nvrtc_startup_ms"] = startup;
  state.counters["cold_compile_ms"] = cold / double(n);
  state.counters["cold_compile_max_ms"] = cold_max;
  state.counters["first_use_compiles_ms"] = first_use / double(n);
  state.counters["disk_hit_ms"] = disk / double(n);
  state.counters["memory_hit_ms"] = memory / double(n);
}

// The sbhd sweep (seq 256..3968 step 128 x batch {1, 2, 4, 8}, q and k of 64 heads, d128):
// one pair of device buffers sized for the largest case, filled with a non-zero pattern
// (correctness of these kernels is covered by the matrix tests and the checked cases above),
// each case a contiguous sbhd view of its own size at the start of the buffers.
struct SweepBuffers {
  CUdeviceptr q = 0, k = 0, cos = 0, sin = 0;
};

SweepBuffers& sweep_buffers(DType dtype) {
  static SweepBuffers buffers[3];
  SweepBuffers& b = buffers[int(dtype)];
  if (b.q) return b;
  const detail::Driver& d = detail::driver();
  const size_t elems = size_t(8) * 3968 * 64 * 128;
  const size_t bytes = elems * size_t(detail::element_bytes(dtype));
  detail::check(d.MemAlloc(&b.q, bytes), "cuMemAlloc");
  detail::check(d.MemAlloc(&b.k, bytes), "cuMemAlloc");
  // 0x3c00 is 1.0 in fp16, 0x3f000000 0.5 in fp32: a non-zero pattern, never zeros.
  if (dtype == DType::f32) {
    std::vector<float> ones(elems / 8, 0.5f);
    for (size_t off = 0; off < bytes; off += ones.size() * 4) {
      detail::check(d.MemcpyHtoD(b.q + off, ones.data(), ones.size() * 4), "fill");
      detail::check(d.MemcpyHtoD(b.k + off, ones.data(), ones.size() * 4), "fill");
    }
  } else {
    std::vector<uint16_t> ones(elems / 8, 0x3c00);
    for (size_t off = 0; off < bytes; off += ones.size() * 2) {
      detail::check(d.MemcpyHtoD(b.q + off, ones.data(), ones.size() * 2), "fill");
      detail::check(d.MemcpyHtoD(b.k + off, ones.data(), ones.size() * 2), "fill");
    }
  }
  std::vector<float> cs(size_t(3968) * 64), sn(cs.size());
  for (size_t r = 0; r < 3968; ++r)
    for (size_t i = 0; i < 64; ++i) {
      const double angle = double(r) * std::pow(10000.0, -double(i) / 64.0);
      cs[r * 64 + i] = float(std::cos(angle));
      sn[r * 64 + i] = float(std::sin(angle));
    }
  detail::check(d.MemAlloc(&b.cos, cs.size() * 4), "cuMemAlloc");
  detail::check(d.MemAlloc(&b.sin, sn.size() * 4), "cuMemAlloc");
  detail::check(d.MemcpyHtoD(b.cos, cs.data(), cs.size() * 4), "fill");
  detail::check(d.MemcpyHtoD(b.sin, sn.data(), sn.size() * 4), "fill");
  return b;
}

void run_sweep(benchmark::State& state, DType dtype, int64_t batch, int64_t seq) {
  const SweepBuffers& b = sweep_buffers(dtype);
  Spec spec;
  spec.layout = Layout::sbhd;
  spec.dtype = dtype;
  Args a;
  a.batch = batch;
  a.seq_len = seq;
  a.q = contiguous(Layout::sbhd, reinterpret_cast<void*>(b.q), batch, seq, 64, 128);
  a.k = contiguous(Layout::sbhd, reinterpret_cast<void*>(b.k), batch, seq, 64, 128);
  a.cos = reinterpret_cast<void*>(b.cos);
  a.sin = reinterpret_cast<void*>(b.sin);
  a.table_rows = 3968;
  a.stream = g_stream;
  apply(spec, a);
  // q and k read and written once, plus the cos and sin rows (64 fp32 each) of every position.
  const int64_t bytes =
      2 * 2 * batch * seq * 64 * 128 * detail::element_bytes(dtype) + seq * 128 * 4;
  time_against_copy(state, bytes, [&] { apply(spec, a); });
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!detail::try_driver(&why)) {
    std::printf("ropejit benchmarks: no usable GPU (%s); nothing to measure.\n", why.c_str());
    return 0;
  }
  detail::use_primary_context(0);
  detail::check(detail::driver().StreamCreate(&g_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  const Info info = ropejit::info();
  benchmark::AddCustomContext("gpu", info.devices.empty() ? "?" : info.devices[0]);
  benchmark::AddCustomContext("driver", std::to_string(info.driver_version));
  benchmark::AddCustomContext(
      "nvrtc", std::to_string(info.nvrtc_major) + "." + std::to_string(info.nvrtc_minor));
  benchmark::AddCustomContext("ropejit", info.version);

  benchmark::RegisterBenchmark("jit", jit_costs)->Iterations(8)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("host/bare_launch", host_overhead, true)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("host/apply_cached", host_overhead, false)
      ->Unit(benchmark::kMicrosecond);
  static const std::vector<Case> all = cases();
  for (const Case& c : all)
    benchmark::RegisterBenchmark(("rope/" + c.name).c_str(), run_case, c)
        ->UseManualTime()
        ->Iterations(50)
        ->Unit(benchmark::kMicrosecond);
  for (int64_t t : {1, 16, 64, 256}) {
    static std::vector<Case> graphs;
    graphs.push_back(make("graph_t" + std::to_string(t), DType::bf16, 128, 128, t, 32, 8));
    benchmark::RegisterBenchmark(("graph/decode_t" + std::to_string(t)).c_str(), run_graph,
                                 graphs.back())
        ->UseManualTime()
        ->Iterations(200)
        ->Unit(benchmark::kMicrosecond);
  }
  for (DType dtype : {DType::f16, DType::f32})
    for (int64_t batch : {1, 2, 4, 8})
      for (int64_t seq = 256; seq <= 3968; seq += 128)
        benchmark::RegisterBenchmark(("sweep/sbhd_" + std::string(to_string(dtype)) + "/b" +
                                      std::to_string(batch) + "/s" + std::to_string(seq))
                                         .c_str(),
                                     run_sweep, dtype, batch, seq)
            ->UseManualTime()
            ->Iterations(20)
            ->Unit(benchmark::kMicrosecond);
  register_fused_benchmarks();
  register_proj_benchmarks();
  register_norm_benchmarks();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
