// Models described by their Hugging Face config.json: every shipped config parses to the
// expected spec and fields, bad configs are errors naming the field and its value, presets agree
// with the shipped files, and the command's --hf-config paths work without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/presets.hpp"
#include "jit/driver.hpp"
#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

std::string config(const std::string& name) {
  return std::string(ROPEJIT_DATA_DIR) + "/hf/" + name + ".json";
}

using Run = testing::CommandResult;
Run command(const std::string& args) {
  return testing::run_command(std::string(ROPEJIT_CLI_PATH) + " " + args);
}
bool has(const Run& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

std::string error_of(const std::string& json_text) {
  try {
    model_from_hf_config(json_text);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "no error";
}

const char* const kShipped[] = {"llama3.1-8b",      "llama3.2-1b",      "qwen2-vl-7b",
                                "qwen2.5-vl-7b",    "qwen3-vl-8b",      "phi-3-mini-128k",
                                "deepseek-v2-lite", "mistral-nemo",     "qwen3-8b",
                                "olmo2-7b",         "gemma3-4b",        "gptj-6b",
                                "qwen2.5-7b-yarn",  "llama2-7b-linear", "llama2-7b-dynamic"};

}  // namespace

TEST_CASE("every shipped config parses to the key its model calls") {
  const std::pair<const char*, const char*> keys[] = {
      {"llama3.1-8b", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-llama3_qk_fwd_ip"},
      {"llama3.2-1b", "rope_bshd_bf16_d64_r64_neox_pos-ids-i64_comp-llama3_qk_fwd_ip"},
      {"qwen2-vl-7b", "rope_bshd_bf16_d128_r128_neox_pos-mrope-i64_comp_qk_fwd_ip"},
      {"qwen2.5-vl-7b", "rope_bshd_bf16_d128_r128_neox_pos-mrope-i64_comp_qk_fwd_ip"},
      {"qwen3-vl-8b", "rope_bshd_bf16_d128_r128_neox_pos-mrope-i64_comp_qk-nrms_fwd_ip"},
      {"phi-3-mini-128k", "rope_bshd_bf16_d96_r96_neox_pos-ids-i64_comp-longrope_qk_fwd_ip"},
      {"deepseek-v2-lite", "rope_bshd_bf16_d64_r64_gptj_pos-ids-i64_comp-yarn_qk_fwd_ip"},
      {"mistral-nemo", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk_fwd_ip"},
      {"qwen3-8b", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk-nrms_fwd_ip"},
      {"olmo2-7b", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk-nrmsall_fwd_ip"},
      {"gemma3-4b", "rope_bshd_bf16_d256_r256_neox_pos-ids-i64_comp-linear_qk-nrms1p_fwd_ip"},
      {"gptj-6b", "rope_bshd_bf16_d256_r64_gptj_pos-ids-i64_comp_qk_fwd_ip"},
      {"qwen2.5-7b-yarn", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-yarn_qk_fwd_ip"},
      {"llama2-7b-linear", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-linear_qk_fwd_ip"},
      {"llama2-7b-dynamic", "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-ntk_qk_fwd_ip"},
  };
  CHECK(std::size(keys) == std::size(kShipped));
  for (const auto& [name, key] : keys) {
    INFO(name);
    const ModelRope m = model_from_hf_config_file(config(name));
    CHECK(spec_from_model(m, DType::bf16).key() == key);
    CHECK(!m.style_reason.empty());
  }
}

TEST_CASE("shipped configs: the fields each family adds") {
  const ModelRope llama = model_from_hf_config_file(config("llama3.1-8b"));
  CHECK(llama.q_heads == 32);
  CHECK(llama.kv_heads == 8);
  CHECK(llama.base == 500000.0);
  CHECK(llama.scaling.factor == 8);
  CHECK(llama.scaling.low_freq_factor == 1);
  CHECK(llama.scaling.high_freq_factor == 4);
  CHECK(llama.scaling.original_max_positions == 8192);
  CHECK(llama.max_positions == 131072);
  CHECK(llama.norm == Norm::none);

  const ModelRope ds = model_from_hf_config_file(config("deepseek-v2-lite"));
  CHECK(ds.head_dim == 192);
  CHECK(ds.rotary_dim == 64);
  CHECK(ds.rotary_offset == 128);
  CHECK(ds.q_heads == 16);
  CHECK(ds.kv_heads == 1);  // k_pe: one rotary k head shared by every q head
  CHECK(ds.kv_lora_rank == 512);
  CHECK(llama.kv_lora_rank == 0);
  CHECK(ds.style == Style::gptj);
  CHECK(ds.scaling.factor == 40);
  CHECK(ds.scaling.original_max_positions == 4096);
  CHECK(ds.scaling.mscale == 0.707);
  CHECK(ds.scaling.mscale_all_dim == 0.707);
  CHECK(ds.scaling.beta_fast == 32);
  CHECK(ds.scaling.beta_slow == 1);
  CHECK(ds.scaling.truncate);
  const double t = 0.1 * 0.707 * std::log(40.0) + 1;
  CHECK(ds.softmax_scale_multiplier == doctest::Approx(t * t));

  const ModelRope phi = model_from_hf_config_file(config("phi-3-mini-128k"));
  CHECK(phi.freqs == Freqs::longrope);
  CHECK(phi.scaling.factor == 32);  // no factor given: 131072 / 4096
  CHECK(phi.scaling.original_max_positions == 4096);
  REQUIRE(phi.short_factor.size() == 48);
  REQUIRE(phi.long_factor.size() == 48);
  CHECK(phi.scaling.short_factor == phi.short_factor.data());
  CHECK(phi.scaling.long_factor == phi.long_factor.data());
  CHECK(phi.long_factor[0] == 1.0800000429153442);
  CHECK(attention_factor(phi.freqs, phi.rotary_dim, phi.scaling) ==
        doctest::Approx(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));

  const ModelRope qwen2vl = model_from_hf_config_file(config("qwen2-vl-7b"));
  CHECK(qwen2vl.mrope);
  CHECK(qwen2vl.mrope_section[0] == 16);
  CHECK(qwen2vl.mrope_section[1] == 24);
  CHECK(qwen2vl.mrope_section[2] == 24);
  CHECK(!qwen2vl.mrope_interleaved);
  CHECK(qwen2vl.freqs == Freqs::computed);  // legacy type "mrope" means default frequencies

  const ModelRope qwen3vl = model_from_hf_config_file(config("qwen3-vl-8b"));
  CHECK(qwen3vl.model_type == "qwen3_vl_text");
  CHECK(qwen3vl.mrope_interleaved);
  CHECK(qwen3vl.mrope_section[0] == 24);
  CHECK(qwen3vl.base == 5000000.0);
  CHECK(qwen3vl.norm == Norm::rms);

  const ModelRope gemma = model_from_hf_config_file(config("gemma3-4b"));
  CHECK(gemma.head_dim == 256);  // the config class's default, not 2560 / 8
  CHECK(gemma.q_heads == 8);
  CHECK(gemma.kv_heads == 4);
  CHECK(gemma.base == 1e6);
  CHECK(gemma.local_base == 1e4);
  CHECK(gemma.freqs == Freqs::linear);
  CHECK(gemma.scaling.factor == 8);
  CHECK(gemma.norm == Norm::rms_one_plus);
  CHECK(gemma.norm_eps == 1e-6);

  const ModelRope qwen3 = model_from_hf_config_file(config("qwen3-8b"));
  CHECK(qwen3.norm == Norm::rms);
  CHECK(qwen3.norm_eps == 1e-6);
  const ModelRope olmo = model_from_hf_config_file(config("olmo2-7b"));
  CHECK(olmo.norm == Norm::rms_all_heads);
  const ModelRope nemo = model_from_hf_config_file(config("mistral-nemo"));
  CHECK(nemo.head_dim == 128);  // explicit, not 5120 / 32
  CHECK(nemo.norm_eps == 1e-5);
  const ModelRope gptj = model_from_hf_config_file(config("gptj-6b"));
  CHECK(gptj.rotary_dim == 64);
  CHECK(gptj.head_dim == 256);
  CHECK(gptj.style == Style::gptj);
  CHECK(gptj.max_positions == 2048);
  const ModelRope yarn = model_from_hf_config_file(config("qwen2.5-7b-yarn"));
  CHECK(yarn.scaling.original_max_positions == 32768);
  const ModelRope dyn = model_from_hf_config_file(config("llama2-7b-dynamic"));
  CHECK(dyn.scaling.original_max_positions == 4096);  // transformers: max_position_embeddings
}

TEST_CASE("rope_parameters (transformers 5) and its per-layer-type form read like rope_scaling") {
  const ModelRope flat = model_from_hf_config(R"({
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "max_position_embeddings": 131072, "partial_rotary_factor": 0.5,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                        "original_max_position_embeddings": 32768, "truncate": false,
                        "beta_fast": null, "attention_factor": 1.5}})");
  CHECK(flat.freqs == Freqs::yarn);
  CHECK(flat.base == 1e6);
  CHECK(flat.rotary_dim == 64);
  CHECK(!flat.scaling.truncate);
  CHECK(flat.scaling.beta_fast == 32);  // null means the default
  CHECK(flat.scaling.attention_factor == 1.5);
  const ModelRope layered = model_from_hf_config(R"({
    "model_type": "gemma3_text", "hidden_size": 2560,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}})");
  CHECK(layered.freqs == Freqs::linear);
  CHECK(layered.base == 1e6);
  CHECK(layered.local_base == 20000.0);
  const ModelRope inside = model_from_hf_config(R"({"head_dim": 128, "num_attention_heads": 8,
    "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}})");
  CHECK(inside.rotary_dim == 32);
  const ModelRope neox = model_from_hf_config(R"({"model_type": "gpt_neox", "hidden_size": 6144,
    "num_attention_heads": 64, "rotary_pct": 0.25, "rotary_emb_base": 10000})");
  CHECK(neox.rotary_dim == 24);
  CHECK(neox.head_dim == 96);
  const ModelRope by_arch =
      model_from_hf_config(R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 128,
                               "num_attention_heads": 16})");
  CHECK(by_arch.model_type == "qwen3");
  CHECK(by_arch.norm == Norm::rms);
  CHECK(by_arch.base == 10000.0);  // transformers' default rope_theta
  const ModelRope v3 = model_from_hf_config(R"({"model_type": "deepseek_v3", "hidden_size": 7168,
    "num_attention_heads": 128, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rope_interleave": false})");
  CHECK(v3.style == Style::neox);
}

TEST_CASE("bad configs are errors naming the field and its value") {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"rope_type": "proportional"}})",
       "ropejit: config.json: rope_scaling.rope_type (\"proportional\") is not a rope_type ropejit "
       "knows: default, linear, dynamic, llama3, yarn, longrope (legacy names mrope, su)"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"type": "ntk", "factor": 2}})",
       "ropejit: config.json: rope_scaling.type (\"ntk\") is not a rope_type"},
      {R"({"hidden_size": 4096})",
       "ropejit: config.json: num_attention_heads is missing; the head count is needed"},
      {R"({"num_attention_heads": "32", "hidden_size": 4096})",
       "ropejit: config.json: num_attention_heads (\"32\") must be a number"},
      {R"({"num_attention_heads": 0, "hidden_size": 4096})",
       "ropejit: config.json: num_attention_heads (0) must be a finite number > 0"},
      {R"({"num_attention_heads": 32.5, "hidden_size": 4096})",
       "ropejit: config.json: num_attention_heads (32.5) must be a positive integer"},
      {R"({"num_attention_heads": 8, "num_key_value_heads": 16, "hidden_size": 512})",
       "ropejit: config.json: num_key_value_heads (16) must be <= num_attention_heads (8)"},
      {R"({"num_attention_heads": 8})",
       "ropejit: config.json: head_dim is missing; give head_dim, or hidden_size and "
       "num_attention_heads"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": [1, 2]})",
       "ropejit: config.json: rope_scaling ([1,2]) must be an object"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"type": "yarn", "factor": "4"}})",
       "ropejit: config.json: rope_scaling.factor (\"4\") must be a number"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "max_position_embeddings": 4096, "rope_scaling": {"type": "yarn"}})",
       "ropejit: config.json: rope_scaling.factor is missing; yarn needs it"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 0}})",
       "ropejit: config.json: rope_scaling.factor (0) must be > 0 for yarn"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"type": "yarn", "factor": 4}})",
       "ropejit: config.json: rope_scaling.original_max_position_embeddings is missing; nor is "
       "max_position_embeddings given"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 8192}})",
       "ropejit: config.json: rope_scaling.low_freq_factor is missing; llama3 needs it"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_scaling": {"type": "dynamic", "factor": 2}})",
       "ropejit: config.json: max_position_embeddings is missing; dynamic scaling starts beyond "
       "it"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 4, "truncate": "no"}})",
       "ropejit: config.json: rope_scaling.truncate (\"no\") must be true or false"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "max_position_embeddings": 8192, "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [1.0]}})",
       "ropejit: config.json: rope_scaling.short_factor ([1.0,1.0]) must be an array of "
       "rotary_dim / 2 (32) numbers"},
      {R"({"num_attention_heads": 8, "hidden_size": 1024, "rope_scaling": {"type": "mrope", "mrope_section": [16, 48]}})",
       "ropejit: config.json: rope_scaling.mrope_section ([16,48]) must be 3 integers"},
      {R"({"num_attention_heads": 8, "hidden_size": 1024, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]}})",
       "ropejit: config.json: rope_scaling.mrope_section ([16,24,20]) must sum to rotary_dim / 2 "
       "(64)"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": "1e6"})",
       "ropejit: config.json: rope_theta (\"1e6\") must be a number"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": 1})",
       "ropejit: config.json: rope_theta (1) must be > 1"},
      {R"({"num_attention_heads": 1, "head_dim": 100, "partial_rotary_factor": 0.25})",
       "ropejit: config.json: partial_rotary_factor (0.25) of head_dim (100) gives rotary_dim 25; "
       "RoPE needs an even rotary_dim >= 2"},
      {R"({"num_attention_heads": 1, "head_dim": 100, "partial_rotary_factor": 1.5})",
       "ropejit: config.json: partial_rotary_factor (1.5) must be <= 1"},
      {R"({"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": 2}}})",
       "ropejit: config.json: rope_parameters.sliding_attention.rope_type (\"linear\") is not "
       "supported: sliding-window layers take unscaled frequencies only"},
      {R"({"num_attention_heads": 8, "qk_rope_head_dim": 64})",
       "ropejit: config.json: qk_nope_head_dim is missing"},
      {R"({"model_type": "deepseek_v3", "num_attention_heads": 8, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "rope_interleave": 1})",
       "ropejit: config.json: rope_interleave (1) must be true or false"},
      {"{\"num_attention_heads\": 8,", "ropejit: config.json: invalid JSON: "},
      {"[1, 2]", "ropejit: config.json: expected a JSON object, got [1,2]"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    const std::string what = error_of(text);
    CHECK_MESSAGE(what.rfind(message, 0) == 0, what);
  }
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of(deep) ==
        "ropejit: config.json: JSON nested 100000 levels deep; at most 64 are read");
  const std::string long_value =
      R"({"num_attention_heads": ")" + std::string(500, 'x') + R"(", "hidden_size": 4096})";
  CHECK(error_of(long_value).find("... (502 characters)") != std::string::npos);  // clipped
}

TEST_CASE("numbers JSON or a double cannot hold are named with their field and text") {
  // Python's json.dumps writes float('nan') and float('inf') as NaN and Infinity, which JSON
  // has not; 1e400 is past a double and 1e-400 would read as 0.
  const std::pair<const char*, const char*> cases[] = {
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": NaN})",
       "ropejit: config.json: rope_theta (NaN) is not a number JSON can hold: JSON has no NaN or "
       "Infinity (Python's json.dumps writes them); give a finite number"},
      {R"({"num_attention_heads": 8, "hidden_size": 512,
           "rope_theta": Infinity})",
       "ropejit: config.json: rope_theta (Infinity) is not a number JSON can hold"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": -Infinity})",
       "ropejit: config.json: rope_theta (-Infinity) is not a number JSON can hold"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": nan})",
       "ropejit: config.json: rope_theta (nan) is not a number JSON can hold"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": 1e400})",
       "ropejit: config.json: rope_theta (1e400) is beyond the range of a double"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": -2.5e999})",
       "ropejit: config.json: rope_theta (-2.5e999) is beyond the range of a double"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rms_norm_eps": 1e-400})",
       "ropejit: config.json: rms_norm_eps (1e-400) is too small for a double (it would read as "
       "0)"},
      {R"({"text_config": {"rope_scaling": {"type": "longrope", "long_factor": [1.0, NaN]}}})",
       "ropejit: config.json: text_config.rope_scaling.long_factor[1] (NaN) is not a number"},
      {R"({"rope_scaling": {"short_factor": [[1.0], [1e400]]}})",
       "ropejit: config.json: rope_scaling.short_factor[1][0] (1e400) is beyond the range"},
      {"NaN", "ropejit: config.json: the document (NaN) is not a number JSON can hold"},
      // A zero that is written as one is still a zero, not a number too small.
      {R"({"num_attention_heads": 8, "hidden_size": 512, "rope_theta": 0.0e-400})",
       "ropejit: config.json: rope_theta (0.0) must be a finite number > 0"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    const std::string what = error_of(text);
    CHECK_MESSAGE(what.rfind(message, 0) == 0, what);
  }
  // Other JSON errors say where they are.
  const std::string typo = error_of(R"({"rope_scaling": {"factor": tru}})");
  CHECK(typo.rfind("ropejit: config.json: invalid JSON: parse error at line 1", 0) == 0);
  CHECK(typo.find(" (in rope_scaling.factor)") == typo.size() - 25);
  // A long key or token is clipped.
  const std::string long_key = R"({")" + std::string(100000, 'k') + R"(": NaN})";
  const std::string what = error_of(long_key);
  CHECK(what.size() < 1000);
  CHECK(what.find("... (100000 characters)") != std::string::npos);
}

TEST_CASE("head_dim derived from hidden_size / num_attention_heads names both fields") {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"hidden_size": 4, "num_attention_heads": 8})",
       "ropejit: config.json: hidden_size (4) / num_attention_heads (8) gives head_dim 0; give "
       "head_dim, or a hidden_size of at least num_attention_heads"},
      {R"({"n_embd": 4, "n_head": 8})",
       "ropejit: config.json: n_embd (4) / n_head (8) gives head_dim 0"},
      {R"({"n_embd": 4096, "n_head": 0})", "ropejit: config.json: n_head (0) must be"},
      {R"({"hidden_size": 100, "num_attention_heads": 4})",
       "ropejit: config.json: hidden_size (100) / num_attention_heads (4) = head_dim 25 gives "
       "rotary_dim 25; RoPE needs an even rotary_dim >= 2"},
      {R"({"hidden_size": 120, "num_attention_heads": 4, "partial_rotary_factor": 0.1})",
       "ropejit: config.json: partial_rotary_factor (0.1) of hidden_size (120) / "
       "num_attention_heads (4) = head_dim 30 gives rotary_dim 3"},
      {R"({"model_type": "gemma3_text", "num_attention_heads": 2})",
       "ropejit: config.json: num_attention_heads (2) must be >= the gemma3_text default "
       "num_key_value_heads (4)"},
      {R"({"num_attention_heads": 8, "hidden_size": 512, "n_positions": 0})",
       "ropejit: config.json: n_positions (0) must be a finite number > 0"},
      {R"({"model_type": "gemma3_text", "rope_local_base_freq": 0.5})",
       "ropejit: config.json: rope_local_base_freq (0.5) must be > 1"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    const std::string what = error_of(text);
    CHECK_MESSAGE(what.rfind(message, 0) == 0, what);
  }
}

TEST_CASE("config files: only regular files of bounded size are read") {
  const std::string dir = testing::temp_dir();
  const std::pair<std::string, const char*> cases[] = {
      {dir, "is a directory"},
      {"/dev/zero", "not a regular file"},
      {dir + "/missing.json", "does not exist"},
  };
  for (const auto& [path, why] : cases) {
    INFO(path);
    try {
      model_from_hf_config_file(path);
      FAIL("read ", path);
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find("config file '" + path + "'") != std::string::npos);
      CHECK_MESSAGE(what.find(why) != std::string::npos, what);
    }
  }
  const std::string big = dir + "/big.json";
  testing::write_file(big, "{\"x\": \"" + std::string(size_t(5) << 20, 'a') + "\"}");
  CHECK_THROWS_AS(model_from_hf_config_file(big), Error);
  const std::string bad = dir + "/bad.json";
  testing::write_file(bad, R"({"num_attention_heads": true, "hidden_size": 64})");
  CHECK_THROWS_WITH_AS(
      model_from_hf_config_file(bad),
      ("ropejit: " + bad + ": num_attention_heads (true) must be a number").c_str(), Error);
}

TEST_CASE("a copied ModelRope points at its own longrope factors") {
  ModelRope copy;
  {
    const ModelRope original = model_from_hf_config_file(config("phi-3-mini-128k"));
    copy = original;
    CHECK(copy.scaling.short_factor != original.scaling.short_factor);
  }  // the original's arrays are gone
  CHECK(copy.scaling.short_factor == copy.short_factor.data());
  CHECK(copy.scaling.long_factor[47] == 64.83999633789062);
  const ModelRope moved = std::move(copy);
  CHECK(moved.scaling.long_factor == moved.long_factor.data());
  const Args a = args_from_model(moved);
  CHECK(a.base == 10000.0);
  CHECK(a.scaling.long_factor == moved.long_factor.data());
  CHECK(a.norm_eps == 1e-5);
  const Args vl = args_from_model(model_from_hf_config_file(config("qwen3-vl-8b")));
  CHECK(vl.mrope_section[1] == 20);
  CHECK(vl.mrope_interleaved);
}

TEST_CASE("presets named after the shipped configs hold the same fields") {
  for (const char* name : kShipped) {
    INFO(name);
    const std::string key = name;  // a named string: GCC 13 warns of a reference into a temporary
    const cli::Preset& p = cli::find_preset(key);
    CHECK(nlohmann::json::parse(p.config_json) ==
          nlohmann::json::parse(testing::read_file(config(name))));
  }
  for (const cli::Preset& p : cli::presets()) CHECK_NOTHROW(cli::preset_model(p));
  // MLA presets: the latent cache's keys beside the RoPE ones; none for other models.
  for (const char* name : {"deepseek-v3", "kimi-k2"}) {
    INFO(name);
    const std::string preset = name;
    const ModelRope m = cli::preset_model(cli::find_preset(preset));
    CHECK(m.kv_lora_rank == 512);
    CHECK(m.rotary_dim == 64);
    CHECK(m.style == Style::gptj);
    CHECK(m.freqs == Freqs::yarn);
    CHECK(cli::describe(m).find("MLA kv_lora_rank 512") != std::string::npos);
    std::vector<std::string> keys;
    for (const MlaSpec& s : cli::model_mla_specs(m, DType::bf16)) keys.push_back(s.key());
    CHECK(keys ==
          std::vector<std::string>{"mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip",
                                   "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qip",
                                   "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qasm",
                                   "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qasm-e4m3"});
  }
  CHECK(cli::preset_model(cli::find_preset("deepseek-v3")).q_heads == 128);
  CHECK(cli::preset_model(cli::find_preset("kimi-k2")).q_heads == 64);
  CHECK(
      cli::model_mla_specs(cli::preset_model(cli::find_preset("llama3-8b")), DType::bf16).empty());
  // The older presets keep their keys: phi-2's 32 specs, rotary 32 of 80.
  const std::vector<Spec> phi2 =
      cli::model_specs(cli::preset_model(cli::find_preset("phi-2")), DType::bf16);
  CHECK(phi2.size() == 32);
  CHECK(phi2[0].key() == "rope_bshd_bf16_d80_r32_neox_pos-offset_tab-f32-half_qk_fwd_ip");
  // QK-norm models add forward fused keys; Gemma 3 also its sliding layers' unscaled ones.
  const std::vector<Spec> gemma =
      cli::model_specs(cli::preset_model(cli::find_preset("gemma3-4b")), DType::bf16);
  CHECK(gemma.size() == 2 * 2 * 3 * 4 + 2 * 2 * 3);
}

TEST_CASE("C API: spec and model from a config.json") {
  ropejit_spec spec;
  ropejit_model model;
  ropejit_spec_init(&spec);
  ropejit_model_init(&model);
  REQUIRE(ropejit_spec_from_hf_config(config("deepseek-v2-lite").c_str(), ROPEJIT_BF16, &spec,
                                      &model) == ROPEJIT_OK);
  char key[256];
  REQUIRE(ropejit_key(&spec, key, sizeof key) == ROPEJIT_OK);
  CHECK(std::string(key) == "rope_bshd_bf16_d64_r64_gptj_pos-ids-i64_comp-yarn_qk_fwd_ip");
  CHECK(model.head_dim == 192);
  CHECK(model.rotary_offset == 128);
  CHECK(model.kv_heads == 1);
  CHECK(model.freqs == ROPEJIT_FREQS_YARN);
  CHECK(model.scaling.factor == 40);
  CHECK(model.kv_lora_rank == 512);
  // A caller built before kv_lora_rank (a 216-byte model): filled as far as it reaches.
  std::vector<unsigned char> old(sizeof(ropejit_model) + 8, 0xa5);
  ropejit_model* small = reinterpret_cast<ropejit_model*>(old.data());
  REQUIRE(ropejit_model_init_sized(small, 216) == ROPEJIT_OK);
  REQUIRE(ropejit_spec_from_hf_config(config("deepseek-v2-lite").c_str(), ROPEJIT_BF16, &spec,
                                      small) == ROPEJIT_OK);
  CHECK(small->rotary_offset == 128);
  for (size_t i = 216; i < old.size(); ++i) CHECK(old[i] == 0xa5);
  CHECK(ropejit_model_init_sized(small, 215) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  REQUIRE(ropejit_spec_from_hf_config(config("phi-3-mini-128k").c_str(), ROPEJIT_F16, &spec,
                                      &model) == ROPEJIT_OK);
  REQUIRE(model.scaling.short_factor != nullptr);
  CHECK(model.scaling.short_factor[1] == 1.0199999809265137);
  CHECK(model.scaling.factor_count == 48);
  CHECK(spec.dtype == ROPEJIT_F16);
  REQUIRE(ropejit_spec_from_hf_config_text(R"({"num_attention_heads": 4, "head_dim": 64})",
                                           ROPEJIT_BF16, &spec, nullptr) == ROPEJIT_OK);
  CHECK(spec.head_dim == 64);
  CHECK(ropejit_spec_from_hf_config_text(R"({"head_dim": 64})", ROPEJIT_BF16, &spec, nullptr) ==
        ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("num_attention_heads is missing") !=
        std::string::npos);
  CHECK(ropejit_spec_from_hf_config(nullptr, ROPEJIT_BF16, &spec, nullptr) ==
        ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: path is null");
  // Output structs are written only as far as their headers say: one not initialised is refused,
  // and nothing is written.
  ropejit_model blank;
  std::memset(&blank, 0x5a, sizeof blank);
  CHECK(ropejit_spec_from_hf_config(config("phi-3-mini-128k").c_str(), ROPEJIT_F16, &spec,
                                    &blank) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()).find("model was not filled by its _init function") !=
        std::string::npos);
  CHECK(blank.head_dim == 0x5a5a5a5a);
}

TEST_CASE("ropejit compile --hf-config: every shipped config, without a GPU" *
          doctest::test_suite("long")) {
  // Every core: on a GPU host this compile sits on the test command's critical path.
  const unsigned jobs = std::max(2u, std::thread::hardware_concurrency());
  std::string args = "compile --arch sm_90 -j " + std::to_string(std::min(jobs, 64u));
  for (const char* name : kShipped) args += " --hf-config " + config(name);
  const Run r = command(args);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, ", 0 failed"));
  CHECK(has(r, "qwen3-8b.json: qwen3: head_dim 128, rotary 128 neox, 32/8 heads"));
  // Every key of every shipped config has device code: scaled frequencies, mRoPE, QK-norm.
  CHECK(has(r, "rope_bshd_bf16_d128_r128_neox_pos-offset_comp-llama3_qk_fwd_ip  v8h2t512"));
  CHECK(has(r, "_pos-mrope-i64_"));
  CHECK_FALSE(has(r, "SKIPPED"));
  CHECK(has(r, "rope_bshd_bf16_d64_r64_gptj_pos-ids-i64_tab-f32-half_qk_fwd_ip  v8h2t512"));
  size_t lines = 0, bad = 0, at = 0;
  for (size_t next; (next = r.output.find('\n', at)) != std::string::npos; at = next + 1) {
    const std::string line = r.output.substr(at, next - at);
    if (line.rfind("sm_90  rope_", 0) == 0 || line.rfind("rope_", 0) == 0) {
      ++lines;
      bad += line.find(".rjk") == std::string::npos && line.find("SKIPPED") == std::string::npos;
    }
  }
  CHECK(lines > 300);
  CHECK(bad == 0);
}

TEST_CASE("ropejit --hf-config for source, tune, demo, and its errors") {
  Run r = command("source --hf-config " + config("mistral-nemo"));
  CHECK(r.status == 0);
  CHECK(has(r, "kRotaryDim = 128,"));
  r = command("source --hf-config " + config("llama3.1-8b"));
  CHECK(r.status == 0);
  CHECK(has(r, "kPairTable = true,"));  // per-pair float64 frequencies of the scaled variant
  r = command("source rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-yarn_qk_fwd_ip");
  CHECK(r.status == 0);
  CHECK(has(r, "ropejit_dev::WithPairs<ropejit_dev::RopeParams, 64>"));
  r = command("source");
  CHECK(r.status == 2);
  CHECK(has(r, "source needs a KEY or --hf-config FILE"));
  r = command("compile --key rope_bshd_bf16_d128_r128_neox_pos-mrope-i64_comp_qk_fwd_ip");
  CHECK(r.status == 0);
  CHECK(has(r, "1 keys: 2 kernels in"));

  r = command("tune --hf-config " + config("deepseek-v2-lite") + " --tokens 64 --dry-run");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r,
            "rope_bshd_bf16_d64_r64_gptj_pos-ids-i64_tab-f32-half_qk_fwd_ip  bucket 64  heads "
            "16/1: "));
  CHECK(has(r, "comp-yarn_qk_fwd_ip  bucket 64  heads 16/1: "));

  r = command("compile --hf-config " + std::string(ROPEJIT_DATA_DIR) + "/hf/nope.json");
  CHECK(r.status == 2);
  CHECK(has(r, "nope.json' does not exist"));
  const std::string bad = testing::temp_dir() + "/config.json";
  testing::write_file(bad, R"({"num_attention_heads": 8, "hidden_size": 512,
                               "rope_scaling": {"rope_type": "longrope2"}})");
  r = command("compile --hf-config " + bad);
  CHECK(r.status == 2);
  CHECK(has(r, "rope_scaling.rope_type (\"longrope2\") is not a rope_type ropejit knows"));
  r = command("demo --preset phi-2 --hf-config " + bad);
  CHECK(r.status == 2);
  CHECK(has(r, "--preset excludes --hf-config"));

  std::string why;
  if (detail::try_driver(&why)) return;  // the GPU suite runs demos for real
  r = command("demo --hf-config " + config("llama3.1-8b") + " --tokens 16");
  CHECK(r.status == 0);
  CHECK(has(r, "key rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-llama3_qk_fwd_ip"));
  CHECK(has(r, "GPU part SKIPPED"));
  r = command("compile --preset deepseek-v2-lite --arch sm_80 -j 2");
  CHECK(r.status == 0);
  CHECK(has(r, "36 keys: 68 kernels in"));  // the RoPE keys' 64 and MLA's 4
  CHECK(has(r, "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qasm-e4m3: 1 kernels for sm_80"));
}
