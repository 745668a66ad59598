// Model presets for `ropejit compile` / `tune` / `demo`: each is a model's config.json fields
// that describe its RoPE, read like any --hf-config file.
#pragma once

#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::cli {

struct Preset {
  std::string name;
  std::string note;
  std::string config_json;  // the published config's RoPE fields (tests/data/hf holds the same)
};

const std::vector<Preset>& presets();
// Throws Error naming the known presets when `name` is not one.
const Preset& find_preset(const std::string& name);
ModelRope preset_model(const Preset& p);

// The model of a command: --hf-config FILE when given, else --preset NAME.
ModelRope model_for(const std::string& preset, const std::string& hf_config);

// One line for humans: "llama: head_dim 128, rotary 128 neox, 32/8 heads, base 500000, llama3".
std::string describe(const ModelRope& model);

// The specs a deployment of `model` typically calls: bshd and thd; offset and int64 position
// ids (mRoPE's three rows for mRoPE models); fp32 half-width tables and the model's computed
// frequencies (and unscaled ones for Gemma 3's sliding-window layers); forward and backward; in
// and out of place; plus forward in-place keys with the model's QK-norm when it has one.
std::vector<Spec> model_specs(const ModelRope& model, DType dtype);

// An MLA model's (kv_lora_rank > 0) latent-cache keys: the prefill form (q_pe rotated in place)
// and the decode form (the query assembled), each with a cache in the dtype and in e4m3 (the
// decode query then e4m3 too); position ids into fp32 tables, kv_a_layernorm's RMSNorm. Empty
// for other models.
std::vector<MlaSpec> model_mla_specs(const ModelRope& model, DType dtype);

}  // namespace ropejit::cli
