// Tuning cache: strict JSON (schema 1) reading, validation against the launch rules, merging
// and atomic publication of the tuning file.
#include "autotune/tuning_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "jit/decode/proj.hpp"
#include "jit/disk_cache.hpp"
#include "jit/errors.hpp"
#include "jit/family.hpp"
#include "jit/files.hpp"

namespace ropejit::autotune {
namespace {

using detail::concat;
using nlohmann::json;

constexpr int64_t kMaxBucket = int64_t(1) << 31;
constexpr size_t kMaxTuningFileBytes = size_t(16) << 20;  // ~40,000 entries
constexpr size_t kMaxJsonDepth = 16;
constexpr int32_t kMaxHeads = 65536;

const char* const kTopFields[] = {"schema", "fingerprint", "entries"};
// Top-level arrays added later (absent in older files, written only when not empty).
const char* const kOptionalTopFields[] = {"projections"};
const char* const kProjEntryFields[] = {"key",  "bucket",   "hidden",    "columns",
                                        "path", "fused_us", "unfused_us"};
const char* const kOptionalProjEntryFields[] = {"variant"};  // written when not empty
const char* const kFingerprintFields[] = {"gpu", "cc", "sm_count", "driver", "nvrtc", "library"};
const char* const kEntryFields[] = {"key",    "bucket",    "q_heads", "k_heads",
                                    "config", "median_us", "gbps",    "default_us"};
const char* const kConfigFields[] = {"vec",  "heads_per_thread", "max_threads",
                                     "rows", "tokens_per_block", "blocks_per_sm"};
// Fields added later: absent in older files, which keep loading, and written only when they
// differ from the default, so that files without them are written as before.
const char* const kOptionalConfigFields[] = {"head_groups", "ring"};

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

auto slot_of(const TuningEntry& e) { return std::tie(e.key, e.bucket, e.q_heads, e.k_heads); }
auto slot_of(const ProjTuningEntry& e) { return std::tie(e.key, e.bucket, e.hidden, e.columns); }

const char* type_of(const json& v) {
  if (v.is_number_integer()) return "integer";
  return v.type_name();
}

// Strict access to one JSON object: every field listed must be present, nothing else may be
// (except the optional ones named). The first problem is kept in `why` and names the field
// with its dotted path.
class Fields {
 public:
  template <size_t N>
  Fields(const json& obj, std::string prefix, const char* const (&names)[N], std::string* why)
      : Fields(obj, std::move(prefix), names, N, nullptr, 0, why) {}
  template <size_t N, size_t M>
  Fields(const json& obj, std::string prefix, const char* const (&names)[N],
         const char* const (&optional)[M], std::string* why)
      : Fields(obj, std::move(prefix), names, N, optional, M, why) {}

  Fields(const json& obj, std::string prefix, const char* const* names, size_t n,
         const char* const* optional, size_t m, std::string* why)
      : obj_(obj), prefix_(std::move(prefix)), why_(why) {
    if (!obj.is_object()) {
      fail(concat(prefix_.empty() ? "entry" : prefix_.substr(0, prefix_.size() - 1),
                  " must be an object, got ", type_of(obj)));
      return;
    }
    for (const auto& item : obj.items()) {
      auto named = [&](const char* x) { return item.key() == x; };
      if (std::find_if(names, names + n, named) == names + n &&
          std::find_if(optional, optional + m, named) == optional + m) {
        fail(concat("unknown field '", prefix_, detail::clipped(item.key()), "'"));
        return;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!obj.contains(names[i])) {
        fail(concat("missing field '", prefix_, names[i], "'"));
        return;
      }
    }
  }

  bool ok() const { return why_->empty(); }

  void integer(const char* name, int64_t lo, int64_t hi, int64_t* out) {
    if (!ok()) return;
    const json& v = obj_.at(name);
    if (!v.is_number_integer()) return wrong_type(name, "an integer", v);
    // Unsigned values above INT64_MAX would wrap when read as int64_t.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
      return fail(
          concat("field '", prefix_, name, "' (", detail::clipped(v.dump()), ") is out of range"));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      return fail(concat("field '", prefix_, name, "' (", x, ") is out of range"));
    *out = x;
  }

  // An optional field: `out` keeps its value when the field is absent.
  void optional_int32(const char* name, int32_t* out) {
    if (ok() && obj_.contains(name)) int32(name, out);
  }

  void int32(const char* name, int32_t* out) {
    int64_t x = 0;
    integer(name, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), &x);
    if (ok()) *out = int32_t(x);
  }

  void number(const char* name, double* out) {
    if (!ok()) return;
    const json& v = obj_.at(name);
    if (!v.is_number()) return wrong_type(name, "a number", v);
    *out = v.get<double>();
  }

  void string(const char* name, std::string* out) {
    if (!ok()) return;
    const json& v = obj_.at(name);
    if (!v.is_string()) return wrong_type(name, "a string", v);
    *out = v.get<std::string>();
  }

 private:
  void fail(std::string why) {
    if (ok()) *why_ = std::move(why);
  }
  void wrong_type(const char* name, const char* want, const json& v) {
    fail(concat("field '", prefix_, name, "' must be ", want, ", got ", type_of(v)));
  }

  const json& obj_;
  std::string prefix_;
  std::string* why_;
};

bool read_fingerprint(const json& j, Fingerprint* f, std::string* why) {
  Fields fp(j, "fingerprint.", kFingerprintFields, why);
  fp.string("gpu", &f->gpu_name);
  fp.int32("cc", &f->cc);
  fp.int32("sm_count", &f->sm_count);
  fp.int32("driver", &f->driver_version);
  fp.string("nvrtc", &f->nvrtc);
  fp.string("library", &f->library);
  return fp.ok();
}

bool read_entry(const json& j, TuningEntry* e, std::string* why) {
  Fields entry(j, "", kEntryFields, why);
  entry.string("key", &e->key);
  entry.integer("bucket", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                &e->bucket);
  entry.int32("q_heads", &e->q_heads);
  entry.int32("k_heads", &e->k_heads);
  entry.number("median_us", &e->median_us);
  entry.number("gbps", &e->gbps);
  entry.number("default_us", &e->default_us);
  if (!entry.ok()) return false;
  Fields config(j.at("config"), "config.", kConfigFields, kOptionalConfigFields, why);
  detail::LaunchConfig& c = e->config;
  config.int32("vec", &c.kernel.vec);
  config.int32("heads_per_thread", &c.kernel.heads_per_thread);
  config.int32("max_threads", &c.kernel.max_threads);
  config.int32("rows", &c.rows);
  config.int32("tokens_per_block", &c.tokens_per_block);
  config.int32("blocks_per_sm", &c.blocks_per_sm);
  config.optional_int32("head_groups", &c.head_groups);
  config.optional_int32("ring", &c.kernel.ring);
  c.kernel.grid_stride = c.blocks_per_sm > 0;  // implied: only persistent grids loop
  return config.ok() && (*why = invalid_entry_reason(*e)).empty();
}

bool read_proj_entry(const json& j, ProjTuningEntry* e, std::string* why) {
  Fields entry(j, "", kProjEntryFields, kOptionalProjEntryFields, why);
  entry.string("key", &e->key);
  entry.integer("bucket", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                &e->bucket);
  entry.integer("hidden", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                &e->hidden);
  entry.integer("columns", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                &e->columns);
  std::string path;
  entry.string("path", &path);
  entry.number("fused_us", &e->fused_us);
  entry.number("unfused_us", &e->unfused_us);
  if (entry.ok() && j.contains("variant")) entry.string("variant", &e->variant);
  if (!entry.ok()) return false;
  if (path != "fused" && path != "unfused") {
    *why = concat("field 'path' (", detail::clipped(path), ") must be \"fused\" or \"unfused\"");
    return false;
  }
  e->path = path == "fused" ? ProjPath::fused : ProjPath::unfused;
  return (*why = invalid_entry_reason(*e)).empty();
}

std::string describe(const Fingerprint& f) {
  return concat(f.gpu_name.empty() ? "an unnamed GPU" : detail::clipped(f.gpu_name), " (sm_", f.cc,
                ", ", f.sm_count, " SMs)");
}

enum class FileState { missing, ok, rejected, other_gpu };

struct FileContents {
  FileState state = FileState::missing;
  std::string why;  // rejected / other_gpu
  Fingerprint fingerprint;
  std::vector<TuningEntry> entries;
  std::vector<ProjTuningEntry> proj_entries;
  std::vector<std::pair<size_t, std::string>> entry_problems;  // index, why
  std::vector<std::pair<size_t, std::string>> proj_problems;   // index, why
};

// Where `here` is null, the file's own fingerprint is taken (no GPU check): what
// `ropejit compile --from-tuning` needs to prepare caches for another machine's GPU.
FileContents parse_tuning_text(const std::string& text, const Fingerprint* here);

FileContents read_tuning_file(const std::string& path, const Fingerprint* here) {
  FileContents out;
  if (path.empty()) return out;
  const detail::FileRead file = detail::read_regular_file(path, kMaxTuningFileBytes);
  if (file.status == detail::ReadStatus::missing) return out;  // never tuned: no warning
  if (file.status != detail::ReadStatus::ok) {
    out.state = FileState::rejected;
    out.why = file.why;
    return out;
  }
  return parse_tuning_text(file.bytes, here);
}

FileContents parse_tuning_text(const std::string& text, const Fingerprint* here) {
  FileContents out;
  out.state = FileState::rejected;
  if (const size_t depth = detail::json_nesting_depth(text); depth > kMaxJsonDepth) {
    out.why = concat("JSON nested ", depth, " levels deep; a tuning file needs ", 4, ", at most ",
                     kMaxJsonDepth, " are read");
    return out;
  }

  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    const std::string what = e.what();
    const size_t bracket = what.find("] ");  // drop nlohmann's "[json.exception...] " tag
    out.why =
        concat("invalid JSON: ",
               detail::clipped_middle(what.substr(bracket == std::string::npos ? 0 : bracket + 2)));
    return out;
  }
  if (!doc.is_object()) {
    out.why = concat("expected a JSON object, got ", type_of(doc));
    return out;
  }
  // The schema is checked before anything else so that a newer file reports its version, not
  // the fields this library does not know.
  if (!doc.contains("schema")) {
    out.why = "no schema version";
    return out;
  }
  const json& schema = doc.at("schema");
  if (!schema.is_number_integer() || schema.get<int64_t>() != kTuningSchemaVersion) {
    out.why = concat("schema version ", detail::clipped(schema.dump()), " (this library reads ",
                     kTuningSchemaVersion, ")");
    return out;
  }
  Fields top(doc, "", kTopFields, kOptionalTopFields, &out.why);
  if (!top.ok() || !read_fingerprint(doc.at("fingerprint"), &out.fingerprint, &out.why)) return out;
  if (!doc.at("entries").is_array()) {
    out.why = concat("field 'entries' must be an array, got ", type_of(doc.at("entries")));
    return out;
  }
  if (doc.contains("projections") && !doc.at("projections").is_array()) {
    out.why = concat("field 'projections' must be an array, got ", type_of(doc.at("projections")));
    return out;
  }
  if (here && !out.fingerprint.same_gpu(*here)) {
    out.state = FileState::other_gpu;
    out.why = concat("tuned on ", describe(out.fingerprint), ", this GPU is ", describe(*here));
    return out;
  }
  out.state = FileState::ok;
  const json& entries = doc.at("entries");
  for (size_t i = 0; i < entries.size(); ++i) {
    TuningEntry e;
    std::string why;
    if (read_entry(entries[i], &e, &why))
      out.entries.push_back(std::move(e));
    else
      out.entry_problems.emplace_back(i, why);
  }
  if (doc.contains("projections")) {
    const json& projections = doc.at("projections");
    for (size_t i = 0; i < projections.size(); ++i) {
      ProjTuningEntry e;
      std::string why;
      if (read_proj_entry(projections[i], &e, &why))
        out.proj_entries.push_back(std::move(e));
      else
        out.proj_problems.emplace_back(i, why);
    }
  }
  return out;
}

}  // namespace

bool Fingerprint::same_gpu(const Fingerprint& o) const {
  return gpu_name == o.gpu_name && cc == o.cc && sm_count == o.sm_count;
}

bool operator==(const Fingerprint& a, const Fingerprint& b) {
  return a.same_gpu(b) && a.driver_version == b.driver_version && a.nvrtc == b.nvrtc &&
         a.library == b.library;
}

bool operator==(const TuningEntry& a, const TuningEntry& b) {
  return slot_of(a) == slot_of(b) && a.config == b.config && a.median_us == b.median_us &&
         a.gbps == b.gbps && a.default_us == b.default_us;
}

std::string invalid_entry_reason(const TuningEntry& e) {
  Spec spec;
  try {
    spec = parse_key(e.key).canonical();
  } catch (const Error& err) {
    const std::string what = err.what();
    const std::string tag = "ropejit: ";  // the warning that quotes this already says ropejit
    return concat("key: ", what.compare(0, tag.size(), tag) == 0 ? what.substr(tag.size()) : what);
  }
  if (!is_pow2(e.bucket) || e.bucket > kMaxBucket)
    return concat("bucket (", e.bucket, ") must be a power of two in 1..2^31");
  if (e.q_heads < 1 || e.q_heads > kMaxHeads)
    return concat("q_heads (", e.q_heads, ") must be in 1..", kMaxHeads);
  if (e.k_heads < 0 || e.k_heads > kMaxHeads)
    return concat("k_heads (", e.k_heads, ") must be in 0..", kMaxHeads);
  // The engine's own rules (jit/launch_config.hpp), for the call this entry stands for.
  detail::CallShape shape;
  shape.tokens = e.bucket;
  shape.q_heads = e.q_heads;
  shape.k_heads = e.k_heads;
  shape.v_heads = spec.cache != KvCache::none ? e.k_heads : 0;  // tuned with v next to k
  shape.align_bytes = 16;
  detail::DeviceInfo device;
  device.max_threads_per_sm = 2048;
  // Any GPU's shared-memory grant: each call checks its own GPU's before using the entry.
  device.max_shared_per_block = int(detail::kMaxOptinSharedBytes);
  detail::LaunchConfig config = e.config;
  config.kernel.narrow = false;  // not part of an entry: each call decides
  if (const std::string why = detail::illegal_reason(spec, shape, config, device); !why.empty()) {
    // Reasons about one field start with its name: "config.vec (3) ...".
    for (const char* field : kConfigFields)
      if (why.compare(0, std::strlen(field) + 2, concat(field, " (")) == 0)
        return concat("config.", why);
    for (const char* field : kOptionalConfigFields)
      if (why.compare(0, std::strlen(field) + 2, concat(field, " (")) == 0)
        return concat("config.", why);
    return concat("config: ", why);
  }
  const std::pair<const char*, double> times[] = {
      {"median_us", e.median_us}, {"gbps", e.gbps}, {"default_us", e.default_us}};
  for (const auto& [name, v] : times)
    if (!std::isfinite(v) || v < 0) return concat(name, " (", v, ") must be finite and >= 0");
  return {};
}

bool operator==(const ProjTuningEntry& a, const ProjTuningEntry& b) {
  return slot_of(a) == slot_of(b) && a.path == b.path && a.fused_us == b.fused_us &&
         a.unfused_us == b.unfused_us && a.variant == b.variant;
}

std::string invalid_entry_reason(const ProjTuningEntry& e) {
  bool fp8_weights = false;
  try {
    if (detail::family_of(e.key) == detail::Family::ffn_gate_up)
      fp8_weights = parse_ffn_key(e.key).weights == Weights::e4m3;
    else
      fp8_weights = parse_qkv_proj_key(e.key).weights == Weights::e4m3;
  } catch (const Error& err) {
    const std::string what = err.what();
    const std::string tag = "ropejit: ";
    return concat("key: ", what.compare(0, tag.size(), tag) == 0 ? what.substr(tag.size()) : what);
  }
  if (!is_pow2(e.bucket) || e.bucket > kMaxBucket)
    return concat("bucket (", e.bucket, ") must be a power of two in 1..2^31");
  if (e.hidden < 8 || e.hidden % 8 != 0 || e.hidden > (int64_t(1) << 24))
    return concat("hidden (", e.hidden, ") must be a multiple of 8 in [8, 2^24]");
  if (e.columns < 1 || e.columns > kMaxBucket)
    return concat("columns (", e.columns, ") must be in 1..2^31");
  if (e.path != ProjPath::fused && e.path != ProjPath::unfused)
    return concat("path (", int(e.path), ") must be fused or unfused");
  if (!e.variant.empty()) {
    detail::ProjVariant v;
    if (!detail::parse_proj_variant(e.variant, &v))
      return concat("variant (", detail::clipped(e.variant),
                    ") is not a projection variant name such as m1s8u2 or m2s4u1c4");
    if (const std::string why = detail::proj_variant_problem(v, fp8_weights); !why.empty())
      return concat("variant (", e.variant, "): ", why);
  }
  const std::pair<const char*, double> times[] = {{"fused_us", e.fused_us},
                                                  {"unfused_us", e.unfused_us}};
  for (const auto& [name, v] : times)
    if (!std::isfinite(v) || v < 0) return concat(name, " (", v, ") must be finite and >= 0");
  return {};
}

void TuningCache::put(const ProjTuningEntry& e) {
  if (const std::string why = invalid_entry_reason(e); !why.empty())
    detail::invalid("projection tuning entry for ", detail::clipped(e.key, 128),
                    " is invalid: ", why);
  const auto it = std::lower_bound(
      proj_entries_.begin(), proj_entries_.end(), e,
      [](const ProjTuningEntry& a, const ProjTuningEntry& b) { return slot_of(a) < slot_of(b); });
  if (it != proj_entries_.end() && slot_of(*it) == slot_of(e))
    *it = e;
  else
    proj_entries_.insert(it, e);
}

const ProjTuningEntry* TuningCache::find_proj(const std::string& key, int64_t bucket,
                                              int64_t hidden, int64_t columns) const {
  const auto slot = std::tie(key, bucket, hidden, columns);
  const auto it = std::lower_bound(
      proj_entries_.begin(), proj_entries_.end(), slot,
      [](const ProjTuningEntry& a, const decltype(slot)& b) { return slot_of(a) < b; });
  return it != proj_entries_.end() && slot_of(*it) == slot ? &*it : nullptr;
}

TuningCache TuningCache::load(const std::string& path, const Fingerprint& here) {
  TuningCache cache;
  cache.fingerprint_ = here;
  FileContents file = read_tuning_file(path, &here);
  auto warn = [&](const std::string& message) {
    cache.warnings_.push_back(message);
    detail::warn_once("tuning:" + message, message);
  };
  switch (file.state) {
    case FileState::missing:
      break;
    case FileState::rejected:
    case FileState::other_gpu:
      warn(concat("ignoring tuning file ", detail::clipped_path(path), " (", file.why, ")"));
      break;
    case FileState::ok:
      cache.fingerprint_ = file.fingerprint;
      for (const auto& [index, why] : file.entry_problems)
        warn(concat("ignoring entry ", index, " of tuning file ", detail::clipped_path(path), " (",
                    why, ")"));
      for (const auto& [index, why] : file.proj_problems)
        warn(concat("ignoring projection entry ", index, " of tuning file ",
                    detail::clipped_path(path), " (", why, ")"));
      for (const TuningEntry& e : file.entries) cache.put(e);
      for (const ProjTuningEntry& e : file.proj_entries) cache.put(e);
      break;
  }
  return cache;
}

TuningCache TuningCache::parse(const std::string& text, const Fingerprint& here) {
  const FileContents file = parse_tuning_text(text, &here);
  if (file.state != FileState::ok) detail::invalid("not a usable tuning file: ", file.why);
  TuningCache cache;
  cache.fingerprint_ = file.fingerprint;
  for (const auto& [index, why] : file.entry_problems)
    cache.warnings_.push_back(concat("ignoring entry ", index, " (", why, ")"));
  for (const auto& [index, why] : file.proj_problems)
    cache.warnings_.push_back(concat("ignoring projection entry ", index, " (", why, ")"));
  for (const TuningEntry& e : file.entries) cache.put(e);
  for (const ProjTuningEntry& e : file.proj_entries) cache.put(e);
  return cache;
}

TuningCache TuningCache::load_as_tuned(const std::string& path) {
  const FileContents file = read_tuning_file(path, nullptr);
  if (file.state == FileState::missing)
    detail::invalid("tuning file ", detail::clipped_path(path), " does not exist");
  if (file.state != FileState::ok)
    detail::invalid("tuning file ", detail::clipped_path(path), " cannot be used: ", file.why);
  TuningCache cache;
  cache.fingerprint_ = file.fingerprint;
  for (const auto& [index, why] : file.entry_problems) {
    const std::string message = concat("ignoring entry ", index, " of tuning file ",
                                       detail::clipped_path(path), " (", why, ")");
    cache.warnings_.push_back(message);
    detail::warn_once("tuning:" + message, message);
  }
  for (const auto& [index, why] : file.proj_problems) {
    const std::string message = concat("ignoring projection entry ", index, " of tuning file ",
                                       detail::clipped_path(path), " (", why, ")");
    cache.warnings_.push_back(message);
    detail::warn_once("tuning:" + message, message);
  }
  for (const TuningEntry& e : file.entries) cache.put(e);
  for (const ProjTuningEntry& e : file.proj_entries) cache.put(e);
  return cache;
}

void TuningCache::put(const TuningEntry& e) {
  // Checked here too, so that save() never writes what load() would reject.
  if (const std::string why = invalid_entry_reason(e); !why.empty())
    detail::invalid("tuning entry for ", detail::clipped(e.key, 128), " is invalid: ", why);
  const auto it = std::lower_bound(
      entries_.begin(), entries_.end(), e,
      [](const TuningEntry& a, const TuningEntry& b) { return slot_of(a) < slot_of(b); });
  if (it != entries_.end() && slot_of(*it) == slot_of(e))
    *it = e;
  else
    entries_.insert(it, e);
}

const TuningEntry* TuningCache::find(const std::string& key, int64_t bucket, int32_t q_heads,
                                     int32_t k_heads) const {
  const auto slot = std::tie(key, bucket, q_heads, k_heads);
  const auto it = std::lower_bound(
      entries_.begin(), entries_.end(), slot,
      [](const TuningEntry& a, const decltype(slot)& b) { return slot_of(a) < b; });
  return it != entries_.end() && slot_of(*it) == slot ? &*it : nullptr;
}

json TuningCache::to_json() const {
  json fp = json::object();
  fp["gpu"] = fingerprint_.gpu_name;
  fp["cc"] = fingerprint_.cc;
  fp["sm_count"] = fingerprint_.sm_count;
  fp["driver"] = fingerprint_.driver_version;
  fp["nvrtc"] = fingerprint_.nvrtc;
  fp["library"] = fingerprint_.library;
  json entries = json::array();
  for (const TuningEntry& e : entries_) {
    json config = json::object();
    config["vec"] = e.config.kernel.vec;
    config["heads_per_thread"] = e.config.kernel.heads_per_thread;
    config["max_threads"] = e.config.kernel.max_threads;
    config["rows"] = e.config.rows;
    config["tokens_per_block"] = e.config.tokens_per_block;
    config["blocks_per_sm"] = e.config.blocks_per_sm;
    if (e.config.head_groups != 1) config["head_groups"] = e.config.head_groups;
    if (e.config.kernel.ring != 0) config["ring"] = e.config.kernel.ring;
    json j = json::object();
    j["key"] = e.key;
    j["bucket"] = e.bucket;
    j["q_heads"] = e.q_heads;
    j["k_heads"] = e.k_heads;
    j["config"] = std::move(config);
    j["median_us"] = e.median_us;
    j["gbps"] = e.gbps;
    j["default_us"] = e.default_us;
    entries.push_back(std::move(j));
  }
  json doc = json::object();
  doc["schema"] = kTuningSchemaVersion;
  doc["fingerprint"] = std::move(fp);
  doc["entries"] = std::move(entries);
  if (!proj_entries_.empty()) {
    json projections = json::array();
    for (const ProjTuningEntry& e : proj_entries_) {
      json j = json::object();
      j["key"] = e.key;
      j["bucket"] = e.bucket;
      j["hidden"] = e.hidden;
      j["columns"] = e.columns;
      j["path"] = e.path == ProjPath::fused ? "fused" : "unfused";
      j["fused_us"] = e.fused_us;
      j["unfused_us"] = e.unfused_us;
      if (!e.variant.empty()) j["variant"] = e.variant;
      projections.push_back(std::move(j));
    }
    doc["projections"] = std::move(projections);
  }
  return doc;
}

void TuningCache::save(const std::string& path) const {
  if (path.empty()) detail::invalid("cannot write tuning file: the path is empty");
  TuningCache merged = *this;
  const FileContents old = read_tuning_file(path, &fingerprint_);
  if (old.state == FileState::ok) {
    for (const TuningEntry& e : old.entries)
      if (!merged.find(e.key, e.bucket, e.q_heads, e.k_heads)) merged.put(e);
    for (const ProjTuningEntry& e : old.proj_entries)
      if (!merged.find_proj(e.key, e.bucket, e.hidden, e.columns)) merged.put(e);
  } else if (old.state == FileState::rejected) {
    const std::string message =
        concat("replacing unusable tuning file ", detail::clipped_path(path), " (", old.why, ")");
    detail::warn_once("tuning:" + message, message);
  }

  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::string why;
  // Earlier saves killed mid-write left their temp files here; only this file's are touched.
  detail::remove_stale_temp_files(dir, detail::kStaleTempSeconds, path.substr(slash + 1));
  if (!detail::make_private_dirs(dir, &why) ||
      !detail::write_file_atomically(path, merged.to_json().dump(2) + "\n", &why,
                                     detail::Links::follow))
    detail::invalid("cannot write tuning file ", detail::clipped_path(path), ": ",
                    detail::clipped_middle(why, 160));
}

std::string default_tuning_path() {
  auto in_cache_dir = [] {
    const std::string dir = detail::DiskCache::default_dir();
    return dir.empty() ? std::string() : dir + "/tuning.json";
  };
  if (const char* f = std::getenv("ROPEJIT_TUNING_FILE")) {
    const std::string s = f;
    if (s.empty() || s == "off") return {};
    if (s[0] == '/') return s;
    const std::string instead = in_cache_dir();
    detail::ignore_relative_env("ROPEJIT_TUNING_FILE", s,
                                instead.empty() ? "no tuning file (no cache directory)" : instead);
    return instead;
  }
  return in_cache_dir();
}

}  // namespace ropejit::autotune
