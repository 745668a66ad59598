// The benchmark files' shared pieces.
#include "bench/bench_common.hpp"

namespace ropejit::bench {

CUstream g_stream = nullptr;

namespace {
CUdeviceptr g_copy_src = 0, g_copy_dst = 0;
size_t g_copy_bytes = 0;
}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double copy_median_us(int64_t bytes, autotune::Flush flush) {
  const detail::Driver& d = detail::driver();
  const size_t half = size_t(bytes / 2);
  if (half > g_copy_bytes) {
    if (g_copy_src) d.MemFree(g_copy_src), d.MemFree(g_copy_dst);
    detail::check(d.MemAlloc(&g_copy_src, half), "cuMemAlloc");
    detail::check(d.MemAlloc(&g_copy_dst, half), "cuMemAlloc");
    g_copy_bytes = half;
  }
  autotune::Timer timer(g_stream, size_t(256) << 20, flush);
  return timer.time([&] { d.MemcpyDtoDAsync(g_copy_dst, g_copy_src, half, g_stream); }, 3, 30)
      .median_us;
}

double read_median_us(int64_t bytes, autotune::Flush flush) {
  const detail::Driver& d = detail::driver();
  const size_t whole = size_t(bytes) / 16 * 16;
  if (whole > g_copy_bytes) {  // reads the copy's source buffer
    if (g_copy_src) d.MemFree(g_copy_src), d.MemFree(g_copy_dst);
    detail::check(d.MemAlloc(&g_copy_src, whole), "cuMemAlloc");
    detail::check(d.MemAlloc(&g_copy_dst, whole), "cuMemAlloc");
    g_copy_bytes = whole;
  }
  autotune::Timer timer(g_stream, size_t(256) << 20, flush);
  return timer.time([&] { timer.read_pass(g_copy_src, whole); }, 3, 30).median_us;
}

void report_weight_floor(benchmark::State& state, int64_t weight_bytes) {
  const double us = state.counters["median_us"];
  const double floor_us = state.counters["copy_us"] / 2;
  const double read_us = read_median_us(weight_bytes, autotune::Flush::read);
  state.counters["floor_us"] = floor_us;
  state.counters["x_floor"] = us / floor_us;
  state.counters["read_us"] = read_us;
  state.counters["x_read"] = us / read_us;
  state.counters["weight_gbps"] = double(weight_bytes) / us / 1e3;
  state.counters["pct_copy"] = 100.0 * floor_us / us;
}

bool checked_first(benchmark::State& state, oracle::Workload& w, const Spec& spec,
                   const Args& args) {
  apply(spec, args);
  const oracle::CheckReport r = w.check();
  if (!r.ok) state.SkipWithError(("float64 check failed: " + r.first_failure).c_str());
  return r.ok;
}

}  // namespace ropejit::bench
