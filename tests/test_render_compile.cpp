// Rendering and NVRTC compilation (no GPU needed): a covering array of the key matrix in
// which every pair of axis values appears, compiled for sm_80 and sm_90.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.hpp"
#include "autotune/policy.hpp"
#include "jit/nvrtc.hpp"
#include "jit/render.hpp"

using namespace ropejit;
using detail::KernelVariant;

namespace {

// The PTX NVRTC emits for a rendered kernel on a compute_XY target.
std::string ptx_of(const detail::RenderedKernel& r, const char* target) {
  const detail::CompileResult c = detail::compile(r.source, r.entry + ".cu", r.key, target);
  REQUIRE(c.is_ptx);
  return c.image;
}

struct DimPair {
  int32_t head_dim, rotary_dim;
};

// Axis values of the key. Table dtype and width form one axis with computed frequencies.
const std::vector<DimPair> kDims = {{64, 64},   {64, 32},  {80, 80},   {80, 32},
                                    {96, 96},   {96, 24},  {128, 128}, {128, 64},
                                    {256, 256}, {256, 20}, {512, 512}, {112, 112}};
struct FreqChoice {
  Freqs freqs;
  DType dtype;
  TableWidth width;
};
const std::vector<FreqChoice> kFreqs = {{Freqs::computed, DType::f32, TableWidth::half},
                                        {Freqs::table, DType::f32, TableWidth::half},
                                        {Freqs::table, DType::f32, TableWidth::full},
                                        {Freqs::table, DType::f16, TableWidth::half},
                                        {Freqs::table, DType::bf16, TableWidth::full},
                                        {Freqs::table, DType::bf16, TableWidth::half},
                                        {Freqs::linear, DType::f32, TableWidth::half},
                                        {Freqs::dynamic_ntk, DType::f32, TableWidth::half},
                                        {Freqs::llama3, DType::f32, TableWidth::half},
                                        {Freqs::yarn, DType::f32, TableWidth::half},
                                        {Freqs::longrope, DType::f32, TableWidth::half}};
struct PosChoice {
  Positions positions;
  IndexType index;
};
const std::vector<PosChoice> kPositions = {
    {Positions::offset, IndexType::i64},      {Positions::seq_offsets, IndexType::i32},
    {Positions::seq_offsets, IndexType::i64}, {Positions::ids, IndexType::i32},
    {Positions::ids, IndexType::i64},         {Positions::mrope, IndexType::i32},
    {Positions::mrope, IndexType::i64}};
const std::vector<int> kSizes = {
    4, 3, int(kDims.size()), 2, int(kPositions.size()), int(kFreqs.size()), 2, 2};

Spec spec_of(const std::vector<int>& v) {
  Spec s;
  s.layout = Layout(v[0]);
  s.dtype = DType(v[1]);
  s.head_dim = kDims[size_t(v[2])].head_dim;
  s.rotary_dim = kDims[size_t(v[2])].rotary_dim;
  s.style = Style(v[3]);
  s.positions = kPositions[size_t(v[4])].positions;
  s.index_type = kPositions[size_t(v[4])].index;
  s.freqs = kFreqs[size_t(v[5])].freqs;
  s.table_dtype = kFreqs[size_t(v[5])].dtype;
  s.table_width = kFreqs[size_t(v[5])].width;
  s.direction = Direction(v[6]);
  s.in_place = v[7] == 0;
  return s.canonical();
}

// The fused axes, crossed with the plain ones: which of q and k are written, norm, FP8 outputs,
// cache and its store. Combinations the spec refuses are repaired (spec_of_fused).
const std::vector<int> kFusedSizes = {
    4, 3, int(kDims.size()), 2, int(kPositions.size()), int(kFreqs.size()), 2, 2, 4, 3, 4, 3};

Spec spec_of_fused(const std::vector<int>& v) {
  Spec s = spec_of({v[0], v[1], v[2], v[3], v[4], v[5], 0, v[6]});
  s.fusion = Fusion(v[7]);
  s.norm = Norm(v[8]);
  s.out_store = Store(v[9]);
  s.cache = KvCache(v[10]);
  s.cache_store = Store(v[11]);
  if (s.fusion == Fusion::q && s.cache == KvCache::none) s.cache = KvCache::slots;
  if (s.cache == KvCache::none) s.cache_store = Store::same;
  if (is_fp8(s.out_store)) s.in_place = false;
  if (!s.fused()) s.norm = Norm::rms;
  return s.canonical();
}

// Greedy all-pairs covering array over axes of `sizes` values: each new row takes, from a
// deterministic pool of candidates, the one covering the most uncovered value pairs.
std::vector<std::vector<int>> covering_array(const std::vector<int>& sizes = kSizes) {
  const size_t n = sizes.size();
  std::set<std::vector<int>> uncovered;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b)
      for (int x = 0; x < sizes[a]; ++x)
        for (int y = 0; y < sizes[b]; ++y) uncovered.insert({int(a), x, int(b), y});
  std::vector<std::vector<int>> rows;
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  while (!uncovered.empty()) {
    std::vector<int> best;
    size_t best_gain = 0;
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<int> row(n);
      const std::vector<int>& seed = *std::next(uncovered.begin(), next() % uncovered.size());
      for (size_t i = 0; i < n; ++i) row[i] = int(next() % uint32_t(sizes[i]));
      row[size_t(seed[0])] = seed[1];
      row[size_t(seed[2])] = seed[3];
      size_t gain = 0;
      for (size_t a = 0; a < n; ++a)
        for (size_t b = a + 1; b < n; ++b)
          gain += uncovered.count({int(a), row[a], int(b), row[b]});
      if (gain > best_gain) {
        best_gain = gain;
        best = row;
      }
    }
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b) uncovered.erase({int(a), best[a], int(b), best[b]});
    rows.push_back(best);
  }
  return rows;
}

TEST_CASE("rendering binds every axis and nothing else") {
  const Spec s = parse_key("rope_thd_f16_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop");
  const KernelVariant v{4, 2, 256};
  const detail::RenderedKernel r = detail::render(s.canonical(), v);
  CHECK(r.key == "rope_thd_f16_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop");
  CHECK(r.entry == "rope_thd_f16_d80_r32_gptj_posZidsZi32_comp_qk_bwd_oop__v4h2t256");
  // Each constant is an enumerator: "name = value," or, last in its enum, "name = value\n".
  auto binds = [&](const std::string& binding) {
    for (size_t at = r.source.find(binding); at != std::string::npos;
         at = r.source.find(binding, at + 1)) {
      const char next = r.source[at + binding.size()];
      if (next == ',' || next == '\n') return true;
    }
    return false;
  };
  for (const char* binding :
       {"kDType = 1", "kHeadDim = 80", "kRotaryDim = 32", "kNeox = false", "kPacked = true",
        "kPosMode = 2", "kIdx64 = false", "kComputed = true", "kBackward = true",
        "kInPlace = false", "kVec = 4", "kHeadsPerThread = 2", "kGridStride = false"})
    CHECK_MESSAGE(binds(binding), binding);
  CHECK(r.source.find("__launch_bounds__(256, 1)") != std::string::npos);
  CHECK(r.source.find("{{") == std::string::npos);
  // Fused kernels of up to 256 threads keep two blocks per SM.
  const Spec fused =
      parse_key("rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-cpaged_fwd_ip");
  CHECK(detail::render(fused, KernelVariant{8, 1, 256}).source.find("__launch_bounds__(256, 2)") !=
        std::string::npos);
  CHECK(detail::render(fused, KernelVariant{8, 1, 512}).source.find("__launch_bounds__(512, 1)") !=
        std::string::npos);
  // Deterministic: the same inputs render byte-identical source (cache keys depend on it).
  CHECK(detail::render(s.canonical(), v).source == r.source);
}

TEST_CASE("a kernel module declares no device globals") {
  // Static constexpr members would each become a .global variable that the driver allocates
  // and initializes at every module load; the constants are enumerators instead.
  for (const char* key : {"rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip",
                          "rope_thd_f16_d80_r32_gptj_pos-offset_comp_qk_bwd_oop"}) {
    const Spec s = parse_key(key).canonical();
    const detail::RenderedKernel r = detail::render(s, detail::prefill_variant(s, 16));
    const std::string ptx = ptx_of(r, "compute_90");
    CHECK_MESSAGE(ptx.find("\n.global ") == std::string::npos, key);
    CHECK(ptx.find(".entry " + r.entry) != std::string::npos);
  }
}

TEST_CASE(
    "a RoPE kernel waits for the previous grid before any load, then releases its dependents") {
  // The engine launches every RoPE kernel as a programmatic dependent launch on sm_90+: the
  // kernel may start while the stream's previous kernel still runs, so nothing may read memory
  // before griddepcontrol.wait; right after it, launch_dependents lets the next programmatic
  // launch be scheduled. Older targets carry neither instruction.
  for (const char* key :
       {"rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip",
        "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3-cpaged-e4m3_fwd_oop"}) {
    const Spec s = parse_key(key).canonical();
    const detail::RenderedKernel r = detail::render(s, detail::decode_variant(s, 16));
    const std::string ptx = ptx_of(r, "compute_90");
    const size_t wait = ptx.find("griddepcontrol.wait;");
    const size_t release = ptx.find("griddepcontrol.launch_dependents;");
    REQUIRE_MESSAGE(wait != std::string::npos, key);
    REQUIRE_MESSAGE(release != std::string::npos, key);
    CHECK_MESSAGE(wait < release, key);
    const size_t body = ptx.find(".entry " + r.entry);
    REQUIRE(body != std::string::npos);
    REQUIRE(body < wait);
    // Every instruction before the wait: nothing that reads or writes memory but the kernel's
    // own parameters (loads of any state space, stores, copies, texture reads, atomics).
    std::istringstream before(ptx.substr(body, wait - body));
    for (std::string line; std::getline(before, line);) {
      std::string op = line.substr(std::min(line.find_first_not_of(" \t"), line.size()));
      if (!op.empty() && op[0] == '@') op = op.substr(std::min(op.find(' ') + 1, op.size()));
      const bool param = op.rfind("ld.param", 0) == 0;
      bool memory = false;
      for (const char* m :
           {"ld.", "ldu.", "st.", "cp.", "tex.", "tld4.", "atom.", "red.", "prefetch"})
        memory = memory || op.rfind(m, 0) == 0;
      CHECK_MESSAGE(!(memory && !param), key, ": '", op, "' before griddepcontrol.wait");
    }
    CHECK(ptx_of(r, "compute_80").find("griddepcontrol") == std::string::npos);
  }
}

TEST_CASE("fused kernels keep their per-thread arrays in registers") {
  // A reference chosen at run time between two register arrays (q's or k's norm weights) made
  // NVVM place both in a local-memory stack frame, with loads from it in the store loop; the
  // PTX of such a kernel declares a __local_depot.
  for (const char* key :
       {"rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-cpaged_fwd_ip",
        "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3-cpaged-e4m3_fwd_oop",
        "rope_thd_f16_d64_r32_gptj_pos-ids-i64_tab-f32-half_q-nrms1p-cslots_fwd_ip",
        "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk-nrmsall_fwd_ip",
        "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-cpaged-e4m3dyn_fwd_"
        "oop",
        "rope_bshd_bf16_d256_r64_gptj_pos-ids-i64_tab-f32-half_qk-nrms-oe4m3dyn-cslots_fwd_oop"}) {
    const Spec s = parse_key(key).canonical();
    detail::KernelVariant narrow = detail::decode_variant(s, 16);
    narrow.narrow = true;
    for (const detail::KernelVariant& v :
         {detail::decode_variant(s, 16), detail::prefill_variant(s, 16), narrow}) {
      const detail::RenderedKernel r = detail::render(s, v);
      CHECK_MESSAGE(ptx_of(r, "compute_90").find("__local_depot") == std::string::npos, key, " ",
                    v.name());
    }
  }
}

TEST_CASE("a ring kernel copies its passes through cp.async, and waits for all but ring - 1") {
  // sm_80+: each pass's heads go to shared memory by cp.async, one group per pass, and a pass
  // is read after waiting for all groups but the ring's other slots. sm_75 has no cp.async: the
  // same kernel with ordinary loads and stores.
  const Spec s = parse_key(
                     "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-cpaged-"
                     "e4m3dyn_fwd_oop")
                     .canonical();
  for (int32_t ring : {2, 3, 4}) {
    detail::KernelVariant v = detail::prefill_variant(s, 16);
    v.ring = ring;
    REQUIRE(detail::variant_problem(s, v).empty());
    const detail::RenderedKernel r = detail::render(s, v);
    const std::string ptx = ptx_of(r, "compute_80");
    CHECK_MESSAGE(ptx.find("cp.async.cg.shared.global") != std::string::npos, v.name());
    CHECK_MESSAGE(ptx.find("cp.async.commit_group") != std::string::npos, v.name());
    CHECK_MESSAGE(
        ptx.find("cp.async.wait_group " + std::to_string(ring - 1) + ";") != std::string::npos,
        v.name());
    CHECK(ptx_of(r, "compute_75").find("cp.async") == std::string::npos);
    CHECK(ptx_of(r, "compute_90").find("__local_depot") == std::string::npos);
  }
  // Legality: fused keys, one or two heads per thread, 16-byte vectors, 2..4 slots.
  detail::KernelVariant v = detail::prefill_variant(s, 16);
  v.ring = 5;
  CHECK(detail::variant_problem(s, v) == "ring (5) must be 0 or 2..4");
  v.ring = 3;
  v.heads_per_thread = 4;
  CHECK(detail::variant_problem(s, v) == "ring (3) needs one or two heads per thread, not 4");
  v.heads_per_thread = 2;
  v.vec = 4;
  CHECK(detail::variant_problem(s, v) == "ring (3) needs 16-byte vectors, not 8");
  const Spec plain = parse_key("rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip");
  v = detail::prefill_variant(plain, 16);
  v.ring = 2;
  CHECK(detail::variant_problem(plain, v) == "ring (2) is for fused keys");
  CHECK(v.name() == "v8h2t512a2");
}

TEST_CASE("an NVRTC failure carries the key, the options and the full log") {
  Spec s;
  const KernelVariant bad{3, 1, 256};  // 3 elements do not divide the 64 neox pairs
  const detail::RenderedKernel r = detail::render(s.canonical(), bad);
  try {
    detail::compile(r.source, r.entry + ".cu", r.key, "sm_90");
    FAIL("compiled an impossible variant");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(e.code() == ErrorCode::compile);
    CHECK(what.find(r.key) != std::string::npos);
    CHECK(what.find("--gpu-architecture=sm_90") != std::string::npos);
    CHECK(what.find("static assertion failed") != std::string::npos);
  }
}

TEST_CASE("arch parsing and targets") {
  CHECK(detail::parse_arch("sm_90", "arch") == 90);
  CHECK_THROWS_WITH_AS(detail::parse_arch("hopper", "--arch"),
                       "ropejit: --arch ('hopper') must look like sm_90", Error);
  CHECK(detail::target_for(80) == "sm_80");
  CHECK(detail::target_for(90) == "sm_90");
  CHECK(detail::target_for(990).rfind("compute_", 0) == 0);  // newer than NVRTC: PTX
}

// Compiles the default and a second variant of each key of a covering array for sm_80 and sm_90:
// narrow vectors, other heads per thread, element-wise tables, the persistent loop and, for fused
// keys, 32-bit offsets.
void compile_covering(const std::vector<std::vector<int>>& rows,
                      Spec (*spec_for)(const std::vector<int>&)) {
  MESSAGE(rows.size(), " keys cover every pair of axis values");
  std::vector<std::pair<Spec, KernelVariant>> jobs;
  for (const std::vector<int>& row : rows) {
    const Spec s = spec_for(row);
    const KernelVariant v = detail::prefill_variant(s, 16);
    jobs.emplace_back(s, v);
    // The narrowest legal vector too: the path for misaligned views.
    KernelVariant other = v;
    other.vec = s.style == Style::gptj ? 2 : 1;
    other.heads_per_thread = 1 + int32_t(jobs.size() % 4);
    other.table_vec = jobs.size() % 3 != 0;    // the element-by-element table path too
    other.grid_stride = jobs.size() % 2 == 0;  // and the persistent-grid token loop
    other.narrow = s.fused();                  // 32-bit offsets (calls whose offsets fit)
    other.ring = 0;  // (a ring needs 16-byte vectors; the default variant has it where legal)
    if (!(other == v)) jobs.emplace_back(s, other);
  }
  std::atomic<size_t> next{0}, failures{0};
  std::vector<std::string> errors(jobs.size() * 2);
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size() * 2;) {
      const auto& [spec, variant] = jobs[i / 2];
      const std::string target = i % 2 ? "sm_90" : "sm_80";
      try {
        const detail::CacheEntry& e = api::engine().image(spec, variant, target);
        if (e.image.size() < 1000) errors[i] = "suspiciously small cubin";
      } catch (const Error& err) {
        errors[i] = err.what();
      }
      if (!errors[i].empty()) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); ++i)
    CHECK_MESSAGE(errors[i].empty(), jobs[i / 2].first.key(), " ", jobs[i / 2].second.name(), ": ",
                  errors[i]);
  CHECK(failures == 0);
}

}  // namespace

TEST_CASE("covering array of the key matrix compiles for sm_80 and sm_90" *
          doctest::test_suite("long")) {
  compile_covering(covering_array(), &spec_of);
}

TEST_CASE("covering array of the fused keys compiles for sm_80 and sm_90" *
          doctest::test_suite("long")) {
  const std::vector<std::vector<int>> rows = covering_array(kFusedSizes);
  std::set<std::string> keys;
  for (const std::vector<int>& row : rows) keys.insert(spec_of_fused(row).key());
  // Every fused stage appears, in keys that parse back to themselves.
  for (const char* part : {"-nrms_", "-nrms1p", "-nrmsall", "-oe4m3-", "-oe4m3dyn", "-cslots",
                           "-cpaged", "-ccont", "-e4m3_", "-e4m3dyn_", "_q-"}) {
    bool seen = false;
    for (const std::string& k : keys) {
      seen = seen || k.find(part) != std::string::npos;
      CHECK(parse_key(k).key() == k);
    }
    CHECK_MESSAGE(seen, part);
  }
  compile_covering(rows, &spec_of_fused);
}
