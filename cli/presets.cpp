// Model presets (figures from each model's published config).
#include "cli/presets.hpp"

#include "jit/errors.hpp"

namespace ropejit::cli {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> list = {
      {"llama3-8b", 32, 8, 128, 128, 500000.0, "Llama 3 8B: GQA 32/8, rope_theta 5e5"},
      {"qwen2.5-7b", 28, 4, 128, 128, 1000000.0, "Qwen2.5 7B: GQA 28/4, rope_theta 1e6"},
      {"gpt-neox-20b", 64, 64, 96, 24, 10000.0, "GPT-NeoX 20B: rotary_pct 0.25 of 96"},
      {"phi-2", 32, 32, 80, 32, 10000.0, "Phi-2: partial_rotary_factor 0.4 of 80"},
      {"mistral-7b", 32, 8, 128, 128, 1000000.0, "Mistral 7B v0.2+: GQA 32/8"},
      {"gemma-2b", 8, 1, 256, 256, 10000.0, "Gemma 2B: MQA, head_dim 256"},
  };
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

std::vector<Spec> preset_specs(const Preset& p, DType dtype) {
  std::vector<Spec> out;
  for (Layout layout : {Layout::bshd, Layout::thd})
    for (Positions pos : {Positions::offset, Positions::ids})
      for (Freqs freqs : {Freqs::table, Freqs::computed})
        for (Direction dir : {Direction::forward, Direction::backward})
          for (bool in_place : {true, false}) {
            Spec s;
            s.layout = layout;
            s.dtype = dtype;
            s.head_dim = p.head_dim;
            s.rotary_dim = p.rotary_dim;
            s.positions = pos;
            s.index_type = IndexType::i64;
            s.freqs = freqs;
            s.direction = dir;
            s.in_place = in_place;
            out.push_back(s.canonical());
          }
  return out;
}

}  // namespace ropejit::cli
