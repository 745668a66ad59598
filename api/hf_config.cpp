// Models described by their Hugging Face config.json: head sizes, rotary width, base, the
// frequency variant and its parameters, mRoPE sections, pair style and QK-norm, read as the
// transformers library reads them (its config classes' field names, legacy names and defaults
// for the fields published configs leave out), with every bad field named in the error.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "jit/errors.hpp"
#include "jit/files.hpp"
#include "jit/names.hpp"
#include "jit/scaling.hpp"

namespace ropejit {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxConfigBytes = size_t(4) << 20;  // configs with LongRoPE factors are ~10 KB
constexpr size_t kMaxConfigDepth = 64;               // published configs nest 4 levels

// A config's fields, looked up in the text model's part first (multimodal configs keep it under
// "text_config"), then at the top level. Null values count as absent, as in transformers.
class Fields {
 public:
  Fields(const json& doc, std::string source) : doc_(doc), source_(std::move(source)) {
    const auto it = doc.find("text_config");
    if (it != doc.end() && it->is_object()) text_ = &*it;
  }

  const std::string& source() const { return source_; }

  // The field's value, or null when it is absent or null.
  const json* find(const char* name) const {
    for (const json* scope : {text_, &doc_}) {
      if (!scope) continue;
      const auto it = scope->find(name);
      if (it != scope->end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  [[noreturn]] void bad(const std::string& field, const json& value, const char* rule) const {
    detail::invalid(source_, ": ", field, " (", detail::clipped(value.dump()), ") ", rule);
  }

  [[noreturn]] void missing(const std::string& field, const char* why) const {
    detail::invalid(source_, ": ", field, " is missing; ", why);
  }

  // A number > 0 (or >= 0), or an integer: by name at the config's level, or inside an object.
  double number(const std::string& field, const json& v, bool allow_zero = false) const {
    if (!v.is_number()) bad(field, v, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || (d == 0 && !allow_zero))
      bad(field, v, allow_zero ? "must be a finite number >= 0" : "must be a finite number > 0");
    return d;
  }
  int64_t integer(const std::string& field, const json& v) const {
    const double d = number(field, v);
    if (d != std::floor(d) || d > 9.0e15) bad(field, v, "must be a positive integer");
    return int64_t(d);
  }
  // A RoPE base: > 1, so that the frequencies base^(-2i/d) fall from 1.
  double base(const std::string& field, const json& v) const {
    const double b = number(field, v);
    if (!(b > 1)) bad(field, v, "must be > 1");
    return b;
  }
  // A size that must fit the spec's 32-bit fields with room to spare: 1 .. 2^24.
  int32_t size(const std::string& field, const json& v) const {
    const int64_t n = integer(field, v);
    if (n > (int64_t(1) << 24)) bad(field, v, "must be <= 2^24");
    return int32_t(n);
  }

 private:
  const json& doc_;
  const json* text_ = nullptr;
  std::string source_;
};

// Reads JSON text event by event, keeping the path to the value being read, so that what the
// parser refuses (NaN and Infinity, which Python's json.dumps writes; 1e400, beyond a double) or
// reads as 0 (1e-400) is reported with its field and its text: the parser's own message names
// neither.
class JsonProblemFinder : public json::json_sax_t {
 public:
  explicit JsonProblemFinder(const std::string& text) : text_(text) {}

  // "" when the text parses and every number keeps its value.
  const std::string& problem() const { return problem_; }

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t v, const string_t& raw) override {
    const std::string field = path(true);
    // A nonzero digit before the exponent: a value below the smallest double, read as 0.
    if (v == 0 && raw.find_first_of("123456789") < raw.find_first_of("eE")) {
      problem_ = detail::concat(field, " (", detail::clipped(raw),
                                ") is too small for a double (it would read as 0)");
      return false;
    }
    return true;
  }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({false, path(true)});
    return true;
  }
  bool key(string_t& k) override {
    frames_.back().key = detail::clipped(k);
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    frames_.push_back({true, path(true)});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t at, const std::string&, const json::exception& e) override {
    const std::string field = path(false);
    const std::string token = token_at(at);
    std::string word = token;
    if (!word.empty() && (word[0] == '-' || word[0] == '+')) word.erase(0, 1);
    for (char& ch : word) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (word.rfind("nan", 0) == 0 || word.rfind("inf", 0) == 0) {
      problem_ =
          detail::concat(field.empty() ? "the document" : field, " (", detail::clipped(token),
                         ") is not a number JSON can hold: JSON has no NaN or Infinity "
                         "(Python's json.dumps writes them); give a finite number");
    } else if (e.id == 406) {  // nlohmann's out_of_range: number overflow
      problem_ = detail::concat(field.empty() ? "the document" : field, " (",
                                detail::clipped(token), ") is beyond the range of a double");
    } else {
      const std::string what = e.what();
      const size_t tag = what.find("] ");  // drop nlohmann's "[json.exception...] "
      problem_ = detail::concat(
          "invalid JSON: ",
          detail::clipped_middle(what.substr(tag == std::string::npos ? 0 : tag + 2)),
          field.empty() ? "" : detail::concat(" (in ", field, ")"));
    }
    return false;
  }

 private:
  struct Frame {
    bool array = false;
    std::string path;  // the container's own
    std::string key;   // an object's current member, "" between members
    size_t next = 0;   // an array's next index
  };

  bool value() {
    path(true);
    return true;
  }

  // The path of the value being read ("rope_scaling.long_factor[3]"); `consume` moves past it.
  std::string path(bool consume) {
    if (frames_.empty()) return "";
    Frame& f = frames_.back();
    if (f.array)
      return detail::clipped_middle(detail::concat(f.path, "[", consume ? f.next++ : f.next, "]"));
    std::string p = f.path.empty() || f.key.empty() ? f.path + f.key : f.path + "." + f.key;
    if (consume) f.key.clear();
    return detail::clipped_middle(p);
  }

  // The whole word around byte `at`, where the parser stopped: "NaN", "-Infinity", "1e400".
  std::string token_at(size_t at) const {
    static const char* const kDelimiters = " \t\r\n,:[]{}\"";
    at = std::min(at, text_.size());
    size_t begin = at;
    while (begin > 0 && !std::strchr(kDelimiters, text_[begin - 1])) --begin;
    size_t end = at;
    while (end < text_.size() && !std::strchr(kDelimiters, text_[end])) ++end;
    return text_.substr(begin, end - begin);
  }

  const std::string& text_;
  std::vector<Frame> frames_;
  std::string problem_;
};

json parse_config(const std::string& text, const std::string& source) {
  if (const size_t depth = detail::json_nesting_depth(text); depth > kMaxConfigDepth)
    detail::invalid(source, ": JSON nested ", depth, " levels deep; at most ", kMaxConfigDepth,
                    " are read");
  JsonProblemFinder finder(text);
  json::sax_parse(text, &finder);
  if (!finder.problem().empty()) detail::invalid(source, ": ", finder.problem());
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    const std::string what = e.what();
    const size_t tag = what.find("] ");  // drop nlohmann's "[json.exception...] "
    detail::invalid(source,
                    ": invalid JSON: ", what.substr(tag == std::string::npos ? 0 : tag + 2));
  }
  if (!doc.is_object())
    detail::invalid(source, ": expected a JSON object, got ", detail::clipped(doc.dump()));
  return doc;
}

// The text model's type: text_config.model_type, else model_type, else the first architecture
// named in "architectures" ("Qwen3ForCausalLM" -> "qwen3"), else "".
std::string model_type_of(const json& doc) {
  for (const json* scope : {doc.contains("text_config") ? &doc["text_config"] : nullptr, &doc}) {
    if (!scope || !scope->is_object()) continue;
    const auto it = scope->find("model_type");
    if (it != scope->end() && it->is_string()) return it->get<std::string>();
  }
  static const std::pair<const char*, const char*> kArchitectures[] = {
      {"LlamaFor", "llama"},
      {"MistralFor", "mistral"},
      {"Qwen2For", "qwen2"},
      {"Qwen3For", "qwen3"},
      {"Qwen3MoeFor", "qwen3_moe"},
      {"Olmo2For", "olmo2"},
      {"Gemma3For", "gemma3"},
      {"Phi3For", "phi3"},
      {"DeepseekV2For", "deepseek_v2"},
      {"DeepseekV3For", "deepseek_v3"},
      {"GPTJFor", "gptj"},
      {"Qwen2VLFor", "qwen2_vl"},
      {"Qwen2_5_VLFor", "qwen2_5_vl"}};
  const auto arch = doc.find("architectures");
  if (arch != doc.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    const std::string name = (*arch)[0].get<std::string>();
    for (const auto& [prefix, type] : kArchitectures)
      if (name.rfind(prefix, 0) == 0) return type;
  }
  return "";
}

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}

// Defaults of the config classes whose published configs leave RoPE fields out (Gemma 3's
// text_config names neither its heads nor its bases).
struct TypeDefaults {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, max_positions = 0;
  double base = 10000.0, local_base = 0;
};

TypeDefaults defaults_for(const std::string& type) {
  TypeDefaults d;
  if (one_of(type, {"gemma3", "gemma3_text"})) {
    d.q_heads = 8;
    d.kv_heads = 4;
    d.head_dim = 256;
    d.max_positions = 131072;
    d.base = 1000000.0;
    d.local_base = 10000.0;
  }
  return d;
}

// Heads, head size and the rotary part of each head.
void read_dims(const Fields& f, const TypeDefaults& d, ModelRope* m) {
  // Messages name the field the config gives (GPT-2 style configs say n_head and n_embd).
  const char* heads_field = f.find("num_attention_heads") ? "num_attention_heads" : "n_head";
  const json* heads = f.find(heads_field);
  if (heads)
    m->q_heads = f.size(heads_field, *heads);
  else if (d.q_heads)
    m->q_heads = int32_t(d.q_heads);
  else
    f.missing("num_attention_heads", "the head count is needed for head_dim and the call");
  const json* kv = f.find("num_key_value_heads");
  m->kv_heads =
      kv ? f.size("num_key_value_heads", *kv) : int32_t(d.kv_heads ? d.kv_heads : m->q_heads);
  if (m->kv_heads > m->q_heads && kv)
    f.bad("num_key_value_heads", *kv,
          detail::concat("must be <= num_attention_heads (", m->q_heads, ")").c_str());
  if (m->kv_heads > m->q_heads && heads)  // the config class's default, more than it gives
    f.bad(heads_field, *heads,
          detail::concat("must be >= the ", m->model_type, " default num_key_value_heads (",
                         m->kv_heads, ")")
              .c_str());

  const json* mla_rope = f.find("qk_rope_head_dim");
  if (mla_rope) {
    // DeepSeek MLA: each q head is [qk_nope_head_dim | qk_rope_head_dim], and the rotary part's k
    // is one head shared by all q heads (k_pe, cached next to the compressed kv).
    const json* nope = f.find("qk_nope_head_dim");
    if (!nope) f.missing("qk_nope_head_dim", "MLA configs (qk_rope_head_dim) give both parts");
    m->rotary_dim = f.size("qk_rope_head_dim", *mla_rope);
    m->rotary_offset = f.size("qk_nope_head_dim", *nope);
    m->head_dim = m->rotary_offset + m->rotary_dim;
    m->kv_heads = 1;
    if (const json* rank = f.find("kv_lora_rank")) m->kv_lora_rank = f.size("kv_lora_rank", *rank);
    return;
  }
  // head_dim, else the config class's default (Gemma 3: 256, not hidden_size / heads), else
  // hidden_size / num_attention_heads rounded down, as transformers derives it.
  // `head_dim_from` names where head_dim came from, for the messages below.
  std::string head_dim_from;
  if (const json* hd = f.find("head_dim")) {
    m->head_dim = f.size("head_dim", *hd);
    head_dim_from = detail::concat("head_dim (", m->head_dim, ")");
  } else if (d.head_dim) {
    m->head_dim = int32_t(d.head_dim);
    head_dim_from = detail::concat("the ", m->model_type, " default head_dim (", m->head_dim, ")");
  } else if (const char* hidden_field = f.find("hidden_size") ? "hidden_size"
                                        : f.find("n_embd")    ? "n_embd"
                                                              : nullptr) {
    const int32_t hidden = f.size(hidden_field, *f.find(hidden_field));
    m->head_dim = hidden / m->q_heads;
    head_dim_from = detail::concat(hidden_field, " (", hidden, ") / ", heads_field, " (",
                                   m->q_heads, ") = head_dim ", m->head_dim);
    if (m->head_dim == 0)
      detail::invalid(f.source(), ": ", hidden_field, " (", hidden, ") / ", heads_field, " (",
                      m->q_heads, ") gives head_dim 0; give head_dim, or a ", hidden_field,
                      " of at least ", heads_field);
  } else {
    f.missing("head_dim", "give head_dim, or hidden_size and num_attention_heads");
  }
  // The rotary width: an absolute rotary_dim (GPT-J), or a fraction of the head, truncated as
  // transformers does (int(head_dim * factor)).
  if (const json* rd = f.find("rotary_dim")) {
    m->rotary_dim = f.size("rotary_dim", *rd);
    return;
  }
  // transformers 5 may keep partial_rotary_factor inside rope_parameters only.
  std::vector<std::pair<std::string, const json*>> fractions = {
      {"partial_rotary_factor", f.find("partial_rotary_factor")},
      {"rotary_pct", f.find("rotary_pct")}};
  for (const char* name : {"rope_parameters", "rope_scaling"})
    if (const json* p = f.find(name); p && p->is_object() && p->contains("partial_rotary_factor"))
      fractions.emplace_back(std::string(name) + ".partial_rotary_factor",
                             &(*p)["partial_rotary_factor"]);
  double fraction = 1.0;
  std::string fraction_from;
  for (const auto& [name, v] : fractions) {
    if (!v || v->is_null() || !fraction_from.empty()) continue;
    fraction = f.number(name, *v);
    fraction_from = detail::concat(name, " (", detail::clipped(v->dump()), ")");
    if (fraction > 1.0) f.bad(name, *v, "must be <= 1");
  }
  m->rotary_dim = int32_t(double(m->head_dim) * fraction);
  if (m->rotary_dim < 2 || m->rotary_dim % 2 != 0)
    detail::invalid(f.source(), ": ",
                    fraction_from.empty() ? head_dim_from : fraction_from + " of " + head_dim_from,
                    " gives rotary_dim ", m->rotary_dim, "; RoPE needs an even rotary_dim >= 2");
}

// The object holding rope_type and the scaling parameters, and its name for messages:
// rope_scaling (older configs; wins when both are given, as in transformers), else
// rope_parameters, whose "full_attention" entry is taken when it is keyed by layer type.
std::pair<const json*, std::string> rope_params(const Fields& f, const json** sliding) {
  *sliding = nullptr;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    const json* p = f.find(name);
    if (!p) continue;
    if (!p->is_object()) f.bad(name, *p, "must be an object");
    if (p->empty()) continue;
    const auto full = p->find("full_attention");
    if (full != p->end() && full->is_object()) {
      const auto sl = p->find("sliding_attention");
      if (sl != p->end() && sl->is_object()) *sliding = &*sl;
      return {&*full, std::string(name) + ".full_attention"};
    }
    return {p, name};
  }
  return {nullptr, "rope_scaling"};
}

Freqs freqs_of(const Fields& f, const json* params, const std::string& where) {
  if (!params) return Freqs::computed;
  const char* field = params->contains("rope_type") ? "rope_type" : "type";
  const auto it = params->find(field);
  if (it == params->end() || it->is_null()) return Freqs::computed;
  if (!it->is_string()) f.bad(where + "." + field, *it, "must be a string");
  const std::string t = it->get<std::string>();
  // "mrope" is Qwen2-VL's legacy type for default frequencies; "su" Phi-3's for longrope.
  if (t == "default" || t == "mrope") return Freqs::computed;
  if (t == "linear") return Freqs::linear;
  if (t == "dynamic") return Freqs::dynamic_ntk;
  if (t == "llama3") return Freqs::llama3;
  if (t == "yarn") return Freqs::yarn;
  if (t == "longrope" || t == "su") return Freqs::longrope;
  f.bad(where + "." + field, *it,
        "is not a rope_type ropejit knows: default, linear, dynamic, llama3, yarn, longrope "
        "(legacy names mrope, su)");
}

double param_number(const Fields& f, const json* params, const std::string& where, const char* name,
                    double fallback, bool required, const char* why) {
  const auto it = params ? params->find(name) : json::const_iterator();
  if (!params || it == params->end() || it->is_null()) {
    if (required) f.missing(where + "." + name, why);
    return fallback;
  }
  return f.number(where + "." + name, *it, true);
}

std::vector<double> factor_array(const Fields& f, const json* params, const std::string& where,
                                 const char* name, int32_t pairs) {
  const std::string field = where + "." + name;
  const auto it = params->find(name);
  if (it == params->end() || it->is_null())
    f.missing(field, "longrope needs short_factor and long_factor");
  if (!it->is_array() || it->size() != size_t(pairs))
    f.bad(field, *it,
          detail::concat("must be an array of rotary_dim / 2 (", pairs, ") numbers").c_str());
  std::vector<double> out;
  for (size_t i = 0; i < it->size(); ++i)
    out.push_back(f.number(detail::concat(field, "[", i, "]"), (*it)[i]));
  return out;
}

// original_max_position_embeddings for llama3, yarn and longrope, with transformers' priority:
// a top-level field, then the parameters', then max_position_embeddings.
int64_t original_length(const Fields& f, const json* params, const std::string& where,
                        const ModelRope& m) {
  if (const json* top = f.find("original_max_position_embeddings"))
    return f.integer("original_max_position_embeddings", *top);
  const auto it = params->find("original_max_position_embeddings");
  if (it != params->end() && !it->is_null())
    return f.integer(where + ".original_max_position_embeddings", *it);
  if (m.max_positions == 0)
    f.missing(where + ".original_max_position_embeddings",
              "nor is max_position_embeddings given, and the variant needs the trained length");
  return m.max_positions;
}

void read_scaling(const Fields& f, const json* params, const std::string& where, ModelRope* m) {
  RopeScaling& s = m->scaling;
  const char* name = detail::name_of(m->freqs);
  const std::string needs = detail::concat(name, " needs it");
  if (m->freqs == Freqs::computed) return;
  const bool factor_required = m->freqs != Freqs::longrope;
  s.factor = param_number(f, params, where, "factor", 0.0, factor_required, needs.c_str());
  switch (m->freqs) {
    case Freqs::dynamic_ntk:  // transformers rescales from max_position_embeddings here
      if (m->max_positions == 0)
        f.missing("max_position_embeddings", "dynamic scaling starts beyond it");
      s.original_max_positions = m->max_positions;
      break;
    case Freqs::llama3:
      s.original_max_positions = original_length(f, params, where, *m);
      s.low_freq_factor = param_number(f, params, where, "low_freq_factor", 0, true, needs.c_str());
      s.high_freq_factor =
          param_number(f, params, where, "high_freq_factor", 0, true, needs.c_str());
      break;
    case Freqs::yarn: {
      s.original_max_positions = original_length(f, params, where, *m);
      // transformers reads `beta_fast or 32`: absent, null or 0 all mean the default.
      const double fast = param_number(f, params, where, "beta_fast", 0, false, "");
      const double slow = param_number(f, params, where, "beta_slow", 0, false, "");
      s.beta_fast = fast > 0 ? fast : 32.0;
      s.beta_slow = slow > 0 ? slow : 1.0;
      s.mscale = param_number(f, params, where, "mscale", 0, false, "");
      s.mscale_all_dim = param_number(f, params, where, "mscale_all_dim", 0, false, "");
      s.attention_factor = param_number(f, params, where, "attention_factor", 0, false, "");
      const auto t = params->find("truncate");
      if (t != params->end() && !t->is_null()) {
        if (!t->is_boolean()) f.bad(where + ".truncate", *t, "must be true or false");
        s.truncate = t->get<bool>();
      }
      break;
    }
    case Freqs::longrope:
      s.original_max_positions = original_length(f, params, where, *m);
      // Phi-3 gives no factor: the default attention factor uses the length ratio instead.
      if (s.factor == 0 && m->max_positions > 0)
        s.factor = double(m->max_positions) / double(s.original_max_positions);
      s.attention_factor = param_number(f, params, where, "attention_factor", 0, false, "");
      m->short_factor = factor_array(f, params, where, "short_factor", m->rotary_dim / 2);
      m->long_factor = factor_array(f, params, where, "long_factor", m->rotary_dim / 2);
      s.short_factor = m->short_factor.data();
      s.long_factor = m->long_factor.data();
      s.factor_count = m->rotary_dim / 2;
      break;
    default:
      break;
  }
  try {
    detail::validate_scaling(m->freqs, m->rotary_dim, s, where.c_str());
  } catch (const Error& e) {
    detail::invalid(f.source(), ": ", std::string(e.what()).substr(9));  // drop "ropejit: "
  }
}

void read_mrope(const Fields& f, const json* params, const std::string& where, ModelRope* m) {
  const json* section = nullptr;
  if (params && params->contains("mrope_section") && !(*params)["mrope_section"].is_null())
    section = &(*params)["mrope_section"];
  if (!section) return;
  const std::string field = where + ".mrope_section";
  if (!section->is_array() || section->size() != 3)
    f.bad(field, *section, "must be 3 integers (temporal, height, width pairs)");
  for (size_t i = 0; i < 3; ++i)
    m->mrope_section[i] = f.size(detail::concat(field, "[", i, "]"), (*section)[i]);
  const auto il = params->find("mrope_interleaved");
  if (il != params->end() && !il->is_null()) {
    if (!il->is_boolean()) f.bad(where + ".mrope_interleaved", *il, "must be true or false");
    m->mrope_interleaved = il->get<bool>();
  }
  m->mrope = true;
  if (m->mrope_section[0] + m->mrope_section[1] + m->mrope_section[2] != m->rotary_dim / 2)
    f.bad(field, *section,
          detail::concat("must sum to rotary_dim / 2 (", m->rotary_dim / 2, ")").c_str());
}

// Pair style, decided from the model type (the published modeling code, not the config, says
// which elements a rotation pairs).
void read_style(const Fields& f, ModelRope* m) {
  const std::string& t = m->model_type;
  if (one_of(t, {"gptj", "codegen"})) {
    m->style = Style::gptj;
    m->style_reason = t + " rotates neighbouring elements (2i, 2i + 1)";
  } else if (one_of(t, {"deepseek_v2", "deepseek_v3", "kimi_k2"})) {
    // DeepSeek's checkpoints store the rotary part pair-interleaved: V2's modeling code multiplies
    // complex pairs (2i, 2i + 1); V3's (rope_interleave, default true) de-interleaves to rotate
    // and leaves the result in half-split order, a permutation shared by q and k that attention
    // scores do not see. Either way the pairs are (2i, 2i + 1).
    const json* il = f.find("rope_interleave");
    if (il && !il->is_boolean()) f.bad("rope_interleave", *il, "must be true or false");
    const bool interleaved = !il || il->get<bool>();
    m->style = interleaved ? Style::gptj : Style::neox;
    m->style_reason = interleaved ? t + " pairs interleaved elements (2i, 2i + 1)"
                                  : t + " with rope_interleave false rotates halves";
  } else {
    m->style = Style::neox;
    m->style_reason = t.empty() ? "no model_type: the rotate-half convention most models use"
                                : t + " rotates halves (i, i + R/2)";
  }
}

// QK-norm, from the architecture: which RMSNorm its attention applies to q and k before RoPE.
void read_norm(const Fields& f, ModelRope* m) {
  const std::string& t = m->model_type;
  if (one_of(t, {"qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe",
                 "qwen3_vl_moe_text"}))
    m->norm = Norm::rms;  // per head, x * w
  else if (one_of(t, {"gemma3", "gemma3_text"}))
    m->norm = Norm::rms_one_plus;  // per head, x * (1 + w)
  else if (one_of(t, {"olmo2", "olmo3", "olmoe"}))
    m->norm = Norm::rms_all_heads;  // over the whole q (k) projection
  if (const json* eps = f.find("rms_norm_eps")) m->norm_eps = f.number("rms_norm_eps", *eps);
}

ModelRope describe(const json& doc, const std::string& source) {
  const Fields f(doc, source);
  ModelRope m;
  m.model_type = model_type_of(doc);
  const TypeDefaults d = defaults_for(m.model_type);
  read_dims(f, d, &m);
  const char* mp_field =
      f.find("max_position_embeddings") ? "max_position_embeddings" : "n_positions";
  const json* mp = f.find(mp_field);
  m.max_positions = mp ? f.integer(mp_field, *mp) : d.max_positions;

  const json* sliding = nullptr;
  const auto [params, where] = rope_params(f, &sliding);
  // The base: the parameters' rope_theta, else the config's (GPT-NeoX: rotary_emb_base), else
  // the config class's default.
  m.base = d.base;
  const json* theta = nullptr;
  std::string theta_field;
  if (params && params->contains("rope_theta") && !(*params)["rope_theta"].is_null()) {
    theta = &(*params)["rope_theta"];
    theta_field = where + ".rope_theta";
  }
  for (const char* name : {"rope_theta", "rotary_emb_base"})
    if (!theta && (theta = f.find(name))) theta_field = name;
  if (theta) m.base = f.base(theta_field, *theta);
  m.freqs = freqs_of(f, params, where);
  read_scaling(f, params, where, &m);
  read_mrope(f, params, where, &m);
  read_style(f, &m);
  read_norm(f, &m);

  // Sliding-window layers with a base of their own (Gemma 3): rope_local_base_freq, or the
  // "sliding_attention" entry of rope_parameters; only unscaled frequencies there.
  m.local_base = d.local_base;
  if (const json* lb = f.find("rope_local_base_freq"))
    m.local_base = f.base("rope_local_base_freq", *lb);
  if (sliding) {
    const std::string sw = where.substr(0, where.find('.')) + ".sliding_attention";
    if (freqs_of(f, sliding, sw) != Freqs::computed)
      f.bad(sw + ".rope_type", (*sliding)["rope_type"],
            "is not supported: sliding-window layers take unscaled frequencies only");
    if (sliding->contains("rope_theta") && !(*sliding)["rope_theta"].is_null())
      m.local_base = f.base(sw + ".rope_theta", (*sliding)["rope_theta"]);
  }
  // DeepSeek's YaRN moves mscale_all_dim's magnitude term into the softmax scale, squared.
  if (m.rotary_offset > 0 && m.freqs == Freqs::yarn && m.scaling.mscale_all_dim > 0) {
    const double t = 0.1 * m.scaling.mscale_all_dim * std::log(m.scaling.factor) + 1.0;
    m.softmax_scale_multiplier = m.scaling.factor <= 1 ? 1.0 : t * t;
  }
  return m;
}

}  // namespace

ModelRope model_from_hf_config(const std::string& json_text) {
  return describe(parse_config(json_text, "config.json"), "config.json");
}

ModelRope model_from_hf_config_file(const std::string& path) {
  const detail::FileRead file = detail::read_regular_file(path, kMaxConfigBytes);
  const std::string source = detail::clipped_path(path);
  if (file.status == detail::ReadStatus::missing)
    detail::invalid("config file '", source, "' does not exist");
  if (file.status != detail::ReadStatus::ok)
    detail::invalid("config file '", source, "': ", file.why);
  return describe(parse_config(file.bytes, source), source);
}

Spec spec_from_model(const ModelRope& model, DType dtype, Layout layout) {
  Spec s;
  s.layout = layout;
  s.dtype = dtype;
  // MLA's rotary part is the tail of each head: the call covers that slice alone (q viewed from
  // element rotary_offset with the head stride of the whole head; k_pe its own tensor).
  s.head_dim = model.rotary_offset > 0 ? model.rotary_dim : model.head_dim;
  s.rotary_dim = model.rotary_dim;
  s.style = model.style;
  s.positions = model.mrope ? Positions::mrope : Positions::ids;
  s.index_type = IndexType::i64;
  s.freqs = model.freqs;
  s.norm = model.norm;
  return s.canonical();
}

Args args_from_model(const ModelRope& model) {
  Args a;
  a.base = model.base;
  a.scaling = model.scaling;
  for (int i = 0; i < 3; ++i) a.mrope_section[i] = model.mrope_section[i];
  a.mrope_interleaved = model.mrope_interleaved;
  a.norm_eps = model.norm_eps;
  return a;
}

}  // namespace ropejit
