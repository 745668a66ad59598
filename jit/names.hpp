// Enum <-> name tables shared by key strings, the CLI and error messages.
#pragma once

#include <array>
#include <string>
#include <utility>

#include "jit/errors.hpp"

namespace ropejit::detail {

template <class E>
struct Names;

#define ROPEJIT_NAMES(E, ...)                                            \
  template <>                                                            \
  struct Names<E> {                                                      \
    static constexpr std::pair<E, const char*> kTable[] = {__VA_ARGS__}; \
    static constexpr const char* kWhat = #E;                             \
  };

ROPEJIT_NAMES(Layout, {Layout::bshd, "bshd"}, {Layout::sbhd, "sbhd"}, {Layout::bhsd, "bhsd"},
              {Layout::thd, "thd"})
ROPEJIT_NAMES(DType, {DType::f32, "f32"}, {DType::f16, "f16"}, {DType::bf16, "bf16"})
ROPEJIT_NAMES(Style, {Style::neox, "neox"}, {Style::gptj, "gptj"})
ROPEJIT_NAMES(Positions, {Positions::offset, "offset"}, {Positions::seq_offsets, "seqoff"},
              {Positions::ids, "ids"}, {Positions::mrope, "mrope"})
ROPEJIT_NAMES(IndexType, {IndexType::i32, "i32"}, {IndexType::i64, "i64"})
ROPEJIT_NAMES(Freqs, {Freqs::table, "tab"}, {Freqs::computed, "comp"}, {Freqs::linear, "linear"},
              {Freqs::dynamic_ntk, "ntk"}, {Freqs::llama3, "llama3"}, {Freqs::yarn, "yarn"},
              {Freqs::longrope, "longrope"})
ROPEJIT_NAMES(TableWidth, {TableWidth::half, "half"}, {TableWidth::full, "full"})
ROPEJIT_NAMES(Direction, {Direction::forward, "fwd"}, {Direction::backward, "bwd"})
ROPEJIT_NAMES(Fusion, {Fusion::qk, "qk"}, {Fusion::q, "q"})
ROPEJIT_NAMES(Norm, {Norm::none, "none"}, {Norm::rms, "rms"}, {Norm::rms_one_plus, "rms1p"},
              {Norm::rms_all_heads, "rmsall"})
ROPEJIT_NAMES(KvCache, {KvCache::none, "none"}, {KvCache::contiguous, "cont"},
              {KvCache::paged, "paged"}, {KvCache::slots, "slots"})
ROPEJIT_NAMES(Store, {Store::same, "same"}, {Store::e4m3, "e4m3"}, {Store::e4m3_dynamic, "e4m3dyn"})
ROPEJIT_NAMES(Activation, {Activation::silu, "silu"}, {Activation::gelu_tanh, "gelutanh"})
ROPEJIT_NAMES(Weights, {Weights::same, "same"}, {Weights::e4m3, "e4m3"})
ROPEJIT_NAMES(MlaQuery, {MlaQuery::in_place, "ip"}, {MlaQuery::assemble, "asm"})
ROPEJIT_NAMES(ProjPath, {ProjPath::automatic, "auto"}, {ProjPath::fused, "fused"},
              {ProjPath::unfused, "unfused"})
#undef ROPEJIT_NAMES

template <class E>
const char* name_of(E v) {
  for (const auto& [value, text] : Names<E>::kTable)
    if (value == v) return text;
  return "?";
}

template <class E>
bool is_valid(E v) {
  for (const auto& entry : Names<E>::kTable)
    if (entry.first == v) return true;
  return false;
}

// Parses a name; `what` names the argument in the error ("--dtype", "key field 2").
template <class E>
E parse_name(const std::string& text, const std::string& what) {
  std::string choices;
  for (const auto& [value, name] : Names<E>::kTable) {
    if (text == name) return value;
    choices += choices.empty() ? name : std::string(", ") + name;
  }
  invalid(what, " ('", clipped(text), "') must be one of: ", choices);
}

}  // namespace ropejit::detail
