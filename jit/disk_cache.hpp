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

// Held while this process compiles and publishes one entry, so that other processes missing the
// same entry wait for it and then load what it published: one compile per entry per machine.
// An flock(2) lock, which the kernel drops when its holder dies (no stale lock after kill -9);
// the lock file is removed by the holder that finishes with it.
class EntryLock {
 public:
  EntryLock() = default;
  EntryLock(EntryLock&& other) noexcept;
  EntryLock& operator=(EntryLock&& other) noexcept;
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;
  ~EntryLock();
  bool held() const { return fd_ >= 0; }

 private:
  friend class DiskCache;
  void release();
  int fd_ = -1;
  std::string path_;
};

class DiskCache {
 public:
  // ROPEJIT_CACHE_DIR, else $XDG_CACHE_HOME/ropejit, else ~/.cache/ropejit. ROPEJIT_CACHE_DIR
  // set to "off" (or empty) disables the disk cache. A relative ROPEJIT_CACHE_DIR or
  // XDG_CACHE_HOME is ignored with one warning (ignore_relative_env), as the XDG Base Directory
  // specification asks of its variables.
  static std::string default_dir();

  // Creates `dir` (mode 0700) if needed; an unusable directory, or one not owned by this user
  // (or root) or writable by group or others, leaves the cache disabled (memory only) with one
  // warning. A trusted directory this process cannot write (an image's cache mounted read-only)
  // is read: its entries load, kernels it lacks are compiled into memory (one note says so).
  // Removes temp files that killed writers left there more than an hour ago.
  explicit DiskCache(std::string dir);

  // Whether new entries are written (false when off, read-only, or after a failed write).
  bool enabled() const { return enabled_.load(); }
  bool read_only() const { return read_only_; }
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
  // Waits until no other process holds the entry's lock, then holds it. Not held when the cache
  // writes nothing or the lock file cannot be made: the caller then compiles without waiting.
  EntryLock lock(const std::string& hash) const;
  size_t count_entries() const;

 private:
  std::string dir_;
  std::string disabled_reason_;  // set only by the constructor
  bool trusted_ = false;         // the directory passed the ownership check: entries are read
  bool read_only_ = false;       // trusted but not writable: entries are read, none written
  std::atomic<bool> enabled_{false};
};

}  // namespace ropejit::detail
