// Content-addressed disk cache of compiled kernels. Entries are versioned, checksummed and
// published atomically (temp file, fsync, rename); any defect reads as a miss.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ropejit::detail {

inline constexpr uint32_t kCacheFormatVersion = 1;

struct CacheEntry {
  std::string key;    // the kernel's key + variant, for diagnostics and foreign-entry checks
  std::string image;  // cubin or PTX
  bool is_ptx = false;
};

// Serialized entry bytes (header + key + image); exposed for the golden-file test.
std::string encode_entry(const CacheEntry& entry);
// Parses entry bytes into `out`; false with `why` set on any defect of the format. (Whether the
// image is loadable is DiskCache's question: image_problem() in jit/nvrtc.hpp.)
bool decode_entry(const std::string& bytes, CacheEntry* out, std::string* why);

// Stable hex hash of everything that determines a compiled image.
std::string content_hash(const std::string& source, const std::vector<std::string>& options,
                         const std::string& target, int nvrtc_major, int nvrtc_minor);

// Environment variables that name paths (ROPEJIT_CACHE_DIR, XDG_CACHE_HOME, ROPEJIT_TUNING_FILE)
// must be absolute: a relative one would name another place from each working directory. One
// warning per value names the variable, the value and `instead`, what is used in its place (the
// default path, or what having none means).
void ignore_relative_env(const char* name, const std::string& value, const std::string& instead);

class DiskCache {
 public:
  // ROPEJIT_CACHE_DIR, else $XDG_CACHE_HOME/ropejit, else ~/.cache/ropejit. ROPEJIT_CACHE_DIR
  // set to "off" (or empty) disables the disk cache. A relative ROPEJIT_CACHE_DIR or
  // XDG_CACHE_HOME is ignored with one warning (ignore_relative_env), as the XDG Base Directory
  // specification asks of its variables.
  static std::string default_dir();

  // Creates `dir` (mode 0700) if needed; an unusable directory, or one not owned by this user
  // or writable by group or others, leaves the cache disabled (memory only) with one warning.
  // Removes temp files that killed writers left there more than an hour ago.
  explicit DiskCache(std::string dir);

  bool enabled() const { return enabled_.load(); }
  const std::string& dir() const { return dir_; }
  std::string status() const;
  std::string path_for(const std::string& hash) const;

  // True and `out` filled when the entry for `hash` is a regular file owned by this user, not
  // writable by others, intact, holding a loadable-looking image, and made for `key`. Anything
  // else is a miss (with one warning when the file exists).
  bool load(const std::string& hash, const std::string& key, CacheEntry* out) const;
  // Publishes an entry; returns its path, or "" when the directory is not writable (the
  // cache then turns itself off with one warning) or the image is not loadable (never stored).
  std::string store(const std::string& hash, const CacheEntry& entry);
  size_t count_entries() const;

 private:
  std::string dir_;
  std::string disabled_reason_;  // set only by the constructor
  bool trusted_ = false;         // the directory passed the ownership check: entries are read
  std::atomic<bool> enabled_{false};
};

}  // namespace ropejit::detail
