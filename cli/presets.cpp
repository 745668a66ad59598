// Model presets: each a model's config.json fields that describe its RoPE (the published
// configs' values; tests/data/hf holds the same files for the newer models, and a CPU test
// checks that both agree).
#include "cli/presets.hpp"

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::cli {

namespace {

// name, one line about it, its config.json's RoPE fields.
struct Entry {
  const char* name;
  const char* note;
  const char* config_json;
};

constexpr Entry kPresets[] = {
    {"llama3-8b", "Llama 3 8B: GQA 32/8, rope_theta 5e5",
     R"json({
 "model_type": "llama",
 "hidden_size": 4096,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 8192,
 "rope_theta": 500000.0
})json"},
    {"qwen2.5-7b", "Qwen2.5 7B: GQA 28/4, rope_theta 1e6",
     R"json({
 "model_type": "qwen2",
 "hidden_size": 3584,
 "num_attention_heads": 28,
 "num_key_value_heads": 4,
 "max_position_embeddings": 32768,
 "rope_theta": 1000000.0
})json"},
    {"gpt-neox-20b", "GPT-NeoX 20B: rotary_pct 0.25 of 96",
     R"json({
 "model_type": "gpt_neox",
 "hidden_size": 6144,
 "num_attention_heads": 64,
 "rotary_pct": 0.25,
 "rotary_emb_base": 10000,
 "max_position_embeddings": 2048
})json"},
    {"phi-2", "Phi-2: partial_rotary_factor 0.4 of 80",
     R"json({
 "model_type": "phi",
 "hidden_size": 2560,
 "num_attention_heads": 32,
 "num_key_value_heads": 32,
 "partial_rotary_factor": 0.4,
 "rope_theta": 10000.0,
 "max_position_embeddings": 2048
})json"},
    {"mistral-7b", "Mistral 7B v0.2+: GQA 32/8",
     R"json({
 "model_type": "mistral",
 "hidden_size": 4096,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 32768,
 "rope_theta": 1000000.0
})json"},
    {"gemma-2b", "Gemma 2B: MQA, head_dim 256",
     R"json({
 "model_type": "gemma",
 "hidden_size": 2048,
 "head_dim": 256,
 "num_attention_heads": 8,
 "num_key_value_heads": 1,
 "max_position_embeddings": 8192,
 "rope_theta": 10000.0
})json"},
    {"llama3.1-8b", "Llama 3.1 8B: llama3 scaling x8 from 8192, GQA 32/8",
     R"json({
 "architectures": ["LlamaForCausalLM"],
 "model_type": "llama",
 "hidden_size": 4096,
 "head_dim": 128,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0,
 "rope_scaling": {
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 8192,
  "rope_type": "llama3"
 }
})json"},
    {"llama3.2-1b", "Llama 3.2 1B: llama3 scaling x32, head_dim 64",
     R"json({
 "architectures": ["LlamaForCausalLM"],
 "model_type": "llama",
 "hidden_size": 2048,
 "head_dim": 64,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0,
 "rope_scaling": {
  "factor": 32.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 8192,
  "rope_type": "llama3"
 }
})json"},
    {"qwen2-vl-7b", "Qwen2-VL 7B: mRoPE sections 16/24/24",
     R"json({
 "architectures": ["Qwen2VLForConditionalGeneration"],
 "model_type": "qwen2_vl",
 "hidden_size": 3584,
 "num_attention_heads": 28,
 "num_key_value_heads": 4,
 "max_position_embeddings": 32768,
 "rms_norm_eps": 1e-06,
 "rope_theta": 1000000.0,
 "rope_scaling": {
  "type": "mrope",
  "mrope_section": [16, 24, 24]
 }
})json"},
    {"qwen2.5-vl-7b", "Qwen2.5-VL 7B: mRoPE sections 16/24/24",
     R"json({
 "architectures": ["Qwen2_5_VLForConditionalGeneration"],
 "model_type": "qwen2_5_vl",
 "hidden_size": 3584,
 "num_attention_heads": 28,
 "num_key_value_heads": 4,
 "max_position_embeddings": 128000,
 "rms_norm_eps": 1e-06,
 "rope_theta": 1000000.0,
 "rope_scaling": {
  "type": "mrope",
  "mrope_section": [16, 24, 24],
  "rope_type": "default"
 }
})json"},
    {"qwen3-vl-8b", "Qwen3-VL 8B: interleaved mRoPE 24/20/20, QK-norm",
     R"json({
 "architectures": ["Qwen3VLForConditionalGeneration"],
 "model_type": "qwen3_vl",
 "text_config": {
  "model_type": "qwen3_vl_text",
  "hidden_size": 4096,
  "head_dim": 128,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "max_position_embeddings": 262144,
  "rms_norm_eps": 1e-06,
  "rope_theta": 5000000,
  "rope_scaling": {
   "mrope_interleaved": true,
   "mrope_section": [24, 20, 20],
   "rope_type": "default"
  }
 }
})json"},
    {"phi-3-mini-128k", "Phi-3 mini 128k: LongRoPE, 96-wide heads",
     R"json({
 "architectures": ["Phi3ForCausalLM"],
 "model_type": "phi3",
 "hidden_size": 3072,
 "num_attention_heads": 32,
 "num_key_value_heads": 32,
 "max_position_embeddings": 131072,
 "original_max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05,
 "rope_theta": 10000.0,
 "rope_scaling": {
  "long_factor": [1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523, 32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688, 64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062],
  "short_factor": [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533],
  "type": "longrope"
 }
})json"},
    {"deepseek-v2-lite", "DeepSeek-V2-Lite: MLA rotary 64 of 192, YaRN x40, gptj pairs",
     R"json({
 "architectures": ["DeepseekV2ForCausalLM"],
 "model_type": "deepseek_v2",
 "hidden_size": 2048,
 "num_attention_heads": 16,
 "num_key_value_heads": 16,
 "kv_lora_rank": 512,
 "q_lora_rank": null,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "v_head_dim": 128,
 "max_position_embeddings": 163840,
 "rms_norm_eps": 1e-06,
 "rope_theta": 10000,
 "rope_scaling": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 40,
  "mscale": 0.707,
  "mscale_all_dim": 0.707,
  "original_max_position_embeddings": 4096,
  "type": "yarn"
 }
})json"},
    {"deepseek-v3", "DeepSeek-V3 / R1: MLA 128 heads, kv_lora_rank 512, rotary 64 of 192, YaRN x40",
     R"json({
 "architectures": ["DeepseekV3ForCausalLM"],
 "model_type": "deepseek_v3",
 "hidden_size": 7168,
 "num_attention_heads": 128,
 "num_key_value_heads": 128,
 "kv_lora_rank": 512,
 "q_lora_rank": 1536,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "v_head_dim": 128,
 "max_position_embeddings": 163840,
 "rms_norm_eps": 1e-06,
 "rope_theta": 10000,
 "rope_scaling": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 40,
  "mscale": 1.0,
  "mscale_all_dim": 1.0,
  "original_max_position_embeddings": 4096,
  "type": "yarn"
 }
})json"},
    {"kimi-k2", "Kimi K2 Instruct 0905: MLA 64 heads, kv_lora_rank 512, YaRN x64, base 5e4",
     R"json({
 "architectures": ["DeepseekV3ForCausalLM"],
 "model_type": "kimi_k2",
 "hidden_size": 7168,
 "num_attention_heads": 64,
 "num_key_value_heads": 64,
 "kv_lora_rank": 512,
 "q_lora_rank": 1536,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "v_head_dim": 128,
 "max_position_embeddings": 262144,
 "rms_norm_eps": 1e-06,
 "rope_theta": 50000.0,
 "rope_scaling": {
  "beta_fast": 1.0,
  "beta_slow": 1.0,
  "factor": 64.0,
  "mscale": 1.0,
  "mscale_all_dim": 1.0,
  "original_max_position_embeddings": 4096,
  "type": "yarn"
 }
})json"},
    {"mistral-nemo", "Mistral NeMo 12B: head_dim 128 of hidden 5120",
     R"json({
 "architectures": ["MistralForCausalLM"],
 "model_type": "mistral",
 "hidden_size": 5120,
 "head_dim": 128,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 1024000,
 "rms_norm_eps": 1e-05,
 "rope_theta": 1000000.0
})json"},
    {"qwen3-8b", "Qwen3 8B: QK-norm (RMS per head)",
     R"json({
 "architectures": ["Qwen3ForCausalLM"],
 "model_type": "qwen3",
 "hidden_size": 4096,
 "head_dim": 128,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "max_position_embeddings": 40960,
 "rms_norm_eps": 1e-06,
 "rope_theta": 1000000,
 "rope_scaling": null
})json"},
    {"olmo2-7b", "OLMo 2 7B: QK-norm over all heads",
     R"json({
 "architectures": ["Olmo2ForCausalLM"],
 "model_type": "olmo2",
 "hidden_size": 4096,
 "num_attention_heads": 32,
 "num_key_value_heads": 32,
 "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-06,
 "rope_theta": 500000,
 "rope_scaling": null
})json"},
    {"gemma3-4b", "Gemma 3 4B: linear x8 global layers, base 1e4 local layers, QK-norm (1 + w)",
     R"json({
 "architectures": ["Gemma3ForConditionalGeneration"],
 "model_type": "gemma3",
 "text_config": {
  "model_type": "gemma3_text",
  "hidden_size": 2560,
  "num_hidden_layers": 34,
  "rope_scaling": {
   "factor": 8.0,
   "rope_type": "linear"
  },
  "sliding_window": 1024
 }
})json"},
    {"gptj-6b", "GPT-J 6B: gptj pairs, rotary 64 of 256",
     R"json({
 "architectures": ["GPTJForCausalLM"],
 "model_type": "gptj",
 "n_embd": 4096,
 "n_head": 16,
 "rotary_dim": 64,
 "n_positions": 2048
})json"},
    {"qwen2.5-7b-yarn", "Qwen2.5 7B with its model card's YaRN x4 rope_scaling",
     R"json({
 "architectures": ["Qwen2ForCausalLM"],
 "model_type": "qwen2",
 "hidden_size": 3584,
 "num_attention_heads": 28,
 "num_key_value_heads": 4,
 "max_position_embeddings": 32768,
 "rms_norm_eps": 1e-06,
 "rope_theta": 1000000.0,
 "rope_scaling": {
  "factor": 4.0,
  "original_max_position_embeddings": 32768,
  "type": "yarn"
 }
})json"},
    {"llama2-7b-linear", "Llama 2 7B with linear scaling x4 (example)",
     R"json({
 "architectures": ["LlamaForCausalLM"],
 "model_type": "llama",
 "hidden_size": 4096,
 "num_attention_heads": 32,
 "num_key_value_heads": 32,
 "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05,
 "rope_theta": 10000.0,
 "rope_scaling": {
  "factor": 4.0,
  "type": "linear"
 }
})json"},
    {"llama2-7b-dynamic", "Llama 2 7B with dynamic NTK x2 (example)",
     R"json({
 "architectures": ["LlamaForCausalLM"],
 "model_type": "llama",
 "hidden_size": 4096,
 "num_attention_heads": 32,
 "num_key_value_heads": 32,
 "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05,
 "rope_theta": 10000.0,
 "rope_scaling": {
  "factor": 2.0,
  "rope_type": "dynamic"
 }
})json"},
};

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> list = [] {
    std::vector<Preset> out;
    for (const Entry& e : kPresets) out.push_back({e.name, e.note, e.config_json});
    return out;
  }();
  return list;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  detail::invalid("--preset ('", detail::clipped(name), "') is not a known preset: ", known);
}

ModelRope preset_model(const Preset& p) {
  try {
    return model_from_hf_config(p.config_json);
  } catch (const Error& e) {  // a broken preset is a bug of this file
    detail::fail(ErrorCode::internal, "preset ", p.name, ": ", e.what());
  }
}

ModelRope model_for(const std::string& preset, const std::string& hf_config) {
  if (!hf_config.empty()) return model_from_hf_config_file(hf_config);
  return preset_model(find_preset(preset));
}

std::string describe(const ModelRope& m) {
  std::string out = detail::concat(m.model_type.empty() ? "model" : m.model_type, ": head_dim ",
                                   m.head_dim, ", rotary ", m.rotary_dim);
  if (m.rotary_offset > 0) out += detail::concat(" from element ", m.rotary_offset);
  out += detail::concat(" ", to_string(m.style), ", ", m.q_heads, "/", m.kv_heads, " heads, base ",
                        m.base, ", freqs ", to_string(m.freqs));
  if (m.freqs != Freqs::computed) out += detail::concat(" (factor ", m.scaling.factor, ")");
  if (m.mrope)
    out += detail::concat(", mrope ", m.mrope_section[0], "/", m.mrope_section[1], "/",
                          m.mrope_section[2], m.mrope_interleaved ? " interleaved" : "");
  if (m.norm != Norm::none) out += detail::concat(", qk-norm ", to_string(m.norm));
  if (m.local_base > 0) out += detail::concat(", sliding-window layers base ", m.local_base);
  if (m.kv_lora_rank > 0) out += detail::concat(", MLA kv_lora_rank ", m.kv_lora_rank);
  return out;
}

std::vector<MlaSpec> model_mla_specs(const ModelRope& m, DType dtype) {
  std::vector<MlaSpec> out;
  if (m.kv_lora_rank <= 0) return out;
  for (const MlaQuery query : {MlaQuery::in_place, MlaQuery::assemble})
    for (const Store store : {Store::same, Store::e4m3}) {
      MlaSpec s;
      s.dtype = dtype;
      s.kv_rank = m.kv_lora_rank;
      s.rope_dim = m.rotary_dim;
      s.style = m.style;
      s.index_type = IndexType::i64;
      s.table_dtype = DType::f32;
      s.norm = Norm::rms;
      s.cache_store = store;
      s.query = query;
      if (query == MlaQuery::assemble) s.q_store = store;
      out.push_back(s.canonical());
    }
  return out;
}

std::vector<Spec> model_specs(const ModelRope& m, DType dtype) {
  std::vector<Freqs> freqs = {Freqs::table, m.freqs};
  if (m.local_base > 0 && m.freqs != Freqs::computed) freqs.push_back(Freqs::computed);
  const std::vector<Positions> positions =
      m.mrope ? std::vector<Positions>{Positions::mrope}
              : std::vector<Positions>{Positions::offset, Positions::ids};
  Spec base = spec_from_model(m, dtype);
  base.norm = Norm::none;
  std::vector<Spec> out;
  auto add = [&](Layout layout, Positions pos, Freqs f, Direction dir, bool in_place, Norm norm) {
    Spec s = base;
    s.layout = layout;
    s.positions = pos;
    s.index_type = IndexType::i64;
    s.freqs = f;
    s.direction = dir;
    s.in_place = in_place;
    s.norm = norm;
    out.push_back(s.canonical());
  };
  for (Layout layout : {Layout::bshd, Layout::thd})
    for (Positions pos : positions)
      for (Freqs f : freqs)
        for (Direction dir : {Direction::forward, Direction::backward})
          for (bool in_place : {true, false}) add(layout, pos, f, dir, in_place, Norm::none);
  if (m.norm != Norm::none)  // the fused stages run forward only
    for (Layout layout : {Layout::bshd, Layout::thd})
      for (Positions pos : positions)
        for (Freqs f : freqs) add(layout, pos, f, Direction::forward, true, m.norm);
  return out;
}

}  // namespace ropejit::cli
