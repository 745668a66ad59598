// The ropejit command, run as a user would.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "autotune/tuning_cache.hpp"
#include "jit/driver.hpp"
#include "test_util.hpp"

namespace {

using Run = ropejit::testing::CommandResult;

Run run(const std::string& args) {
  return ropejit::testing::run_command(std::string(ROPEJIT_CLI_PATH) + " " + args);
}

bool has(const Run& r, const char* text) { return r.output.find(text) != std::string::npos; }

}  // namespace

TEST_CASE("ropejit info") {
  const Run r = run("info");
  CHECK(r.status == 0);
  CHECK(has(r, (std::string("ropejit ") + ropejit::kVersion).c_str()));
  CHECK(has(r, "nvrtc        13."));
  CHECK(has(r, "cache dir    "));
}

TEST_CASE("ropejit compile --preset for two archs, then again from the disk cache") {
  Run r = run("compile --arch sm_80,sm_90 --preset phi-2 -j 2");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "rope_bshd_bf16_d80_r32_neox_pos-offset_tab-f32-half_qk_fwd_ip"));
  CHECK(has(r, "32 keys: 128 kernels in"));
  // One line per kernel, each naming its target, key, variant and cache file.
  size_t lines = 0;
  for (size_t at = r.output.find(".rjk\n"); at != std::string::npos;
       at = r.output.find(".rjk\n", at + 1))
    ++lines;
  CHECK(lines == 128);
  CHECK(has(r, ", 0 failed"));
  r = run("compile --arch sm_80,sm_90 --preset phi-2 -j 2");
  CHECK(r.status == 0);
  CHECK(has(r, "0 compiled, 128 from the disk cache"));
}

TEST_CASE("ropejit compile errors") {
  const std::pair<const char*, const char*> cases[] = {
      {"compile --preset llama4",
       "--preset ('llama4') is not a known preset: llama3-8b, qwen2.5-7b, gpt-neox-20b, phi-2"},
      {"compile --arch hopper --preset phi-2", "--arch ('hopper') must look like sm_90"},
      {"compile --key rope_bshd_bf16_d7_r7", "is not a ropejit key"},
      {"compile", "compile needs --preset NAME, --hf-config FILE, --key KEY or --from-tuning FILE"},
  };
  for (const auto& [args, message] : cases) {
    const Run bad = run(args);
    INFO(args);
    CHECK(bad.status == 2);
    CHECK(has(bad, message));
  }
  Run r = run("bogus");
  CHECK(r.status != 0);
  r = run("tune --preset phi-2 --top -1 --dry-run");
  CHECK(r.status != 0);
  CHECK(has(r, "--top"));
}

TEST_CASE("ropejit tune --key: any axis the shape options cannot spell") {
  const std::string oop = "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_oop";
  const std::string bwd = "rope_thd_f16_d64_r64_gptj_pos-offset_tab-bf16-full_qk_bwd_ip";
  Run r = run("tune --key " + oop + " --key " + bwd + " --heads 32,8 --tokens 4096 --dry-run");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, (oop + "  bucket 4096  heads 32/8: ").c_str()));
  CHECK(has(r, (bwd + "  bucket 4096  heads 32/8: ").c_str()));
  const std::pair<const char*, const char*> cases[] = {
      {"--dry-run", "--key needs --heads Q[,K]"},
      {"--heads 32,8 --layout thd --dry-run", "--key excludes --layout"},
      {"--heads 32,8 --dtype f16 --dry-run", "--key excludes --dtype"},
  };
  for (const auto& [args, message] : cases) {
    const Run bad = run("tune --key " + oop + " " + args);
    INFO(args);
    CHECK(bad.status != 0);
    CHECK(has(bad, message));
  }
  r = run("tune --key rope_bshd_bf16 --heads 8 --dry-run");
  CHECK(r.status == 2);
  CHECK(has(r, "ropejit: --key: key 'rope_bshd_bf16' is not a ropejit key"));
  r = run("tune --key " + oop + " --heads 0,8 --dry-run");
  CHECK(r.status == 2);
  CHECK(has(r, "--heads (0,8) must be Q or Q,K"));
}

TEST_CASE("ropejit source prints the rendered kernel") {
  const Run r = run("source rope_bshd_f16_d64_r32_gptj_pos-offset_comp_qk_fwd_oop");
  CHECK(r.status == 0);
  CHECK(has(r, "#include \"rope_kernel.cuh\""));
  CHECK(has(r, "kRotaryDim = 32,"));
  CHECK(has(r, "kHeadsPerThread = 2,"));  // the heuristic's variant
}

TEST_CASE("ropejit demo without a GPU compiles and says the GPU part was skipped") {
  std::string why;
  if (ropejit::detail::try_driver(&why)) return;  // the GPU suite runs the real demo
  Run r = run("demo --preset phi-2 --tokens 64");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK((has(r, "compiled for sm_90") || has(r, "loaded from the disk cache for sm_90")));
  CHECK(has(r, "GPU part SKIPPED: the CUDA driver (libcuda.so.1) could not be loaded"));
  r = run("demo --preset phi-2 --tokens 64");  // the kernel is on disk now: said so
  CHECK(r.status == 0);
  CHECK(has(r, "loaded from the disk cache for sm_90"));
}

TEST_CASE("ropejit compile --key: the decode families' keys, counted") {
  const std::string keys =
      " --key qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms --key "
      "ffnglu_bf16_nrms_silu --key rmsnorm_bf16_nrms_res --key "
      "rope_bshd_f16_d64_r64_neox_pos-offset_tab-f32-half_qk_fwd_ip";
  Run r = run("compile --arch sm_90" + keys);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "rmsnorm_bf16_nrms_res: "));
  CHECK(has(r, "ffnglu_bf16_nrms_silu: "));
  CHECK(has(r, "4 keys: "));
  CHECK(has(r, ", 0 failed"));
  r = run("compile --arch sm_90" + keys);
  CHECK(r.status == 0);
  CHECK(has(r, " 0 compiled, "));
  r = run("source rmsnorm_bf16_nrms1p");
  CHECK(r.status == 0);
  CHECK(has(r, "#include"));
  r = run("compile --arch sm_90 --key dequant_e4m3_bf16");  // not compiled alone: said so
  CHECK(r.status != 0);
  CHECK(has(r, "compiled with the e4m3-weight projection and FFN keys that use it"));
}

TEST_CASE(
    "ropejit compile --from-tuning: the tuned kernels and their keys' defaults, no GPU needed") {
  const std::string file = ropejit::testing::temp_dir() + "/warm-start.json";
  const ropejit::Spec c =
      ropejit::parse_key("rope_bshd_f16_d64_r64_neox_pos-offset_tab-f32-half_qk_fwd_ip");
  ropejit::autotune::TuningCache cache;
  ropejit::autotune::Fingerprint fp;
  fp.gpu_name = "Warm Start GPU";
  fp.cc = 80;
  fp.sm_count = 108;
  cache.set_fingerprint(fp);
  ropejit::autotune::TuningEntry e;
  e.key = c.key();
  e.bucket = 64;
  e.q_heads = 8;
  e.k_heads = 8;
  e.config.kernel.vec = 8;
  e.config.kernel.heads_per_thread = 4;
  e.config.kernel.max_threads = 256;
  e.config.rows = 4;
  e.median_us = 1;
  e.default_us = 1;
  cache.put(e);
  e.bucket = 4096;  // the same kernel for another bucket: built once
  cache.put(e);
  cache.save(file);
  const Run r = run("compile --from-tuning " + file);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "2 tuning entries for Warm Start GPU (sm_80): 3 kernels in"));
  CHECK(has(r, (c.key() + "  v8h4t256  ").c_str()));
  CHECK(has(r, (c.key() + "  v8h2t512  ").c_str()));
  CHECK(has(r, (c.key() + "  v8h1t512  ").c_str()));

  // Projection entries: their keys' default kernels and the fused variants they name (a
  // cluster variant only for targets that have clusters).
  const std::string proj_key = "qkvproj_f16_d64_r64_neox_pos-ids-i64_tab-f32-half_nrms";
  ropejit::autotune::ProjTuningEntry p;
  p.key = proj_key;
  p.bucket = 8;
  p.hidden = 1024;
  p.columns = 512;
  p.fused_us = 3;
  p.unfused_us = 9;
  p.variant = "m1s2u1c2";
  fp.cc = 90;
  cache.set_fingerprint(fp);
  cache.put(p);
  cache.save(file);
  const Run rp = run("compile --from-tuning " + file);
  INFO(rp.output);
  CHECK(rp.status == 0);
  CHECK(has(rp, "and 1 projection entries"));
  CHECK(has(rp, (proj_key + ": 4 kernels for sm_90").c_str()));
  CHECK(has(rp, (proj_key + " m1s2u1c2 (sm_90): tuned variant").c_str()));
  const Run r80 = run("compile --arch sm_80 --from-tuning " + file);
  INFO(r80.output);
  CHECK(r80.status == 0);
  CHECK(has(r80, (proj_key + " m1s2u1c2 (sm_80): tuned variant SKIPPED").c_str()));
}

TEST_CASE("ROPEJIT_NVRTC_FLAGS: appended to the compile, part of the cache key") {
  const std::string key = "rope_bshd_f16_d64_r64_gptj_pos-offset_tab-f32-half_qk_fwd_oop";
  Run r = run("compile --arch sm_90 --key " + key);
  CHECK(r.status == 0);
  r = run("compile --arch sm_90 --key " + key);
  CHECK(has(r, "0 compiled, 2 from the disk cache"));
  // Other options are another cache entry: compiled again, not served from the first.
  r = ropejit::testing::run_command("ROPEJIT_NVRTC_FLAGS='--Ofast-compile=min' " +
                                    std::string(ROPEJIT_CLI_PATH) + " compile --arch sm_90 --key " +
                                    key);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "2 compiled, 0 from the disk cache"));
  r = ropejit::testing::run_command("ROPEJIT_NVRTC_FLAGS='--no-such-flag' " +
                                    std::string(ROPEJIT_CLI_PATH) + " compile --arch sm_90 --key " +
                                    key);
  CHECK(r.status != 0);
  CHECK(has(r, "unrecognized option --no-such-flag"));
  CHECK(has(r, "2 failed"));
}

TEST_CASE("ropejit compile and source take the decode block's projection keys") {
  Run r = run(
      "compile --arch sm_80,sm_90 --key qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms: 4 kernels for sm_80"));
  CHECK(has(r, "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms: 4 kernels for sm_90"));
  r = run("compile --arch sm_75 --key qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms");
  CHECK(r.status != 0);
  CHECK(has(r, "needs sm_80 or newer"));
  r = run("source qkvproj_f16_d64_r32_gptj_pos-offset_comp_nrms1p");
  CHECK(r.status == 0);
  CHECK(has(r, "#include \"proj_kernel.cuh\""));
  CHECK(has(r, "kRotaryDim = 32,"));
  CHECK(has(r, "kSplits = 8,"));  // the heuristic's one-token variant
  r = run("source qkvproj_bf16_d72_r72_neox_pos-offset_comp_nrms");
  CHECK(r.status != 0);
  CHECK(has(r, "spec.head_dim (72) must be a multiple of 16"));
}

TEST_CASE("ropejit tune takes projection keys: the path per token bucket") {
  const std::string key = "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms";
  Run r = run("tune --key " + key + " --heads 32,8 --hidden 4096 --tokens 1,20,64 --dry-run");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, (key + "  bucket 1  hidden 4096  heads 32/8: fused (m1s8u2) vs unfused").c_str()));
  CHECK(has(r, (key + "  bucket 32  hidden 4096  heads 32/8: fused (m4s4u2t) vs unfused").c_str()));
  CHECK(has(r, (key + "  bucket 64  hidden 4096  heads 32/8: fused (m8s4u1t) vs unfused").c_str()));
  // The fused variants raced where the fused path competes: the heuristic's first, then its
  // token tiles and half as many, clusters on sm_90.
  CHECK(
      has(r, "vs unfused; 27 fused variants where the fused path competes (sm_90):\n    m1s8u2 "));
  CHECK(has(r, " m1s8u4c4\n"));
  // e4m3 weights: both paths (the unfused one dequantizes), wide chunks among the candidates.
  r = run("tune --key " + key + "_we4m3 --heads 32,8 --hidden 4096 --tokens 16 --dry-run");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "fused (m2s4u1w) vs unfused (e4m3 weights dequantized); 93 fused variants"));
  CHECK(has(r, " m2s8u2wc4 "));
  CHECK(has(r, " m2s1u2r4c2 "));  // row groups sharing staged activations, from two tiles
  r = run("tune --key " + key + " --heads 32,8 --dry-run");
  CHECK(r.status != 0);
  CHECK(has(r, "--hidden (0) must be a multiple of 8"));
  r = run("tune --key " + key + " --heads 32 --hidden 4096 --dry-run");
  CHECK(r.status != 0);
  CHECK(has(r, "--heads (32) must be Q,KV"));
  r = run("tune --key qkvproj_bf16_d72_r72_neox_pos-offset_comp_nrms --heads 32,8 --hidden 64");
  CHECK(r.status != 0);
  CHECK(has(r, "--key: spec.head_dim (72)"));
  r = run("tune --heads 32,8 --hidden 4096 --dry-run");
  CHECK(r.status != 0);
  CHECK(has(r, "--hidden (4096) is for projection keys only"));
}

TEST_CASE("ropejit compile --arch: one newer than NVRTC is named with the PTX built for it") {
  const std::string key = "rope_bshd_f16_d64_r64_gptj_pos-offset_tab-f32-half_qk_fwd_ip";
  Run r = run("compile --arch sm_999 --key " + key);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "ropejit: compile: --arch sm_999 is newer than this NVRTC (13."));
  CHECK(has(r, ") supports (sm_"));
  CHECK(has(r, "); building PTX for compute_"));
  CHECK(has(r, "compute_"));
  // Older than NVRTC supports, or no architecture at all: refused, listing those it has.
  for (const char* arch : {"sm_35", "sm_91"}) {
    r = run(std::string("compile --arch ") + arch + " --key " + key);
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK(has(r, (std::string("ropejit: ") + arch).c_str()));
    CHECK(has(r, "is not an architecture this NVRTC supports: sm_"));
    CHECK(has(r, "sm_80, "));
  }
  // A supported arch says nothing more.
  r = run("compile --arch sm_90 --key " + key);
  CHECK(r.status == 0);
  CHECK_FALSE(has(r, "newer than"));
}
