// The C ABI: defaults, keys, status codes and the thread-local last error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"

TEST_CASE("C defaults match the C++ defaults and produce the same key") {
  ropejit_spec s;
  ropejit_spec_init(&s);
  char key[128];
  REQUIRE(ropejit_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::Spec{}.key());
  CHECK(std::string(ropejit_last_error()).empty());
  s.layout = ROPEJIT_LAYOUT_THD;
  s.style = ROPEJIT_GPTJ;
  s.positions = ROPEJIT_POS_IDS;
  s.index_type = ROPEJIT_I32;
  s.freqs = ROPEJIT_FREQS_COMPUTED;
  s.in_place = 0;
  REQUIRE(ropejit_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "rope_thd_bf16_d128_r128_gptj_pos-ids-i32_comp_qk_fwd_oop");
  CHECK(std::string(ropejit_version()) == ropejit::kVersion);
}

TEST_CASE("C cache counts: what precompiling compiled or loaded, as the C++ API counts it") {
  uint64_t compiled = 0, disk = 0, memory = 0, loads = 0;
  ropejit_cache_counts(&compiled, &disk, &memory, &loads);
  const ropejit::CacheCounts before = ropejit::cache_counts();
  CHECK(before.compiled >= compiled);  // counts only grow (other threads may compile too)
  ropejit_spec spec;
  REQUIRE(ropejit_spec_init(&spec) == ROPEJIT_OK);
  spec.head_dim = 96;
  REQUIRE(ropejit_precompile(&spec, "sm_80") == ROPEJIT_OK);
  uint64_t after_compiled = 0, after_disk = 0, after_memory = 0;
  ropejit_cache_counts(&after_compiled, &after_disk, &after_memory, nullptr);  // NULL: skipped
  // Both default kernels came from somewhere: NVRTC, the disk cache or memory.
  CHECK(after_compiled + after_disk + after_memory >= compiled + disk + memory + 2);
  CHECK(ropejit::cache_counts().module_loads == before.module_loads);  // no GPU work
  ropejit_cache_counts(nullptr, nullptr, nullptr, nullptr);
}

TEST_CASE("C errors: status code plus a message naming the argument") {
  ropejit_spec s;
  ropejit_spec_init(&s);
  char small[8];
  CHECK(ropejit_key(&s, small, sizeof small) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("size (8) is too small") != std::string::npos);
  s.head_dim = 7;
  char key[128];
  CHECK(ropejit_key(&s, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) ==
        "ropejit: spec.head_dim (7) must be even and in [2, 512]");
  CHECK(ropejit_apply(nullptr, nullptr) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: spec is null");

  ropejit_spec_init(&s);
  ropejit_args a;
  ropejit_args_init(&a);
  a.seq_len = 3;
  CHECK(ropejit_apply(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: args.q.heads (0) must be in [1, 2^29]");
  CHECK(ropejit_precompile(&s, "volta") == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: arch ('volta') must look like sm_90");
}

TEST_CASE("the last error is per thread") {
  ropejit_spec s;
  ropejit_spec_init(&s);
  s.rotary_dim = 3;
  char key[128];
  CHECK(ropejit_key(&s, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = ropejit_last_error(); }).join();
  CHECK(other.empty());
  CHECK(std::string(ropejit_last_error()).find("spec.rotary_dim (3)") != std::string::npos);
}

TEST_CASE("C ABI: structs are read and written only as far as their headers say") {
  // A caller built against a newer header: a larger struct whose extra fields are zero works; one
  // that sets a field this library lacks is refused by byte.
  struct Newer {
    ropejit_spec spec;
    int32_t future_field;
  } newer{};
  REQUIRE(ropejit_spec_init_sized(&newer.spec, sizeof newer) == ROPEJIT_OK);
  CHECK(newer.spec.header.size == sizeof newer);
  CHECK(newer.spec.header.tag == ROPEJIT_STRUCT_TAG);
  char key[128];
  REQUIRE(ropejit_key(&newer.spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::Spec{}.key());
  newer.future_field = 3;
  CHECK(ropejit_key(&newer.spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error())
            .find("spec sets a field this library (ropejit " + std::string(ropejit::kVersion) +
                  ") does not have") != std::string::npos);

  // _init writes exactly the size it is given: the bytes after stay as they were.
  unsigned char buf[sizeof(ropejit_args) + 16];
  std::memset(buf, 0xab, sizeof buf);
  auto* args = reinterpret_cast<ropejit_args*>(buf);
  REQUIRE(ropejit_args_init_sized(args, sizeof(ropejit_args)) == ROPEJIT_OK);
  for (size_t i = sizeof(ropejit_args); i < sizeof buf; ++i) CHECK(buf[i] == 0xab);
  CHECK(args->base == 10000.0);

  // Sizes no caller of this library can have are refused, naming the value.
  ropejit_spec spec;
  CHECK(ropejit_spec_init_sized(&spec, 8) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec size (8) must be in [") != std::string::npos);
  CHECK(ropejit_spec_init_sized(&spec, size_t(1) << 40) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  ropejit_spec_init(&spec);
  spec.header.size = 1u << 30;
  CHECK(ropejit_key(&spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec size (1073741824)") != std::string::npos);

  // A decode-block struct that no _init filled is refused, not read as garbage.
  ropejit_qkv_proj_spec proj;
  std::memset(&proj, 0, sizeof proj);
  CHECK(ropejit_qkv_proj_key(&proj, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) ==
        "ropejit: spec was not filled by its _init function (header.tag is 0): initialise it "
        "with the macro of ropejit.h before setting fields");
}

TEST_CASE("C ABI: the 0.2.0 struct sizes, the smallest each struct's header may claim") {
  // Appending a field changes sizeof: api/c_structs.hpp's kFirstSize must then keep these.
  if (sizeof(void*) != 8) return;
  CHECK(sizeof(ropejit_spec) == 76);
  CHECK(sizeof(ropejit_args) == 704);
  CHECK(sizeof(ropejit_table_spec) == 152);
  CHECK(sizeof(ropejit_model) == 224);  // 216 before kv_lora_rank (api/c_structs.hpp)
  CHECK(sizeof(ropejit_qkv_proj_spec) == 60);
  CHECK(sizeof(ropejit_qkv_proj_args) == 488);  // 480 before bias (api/c_structs.hpp)
  CHECK(sizeof(ropejit_ffn_spec) == 24);
  CHECK(sizeof(ropejit_ffn_args) == 152);
  CHECK(sizeof(ropejit_rms_norm_spec) == 20);
  CHECK(sizeof(ropejit_rms_norm_args) == 96);
  CHECK(sizeof(ropejit_mla_spec) == 52);   // 48 before scale_multiplies (api/c_structs.hpp)
  CHECK(sizeof(ropejit_mla_args) == 392);  // 248 before k_pe_out
}

TEST_CASE("C ABI: int fields that stand for bools take only 0 and 1") {
  ropejit_spec spec;
  ropejit_spec_init(&spec);
  ropejit_args args;
  ropejit_args_init(&args);
  args.mrope_interleaved = 7;
  CHECK(ropejit_apply(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: args.mrope_interleaved (7) must be 0 or 1");
  ropejit_args_init(&args);
  args.scaling.truncate = -1;
  CHECK(ropejit_apply(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: args.scaling.truncate (-1) must be 0 or 1");
  ropejit_args_init(&args);
  spec.in_place = 2;
  CHECK(ropejit_apply(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: spec.in_place (2) must be 0 or 1");
}

TEST_CASE("C contiguous strides") {
  int x = 0;
  const ropejit_tensor t = ropejit_contiguous(ROPEJIT_LAYOUT_BHSD, &x, 2, 5, 3, 64);
  CHECK(t.data == &x);
  CHECK(t.heads == 3);
  CHECK(t.stride_seq == 64);
  CHECK(t.stride_head == 320);
  CHECK(t.stride_batch == 960);
}

TEST_CASE("C API: the projection's defaults, key, errors and precompile") {
  ropejit_qkv_proj_spec s;
  ropejit_qkv_proj_spec_init(&s);
  char key[256];
  REQUIRE(ropejit_qkv_proj_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::QkvProjSpec{}.key());
  CHECK(ropejit_qkv_proj_key(&s, key, 8) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("too small") != std::string::npos);
  ropejit_qkv_proj_args a;
  ropejit_qkv_proj_args_init(&a);
  CHECK(a.norm_eps == ropejit::QkvProjArgs{}.norm_eps);
  CHECK(a.base == ropejit::QkvProjArgs{}.base);
  a.hidden = 12;  // checked before anything touches the GPU
  a.tokens = 1;
  CHECK(ropejit_qkv_projection(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.hidden (12)") != std::string::npos);
  CHECK(ropejit_qkv_projection(nullptr, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  s.head_dim = 72;
  CHECK(ropejit_qkv_proj_precompile(&s, "sm_90") == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec.head_dim (72)") != std::string::npos);
  s.head_dim = 64;
  CHECK(ropejit_qkv_proj_precompile(&s, "sm_90") == ROPEJIT_OK);
  CHECK(a.path == 0);  // automatic
  CHECK(a.workspace == nullptr);
  size_t bytes = 0;
  CHECK(ropejit_qkv_projection_workspace_bytes(&s, &a, &bytes) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.hidden (12)") != std::string::npos);
  a.hidden = 4096;
  a.tokens = 64;
  REQUIRE(ropejit_qkv_projection_workspace_bytes(&s, &a, &bytes) == ROPEJIT_OK);
  CHECK(bytes == size_t(64 * 4096 * 2) + (size_t(32) << 20));
  CHECK(ropejit_qkv_projection_workspace_bytes(&s, &a, nullptr) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  int32_t path = -1;
  CHECK(ropejit_qkv_projection_path(&s, nullptr, &path) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  a.path = 9;
  CHECK(ropejit_qkv_projection_path(&s, &a, &path) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.path (9)") != std::string::npos);
  // e4m3 weights: the spec's last field, the scales the args' last; checked before any GPU work.
  CHECK(s.weights == 0);
  s.weights = 1;
  REQUIRE(ropejit_qkv_proj_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key).size() > 6);
  CHECK(std::string(key).substr(std::string(key).size() - 6) == "_we4m3");
  ropejit_qkv_proj_args_init(&a);
  CHECK(a.weight_scale == nullptr);
  a.tokens = 1;
  a.hidden = 4096;
  a.q_heads = 4;
  a.kv_heads = 1;
  a.x = reinterpret_cast<void*>(0x10000000);
  a.weight = reinterpret_cast<void*>(0x20000000);
  CHECK(ropejit_qkv_projection(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.weight_scale is null") != std::string::npos);
  s.weights = 2;
  CHECK(ropejit_qkv_proj_key(&s, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec.weights (2)") != std::string::npos);
  // A KV cache through slots: the spec's last two fields, the args' cache descriptor.
  s.weights = 0;
  CHECK(s.cache == 0);
  CHECK(s.cache_store == 0);
  CHECK(a.cache.k_quant_scale == 1.0f);
  s.cache = 3;
  s.cache_store = 1;
  REQUIRE(ropejit_qkv_proj_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key).substr(std::string(key).size() - 12) == "_cslots-e4m3");
  a.weight_scale = nullptr;
  a.norm_weight = reinterpret_cast<void*>(0x30000000);
  a.position_ids = reinterpret_cast<void*>(0x50000000);
  a.cos = reinterpret_cast<void*>(0x60000000);
  a.sin = reinterpret_cast<void*>(0x70000000);
  a.table_rows = 16;
  a.q = ropejit_tensor{reinterpret_cast<void*>(0x40000000), 4, 0, 4 * 64, 64};
  a.cache.k = reinterpret_cast<void*>(0x80000000);
  a.cache.v = reinterpret_cast<void*>(0x90000000);
  a.cache.pages = 4;
  a.cache.page_size = 16;
  a.cache.stride_page = 16 * 64;
  a.cache.stride_slot = 64;
  a.cache.stride_head = 64;
  CHECK(ropejit_qkv_projection(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.cache.slot_mapping is null") !=
        std::string::npos);
  // A chunk's sequences (the args' last two fields) go with a paged or contiguous cache only.
  CHECK(a.cu_seqlens == nullptr);
  CHECK(a.batch == 0);
  a.cache.slot_mapping = reinterpret_cast<const int64_t*>(0xa0000000);
  const int32_t* cu = reinterpret_cast<const int32_t*>(0xb0000000);
  a.cu_seqlens = cu;
  a.batch = 2;
  CHECK(ropejit_qkv_projection(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(
      std::string(ropejit_last_error()).find("args.cu_seqlens is given but spec.cache is slots") !=
      std::string::npos);
  s.cache = 2;  // paged
  a.cache.slot_mapping = nullptr;
  a.cache.indptr = reinterpret_cast<const int32_t*>(0xb1000000);
  a.cache.indices = reinterpret_cast<const int32_t*>(0xb2000000);
  a.cache.last_page_len = reinterpret_cast<const int32_t*>(0xb3000000);
  a.cache.num_indices = 4;
  a.batch = 0;
  CHECK(ropejit_qkv_projection(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.batch (0) must be in [1, 2^31 - 1)") !=
        std::string::npos);
}

TEST_CASE("C API: the projection's bias, appended to the args, and a caller's 480-byte args") {
  ropejit_qkv_proj_spec s;
  ropejit_qkv_proj_spec_init(&s);
  // A well-formed call that a bias makes unfused-impossible: the bias is read through C.
  std::vector<unsigned char> bytes(sizeof(ropejit_qkv_proj_args) + 8, 0xa5);
  auto* a = reinterpret_cast<ropejit_qkv_proj_args*>(bytes.data());
  REQUIRE(ropejit_qkv_proj_args_init(a) == ROPEJIT_OK);
  CHECK(a->bias == nullptr);
  a->tokens = 1;
  a->hidden = 4096;
  a->q_heads = 4;
  a->kv_heads = 1;
  a->x = reinterpret_cast<void*>(0x10000000);
  a->weight = reinterpret_cast<void*>(0x20000000);
  a->norm_weight = reinterpret_cast<void*>(0x30000000);
  a->position_ids = reinterpret_cast<void*>(0x50000000);
  a->cos = reinterpret_cast<void*>(0x60000000);
  a->sin = reinterpret_cast<void*>(0x70000000);
  a->table_rows = 16;
  a->q = ropejit_tensor{reinterpret_cast<void*>(0x40000000), 4, 0, 6 * 128, 128};
  a->k = ropejit_tensor{reinterpret_cast<void*>(0x40000000 + 4 * 128 * 2), 1, 0, 6 * 128, 128};
  a->v = ropejit_tensor{reinterpret_cast<void*>(0x40000000 + 5 * 128 * 2), 1, 0, 6 * 128, 128};
  a->path = 2;  // unfused
  a->workspace = reinterpret_cast<void*>(0x80000000);
  a->workspace_bytes = size_t(64) << 20;
  a->bias = reinterpret_cast<const void*>(0x30100000);
  int32_t path = -1;
  CHECK(ropejit_qkv_projection_path(&s, a, &path) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.bias is set: the unfused path") !=
        std::string::npos);
  // Built before the bias: 480 bytes, the bytes after them (here 0xa5) never written.
  std::fill(bytes.begin(), bytes.end(), 0xa5);
  REQUIRE(ropejit_qkv_proj_args_init_sized(a, 480) == ROPEJIT_OK);
  for (size_t i = 480; i < bytes.size(); ++i) CHECK(bytes[i] == 0xa5);
  CHECK(ropejit_qkv_proj_args_init_sized(a, 479) == ROPEJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("C API: the FFN's defaults, key, errors, workspace and precompile") {
  ropejit_ffn_spec s;
  ropejit_ffn_spec_init(&s);
  char key[128];
  REQUIRE(ropejit_ffn_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "ffnglu_bf16_nrms_silu");
  s.act = 1;
  s.norm = 2;
  REQUIRE(ropejit_ffn_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "ffnglu_bf16_nrms1p_gelutanh");
  s.act = 7;
  CHECK(ropejit_ffn_key(&s, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec.act (7)") != std::string::npos);
  ropejit_ffn_spec_init(&s);
  ropejit_ffn_args a;
  ropejit_ffn_args_init(&a);
  CHECK(a.norm_eps == ropejit::FfnArgs{}.norm_eps);
  CHECK(a.path == 0);
  a.tokens = 1;
  a.hidden = 12;
  CHECK(ropejit_ffn_gate_up(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.hidden (12)") != std::string::npos);
  CHECK(ropejit_ffn_gate_up(&s, nullptr) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  a.hidden = 4096;
  a.intermediate = 14336;
  a.tokens = 64;
  size_t bytes = 0;
  REQUIRE(ropejit_ffn_gate_up_workspace_bytes(&s, &a, &bytes) == ROPEJIT_OK);
  CHECK(bytes == size_t(64 * 4096 * 2) + size_t(64 * 2 * 14336 * 2) + (size_t(32) << 20));
  int32_t path = -1;
  a.path = 5;
  CHECK(ropejit_ffn_gate_up_path(&s, &a, &path) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(ropejit_ffn_gate_up_path(&s, &a, nullptr) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(ropejit_ffn_precompile(&s, "sm_70") == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(ropejit_ffn_precompile(&s, "sm_90") == ROPEJIT_OK);
  // e4m3 weights: the spec's last field, the two scales the args' last.
  CHECK(s.weights == 0);
  s.weights = 1;
  REQUIRE(ropejit_ffn_key(&s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "ffnglu_bf16_nrms_silu_we4m3");
  ropejit_ffn_args_init(&a);
  CHECK(a.gate_scale == nullptr);
  CHECK(a.up_scale == nullptr);
  a.tokens = 1;
  a.hidden = 4096;
  a.intermediate = 128;
  a.x = reinterpret_cast<void*>(0x10000000);
  a.gate_weight = reinterpret_cast<void*>(0x20000000);
  a.up_weight = reinterpret_cast<void*>(0x30000000);
  a.gate_scale = reinterpret_cast<const float*>(0x40000000);
  CHECK(ropejit_ffn_gate_up(&s, &a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.up_scale is null") != std::string::npos);
}

TEST_CASE("C API: RMSNorm's defaults, key, errors and precompile") {
  ropejit_rms_norm_spec spec;
  REQUIRE(ropejit_rms_norm_spec_init(&spec) == ROPEJIT_OK);
  char key[128];
  REQUIRE(ropejit_rms_norm_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::RmsNormSpec{}.key());
  spec.dtype = ROPEJIT_F16;
  spec.norm = ROPEJIT_NORM_RMS_ONE_PLUS;
  spec.residual = 1;
  REQUIRE(ropejit_rms_norm_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "rmsnorm_f16_nrms1p_res");
  spec.residual = 2;
  CHECK(ropejit_rms_norm_key(&spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: spec.residual (2) must be 0 or 1");
  spec.residual = 1;

  ropejit_rms_norm_args args;
  REQUIRE(ropejit_rms_norm_args_init(&args) == ROPEJIT_OK);
  CHECK(args.norm_eps == 1e-6);
  args.rows = 2;
  args.hidden = 12;
  CHECK(ropejit_rms_norm(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.hidden (12)") != std::string::npos);
  args.hidden = 64;
  args.norm_eps = 1e300;
  CHECK(ropejit_rms_norm(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.norm_eps (1e+300)") != std::string::npos);
  CHECK(ropejit_rms_norm_precompile(&spec, "sm_90") == ROPEJIT_OK);
}

TEST_CASE("C API: MLA's defaults, key, errors and precompile") {
  ropejit_mla_spec spec;
  REQUIRE(ropejit_mla_spec_init(&spec) == ROPEJIT_OK);
  char key[160];
  REQUIRE(ropejit_mla_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::MlaSpec{}.key());
  spec.query = ROPEJIT_MLA_QUERY_ASSEMBLE;
  spec.cache_store = ROPEJIT_STORE_E4M3;
  spec.q_store = ROPEJIT_STORE_E4M3;
  REQUIRE(ropejit_mla_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qasm-e4m3");
  spec.kv_rank = 12;
  CHECK(ropejit_mla_key(&spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec.kv_rank (12)") != std::string::npos);
  spec.kv_rank = 512;

  ropejit_mla_args args;
  REQUIRE(ropejit_mla_args_init(&args) == ROPEJIT_OK);
  CHECK(args.norm_eps == 1e-6);
  args.tokens = 3;
  args.heads = 16;
  CHECK(ropejit_mla_prepare(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.position_ids is null") != std::string::npos);
  CHECK(ropejit_mla_prepare(nullptr, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(ropejit_mla_precompile(&spec, "sm_90") == ROPEJIT_OK);
}

TEST_CASE("C API: MLA's appended fields, and callers with the first sized structs") {
  ropejit_mla_spec spec;
  REQUIRE(ropejit_mla_spec_init(&spec) == ROPEJIT_OK);
  CHECK(spec.scale_multiplies == 0);
  spec.cache_store = ROPEJIT_STORE_E4M3;
  spec.scale_multiplies = 1;
  char key[160];
  REQUIRE(ropejit_mla_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qip_smul");
  spec.scale_multiplies = 2;
  CHECK(ropejit_mla_key(&spec, key, sizeof key) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("spec.scale_multiplies (2)") != std::string::npos);

  // A caller built before the appends: 48 and 248 bytes, the bytes after them (0xa5) never
  // written by _init, never read by the call (whose error is the same as with whole structs).
  std::vector<unsigned char> sb(sizeof(ropejit_mla_spec) + 8, 0xa5);
  std::vector<unsigned char> ab(sizeof(ropejit_mla_args) + 8, 0xa5);
  auto* s = reinterpret_cast<ropejit_mla_spec*>(sb.data());
  auto* a = reinterpret_cast<ropejit_mla_args*>(ab.data());
  REQUIRE(ropejit_mla_spec_init_sized(s, 48) == ROPEJIT_OK);
  REQUIRE(ropejit_mla_args_init_sized(a, 248) == ROPEJIT_OK);
  for (size_t i = 48; i < sb.size(); ++i) CHECK(sb[i] == 0xa5);
  for (size_t i = 248; i < ab.size(); ++i) CHECK(ab[i] == 0xa5);
  REQUIRE(ropejit_mla_key(s, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == ropejit::MlaSpec{}.key());
  a->tokens = 3;
  a->heads = 16;
  CHECK(ropejit_mla_prepare(s, a) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.position_ids is null") != std::string::npos);
  CHECK(ropejit_mla_args_init_sized(a, 247) == ROPEJIT_ERROR_INVALID_ARGUMENT);

  ropejit_mla_args args;
  REQUIRE(ropejit_mla_args_init(&args) == ROPEJIT_OK);
  CHECK(args.k_pe_out == nullptr);
  CHECK(args.rows_by_token == 0);
  args.rows_by_token = 3;
  args.tokens = 1;
  CHECK(ropejit_mla_prepare(&spec, &args) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("args.rows_by_token (3)") != std::string::npos);
}
