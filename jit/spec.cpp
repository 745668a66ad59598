// Spec validation, canonical form and the one canonical key string per specialization.
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "jit/family.hpp"
#include "jit/key_fields.hpp"
#include "jit/names.hpp"

namespace ropejit {

const char* to_string(Layout v) { return detail::name_of(v); }
const char* to_string(DType v) { return detail::name_of(v); }
const char* to_string(Style v) { return detail::name_of(v); }
const char* to_string(Positions v) { return detail::name_of(v); }
const char* to_string(IndexType v) { return detail::name_of(v); }
const char* to_string(Freqs v) { return detail::name_of(v); }
const char* to_string(TableWidth v) { return detail::name_of(v); }
const char* to_string(Direction v) { return detail::name_of(v); }
const char* to_string(Fusion v) { return detail::name_of(v); }
const char* to_string(Norm v) { return detail::name_of(v); }
const char* to_string(KvCache v) { return detail::name_of(v); }
const char* to_string(Store v) { return detail::name_of(v); }
const char* to_string(ProjPath v) { return detail::name_of(v); }
const char* to_string(Weights v) { return detail::name_of(v); }
const char* to_string(Activation v) { return detail::name_of(v); }
const char* to_string(MlaQuery v) { return detail::name_of(v); }

using detail::check_enum;
using detail::kMaxHeadDim;

void Spec::validate() const {
  // A bool holding anything but 0 or 1 (memset, a C caller's int) is a bug in the caller.
  unsigned char in_place_byte = 0;
  std::memcpy(&in_place_byte, &in_place, 1);
  if (in_place_byte > 1)
    detail::invalid("spec.in_place (", int(in_place_byte), ") must be true or false");
  check_enum(layout, "layout");
  check_enum(dtype, "dtype");
  check_enum(style, "style");
  check_enum(positions, "positions");
  check_enum(index_type, "index_type");
  check_enum(freqs, "freqs");
  check_enum(table_dtype, "table_dtype");
  check_enum(table_width, "table_width");
  check_enum(direction, "direction");
  check_enum(fusion, "fusion");
  check_enum(norm, "norm");
  check_enum(out_store, "out_store");
  check_enum(cache, "cache");
  check_enum(cache_store, "cache_store");
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim)
    detail::invalid("spec.head_dim (", head_dim, ") must be even and in [2, ", kMaxHeadDim, "]");
  const int32_t rot = rotary_dim == 0 ? head_dim : rotary_dim;
  if (rot < 0 || rot % 2 != 0 || rot > head_dim)
    detail::invalid("spec.rotary_dim (", rotary_dim, ") must be even and <= head_dim (", head_dim,
                    "); 0 means head_dim");
  // The fusion axes' combinations.
  if (fusion == Fusion::q && cache == KvCache::none)
    detail::invalid("spec.fusion (q) writes k only into the KV cache, but spec.cache is none");
  if (out_store != Store::same && in_place)
    detail::invalid("spec.out_store (", to_string(out_store),
                    ") needs spec.in_place = false: q (and k) are written to q_out (k_out)");
  if (cache_store != Store::same && cache == KvCache::none)
    detail::invalid("spec.cache_store (", to_string(cache_store),
                    ") needs a KV cache (spec.cache)");
  const bool fused = norm != Norm::none || out_store != Store::same || cache != KvCache::none ||
                     fusion != Fusion::qk;
  if (fused && direction == Direction::backward)
    detail::invalid(
        "spec.direction (bwd) is for plain RoPE gradients; the fused stages (norm, "
        "FP8 outputs, KV cache) run forward only");
}

bool Spec::fused() const {
  return norm != Norm::none || out_store != Store::same || cache != KvCache::none ||
         fusion != Fusion::qk;
}

Spec Spec::canonical() const {
  validate();
  Spec c = *this;
  detail::canonicalize_rope_axes(&c);
  if (c.cache == KvCache::none) c.cache_store = Store::same;
  return c;
}

bool operator==(const Spec& a, const Spec& b) {
  return a.layout == b.layout && a.dtype == b.dtype && a.head_dim == b.head_dim &&
         a.rotary_dim == b.rotary_dim && a.style == b.style && a.positions == b.positions &&
         a.index_type == b.index_type && a.freqs == b.freqs && a.table_dtype == b.table_dtype &&
         a.table_width == b.table_width && a.direction == b.direction && a.in_place == b.in_place &&
         a.fusion == b.fusion && a.norm == b.norm && a.out_store == b.out_store &&
         a.cache == b.cache && a.cache_store == b.cache_store;
}

// Field order is part of the persisted format (cache entries and tuning files name keys):
// rope_<layout>_<dtype>_d<D>_r<R>_<style>_pos-<mode>[-<idx>]_<freqs>_<fusion>_<direction>_<ip|oop>
//   freqs:  tab-<tdtype>-<width> | comp | comp-<variant>
//   fusion: qk | <qk|q>[-n<norm>][-o<store>][-c<cache>[-<store>]]   (fused stages, in order)
std::string Spec::key() const {
  const Spec c = canonical();
  std::ostringstream os;
  os << detail::family_tag(detail::Family::rope) << '_' << to_string(c.layout) << '_'
     << to_string(c.dtype) << "_d" << c.head_dim << "_r" << c.rotary_dim << '_'
     << to_string(c.style) << "_pos-" << to_string(c.positions);
  if (c.positions != Positions::offset) os << '-' << to_string(c.index_type);
  if (c.freqs == Freqs::table)
    os << "_tab-" << to_string(c.table_dtype) << '-' << to_string(c.table_width);
  else if (c.freqs == Freqs::computed)
    os << "_comp";
  else
    os << "_comp-" << to_string(c.freqs);
  os << '_' << to_string(c.fusion);
  if (c.norm != Norm::none) os << "-n" << to_string(c.norm);
  if (c.out_store != Store::same) os << "-o" << to_string(c.out_store);
  if (c.cache != KvCache::none) {
    os << "-c" << to_string(c.cache);
    if (c.cache_store != Store::same) os << '-' << to_string(c.cache_store);
  }
  os << '_' << to_string(c.direction) << '_' << (c.in_place ? "ip" : "oop");
  return os.str();
}

namespace detail {

std::vector<std::string> split_key(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char ch : s) {
    if (ch == sep)
      out.emplace_back();
    else
      out.back() += ch;
  }
  return out;
}

int32_t parse_key_dim(const std::string& field, char prefix, const std::string& key) {
  if (field.size() < 2 || field[0] != prefix || field.size() > 5)
    detail::invalid("key '", detail::clipped(key), "': expected ", prefix, "<number>, got '",
                    detail::clipped(field), "'");
  int32_t v = 0;
  for (size_t i = 1; i < field.size(); ++i) {
    if (field[i] < '0' || field[i] > '9')
      detail::invalid("key '", detail::clipped(key), "': expected ", prefix, "<number>, got '",
                      detail::clipped(field), "'");
    v = v * 10 + (field[i] - '0');
  }
  return v;
}

}  // namespace detail

using detail::parse_key_dim;
using detail::split_key;

Spec parse_key(const std::string& key) {
  const std::vector<std::string> f = split_key(key, '_');
  if (f.size() != 11 || f[0] != detail::family_tag(detail::Family::rope))
    detail::invalid("key '", detail::clipped(key),
                    "' is not a ropejit key (rope_<layout>_<dtype>_d.._r.._...)");
  Spec s;
  s.layout = detail::parse_name<Layout>(f[1], "key layout");
  s.dtype = detail::parse_name<DType>(f[2], "key dtype");
  s.head_dim = parse_key_dim(f[3], 'd', key);
  s.rotary_dim = parse_key_dim(f[4], 'r', key);
  s.style = detail::parse_name<Style>(f[5], "key style");
  const std::vector<std::string> pos = split_key(f[6], '-');
  if (pos.size() < 2 || pos[0] != "pos")
    detail::invalid("key '", detail::clipped(key), "': bad positions field '",
                    detail::clipped(f[6]), "'");
  s.positions = detail::parse_name<Positions>(pos[1], "key positions");
  if (s.positions != Positions::offset) {
    if (pos.size() != 3)
      detail::invalid("key '", detail::clipped(key), "': positions field needs an index type");
    s.index_type = detail::parse_name<IndexType>(pos[2], "key index type");
  } else if (pos.size() != 2) {
    detail::invalid("key '", detail::clipped(key), "': bad positions field '",
                    detail::clipped(f[6]), "'");
  }
  const std::vector<std::string> fr = split_key(f[7], '-');
  if (fr[0] == "tab") {
    if (fr.size() != 3)
      detail::invalid("key '", detail::clipped(key), "': table field needs dtype and width");
    s.freqs = Freqs::table;
    s.table_dtype = detail::parse_name<DType>(fr[1], "key table dtype");
    s.table_width = detail::parse_name<TableWidth>(fr[2], "key table width");
  } else if (fr[0] == "comp" && fr.size() <= 2) {
    s.freqs = fr.size() == 1 ? Freqs::computed
                             : detail::parse_name<Freqs>(fr[1], "key frequency variant");
    if (s.freqs == Freqs::table || (fr.size() == 2 && s.freqs == Freqs::computed))
      detail::invalid("key '", detail::clipped(key), "': bad freqs field '", detail::clipped(f[7]),
                      "'");
  } else {
    detail::invalid("key '", detail::clipped(key), "': bad freqs field '", detail::clipped(f[7]),
                    "'");
  }
  const std::vector<std::string> fu = split_key(f[8], '-');
  s.fusion = detail::parse_name<Fusion>(fu[0], "key fusion");
  for (size_t i = 1; i < fu.size(); ++i) {
    const std::string& t = fu[i];
    const std::string rest = t.size() > 1 ? t.substr(1) : std::string();
    const char tag = t.empty() ? '\0' : t[0];
    if (tag == 'n') {
      s.norm = detail::parse_name<Norm>(rest, "key norm");
    } else if (tag == 'o') {
      s.out_store = detail::parse_name<Store>(rest, "key output store");
    } else if (tag == 'c') {
      s.cache = detail::parse_name<KvCache>(rest, "key cache");
      if (i + 1 < fu.size() && (fu[i + 1] == "e4m3" || fu[i + 1] == "e4m3dyn"))
        s.cache_store = detail::parse_name<Store>(fu[++i], "key cache store");
    } else {
      detail::invalid("key '", detail::clipped(key), "': bad fusion field '", detail::clipped(f[8]),
                      "'");
    }
  }
  s.direction = detail::parse_name<Direction>(f[9], "key direction");
  if (f[10] != "ip" && f[10] != "oop")
    detail::invalid("key '", detail::clipped(key), "': last field must be ip or oop");
  s.in_place = f[10] == "ip";
  if (s.key() != key)
    detail::invalid("key '", detail::clipped(key), "' is not canonical (expected '", s.key(), "')");
  return s;
}

Tensor contiguous(Layout layout, void* data, int64_t batch, int64_t seq, int64_t heads,
                  int64_t head_dim) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"batch", batch}, {"seq", seq}, {"heads", heads}, {"head_dim", head_dim}};
  for (const auto& [name, v] : sizes)
    if (v < 0) detail::invalid("contiguous: ", name, " (", v, ") must be >= 0");
  if (!detail::is_valid(layout))
    detail::invalid("contiguous: layout (", static_cast<int32_t>(layout), ") is not a known value");
  // Every stride is a product of some of the sizes; all of them at once must fit in int64.
  int64_t all = head_dim;
  for (const int64_t v : {heads, seq, layout == Layout::thd ? int64_t(1) : batch})
    if (__builtin_mul_overflow(all, v, &all))
      detail::invalid("contiguous: batch (", batch, ") x seq (", seq, ") x heads (", heads,
                      ") x head_dim (", head_dim, ") overflows int64");
  Tensor t;
  t.data = data;
  t.heads = heads;
  switch (layout) {
    case Layout::bshd:
      t.stride_head = head_dim;
      t.stride_seq = heads * head_dim;
      t.stride_batch = seq * heads * head_dim;
      break;
    case Layout::sbhd:
      t.stride_head = head_dim;
      t.stride_batch = heads * head_dim;
      t.stride_seq = batch * heads * head_dim;
      break;
    case Layout::bhsd:
      t.stride_seq = head_dim;
      t.stride_head = seq * head_dim;
      t.stride_batch = heads * seq * head_dim;
      break;
    case Layout::thd:
      t.stride_head = head_dim;
      t.stride_seq = heads * head_dim;
      t.stride_batch = 0;
      break;
  }
  return t;
}

}  // namespace ropejit
