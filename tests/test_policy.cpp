// Launch policy without a GPU: candidate legality, tuned entries, heuristic fallback, frozen
// mode, and the mode switch.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "autotune/candidates.hpp"
#include "autotune/policy.hpp"
#include "autotune/tuning_cache.hpp"
#include "test_util.hpp"

using namespace ropejit;
using ropejit::testing::ScopedEnv;

namespace {

detail::DeviceInfo fake_gpu(const char* name) {
  detail::DeviceInfo d;
  d.cc = 90;
  d.sm_count = 7;
  d.max_shared_per_block = 227 * 1024;  // as an H100's opt-in maximum
  d.name = name;
  return d;
}

detail::CallShape shape_of(int64_t tokens, int32_t q, int32_t k, int32_t align = 16) {
  detail::CallShape s;
  s.tokens = tokens;
  s.q_heads = q;
  s.k_heads = k;
  s.align_bytes = align;
  return s;
}

}  // namespace

TEST_CASE("candidates: legal, unique, heuristic first, pruned to the device") {
  const detail::DeviceInfo dev = fake_gpu("Candidates GPU");
  for (const Spec& s :
       {Spec{}, parse_key("rope_thd_f32_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop"),
        parse_key("rope_bshd_f16_d512_r512_neox_pos-offset_tab-f32-half_qk_fwd_ip")}) {
    const Spec c = s.canonical();
    for (int64_t tokens : {1, 64, 4096}) {
      const detail::CallShape shape = shape_of(tokens, 32, 8);
      const std::vector<detail::LaunchConfig> cands = autotune::candidates(c, shape, dev);
      REQUIRE(!cands.empty());
      CHECK(cands.front() == autotune::heuristic_config(c, shape, dev));
      std::set<std::string> names;
      for (const detail::LaunchConfig& cfg : cands) {
        CHECK_MESSAGE(detail::illegal_reason(c, shape, cfg, dev).empty(), cfg.name());
        names.insert(cfg.name());
      }
      CHECK(names.size() == cands.size());
      CHECK(cands.size() >= 10);
    }
  }
  // One head: no candidate may ask for more head rows than there are heads.
  for (const detail::LaunchConfig& cfg :
       autotune::candidates(Spec{}.canonical(), shape_of(8, 1, 0), dev))
    CHECK(cfg.rows == 1);
}

TEST_CASE("heuristic: two kernel variants for every shape and the decode and prefill launches") {
  detail::DeviceInfo h100 = fake_gpu("Heuristic GPU");
  h100.sm_count = 132;
  h100.memory_gbps = 3352;  // 25 GB/s per SM: one pass of two heads
  detail::DeviceInfo h200 = h100;
  h200.memory_gbps = 4917;  // 37 GB/s per SM: two passes of two heads
  for (const detail::DeviceInfo& dev : {h100, h200}) {
    for (const Spec& s :
         {Spec{}, parse_key("rope_thd_f32_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop"),
          parse_key("rope_sbhd_f16_d512_r512_neox_pos-offset_tab-f32-half_qk_fwd_ip"),
          parse_key("rope_bshd_f32_d512_r512_gptj_pos-offset_comp_qk_fwd_oop")}) {
      const Spec c = s.canonical();
      const detail::KernelVariant v = detail::prefill_variant(c, 16);
      CHECK(v.heads_per_thread == 2);
      const detail::KernelVariant one = detail::decode_variant(c, 16);
      detail::KernelVariant expected_one = v;
      expected_one.heads_per_thread = 1;
      CHECK(one == expected_one);
      CHECK(detail::default_variants(c, 16) == std::vector<detail::KernelVariant>{v, one});
      const int32_t x = detail::chunks(c, v.vec);
      const int32_t max_rows = v.max_threads / x;
      for (int64_t tokens : {int64_t(1), int64_t(64), int64_t(512), int64_t(513), int64_t(528),
                             int64_t(529), int64_t(4096), int64_t(1) << 20}) {
        for (auto [q, k] :
             {std::pair{32, 8}, std::pair{1, 0}, std::pair{64, 64}, std::pair{128, 0}}) {
          const detail::CallShape shape = shape_of(tokens, q, k);
          const detail::LaunchConfig cfg = autotune::heuristic_config(c, shape, dev);
          INFO(c.key(), " tokens ", tokens, " heads ", q, "/", k, ": ", cfg.name());
          CHECK((cfg.kernel == v || cfg.kernel == one));  // shapes never pick another kernel
          CHECK(detail::illegal_reason(c, shape, cfg, dev).empty());
          CHECK(cfg.blocks_per_sm == 0);
          // Decided per token bucket (plans are remembered per bucket): 513..1024 is one bucket,
          // above the 528 tokens of 4 blocks per SM, so all of it is prefill.
          if (detail::token_bucket(tokens) <= 4 * dev.sm_count) {
            // Decode: the one-head kernel, a token per block, the heads dealt over blocks of
            // at most 10 rows (head groups), every block with at least one head.
            const int32_t heads = q + k;
            CHECK(cfg.kernel == one);
            CHECK(cfg.tokens_per_block == 1);
            CHECK(cfg.rows <= std::min(10, max_rows));
            CHECK(cfg.rows ==
                  std::min(max_rows, (heads + (heads + 9) / 10 - 1) / ((heads + 9) / 10)));
            CHECK(cfg.head_groups == std::min(64, (heads + cfg.rows - 1) / cfg.rows));
            CHECK(cfg.rows * (cfg.head_groups - 1) < heads);
          } else {
            // Prefill: two heads per thread in one pass (two passes where bandwidth per SM is
            // high); tokens only to reach 64 threads.
            const bool two_passes = dev.memory_gbps / dev.sm_count >= 30 && (x & (x - 1)) == 0;
            const int32_t per_row = two_passes ? 4 : 2;
            CHECK(cfg.rows == std::min((q + k + per_row - 1) / per_row, max_rows));
            CHECK(cfg.kernel == v);
            const int32_t threads = x * cfg.rows * cfg.tokens_per_block;
            CHECK((cfg.tokens_per_block == 1 || threads <= 64 + x * cfg.rows));
            CHECK((threads >= 64 || cfg.tokens_per_block == 64));
          }
        }
      }
    }
  }
  const detail::DeviceInfo& dev = h100;
  // Less aligned calls get narrower vectors, still independent of the shape.
  const Spec c = Spec{}.canonical();
  CHECK(detail::prefill_variant(c, 4).vec == 2);
  CHECK(autotune::heuristic_config(c, shape_of(9000, 32, 8, 4), dev).kernel ==
        detail::prefill_variant(c, 4));
  // A table that is not aligned to the vector loads gets the element-by-element variant (its
  // own kernel, "s"); computed frequencies read no table.
  detail::CallShape misaligned_table = shape_of(64, 32, 8);
  misaligned_table.table_align = 4;
  const detail::LaunchConfig sc = autotune::heuristic_config(c, misaligned_table, dev);
  CHECK_FALSE(sc.kernel.table_vec);
  CHECK(sc.kernel.name() == "v8h1t512s");
  CHECK(detail::illegal_reason(c, misaligned_table, sc, dev).empty());
  detail::LaunchConfig vec_table = sc;
  vec_table.kernel.table_vec = true;
  CHECK(detail::illegal_reason(c, misaligned_table, vec_table, dev) ==
        "vector table loads need cos, sin and the table row stride aligned to 16 bytes, the call "
        "has 4");
  Spec computed = c;
  computed.freqs = Freqs::computed;
  computed = computed.canonical();
  CHECK(autotune::heuristic_config(computed, misaligned_table, dev).kernel.table_vec);
  // Persistent grids and the grid-stride variant ("p") go together, both ways.
  detail::LaunchConfig persistent = autotune::heuristic_config(c, shape_of(32768, 32, 8), dev);
  CHECK_FALSE(persistent.kernel.grid_stride);
  persistent.blocks_per_sm = 2;
  CHECK(detail::illegal_reason(c, shape_of(32768, 32, 8), persistent, dev) ==
        "a persistent grid (blocks_per_sm 2) needs a grid-stride variant");
  detail::set_persistent(persistent, 2);
  CHECK(persistent.name() == "v8h2t512p_r20_z1_g2");
  CHECK(detail::illegal_reason(c, shape_of(32768, 32, 8), persistent, dev).empty());
  persistent.blocks_per_sm = 0;
  CHECK(detail::illegal_reason(c, shape_of(32768, 32, 8), persistent, dev) ==
        "a grid-stride variant is for persistent grids (blocks_per_sm > 0), not 0");
  // The shapes the tuner measured (bench/history/2026-11-22.md, "Tuning"): llama decode and
  // prefill.
  CHECK(autotune::heuristic_config(c, shape_of(64, 32, 8), dev).name() == "v8h1t512_r10_z1_g0_y4");
  CHECK(autotune::heuristic_config(c, shape_of(32768, 32, 8), dev).name() == "v8h2t512_r20_z1_g0");
  CHECK(autotune::heuristic_config(c, shape_of(4096, 1, 1), dev).name() == "v8h2t512_r1_z8_g0");
  // The H200's prefill: two passes of two heads; its decode is the H100's.
  CHECK(autotune::heuristic_config(c, shape_of(32768, 32, 8), h200).name() == "v8h2t512_r10_z1_g0");
  CHECK(autotune::heuristic_config(c, shape_of(64, 32, 8), h200).name() == "v8h1t512_r10_z1_g0_y4");
  // More heads: more groups of 10.
  CHECK(autotune::heuristic_config(c, shape_of(64, 64, 64), dev).name() ==
        "v8h1t512_r10_z1_g0_y13");
  // Fused keys' decode takes head groups too, except a norm over all heads (every head of a
  // token in one block); their prefill takes two to four rows and fills the block with tokens.
  detail::LaunchConfig grouped = autotune::heuristic_config(c, shape_of(64, 32, 8), dev);
  Spec fused = c;
  fused.norm = Norm::rms;
  fused = fused.canonical();
  CHECK(detail::launch_problem(fused, grouped).empty());
  CHECK(autotune::heuristic_config(fused, shape_of(64, 32, 8), dev).name() ==
        "v8h1t512_r10_z1_g0_y4");
  detail::CallShape with_v = shape_of(1, 32, 8);
  with_v.v_heads = 8;
  CHECK(autotune::heuristic_config(fused, with_v, dev).name() == "v8h1t512_r10_z1_g0_y5");
  with_v.tokens = 64;
  CHECK(autotune::heuristic_config(fused, with_v, dev).name() == "v8h1t512_r10_z1_g0_y5");
  with_v.tokens = 65;  // bucket 128: the two-head kernel, a token's heads in one block
  CHECK(autotune::heuristic_config(fused, with_v, dev).name() == "v8h2t256a3_r24_z1_g0");
  with_v.tokens = 4096;  // prefill: the 256-thread two-head kernel in blocks of 128 threads,
                         // later passes through a ring of three slots, rows for six passes
  CHECK(autotune::heuristic_config(fused, with_v, dev).name() == "v8h2t256a3_r4_z4_g0");
  detail::CallShape few = shape_of(4096, 16, 4);  // 24 heads: two rows make the six passes
  few.v_heads = 4;
  CHECK(autotune::heuristic_config(fused, few, dev).name() == "v8h2t256a3_r2_z8_g0");
  detail::CallShape many = shape_of(4096, 64, 16);  // 96 heads: at most four rows
  many.v_heads = 16;
  CHECK(autotune::heuristic_config(fused, many, dev).name() == "v8h2t256a3_r4_z4_g0");
  detail::DeviceInfo turing = dev;  // no cp.async: the ringless launch, with its two rows
  turing.cc = 75;
  CHECK(autotune::heuristic_config(fused, with_v, turing).name() == "v8h2t256_r2_z8_g0");
  with_v.align_bytes = 8;  // 8-byte vectors have no ring: two rows, as before the ring
  CHECK(autotune::heuristic_config(fused, with_v, dev).rows == 2);
  CHECK(autotune::heuristic_config(fused, with_v, dev).kernel.ring == 0);
  with_v.align_bytes = 16;
  CHECK(detail::prefill_variant(fused, 16).max_threads == 256);
  CHECK(detail::prefill_variant(fused, 16).ring == detail::kPrefillRing);
  CHECK(detail::prefill_variant(fused, 8).ring == 0);  // 8-byte vectors: no ring
  CHECK(detail::prefill_variant(c, 16).ring == 0);     // plain keys: none
  // q stored as static FP8, or with dynamic FP8 scales: the two-head kernel at prefill, as bf16
  // (the tuner's winner on the H100 once the next pass's heads load ahead).
  const Spec fp8_q =
      parse_key(
          "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3-cpaged-e4m3_fwd_oop")
          .canonical();
  detail::CallShape fp8_shape = shape_of(4096, 32, 8);
  fp8_shape.v_heads = 8;
  CHECK(autotune::heuristic_config(fp8_q, fp8_shape, dev).name() == "v8h2t256a3_r4_z4_g0");
  const Spec fp8_dyn = parse_key(
                           "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-"
                           "cpaged-e4m3dyn_fwd_oop")
                           .canonical();
  CHECK(autotune::heuristic_config(fp8_dyn, fp8_shape, dev).name() == "v8h2t256a3_r4_z4_g0");
  // On the H200 (37 GB/s of DRAM per SM) dynamic scales keep two rows; bf16 and static FP8 take
  // four there too.
  CHECK(autotune::heuristic_config(fp8_dyn, fp8_shape, h200).name() == "v8h2t256a3_r2_z8_g0");
  CHECK(autotune::heuristic_config(fp8_q, fp8_shape, h200).name() == "v8h2t256a3_r4_z4_g0");
  CHECK(autotune::heuristic_config(fused, with_v, h200).name() == "v8h2t256a3_r4_z4_g0");
  CHECK(detail::decode_variant(fused, 16).max_threads == 512);
  Spec all_heads = c;
  all_heads.norm = Norm::rms_all_heads;
  all_heads = all_heads.canonical();
  CHECK(detail::launch_problem(all_heads, grouped) ==
        "head_groups (4) must be 1 for a norm over all heads (every head of a token in one block)");
  const detail::LaunchConfig one_block =
      autotune::heuristic_config(all_heads, shape_of(64, 32, 8), dev);
  CHECK(one_block.head_groups == 1);
  CHECK(one_block.rows * one_block.kernel.heads_per_thread >= 40);
  grouped.head_groups = 5;  // rows 10 x 4 already cover the 40 heads
  CHECK(detail::illegal_reason(c, shape_of(64, 32, 8), grouped, dev) ==
        "head_groups (5) leave blocks without heads: 40 heads in rows of 10");
  grouped.head_groups = 65;
  CHECK(detail::launch_problem(c, grouped) == "head_groups (65) must be in 1..64");
}

TEST_CASE("heuristic: fused keys' launches are legal and use the two default variants") {
  // Head groups (decode up to 64 tokens, except a norm over all heads), the two-head kernel in
  // one block above, the 256-thread prefill kernel (512 for a norm over all heads, whose block
  // holds every q and k head): legal for every head shape, wide heads included.
  detail::DeviceInfo dev = fake_gpu("Fused heuristic GPU");
  dev.sm_count = 132;
  dev.memory_gbps = 3352;
  for (const char* key :
       {"rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-cpaged_fwd_ip",
        "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3-cpaged-e4m3_fwd_oop",
        "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk-nrmsall_fwd_ip",
        "rope_bshd_f32_d512_r512_neox_pos-offset_comp_qk-nrms1p_fwd_ip",
        "rope_thd_f16_d80_r32_gptj_pos-ids-i32_tab-f32-full_q-nrms-cslots-e4m3_fwd_ip",
        "rope_sbhd_bf16_d256_r64_neox_pos-offset_tab-bf16-half_qk-ccont_fwd_oop"}) {
    const Spec c = parse_key(key).canonical();
    const detail::KernelVariant prefill = detail::prefill_variant(c, 16);
    const detail::KernelVariant decode = detail::decode_variant(c, 16);
    CHECK(prefill.max_threads >= (c.norm == Norm::rms_all_heads ? 512 : 256));
    for (int64_t tokens :
         {int64_t(1), int64_t(64), int64_t(65), int64_t(512), int64_t(4096), int64_t(1) << 20}) {
      for (auto [q, k, v] : {std::tuple{32, 8, 8}, std::tuple{1, 1, 1}, std::tuple{64, 64, 0},
                             std::tuple{40, 8, 8}, std::tuple{128, 0, 0}}) {
        if (c.cache != KvCache::none && (k == 0 || (c.fusion == Fusion::q && v == 0))) continue;
        detail::CallShape shape = shape_of(tokens, q, k);
        shape.v_heads = c.cache != KvCache::none ? v : 0;
        const detail::LaunchConfig cfg = autotune::heuristic_config(c, shape, dev);
        INFO(std::string(key), " tokens ", tokens, " heads ", q, "/", k, "/", v, ": ", cfg.name());
        CHECK(detail::illegal_reason(c, shape, cfg, dev).empty());
        CHECK((cfg.kernel == prefill || cfg.kernel == decode));
        if (c.norm == Norm::rms_all_heads) {
          CHECK(cfg.head_groups == 1);  // (the one-head kernel when a thread per head fits)
        } else {
          CHECK((cfg.kernel == decode) == (detail::token_bucket(tokens) <= 64));
        }
      }
    }
  }
  // A GPU granting a block only 48 KB: a 256-thread ring launch (48 KB of slots, and here shared
  // angles and the wide heads' reduction scratch) is refused there, and the heuristic takes the
  // same launch without the ring.
  const Spec wide =
      parse_key("rope_bshd_f32_d512_r512_neox_pos-offset_comp_qk-nrms1p_fwd_ip").canonical();
  const detail::CallShape shape = shape_of(65, 32, 8);
  const detail::LaunchConfig ringed = autotune::heuristic_config(wide, shape, dev);
  CHECK(ringed.name() == "v4h2t256a3_r4_z1_g0");
  detail::DeviceInfo small = dev;
  small.max_shared_per_block = 48 * 1024;
  CHECK(detail::illegal_reason(wide, shape, ringed, small) ==
        "1 tokens per block need 51264 bytes of shared memory, more than 49152 (this GPU's most "
        "per block)");
  CHECK(autotune::heuristic_config(wide, shape, small).name() == "v4h2t256_r4_z1_g0");
  // A GPU without cp.async (sm_75): no ring either.
  detail::DeviceInfo turing = dev;
  turing.cc = 75;
  CHECK(autotune::heuristic_config(wide, shape, turing).name() == "v4h2t256_r4_z1_g0");
  // The variants a key's first use prepares hold the launch the heuristic takes there, so a
  // later shape (inside a graph capture too) loads nothing: on sm_75 the prefill variant
  // without its ring; on a GPU granting under 64 KB, with and without it.
  ScopedEnv off("ROPEJIT_TUNING", "off");
  for (const detail::DeviceInfo& gpu : {dev, small, turing}) {
    const std::vector<detail::KernelVariant> prepared = autotune::policy_variants(wide, shape, gpu);
    for (int64_t tokens : {int64_t(1), int64_t(65), int64_t(4096), int64_t(1) << 20}) {
      const detail::LaunchConfig cfg =
          autotune::heuristic_config(wide, shape_of(tokens, 32, 8), gpu);
      CHECK_MESSAGE(std::find(prepared.begin(), prepared.end(), cfg.kernel) != prepared.end(),
                    gpu.cc, " ", gpu.max_shared_per_block, " ", tokens, ": ", cfg.name());
    }
    for (const detail::KernelVariant& v : prepared) CHECK((gpu.cc >= 80 || v.ring == 0));
  }
  CHECK(autotune::policy_variants(wide, shape, dev).size() == 4);    // both widths, two variants
  CHECK(autotune::policy_variants(wide, shape, small).size() == 6);  // and the prefill's ringless
}

TEST_CASE("peak memory bandwidth from the driver's clock and bus width, unknown on MIG") {
  // The attributes the H100 SXM and H200 hosts report (docs/performance.md#method).
  CHECK(detail::peak_memory_gbps("NVIDIA H100 80GB HBM3", 2619000, 5120) ==
        doctest::Approx(3352.3).epsilon(1e-4));
  CHECK(detail::peak_memory_gbps("NVIDIA H200", 3201000, 6144) ==
        doctest::Approx(4916.7).epsilon(1e-4));
  CHECK(detail::peak_memory_gbps("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 2619000, 5120) == 0);
}

TEST_CASE("computed frequencies: shared cos/sin bytes and their limit") {
  const detail::DeviceInfo dev = fake_gpu("Shared GPU");
  Spec s;  // bf16, d128, neox: 8 chunks of 8 pairs
  s.freqs = Freqs::computed;
  s = s.canonical();
  detail::LaunchConfig cfg;
  cfg.kernel = {8, 1, 1024};
  cfg.rows = 1;
  cfg.tokens_per_block = 64;
  CHECK(detail::shared_bytes(Spec{}.canonical(), cfg) == 0);  // tables share nothing
  CHECK(detail::shared_bytes(s, cfg) == 64 * 64 * 8);         // 32 KiB: legal
  CHECK(detail::illegal_reason(s, shape_of(100, 1, 0), cfg, dev).empty());
  Spec wide = s;
  wide.head_dim = wide.rotary_dim = 256;
  wide = wide.canonical();
  CHECK(detail::illegal_reason(wide, shape_of(100, 1, 0), cfg, dev) ==
        "64 tokens per block need 65536 bytes of shared memory, more than 49152");
  cfg.tokens_per_block = 48;  // 48 KiB exactly
  CHECK(detail::illegal_reason(wide, shape_of(100, 1, 0), cfg, dev).empty());
}

TEST_CASE("policy: tuned entry, fallback, frozen and off") {
  const char* file = std::getenv("ROPEJIT_TUNING_FILE");
  REQUIRE(file != nullptr);  // main_cpu.cpp points it into the test's temp dir
  const detail::DeviceInfo dev = fake_gpu("Policy Test GPU");
  const Spec c = Spec{}.canonical();
  const detail::CallShape shape = shape_of(50, 32, 8);
  const detail::LaunchConfig heuristic = autotune::heuristic_config(c, shape, dev);
  const std::vector<detail::LaunchConfig> cands = autotune::candidates(c, shape, dev);
  REQUIRE(cands.size() > 3);
  const detail::LaunchConfig tuned = cands[3];
  REQUIRE_FALSE(tuned == heuristic);

  autotune::TuningCache cache;
  autotune::Fingerprint fp;
  fp.gpu_name = dev.name;
  fp.cc = dev.cc;
  fp.sm_count = dev.sm_count;
  cache.set_fingerprint(fp);
  autotune::TuningEntry e;
  e.key = c.key();
  e.bucket = 64;  // 50 tokens fall in the 64 bucket
  e.q_heads = 32;
  e.k_heads = 8;
  e.config = tuned;
  e.median_us = 2;
  e.default_us = 3;
  cache.put(e);
  // The decode block's projection and FFN: a tuned fused variant for one bucket of one weight
  // shape each.
  const QkvProjSpec pc = QkvProjSpec{}.canonical();
  const FfnSpec fc = FfnSpec{}.canonical();
  autotune::ProjTuningEntry pe;
  pe.key = pc.key();
  pe.bucket = 8;
  pe.hidden = 4096;
  pe.columns = 6144;
  pe.fused_us = 20;
  pe.unfused_us = 30;
  pe.variant = "m1s4u1c2";
  cache.put(pe);
  autotune::ProjTuningEntry fe = pe;
  fe.key = fc.key();
  fe.bucket = 1;
  fe.columns = 2 * 512;
  fe.variant = "m1s2u1";
  cache.put(fe);
  cache.save(file);

  {
    ScopedEnv mode("ROPEJIT_TUNING", std::nullopt);  // default: use
    CHECK(autotune::tuning_mode() == autotune::TuningMode::use);
    CHECK(autotune::select_config(c, shape, dev, false) == tuned);
    CHECK(autotune::select_config(c, shape_of(5000, 32, 8), dev, false) ==
          autotune::heuristic_config(c, shape_of(5000, 32, 8), dev));  // other bucket
    CHECK(autotune::select_config(c, shape_of(50, 32, 4), dev, false) ==
          autotune::heuristic_config(c, shape_of(50, 32, 4), dev));  // other heads
    // A less aligned call cannot use 16-byte vectors: the heuristic's narrower variant.
    const detail::CallShape unaligned = shape_of(50, 32, 8, 4);
    CHECK(autotune::select_config(c, unaligned, dev, false) ==
          autotune::heuristic_config(c, unaligned, dev));
    // A misaligned table cannot use the tuned (vector-table) kernel either.
    detail::CallShape odd_table = shape;
    odd_table.table_align = 4;
    CHECK(autotune::select_config(c, odd_table, dev, false) ==
          autotune::heuristic_config(c, odd_table, dev));
    CHECK_FALSE(autotune::select_config(c, odd_table, dev, false).kernel.table_vec);
  }
  {
    // The variants the engine loads on a key's first use: the heuristic's, then the tuned
    // entry's (another kernel here), whatever bucket the call is in; only those the call's
    // alignment allows; none from the file with tuning off.
    ScopedEnv mode("ROPEJIT_TUNING", std::nullopt);
    const std::vector<detail::KernelVariant> own = detail::default_variants(c, 16);
    REQUIRE(std::find(own.begin(), own.end(), tuned.kernel) == own.end());
    const std::vector<detail::KernelVariant> all =
        autotune::policy_variants(c, shape_of(5000, 32, 8), dev);
    CHECK(all == std::vector<detail::KernelVariant>{own[0], own[1], tuned.kernel});
    CHECK(autotune::policy_variants(c, shape_of(1, 2, 0), dev) == all);
    const detail::CallShape unaligned = shape_of(5000, 32, 8, 4);
    CHECK(autotune::policy_variants(c, unaligned, dev) == detail::default_variants(c, 4));
    ScopedEnv off("ROPEJIT_TUNING", "off");
    CHECK(autotune::policy_variants(c, shape_of(5000, 32, 8), dev) == own);
  }
  {
    // The fused kernel's variant: the entry's for its bucket and weight shape, else the
    // heuristic's; every variant prepared on a key's first use includes the tuned ones of the
    // call's weight shape; none with tuning off.
    ScopedEnv mode("ROPEJIT_TUNING", std::nullopt);
    const detail::ProjShape llama{5, 4096, 32, 8, 3072};
    detail::ProjVariant want;
    REQUIRE(detail::parse_proj_variant("m1s4u1c2", &want));
    CHECK(autotune::select_proj_variant(pc, llama, dev) == want);
    const detail::ProjShape other_bucket{16, 4096, 32, 8, 3072};
    CHECK(autotune::select_proj_variant(pc, other_bucket, dev) ==
          autotune::proj_heuristic(pc, other_bucket, dev));
    const detail::ProjShape other_weight{5, 2048, 32, 8, 3072};
    CHECK(autotune::select_proj_variant(pc, other_weight, dev) ==
          autotune::proj_heuristic(pc, other_weight, dev));
    const std::vector<detail::ProjVariant> prepared =
        autotune::select_proj_variants(pc, other_bucket, dev);
    CHECK(std::find(prepared.begin(), prepared.end(), want) != prepared.end());
    CHECK(autotune::select_proj_variants(pc, other_weight, dev) ==
          autotune::proj_heuristic_variants(pc, other_weight, dev));
    const detail::ProjShape ffn{1, 4096, 0, 0, 512};
    REQUIRE(detail::parse_proj_variant("m1s2u1", &want));
    CHECK(autotune::select_ffn_variant(fc, ffn, dev) == want);
    const std::vector<detail::ProjVariant> ffn_prepared = autotune::select_ffn_variants(fc, dev);
    CHECK(std::find(ffn_prepared.begin(), ffn_prepared.end(), want) != ffn_prepared.end());
    ScopedEnv off("ROPEJIT_TUNING", "off");
    CHECK(autotune::select_proj_variant(pc, llama, dev) ==
          autotune::proj_heuristic(pc, llama, dev));
    CHECK(autotune::select_ffn_variants(fc, dev) == autotune::ffn_heuristic_variants(fc, dev));
  }
  {
    ScopedEnv mode("ROPEJIT_TUNING", "frozen");
    CHECK(autotune::select_config(c, shape, dev, false) == tuned);
    const std::string expected = "no tuned configuration for " + c.key() + " at 8192 tokens";
    CHECK_THROWS_WITH_AS(autotune::select_config(c, shape_of(5000, 32, 8), dev, false),
                         doctest::Contains(expected.c_str()), Error);
  }
  {
    ScopedEnv mode("ROPEJIT_TUNING", "off");
    CHECK(autotune::select_config(c, shape, dev, false) == heuristic);
  }
  {
    ScopedEnv mode("ROPEJIT_TUNING", "sometimes");
    CHECK_THROWS_WITH_AS(
        autotune::tuning_mode(),
        "ropejit: ROPEJIT_TUNING ('sometimes') must be one of: off, use, auto, frozen", Error);
  }
  {
    ScopedEnv tune("ROPEJIT_AUTOTUNE", "1");
    CHECK(autotune::tuning_mode() == autotune::TuningMode::autotune);
    // Under graph capture nothing is tuned: a miss falls back to the heuristic.
    CHECK(autotune::select_config(c, shape_of(5000, 32, 8), dev, true) ==
          autotune::heuristic_config(c, shape_of(5000, 32, 8), dev));
    CHECK(autotune::tunings_performed() == 0);
  }
}

TEST_CASE("ropejit tune --dry-run lists candidates without a GPU") {
  const ropejit::testing::CommandResult r = ropejit::testing::run_command(
      std::string(ROPEJIT_CLI_PATH) + " tune --preset phi-2 --tokens 64 --dry-run");
  const std::string& out = r.output;
  CHECK(r.status == 0);
  CHECK(out.find("rope_bshd_bf16_d80_r32_neox_pos-offset_tab-f32-half_qk_fwd_ip  bucket 64  heads "
                 "32/32:") != std::string::npos);
  CHECK(out.find("    v8h4t256_r") != std::string::npos);
}
