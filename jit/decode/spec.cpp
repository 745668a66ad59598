// The decode families' specs: validation, canonical form and the key of the QKV projection,
// RMSNorm and the FFN's gate/up (the key format: docs/decode.md).
#include <cstring>
#include <string>
#include <vector>

#include "jit/family.hpp"
#include "jit/key_fields.hpp"
#include "jit/names.hpp"

namespace ropejit {

using detail::check_enum;
using detail::kMaxHeadDim;
using detail::parse_key_dim;
using detail::split_key;

// The QKV projection.

void QkvProjSpec::validate() const {
  check_enum(dtype, "dtype");
  check_enum(style, "style");
  check_enum(positions, "positions");
  check_enum(index_type, "index_type");
  check_enum(freqs, "freqs");
  check_enum(table_dtype, "table_dtype");
  check_enum(table_width, "table_width");
  check_enum(norm, "norm");
  check_enum(weights, "weights");
  check_enum(cache, "cache");
  check_enum(cache_store, "cache_store");
  if (dtype == DType::f32)
    detail::invalid("spec.dtype (f32) has no tensor-core projection: use bf16 or f16");
  if (cache == KvCache::none && cache_store != Store::same)
    detail::invalid("spec.cache_store (", to_string(cache_store),
                    ") needs a KV cache: spec.cache is none");
  if (cache_store == Store::e4m3_dynamic && cache != KvCache::slots && positions != Positions::ids)
    detail::invalid("spec.cache_store (e4m3dyn) with a ", to_string(cache),
                    " cache needs spec.positions ids: such keys take the unfused path, whose RoPE "
                    "step places a token in a paged or contiguous cache by its position id");
  if (head_dim < 16 || head_dim % 16 != 0 || head_dim > kMaxHeadDim)
    detail::invalid("spec.head_dim (", head_dim, ") must be a multiple of 16 in [16, ", kMaxHeadDim,
                    "]");
  const int32_t rot = rotary_dim == 0 ? head_dim : rotary_dim;
  if (rot < 0 || rot % 2 != 0 || rot > head_dim)
    detail::invalid("spec.rotary_dim (", rotary_dim, ") must be even and <= head_dim (", head_dim,
                    "); 0 means head_dim");
  if (positions != Positions::offset && positions != Positions::ids)
    detail::invalid("spec.positions (", to_string(positions),
                    ") is not available for the projection: offset or ids");
  if (freqs != Freqs::table && freqs != Freqs::computed)
    detail::invalid("spec.freqs (", to_string(freqs),
                    ") is not available for the projection yet: table or computed (tables of a "
                    "scaled variant come from build_tables)");
  if (norm == Norm::rms_all_heads)
    detail::invalid(
        "spec.norm (rmsall) is a QK-norm; the projection's norm is over x: none, rms "
        "or rms1p");
}

QkvProjSpec QkvProjSpec::canonical() const {
  validate();
  QkvProjSpec c = *this;
  detail::canonicalize_rope_axes(&c);
  return c;
}

bool operator==(const QkvProjSpec& a, const QkvProjSpec& b) {
  return a.dtype == b.dtype && a.head_dim == b.head_dim && a.rotary_dim == b.rotary_dim &&
         a.style == b.style && a.positions == b.positions && a.index_type == b.index_type &&
         a.freqs == b.freqs && a.table_dtype == b.table_dtype && a.table_width == b.table_width &&
         a.norm == b.norm && a.weights == b.weights && a.cache == b.cache &&
         a.cache_store == b.cache_store;
}

// qkvproj_<dtype>_d<D>_r<R>_<style>_pos-<mode>[-<idx>]_<tab-<tdtype>-<width>|comp>_n<norm>[_we4m3]
std::string QkvProjSpec::key() const {
  const QkvProjSpec c = canonical();
  std::ostringstream os;
  os << detail::family_tag(detail::Family::qkv_projection) << '_' << to_string(c.dtype) << "_d"
     << c.head_dim << "_r" << c.rotary_dim << '_' << to_string(c.style) << "_pos-"
     << to_string(c.positions);
  if (c.positions != Positions::offset) os << '-' << to_string(c.index_type);
  if (c.freqs == Freqs::table)
    os << "_tab-" << to_string(c.table_dtype) << '-' << to_string(c.table_width);
  else
    os << "_comp";
  os << "_n" << to_string(c.norm);
  if (c.weights != Weights::same) os << "_w" << to_string(c.weights);
  if (c.cache != KvCache::none) {
    os << "_c" << to_string(c.cache);
    if (c.cache_store != Store::same) os << '-' << to_string(c.cache_store);
  }
  return os.str();
}

QkvProjSpec parse_qkv_proj_key(const std::string& key) {
  const std::vector<std::string> f = split_key(key, '_');
  if (f.size() < 8 || f.size() > 10 || f[0] != detail::family_tag(detail::Family::qkv_projection))
    detail::invalid(
        "key '", detail::clipped(key),
        "' is not a projection key (qkvproj_<dtype>_d.._r.._<style>_pos-.._.._n..[_w..][_c..])");
  QkvProjSpec s;
  s.dtype = detail::parse_name<DType>(f[1], "key dtype");
  s.head_dim = parse_key_dim(f[2], 'd', key);
  s.rotary_dim = parse_key_dim(f[3], 'r', key);
  s.style = detail::parse_name<Style>(f[4], "key style");
  const std::vector<std::string> pos = split_key(f[5], '-');
  if (pos.size() < 2 || pos.size() > 3 || pos[0] != "pos")
    detail::invalid("key '", detail::clipped(key), "': bad positions field '",
                    detail::clipped(f[5]), "'");
  s.positions = detail::parse_name<Positions>(pos[1], "key positions");
  if (pos.size() == 3) s.index_type = detail::parse_name<IndexType>(pos[2], "key index type");
  const std::vector<std::string> fr = split_key(f[6], '-');
  if (fr[0] == "tab" && fr.size() == 3) {
    s.freqs = Freqs::table;
    s.table_dtype = detail::parse_name<DType>(fr[1], "key table dtype");
    s.table_width = detail::parse_name<TableWidth>(fr[2], "key table width");
  } else if (fr[0] == "comp" && fr.size() == 1) {
    s.freqs = Freqs::computed;
  } else {
    detail::invalid("key '", detail::clipped(key), "': bad freqs field '", detail::clipped(f[6]),
                    "'");
  }
  if (f[7].size() < 2 || f[7][0] != 'n')
    detail::invalid("key '", detail::clipped(key), "': bad norm field '", detail::clipped(f[7]),
                    "'");
  s.norm = detail::parse_name<Norm>(f[7].substr(1), "key norm");
  // Optional fields, in this order: _w<weights>, _c<cache>[-<store>].
  size_t i = 8;
  if (i < f.size() && f[i].size() >= 2 && f[i][0] == 'w')
    s.weights = detail::parse_name<Weights>(f[i++].substr(1), "key weights");
  if (i < f.size() && f[i].size() >= 2 && f[i][0] == 'c') {
    const std::vector<std::string> cf = split_key(f[i++].substr(1), '-');
    if (cf.size() > 2)
      detail::invalid("key '", detail::clipped(key), "': bad cache field '",
                      detail::clipped(f[i - 1]), "'");
    s.cache = detail::parse_name<KvCache>(cf[0], "key cache");
    if (cf.size() == 2) s.cache_store = detail::parse_name<Store>(cf[1], "key cache store");
  }
  if (i != f.size())
    detail::invalid("key '", detail::clipped(key), "': bad field '", detail::clipped(f[i]),
                    "' (expected _w<weights> or _c<cache>)");
  if (s.key() != key)
    detail::invalid("key '", detail::clipped(key), "' is not canonical (expected '", s.key(), "')");
  return s;
}

// RMSNorm.

void RmsNormSpec::validate() const {
  check_enum(dtype, "dtype");
  check_enum(norm, "norm");
  unsigned char residual_byte = 0;
  std::memcpy(&residual_byte, &residual, 1);
  if (residual_byte > 1)
    detail::invalid("spec.residual (", int(residual_byte), ") must be true or false");
  if (norm != Norm::rms && norm != Norm::rms_one_plus)
    detail::invalid("spec.norm (", to_string(norm), ") must be rms or rms1p for RMSNorm");
}

RmsNormSpec RmsNormSpec::canonical() const {
  validate();
  return *this;
}

// rmsnorm_<dtype>_n<norm>[_res]
std::string RmsNormSpec::key() const {
  validate();
  return std::string(detail::family_tag(detail::Family::rms_norm)) + '_' + to_string(dtype) + "_n" +
         to_string(norm) + (residual ? "_res" : "");
}

RmsNormSpec parse_rms_norm_key(const std::string& key) {
  const std::vector<std::string> f = split_key(key, '_');
  if (f.size() < 3 || f.size() > 4 || f[0] != detail::family_tag(detail::Family::rms_norm) ||
      f[2].size() < 2 || f[2][0] != 'n' || (f.size() == 4 && f[3] != "res"))
    detail::invalid("key '", detail::clipped(key),
                    "' is not an RMSNorm key (rmsnorm_<dtype>_n<norm>[_res])");
  RmsNormSpec s;
  s.dtype = detail::parse_name<DType>(f[1], "key dtype");
  s.norm = detail::parse_name<Norm>(f[2].substr(1), "key norm");
  s.residual = f.size() == 4;
  if (s.key() != key)
    detail::invalid("key '", detail::clipped(key), "' is not canonical (expected '", s.key(), "')");
  return s;
}

// The FFN's gate/up.

void FfnSpec::validate() const {
  check_enum(dtype, "dtype");
  check_enum(norm, "norm");
  check_enum(act, "act");
  check_enum(weights, "weights");
  if (dtype == DType::f32)
    detail::invalid("spec.dtype (f32) has no tensor-core projection: use bf16 or f16");
  if (norm == Norm::rms_all_heads)
    detail::invalid(
        "spec.norm (rmsall) is a QK-norm; the FFN's norm is over x: none, rms or rms1p");
}

FfnSpec FfnSpec::canonical() const {
  validate();
  return *this;
}

// ffnglu_<dtype>_n<norm>_<act>[_we4m3]
std::string FfnSpec::key() const {
  validate();
  std::string key = std::string(detail::family_tag(detail::Family::ffn_gate_up)) + '_' +
                    to_string(dtype) + "_n" + to_string(norm) + '_' + to_string(act);
  if (weights != Weights::same) key += std::string("_w") + to_string(weights);
  return key;
}

FfnSpec parse_ffn_key(const std::string& key) {
  const std::vector<std::string> f = split_key(key, '_');
  if (f.size() < 4 || f.size() > 5 || f[0] != detail::family_tag(detail::Family::ffn_gate_up) ||
      f[2].size() < 2 || f[2][0] != 'n')
    detail::invalid("key '", detail::clipped(key),
                    "' is not an FFN gate/up key (ffnglu_<dtype>_n<norm>_<act>[_w..])");
  FfnSpec s;
  s.dtype = detail::parse_name<DType>(f[1], "key dtype");
  s.norm = detail::parse_name<Norm>(f[2].substr(1), "key norm");
  s.act = detail::parse_name<Activation>(f[3], "key act");
  if (f.size() == 5) {
    if (f[4].size() < 2 || f[4][0] != 'w')
      detail::invalid("key '", detail::clipped(key), "': bad weights field '",
                      detail::clipped(f[4]), "'");
    s.weights = detail::parse_name<Weights>(f[4].substr(1), "key weights");
  }
  if (s.key() != key)
    detail::invalid("key '", detail::clipped(key), "' is not canonical (expected '", s.key(), "')");
  return s;
}

}  // namespace ropejit
