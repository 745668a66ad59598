// libFuzzer target: the config.json reader. Any text is either refused with ropejit::Error or
// yields a model whose key is valid and whose frequencies compute; nothing crashes or hangs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ropejit::ModelRope m = ropejit::model_from_hf_config(text);
    const ropejit::Spec s = ropejit::spec_from_model(m, ropejit::DType::bf16);
    if (ropejit::parse_key(s.key()) != s) std::abort();
    ropejit::RopeScaling scaling = m.scaling;
    scaling.seq_len = m.max_positions + 1;
    if (m.rotary_dim / 2 > 1 << 16) return 0;  // huge but valid: not worth the time here
    const std::vector<double> inv =
        ropejit::inverse_frequencies(m.freqs, m.rotary_dim, m.base, scaling);
    if (inv.size() != size_t(m.rotary_dim / 2)) std::abort();
    (void)ropejit::attention_factor(m.freqs, m.rotary_dim, scaling);
  } catch (const ropejit::Error&) {
  }
  return 0;
}
