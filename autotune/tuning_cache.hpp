// Tuning cache: measured launch configurations per (key, token bucket, head counts), persisted
// as versioned JSON with the fingerprint of the GPU they were measured on.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jit/launch_config.hpp"

namespace ropejit::autotune {

// Bump when the JSON layout changes; tests/golden/tuning_v1.json freezes version 1.
inline constexpr int kTuningSchemaVersion = 1;

// The environment a tuning was measured in.
struct Fingerprint {
  std::string gpu_name;
  int cc = 0;
  int sm_count = 0;
  int driver_version = 0;
  std::string nvrtc;    // e.g. "13.0"
  std::string library;  // e.g. "0.1.0"

  // Entries are used only on a matching GPU: same gpu_name, cc and sm_count (driver/nvrtc/library
  // differences are allowed but recorded).
  bool same_gpu(const Fingerprint& o) const;
  friend bool operator==(const Fingerprint& a, const Fingerprint& b);
};

struct TuningEntry {
  std::string key;                   // Spec::key() string; must parse with ropejit::parse_key
  int64_t bucket = 1;                // detail::token_bucket value, power of two, 1..2^31
  int32_t q_heads = 0, k_heads = 0;  // exact head counts (q >= 1, k >= 0), <= 65536
  detail::LaunchConfig config;
  double median_us = 0, gbps = 0, default_us = 0;  // finite, >= 0

  friend bool operator==(const TuningEntry& a, const TuningEntry& b);
};

// The decode block's projections (QKV, FFN gate/up): which path (fused kernel, or RMSNorm ->
// cuBLASLt GEMM -> epilogue key) is faster for a token bucket of one weight shape, as
// `ropejit tune --key qkvproj_...|ffnglu_... --hidden N` measured. Both paths' cost depends on
// the weight's shape only (hidden x columns), not on how the columns split into heads.
struct ProjTuningEntry {
  std::string key;      // QkvProjSpec::key() or FfnSpec::key()
  int64_t bucket = 1;   // tokens rounded up to a power of two, 1..2^31
  int64_t hidden = 0;   // a multiple of 8 in [8, 2^24]
  int64_t columns = 0;  // weight rows: (q + 2 kv heads) x head_dim, or 2 x intermediate; 1..2^31
  ProjPath path = ProjPath::fused;      // fused or unfused
  double fused_us = 0, unfused_us = 0;  // finite, >= 0 (0: not measured)
  // The fused kernel's fastest variant at this bucket (detail::ProjVariant::name(), "m1s8u2c4"),
  // which the fused path then launches; empty: the heuristic's (files before this field).
  std::string variant;

  friend bool operator==(const ProjTuningEntry& a, const ProjTuningEntry& b);
};

class TuningCache {
 public:
  // Reads `path` (a regular file of at most 16 MiB, JSON nested at most 16 deep; anything else,
  // such as a pipe or a link to /dev/zero, is refused without blocking or reading it). Missing
  // file: empty cache, no warning. Unreadable/corrupt JSON or wrong
  // schema version: empty cache + one warning (warn_once) naming the file and the reason.
  // File for another GPU (fingerprint.same_gpu false): empty cache + warning. Each entry is
  // validated strictly: unknown fields, missing fields, wrong types, or out-of-range values
  // make that entry ignored with a warning naming the entry index and field; other entries
  // still load. The result's fingerprint is the file's when its entries were accepted (it
  // records where they were measured), else `here`.
  static TuningCache load(const std::string& path, const Fingerprint& here);

  // Parses tuning-file text as load() does, without warnings on stderr: bad entries are listed in
  // warnings(); a text that is no usable tuning file (or one for another GPU) throws
  // Error(invalid_argument). For tests and the fuzzer.
  static TuningCache parse(const std::string& text, const Fingerprint& here);

  // Reads `path` for the GPU it was tuned on, whatever this machine has (preparing caches for
  // another machine). Throws Error(invalid_argument) naming the path when the file is missing,
  // unreadable or not a tuning file; bad entries are skipped with warnings, as load() does.
  static TuningCache load_as_tuned(const std::string& path);

  const Fingerprint& fingerprint() const { return fingerprint_; }
  void set_fingerprint(const Fingerprint& f) { fingerprint_ = f; }

  // Inserts or replaces the entry with the same (key, bucket, q_heads, k_heads).
  void put(const TuningEntry& e);
  const TuningEntry* find(const std::string& key, int64_t bucket, int32_t q_heads,
                          int32_t k_heads) const;
  // Deterministic order: sorted by key, bucket, q_heads, k_heads.
  const std::vector<TuningEntry>& entries() const { return entries_; }

  // Projection entries (the file's optional "projections" array), sorted by key, bucket,
  // hidden, columns; put() replaces the entry of the same slot.
  void put(const ProjTuningEntry& e);
  const ProjTuningEntry* find_proj(const std::string& key, int64_t bucket, int64_t hidden,
                                   int64_t columns) const;
  const std::vector<ProjTuningEntry>& proj_entries() const { return proj_entries_; }
  // What load() ignored and why, in the order found (each also reported once on stderr).
  const std::vector<std::string>& warnings() const { return warnings_; }

  nlohmann::json to_json() const;

  // Merges with the entries already in `path` (entries of this cache win; the file's entries
  // for another GPU are dropped), then writes atomically: temp file in the same directory,
  // fsync, rename. Writes fingerprint(), so a tuner stamps its own with set_fingerprint()
  // first. Creates the parent directory (0700) if needed. Throws ropejit::Error
  // (ErrorCode::invalid_argument) naming the path when it cannot write. Two processes saving
  // at once never leave a torn file, but the later rename drops what only the other added.
  void save(const std::string& path) const;

 private:
  Fingerprint fingerprint_;
  std::vector<TuningEntry> entries_;
  std::vector<ProjTuningEntry> proj_entries_;
  std::vector<std::string> warnings_;
};

// Empty when `e` may be used (the checks load() applies to each entry), else the offending
// field and why: the tuning file is data only and can only select legal launch configurations.
std::string invalid_entry_reason(const TuningEntry& e);
std::string invalid_entry_reason(const ProjTuningEntry& e);

// Default tuning-file path: $ROPEJIT_TUNING_FILE if set ("" or "off": no tuning file), else
// <dir>/tuning.json where <dir> is detail::DiskCache::default_dir(); "" when neither is
// available. A relative ROPEJIT_TUNING_FILE is ignored with one warning (XDG's rule for paths
// from the environment, detail::ignore_relative_env).
std::string default_tuning_path();

}  // namespace ropejit::autotune
