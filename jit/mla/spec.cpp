// MLA keys: validation, canonical form, the key and its parser (the key format: docs/mla.md).
#include <string>
#include <vector>

#include "jit/family.hpp"
#include "jit/key_fields.hpp"
#include "jit/names.hpp"

namespace ropejit {

using detail::check_enum;
using detail::parse_key_dim;
using detail::split_key;

namespace {

constexpr int32_t kMaxKvRank = 4096;
constexpr int32_t kMaxRopeDim = 512;

// "same" or "e4m3": the field of a store in the key ("csame", "qasm-e4m3").
const char* store_field(Store s) { return s == Store::same ? "same" : "e4m3"; }

}  // namespace

void MlaSpec::validate() const {
  check_enum(dtype, "dtype");
  check_enum(style, "style");
  check_enum(index_type, "index_type");
  check_enum(table_dtype, "table_dtype");
  check_enum(norm, "norm");
  check_enum(cache_store, "cache_store");
  check_enum(query, "query");
  check_enum(q_store, "q_store");
  if (dtype == DType::f32)
    detail::invalid("spec.dtype (f32) is not an MLA activation dtype: use bf16 or f16");
  if (kv_rank < 8 || kv_rank > kMaxKvRank || kv_rank % 8 != 0)
    detail::invalid("spec.kv_rank (", kv_rank, ") must be a multiple of 8 in [8, ", kMaxKvRank,
                    "]");
  if (rope_dim < 2 || rope_dim > kMaxRopeDim || rope_dim % 2 != 0)
    detail::invalid("spec.rope_dim (", rope_dim, ") must be even, in [2, ", kMaxRopeDim, "]");
  if (norm != Norm::none && norm != Norm::rms)
    detail::invalid("spec.norm (", to_string(norm), ") must be none or rms for MLA's kv_c");
  if (cache_store == Store::e4m3_dynamic)
    detail::invalid("spec.cache_store (e4m3dyn) is not an MLA cache store: same or e4m3");
  if (q_store == Store::e4m3_dynamic)
    detail::invalid("spec.q_store (e4m3dyn) is not an MLA query store: same or e4m3");
  if (scale_multiplies && cache_store != Store::e4m3 && q_store != Store::e4m3)
    detail::invalid(
        "spec.scale_multiplies is set but no store is e4m3: it says how an e4m3 cache_store or "
        "q_store applies its scale");
  if (q_store != Store::same && query != MlaQuery::assemble)
    detail::invalid("spec.q_store (", to_string(q_store),
                    ") needs spec.query assemble: an in-place q_pe keeps the dtype");
}

MlaSpec MlaSpec::canonical() const {
  validate();
  return *this;
}

// mla_<dtype>_r<kv_rank>_p<rope_dim>_<style>_ids-<index>_tab-<table
// dtype>_n<norm>_c<store>_q<ip|asm>[-e4m3][_smul]
std::string MlaSpec::key() const {
  validate();
  std::string k = std::string(detail::family_tag(detail::Family::mla)) + '_' + to_string(dtype) +
                  "_r" + std::to_string(kv_rank) + "_p" + std::to_string(rope_dim) + '_' +
                  to_string(style) + "_ids-" + to_string(index_type) + "_tab-" +
                  to_string(table_dtype) + "_n" + to_string(norm) + "_c" +
                  store_field(cache_store) + "_q" + to_string(query);
  if (q_store != Store::same) k += std::string("-") + store_field(q_store);
  if (scale_multiplies) k += "_smul";
  return k;
}

MlaSpec parse_mla_key(const std::string& key) {
  const std::vector<std::string> f = split_key(key, '_');
  const auto bad = [&]() {
    detail::invalid("key '", detail::clipped(key),
                    "' is not an MLA key (mla_<dtype>_r<kv_rank>_p<rope_dim>_<style>_ids-<index>_"
                    "tab-<dtype>_n<norm>_c<store>_q<ip|asm>[-e4m3][_smul])");
  };
  const bool smul = f.size() == 11 && f[10] == "smul";
  if ((f.size() != 10 && !smul) || f[0] != detail::family_tag(detail::Family::mla)) bad();
  const auto after = [&](const std::string& field, const std::string& prefix) {
    if (field.compare(0, prefix.size(), prefix) != 0) bad();
    return field.substr(prefix.size());
  };
  MlaSpec s;
  s.dtype = detail::parse_name<DType>(f[1], "key dtype");
  s.kv_rank = parse_key_dim(f[2], 'r', key);
  s.rope_dim = parse_key_dim(f[3], 'p', key);
  s.style = detail::parse_name<Style>(f[4], "key style");
  s.index_type = detail::parse_name<IndexType>(after(f[5], "ids-"), "key index type");
  s.table_dtype = detail::parse_name<DType>(after(f[6], "tab-"), "key table dtype");
  s.norm = detail::parse_name<Norm>(after(f[7], "n"), "key norm");
  s.cache_store = detail::parse_name<Store>(after(f[8], "c"), "key cache store");
  const std::string q = after(f[9], "q");
  const size_t dash = q.find('-');
  s.query = detail::parse_name<MlaQuery>(q.substr(0, dash), "key query");
  if (dash != std::string::npos)
    s.q_store = detail::parse_name<Store>(q.substr(dash + 1), "key query store");
  s.scale_multiplies = smul;
  if (s.key() != key)
    detail::invalid("key '", detail::clipped(key), "' is not canonical (expected '", s.key(), "')");
  return s;
}

}  // namespace ropejit
