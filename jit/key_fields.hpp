// What every family's key parser and spec check share: splitting a key into its fields, a
// numbered field (d128), and the check that an enum holds a known value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/errors.hpp"
#include "jit/names.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

// The widest head a kernel is rendered for, in every family.
inline constexpr int32_t kMaxHeadDim = 512;

template <class E>
void check_enum(E v, const char* field) {
  if (!is_valid(v))
    invalid("spec.", field, " (", static_cast<int32_t>(v), ") is not a known value");
}

// The canonical form of the RoPE axes every rotating spec has: rotary_dim 0 means head_dim, offset
// positions read no index (i64), computed frequencies read no table (f32, half width).
template <class S>
void canonicalize_rope_axes(S* c) {
  if (c->rotary_dim == 0) c->rotary_dim = c->head_dim;
  if (c->positions == Positions::offset) c->index_type = IndexType::i64;
  if (c->freqs != Freqs::table) {
    c->table_dtype = DType::f32;
    c->table_width = TableWidth::half;
  }
}

// `s` split at every `sep` (empty fields kept).
std::vector<std::string> split_key(const std::string& s, char sep);

// The number of a field `prefix`<digits> of `key` (at most four digits); an error naming the
// key and the field otherwise.
int32_t parse_key_dim(const std::string& field, char prefix, const std::string& key);

}  // namespace ropejit::detail
