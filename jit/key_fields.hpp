// What every family's key parser and spec check share: splitting a key into its fields, a
// numbered field (d128), and the check that an enum holds a known value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {

// The widest head a kernel is rendered for, in every family.
inline constexpr int32_t kMaxHeadDim = 512;

template <class E>
void check_enum(E v, const char* field) {
  if (!is_valid(v))
    invalid("spec.", field, " (", static_cast<int32_t>(v), ") is not a known value");
}

// `s` split at every `sep` (empty fields kept).
std::vector<std::string> split_key(const std::string& s, char sep);

// The number of a field `prefix`<digits> of `key` (at most four digits); an error naming the
// key and the field otherwise.
int32_t parse_key_dim(const std::string& field, char prefix, const std::string& key);

}  // namespace ropejit::detail
