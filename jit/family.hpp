// The kernel families a key can name, told apart by the key's first field. This table is the
// one place that spells each family's tag: the families' key() functions write it and their
// parsers check it, and what takes a key of any family (the CLI's compile, source and tune,
// the tuning file's projection entries) asks family_of() which one it is.
#pragma once

#include <string>

namespace ropejit::detail {

enum class Family { rope, qkv_projection, ffn_gate_up, rms_norm, dequant, mla };

// The first field of the family's keys: "rope" for rope_bshd_bf16_..., "qkvproj" for
// qkvproj_bf16_d128_..., and so on.
const char* family_tag(Family family);

// The family whose tag is `key`'s first field (up to the first '_'); Family::rope for a key
// whose first field is no family's, so that parse_key() names what is wrong with it.
Family family_of(const std::string& key);

}  // namespace ropejit::detail
