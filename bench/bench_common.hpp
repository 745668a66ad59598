// What the benchmark files share: the stream, same-run copies, timing against a copy, and
// graph replay of captured calls.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda.h>

#include <algorithm>
#include <vector>

#include "autotune/timing.hpp"
#include "jit/driver.hpp"
#include "oracle/workload.hpp"

namespace ropejit::bench {

extern CUstream g_stream;

double median(std::vector<double> v);

// Median device time of copying `bytes` (half read, half written) on the stream, L2 flushed.
double copy_median_us(int64_t bytes, autotune::Flush flush = autotune::Flush::write);

// Median device time of one read-only pass over `bytes` (Timer::read_pass), L2 flushed: the
// read floor of a kernel that streams `bytes` of weights.
double read_median_us(int64_t bytes, autotune::Flush flush = autotune::Flush::read);

// For kernels bound by a weight read (projection, FFN), after time_against_copy(state, 2 * W,
// call, Flush::read): floor_us (W at the copy's bandwidth: half the copy of 2 x W), read_us (a
// read-only pass over W: the floor that a clean L2 leaves, since the copy's written half can
// stay in L2 and then costs less than its bytes), the call's median against each (x_floor,
// x_read) and its weight bandwidth. Weight-streaming rows flush the L2 by reading (clean lines,
// as in a model's step); ROPEJIT_FLUSH=write times them after a memset instead.
void report_weight_floor(benchmark::State& state, int64_t weight_bytes);

// Times `call` once per benchmark iteration (L2 flushed first) and reports the bytes, the
// median, and a same-run copy of the same bytes as counters.
template <class Call>
void time_against_copy(benchmark::State& state, int64_t bytes, const Call& call,
                       autotune::Flush flush = autotune::Flush::write) {
  autotune::Timer timer(g_stream, size_t(256) << 20, flush);
  std::vector<double> samples;
  for (auto _ : state) {
    const double us = timer.time(call, 0, 1).median_us;
    state.SetIterationTime(us * 1e-6);
    samples.push_back(us);
  }
  const double rope_us = median(samples), copy_us = copy_median_us(bytes, flush);
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
  state.counters["bytes"] = double(bytes);
  state.counters["median_us"] = rope_us;
  state.counters["copy_us"] = copy_us;
  state.counters["pct_copy"] = 100.0 * copy_us / rope_us;
}

// Runs the call once on the uploaded workload and checks it against float64 before anything is
// timed; false (and the row skipped with the first mismatch) when it fails.
bool checked_first(benchmark::State& state, oracle::Workload& w, const Spec& spec,
                   const Args& args);

// kGraphCalls calls captured once into a CUDA graph on g_stream, for replay.
constexpr int kGraphCalls = 20;
class CallGraph {
 public:
  template <class Call>
  explicit CallGraph(Call&& call) {
    const detail::Driver& d = detail::driver();
    detail::check(d.StreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "capture");
    for (int i = 0; i < kGraphCalls; ++i) call();
    detail::check(d.StreamEndCapture(g_stream, &graph_), "capture");
    detail::check(d.GraphInstantiateWithFlags(&exec_, graph_, 0), "instantiate");
  }
  ~CallGraph() {
    detail::driver().GraphExecDestroy(exec_);
    detail::driver().GraphDestroy(graph_);
  }
  CallGraph(const CallGraph&) = delete;
  CallGraph& operator=(const CallGraph&) = delete;

  // Device time of one replay, per captured call.
  double us_per_call(autotune::Timer& timer) const {
    return timer.time([&] { detail::driver().GraphLaunch(exec_, g_stream); }, 1, 1).median_us /
           kGraphCalls;
  }

 private:
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

// The fused rows (bench/bench_fused.cpp).
void register_fused_benchmarks();
// The decode block's projection rows (bench/bench_proj.cpp).
void register_proj_benchmarks();
// RMSNorm rows (bench/bench_proj.cpp).
void register_norm_benchmarks();

}  // namespace ropejit::bench
