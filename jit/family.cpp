#include "jit/family.hpp"

#include <utility>

namespace ropejit::detail {
namespace {

constexpr std::pair<Family, const char*> kTags[] = {
    {Family::rope, "rope"},          {Family::qkv_projection, "qkvproj"},
    {Family::ffn_gate_up, "ffnglu"}, {Family::rms_norm, "rmsnorm"},
    {Family::dequant, "dequant"},    {Family::mla, "mla"},
};

}  // namespace

const char* family_tag(Family family) {
  for (const auto& [f, tag] : kTags)
    if (f == family) return tag;
  return "?";
}

Family family_of(const std::string& key) {
  const std::string first = key.substr(0, key.find('_'));
  for (const auto& [f, tag] : kTags)
    if (first == tag) return f;
  return Family::rope;
}

}  // namespace ropejit::detail
