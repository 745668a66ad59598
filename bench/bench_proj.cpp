// The decode block's QKV projection (RMSNorm -> QKV GEMM -> RoPE, one kernel) at Llama-3-8B's
// shape (hidden 4096, 32 q + 8 kv heads of 128: a 6144 x 4096 bf16 weight, 50 MB), against the
// weight-read floor: the weight's bytes at the bandwidth of a same-run device copy (a copy of
// 2 x 50 MB, half read and half written, takes twice the floor), and a read-only pass over the
// weight's bytes (read_us, x_read). L2 flushed before every timed call by reading a 256 MB
// buffer (clean lines, as after the previous layer's weights; bench_common.hpp): the weight is
// as large as the H100's L2, so repeated calls would otherwise find part of it there.
//   proj/llama3_8b_m<M>: the library's choice for M tokens;
//   proj_fp8/llama3_8b_m<M>: the same with e4m3 weights and a scale per column (25 MB; the floor
//   is those bytes); ffn_fp8/m<M> likewise for the FFN's gate/up (117 MB of e4m3 weights, fused);
//   proj_k[_fp8]/k<K>_m1: one token, the same 6144 output columns over a hidden size K of
//   1024..16384: the time against the weight's bytes separates a fixed cost from the stream;
//   proj_cluster/<shape>_m<M>/<variant>: thread-block clusters splitting the hidden dimension
//   against the same split without them, at Llama-3-8B and at a tensor-parallel shard of
//   Llama-3-70B whose 80 column blocks cannot fill the GPU alone;
//   proj_cache[_fp8]/llama3_8b_m<M>: bf16 weights, k and v also appended to a KV cache through
//   slots (bf16, or e4m3 with a static scale);
//   proj_variants[_fp8]/m<M>/<variant>: every legal kernel variant with the call's token tiles
//   (bf16 or e4m3 weights), to see what the heuristic leaves;
//   proj_chunk/m<M>/<fused|unfused|auto>: a prefill chunk of M tokens in 4 sequences
//   (cu_seqlens) into an e4m3 paged cache, each path (unfused: GEMM, then the fused RoPE key
//   appending k and v);
//   proj_steps/m<M>/<norm|gemm|rope|gemm_rope|all>: the unfused path's steps timed apart;
//   proj_path/m<M>/<fused|unfused|auto>: the fused kernel, the unfused path (RMSNorm key ->
//   cuBLASLt GEMM -> RoPE key) and the automatic choice (tuning file, else the heuristic) from
//   1 to 4096 tokens: the chooser should track the faster of the two everywhere;
//   proj_path_fp8/m<M>/<path>, ffn_path_fp8/m<M>/<path>: the same with e4m3 weights (the
//   unfused path dequantizes them chunk by chunk before its GEMM). Results are
//   checked against float64 up to 64 tokens (the host reference costs M x 6144 x 4096
//   multiply-adds); the GPU tests check every path at larger token counts on smaller shapes.
#include <string>
#include <vector>

#include "api/engine.hpp"
#include "bench_common.hpp"
#include "jit/decode/gemm.hpp"
#include "jit/decode/proj.hpp"
#include "oracle/decode/ffn_workload.hpp"
#include "oracle/decode/norm_workload.hpp"
#include "oracle/decode/proj_workload.hpp"

namespace ropejit::bench {
namespace {

QkvProjSpec llama_spec() {
  QkvProjSpec s;  // bf16, d128, neox, ids, f32 half table, RMSNorm
  return s;
}

// A projection's shape: hidden size and head counts (d128).
struct Shape {
  int64_t hidden = 4096;
  int32_t q_heads = 32, kv_heads = 8;
};

oracle::ProjSizes llama_sizes(int64_t tokens, Shape shape = {}) {
  oracle::ProjSizes z;
  z.tokens = tokens;
  z.hidden = shape.hidden;
  z.q_heads = shape.q_heads;
  z.kv_heads = shape.kv_heads;
  z.max_position = 8191;
  return z;
}

void run_proj(benchmark::State& state, int64_t tokens, const detail::ProjVariant* variant,
              Weights weights = Weights::same, KvCache cache = KvCache::none,
              Store cache_store = Store::same, Shape dims = {}) {
  QkvProjSpec s = llama_spec();
  s.weights = weights;
  s.cache = cache;
  s.cache_store = cache_store;
  const QkvProjSpec c = s.canonical();
  oracle::ProjProblem p(s, llama_sizes(tokens, dims));
  p.upload();
  const QkvProjArgs args = p.args(g_stream);
  const detail::ProjShape shape = detail::check_proj_call(c, args);
  auto call = [&] {
    if (variant)
      api::decode_engine().launch_proj(c, args, shape, variant);
    else
      qkv_projection(s, args);
  };
  call();
  const oracle::CheckReport r = p.check();
  if (!r.ok) {
    state.SkipWithError(("wrong result: " + r.first_failure).c_str());
    return;
  }
  time_against_copy(state, 2 * p.weight_bytes(), call,
                    autotune::Flush::read);  // copy_us: a copy of 2 x W
  report_weight_floor(state, p.weight_bytes());
  state.SetBytesProcessed(int64_t(state.iterations()) * p.bytes_moved());
  state.SetLabel(c.key() + (variant ? " " + variant->name() : std::string(" default")));
}

void run_path(benchmark::State& state, int64_t tokens, ProjPath path, KvCache cache = KvCache::none,
              Store cache_store = Store::same, int32_t sequences = 0,
              Weights weights = Weights::same) {
  QkvProjSpec s = llama_spec();
  s.weights = weights;
  s.cache = cache;
  s.cache_store = cache_store;
  oracle::ProjSizes z = llama_sizes(tokens);
  z.cache_sequences = sequences;
  z.path = path == ProjPath::fused ? ProjPath::fused : ProjPath::automatic;  // workspace
  z.reference = tokens <= 64;
  oracle::ProjProblem p(s, z);
  p.upload();
  QkvProjArgs args = p.args(g_stream);
  args.path = path;
  auto call = [&] { qkv_projection(s, args); };
  call();
  if (z.reference) {
    const oracle::CheckReport r = p.check();
    if (!r.ok) {
      state.SkipWithError(("wrong result: " + r.first_failure).c_str());
      return;
    }
  }
  const ProjPath taken = path == ProjPath::automatic ? qkv_projection_path(s, args) : path;
  time_against_copy(state, 2 * p.weight_bytes(), call, autotune::Flush::read);
  report_weight_floor(state, p.weight_bytes());
  state.counters["unfused"] = taken == ProjPath::unfused ? 1 : 0;
  const double weights_elements =
      double(z.hidden) * double(z.q_heads + 2 * z.kv_heads) * double(s.head_dim);
  state.counters["tflops"] =
      2.0 * double(tokens) * weights_elements / state.counters["median_us"] / 1e6;
  state.SetBytesProcessed(int64_t(state.iterations()) * p.bytes_moved());
  state.SetLabel(s.key() + " " + to_string(path) + " -> " + to_string(taken) +
                 (z.reference ? "" : " (unchecked)"));
}

// The unfused path's steps timed apart at Llama-3-8B's shape: the RMSNorm key into the
// workspace, the cuBLASLt GEMM, the RoPE key on q and k, GEMM then RoPE, and the whole path
// (each after a read flush, as the path's first step sees it).
enum class Step { norm, gemm, rope, gemm_rope, all };

const char* step_name(Step s) {
  switch (s) {
    case Step::norm:
      return "norm";
    case Step::gemm:
      return "gemm";
    case Step::rope:
      return "rope";
    case Step::gemm_rope:
      return "gemm_rope";
    case Step::all:
      return "all";
  }
  return "?";
}

void run_step(benchmark::State& state, int64_t tokens, Step step) {
  const QkvProjSpec s = llama_spec();
  const QkvProjSpec c = s.canonical();
  oracle::ProjSizes z = llama_sizes(tokens);
  z.path = ProjPath::automatic;  // a workspace
  z.reference = false;
  oracle::ProjProblem p(s, z);
  p.upload();
  QkvProjArgs args = p.args(g_stream);
  args.path = ProjPath::unfused;
  const detail::ProjShape shape = detail::check_proj_call(c, args);
  CUcontext ctx = nullptr;
  detail::check(detail::driver().CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  const size_t norm_bytes = detail::proj_norm_bytes(c, shape.tokens, shape.hidden);
  RmsNormArgs n;
  n.rows = tokens;
  n.hidden = shape.hidden;
  n.x = args.x;
  n.x_stride = shape.hidden;
  n.weight = args.norm_weight;
  n.norm_eps = args.norm_eps;
  n.out = args.workspace;
  n.out_stride = shape.hidden;
  n.stream = g_stream;
  detail::GemmCall g;
  g.dtype = c.dtype;
  g.m = tokens;
  g.k = shape.hidden;
  g.a = args.workspace;
  g.lda = shape.hidden;
  g.n = (shape.q_heads + 2 * shape.kv_heads) * c.head_dim;
  g.b = args.weight;
  g.ldb = shape.hidden;
  g.d = args.q.data;
  g.ldd = args.q.stride_seq;
  g.workspace = static_cast<char*>(args.workspace) + norm_bytes;
  g.workspace_bytes = args.workspace_bytes - norm_bytes;
  g.stream = g_stream;
  const Spec rs = detail::proj_rope_spec(c, args);
  const Args ra = detail::proj_rope_args(c, args);
  auto call = [&] {
    if (step == Step::norm) rms_norm(detail::proj_norm_spec(c), n);
    if (step == Step::gemm || step == Step::gemm_rope) detail::gemm(ctx, g);
    if (step == Step::rope || step == Step::gemm_rope) apply(rs, ra);
    if (step == Step::all) qkv_projection(s, args);
  };
  call();
  time_against_copy(state, 2 * p.weight_bytes(), call, autotune::Flush::read);
  report_weight_floor(state, p.weight_bytes());
  state.SetLabel(s.key() + " " + step_name(step));
}

// The FFN's gate/up at Llama-3-8B's shape (hidden 4096, intermediate 14336: two 14336 x 4096
// bf16 weights, 235 MB), every path, against the weight-read floor. Checked against float64 up
// to 8 tokens (M x 28672 x 4096 host multiply-adds).
void run_ffn_path(benchmark::State& state, int64_t tokens, ProjPath path,
                  Weights weights = Weights::same) {
  FfnSpec s;  // bf16, RMSNorm, SiLU
  s.weights = weights;
  oracle::FfnSizes z;
  z.tokens = tokens;
  z.hidden = 4096;
  z.intermediate = 14336;
  z.path = path == ProjPath::fused ? ProjPath::fused : ProjPath::automatic;  // workspace
  z.reference = tokens <= 8;
  oracle::FfnProblem p(s, z);
  p.upload();
  FfnArgs args = p.args(g_stream);
  args.path = path;
  auto call = [&] { ffn_gate_up(s, args); };
  call();
  if (z.reference) {
    const oracle::CheckReport r = p.check();
    if (!r.ok) {
      state.SkipWithError(("wrong result: " + r.first_failure).c_str());
      return;
    }
  }
  const ProjPath taken = path == ProjPath::automatic ? ffn_gate_up_path(s, args) : path;
  time_against_copy(state, 2 * p.weight_bytes(), call, autotune::Flush::read);
  report_weight_floor(state, p.weight_bytes());
  state.counters["unfused"] = taken == ProjPath::unfused ? 1 : 0;
  state.SetBytesProcessed(int64_t(state.iterations()) * p.bytes_moved());
  state.SetLabel(s.key() + " " + to_string(path) + " -> " + to_string(taken) +
                 (z.reference ? "" : " (unchecked)"));
}

}  // namespace

void register_proj_benchmarks() {
  for (const int64_t m : {1, 4, 8, 16, 32, 64, 256, 1024, 4096})
    for (const ProjPath path : {ProjPath::fused, ProjPath::unfused, ProjPath::automatic})
      benchmark::RegisterBenchmark(
          ("ffn_path/m" + std::to_string(m) + "/" + to_string(path)).c_str(),
          [m, path](benchmark::State& st) { run_ffn_path(st, m, path); })
          ->UseManualTime()
          ->Iterations(20)
          ->Unit(benchmark::kMicrosecond);
  for (const int64_t m : {1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096})
    for (const ProjPath path : {ProjPath::fused, ProjPath::unfused, ProjPath::automatic})
      benchmark::RegisterBenchmark(
          ("proj_path/m" + std::to_string(m) + "/" + to_string(path)).c_str(),
          [m, path](benchmark::State& st) { run_path(st, m, path); })
          ->UseManualTime()
          ->Iterations(30)
          ->Unit(benchmark::kMicrosecond);
  for (const int64_t m : {16, 32, 64, 256, 1024})
    for (const Step step : {Step::norm, Step::gemm, Step::rope, Step::gemm_rope, Step::all})
      benchmark::RegisterBenchmark(
          ("proj_steps/m" + std::to_string(m) + "/" + step_name(step)).c_str(),
          [m, step](benchmark::State& st) { run_step(st, m, step); })
          ->UseManualTime()
          ->Iterations(30)
          ->Unit(benchmark::kMicrosecond);
  for (const int64_t m : {1, 2, 4, 8, 16, 32, 64})
    benchmark::RegisterBenchmark(("proj/llama3_8b_m" + std::to_string(m)).c_str(),
                                 [m](benchmark::State& st) { run_proj(st, m, nullptr); })
        ->UseManualTime()
        ->Iterations(50)
        ->Unit(benchmark::kMicrosecond);
  for (const int64_t m : {1, 2, 4, 8, 16, 32, 64})
    benchmark::RegisterBenchmark(
        ("proj_fp8/llama3_8b_m" + std::to_string(m)).c_str(),
        [m](benchmark::State& st) { run_proj(st, m, nullptr, Weights::e4m3); })
        ->UseManualTime()
        ->Iterations(50)
        ->Unit(benchmark::kMicrosecond);
  for (const int64_t m : {1, 4, 8, 16, 32, 64})
    benchmark::RegisterBenchmark(
        ("ffn_fp8/m" + std::to_string(m)).c_str(),
        [m](benchmark::State& st) { run_ffn_path(st, m, ProjPath::fused, Weights::e4m3); })
        ->UseManualTime()
        ->Iterations(20)
        ->Unit(benchmark::kMicrosecond);
  // e4m3 weights on both paths (unfused: the weight dequantized chunk by chunk, then the GEMM).
  for (const int64_t m : {16, 32, 64, 128, 256, 1024, 4096})
    for (const ProjPath path : {ProjPath::fused, ProjPath::unfused, ProjPath::automatic}) {
      benchmark::RegisterBenchmark(
          ("proj_path_fp8/m" + std::to_string(m) + "/" + to_string(path)).c_str(),
          [m, path](benchmark::State& st) {
            run_path(st, m, path, KvCache::none, Store::same, 0, Weights::e4m3);
          })
          ->UseManualTime()
          ->Iterations(30)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(
          ("ffn_path_fp8/m" + std::to_string(m) + "/" + to_string(path)).c_str(),
          [m, path](benchmark::State& st) { run_ffn_path(st, m, path, Weights::e4m3); })
          ->UseManualTime()
          ->Iterations(20)
          ->Unit(benchmark::kMicrosecond);
    }
  // A prefill chunk of 4 sequences into an e4m3 paged cache (16-token pages), both paths.
  for (const int64_t m : {16, 64, 256, 1024, 4096})
    for (const ProjPath path : {ProjPath::fused, ProjPath::unfused, ProjPath::automatic})
      benchmark::RegisterBenchmark(
          ("proj_chunk/m" + std::to_string(m) + "/" + to_string(path)).c_str(),
          [m, path](benchmark::State& st) {
            run_path(st, m, path, KvCache::paged, Store::e4m3, 4);
          })
          ->UseManualTime()
          ->Iterations(20)
          ->Unit(benchmark::kMicrosecond);
  for (const Store store : {Store::same, Store::e4m3})
    for (const int64_t m : {1, 8, 16, 64})
      benchmark::RegisterBenchmark(
          (std::string(store == Store::e4m3 ? "proj_cache_fp8" : "proj_cache") + "/llama3_8b_m" +
           std::to_string(m))
              .c_str(),
          [m, store](benchmark::State& st) {
            run_proj(st, m, nullptr, Weights::same, KvCache::slots, store);
          })
          ->UseManualTime()
          ->Iterations(50)
          ->Unit(benchmark::kMicrosecond);
  for (const Weights w : {Weights::same, Weights::e4m3})
    for (const int64_t k : {1024, 2048, 4096, 8192, 16384})
      benchmark::RegisterBenchmark(
          (std::string(w == Weights::e4m3 ? "proj_k_fp8" : "proj_k") + "/k" + std::to_string(k) +
           "_m1")
              .c_str(),
          [w, k](benchmark::State& st) {
            run_proj(st, 1, nullptr, w, KvCache::none, Store::same, Shape{k, 32, 8});
          })
          ->UseManualTime()
          ->Iterations(50)
          ->Unit(benchmark::kMicrosecond);
  // Thread-block clusters splitting the hidden dimension (sm_90): Llama-3-8B (384 column
  // blocks) and one GPU's share of Llama-3-70B at tensor parallelism 8 (hidden 8192, 8 q + 1 kv
  // heads: 80 column blocks, fewer than the SMs), against the same kernel without clusters.
  static std::vector<detail::ProjVariant> clustered;
  for (const int32_t tiles : {1, 2})
    for (const int32_t splits : {2, 4, 8})
      for (const int32_t cluster : {1, 2, 4, 8}) {
        detail::ProjVariant v{tiles, splits, tiles == 1 ? 2 : 1};
        v.cluster = cluster;
        if (splits * cluster >= 8 && splits * cluster <= 32) clustered.push_back(v);
      }
  const std::pair<const char*, Shape> cluster_shapes[] = {{"l8b", Shape{}},
                                                          {"l70b_tp8", Shape{8192, 8, 1}}};
  for (const auto& [name, shape] : cluster_shapes)
    for (const int64_t m : {1, 16})
      for (const detail::ProjVariant& v : clustered) {
        if (v.token_tiles != detail::proj_token_tiles(m)) continue;
        const detail::ProjVariant* pv = &v;
        const Shape sh = shape;
        benchmark::RegisterBenchmark(
            (std::string("proj_cluster/") + name + "_m" + std::to_string(m) + "/" + v.name())
                .c_str(),
            [m, pv, sh](benchmark::State& st) {
              run_proj(st, m, pv, Weights::same, KvCache::none, Store::same, sh);
            })
            ->UseManualTime()
            ->Iterations(30)
            ->Unit(benchmark::kMicrosecond);
      }
  static std::vector<detail::ProjVariant> variants, fp8_variants;
  for (const int32_t tiles : {1, 2, 4, 8})
    for (const int32_t splits : {1, 2, 4, 8})
      for (const int32_t unroll : {1, 2, 4})
        for (const bool wide : {false, true}) {
          detail::ProjVariant v{tiles, splits, unroll};
          v.wide = wide;
          if (detail::proj_variant_problem(v).empty()) variants.push_back(v);
          if (detail::proj_variant_problem(v, true).empty()) fp8_variants.push_back(v);
          // Row groups sharing staged activations (4 or 8 warps; swapped with 16-bit weights).
          // Clusters of 2 and 4 too: fewer, wider blocks need them to fill the GPU.
          for (const int32_t rows : {2, 4, 8})
            for (const int32_t cluster : {1, 2, 4}) {
              if (wide || (splits * rows != 4 && splits * rows != 8)) continue;
              detail::ProjVariant r = v;
              r.rows = rows;
              r.cluster = cluster;
              if (detail::proj_variant_problem(r, true).empty()) fp8_variants.push_back(r);
              r.swap = tiles >= 2;
              if (detail::proj_variant_problem(r).empty()) variants.push_back(r);
            }
        }
  for (const Weights w : {Weights::same, Weights::e4m3})
    for (const int64_t m : {1, 16, 32, 64})
      for (const detail::ProjVariant& v : w == Weights::e4m3 ? fp8_variants : variants) {
        if (v.token_tiles != detail::proj_token_tiles(m)) continue;
        const detail::ProjVariant* pv = &v;
        benchmark::RegisterBenchmark(
            (std::string(w == Weights::e4m3 ? "proj_variants_fp8" : "proj_variants") + "/m" +
             std::to_string(m) + "/" + v.name())
                .c_str(),
            [m, pv, w](benchmark::State& st) { run_proj(st, m, pv, w); })
            ->UseManualTime()
            ->Iterations(30)
            ->Unit(benchmark::kMicrosecond);
      }
}

}  // namespace ropejit::bench

namespace ropejit::bench {
namespace {

void run_norm(benchmark::State& state, int64_t rows, bool residual) {
  const RmsNormSpec s{DType::bf16, Norm::rms, residual};
  oracle::NormSizes z;
  z.rows = rows;
  z.hidden = 4096;
  oracle::NormProblem p(s, z);
  p.upload();
  const RmsNormArgs args = p.args(g_stream);
  rms_norm(s, args);
  const oracle::CheckReport r = p.check();
  if (!r.ok) {
    state.SkipWithError(("wrong result: " + r.first_failure).c_str());
    return;
  }
  p.upload();  // the residual was updated in place
  time_against_copy(state, p.bytes_moved(), [&] { rms_norm(s, args); });
  state.SetLabel(s.key());
}

}  // namespace

void register_norm_benchmarks() {
  for (const bool residual : {false, true})
    for (const int64_t rows : {1, 64, 4096, 32768})
      benchmark::RegisterBenchmark(
          (std::string("rmsnorm/h4096") + (residual ? "_res" : "") + "_rows" + std::to_string(rows))
              .c_str(),
          [rows, residual](benchmark::State& st) { run_norm(st, rows, residual); })
          ->UseManualTime()
          ->Iterations(50)
          ->Unit(benchmark::kMicrosecond);
}

}  // namespace ropejit::bench
