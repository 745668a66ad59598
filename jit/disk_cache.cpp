// Disk cache: directory policy, entry format v1, atomic publication.
//
// Entry format v1 (little-endian):
//   0  char[8]  magic "RJKERNEL"
//   8  u32      format version (kCacheFormatVersion)
//   12 u32      flags (bit 0: image is PTX)
//   16 u32      key length K
//   20 u32      reserved, 0
//   24 u64      image length N
//   32 u64      XXH3-64 of the K key bytes followed by the N image bytes
//   40 key, then image
#include "jit/disk_cache.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/files.hpp"
#include "jit/nvrtc.hpp"

namespace ropejit::detail {
namespace {

constexpr char kMagic[8] = {'R', 'J', 'K', 'E', 'R', 'N', 'E', 'L'};
constexpr size_t kHeaderBytes = 40;
constexpr const char* kSuffix = ".rjk";
constexpr size_t kMaxEntryBytes = size_t(64) << 20;  // cubins of RoPE kernels are ~10-100 KB

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

uint64_t checksum(const std::string& key, const char* image, size_t n) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, key.data(), key.size());
  XXH3_64bits_update(&state, image, n);
  return XXH3_64bits_digest(&state);
}

}  // namespace

std::string encode_entry(const CacheEntry& e) {
  std::string s(kMagic, sizeof kMagic);
  put_u32(s, kCacheFormatVersion);
  put_u32(s, e.is_ptx ? 1u : 0u);
  put_u32(s, uint32_t(e.key.size()));
  put_u32(s, 0);
  put_u64(s, e.image.size());
  put_u64(s, checksum(e.key, e.image.data(), e.image.size()));
  s += e.key;
  s += e.image;
  return s;
}

bool decode_entry(const std::string& b, CacheEntry* out, std::string* why) {
  if (b.size() < kHeaderBytes || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) {
    *why = "not a ropejit cache entry";
    return false;
  }
  const uint64_t version = get_le(b, 8, 4), flags = get_le(b, 12, 4);
  const uint64_t key_len = get_le(b, 16, 4), image_len = get_le(b, 24, 8);
  if (version != kCacheFormatVersion) {
    *why = concat("format version ", version, " (this library reads ", kCacheFormatVersion, ")");
    return false;
  }
  if (flags > 1 || get_le(b, 20, 4) != 0 || key_len > 4096 || b.size() < kHeaderBytes + key_len ||
      image_len != b.size() - kHeaderBytes - key_len) {
    *why = "truncated or inconsistent header";
    return false;
  }
  const std::string key = b.substr(kHeaderBytes, key_len);
  if (checksum(key, b.data() + kHeaderBytes + key_len, image_len) != get_le(b, 32, 8)) {
    *why = "checksum mismatch";
    return false;
  }
  out->is_ptx = flags == 1;
  out->key = key;
  out->image = b.substr(kHeaderBytes + key_len);
  return true;
}

std::string content_hash(const std::string& source, const std::vector<std::string>& options,
                         const std::string& target, int nvrtc_major, int nvrtc_minor) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  auto feed = [&](const std::string& s) {
    const uint64_t n = s.size();
    XXH3_128bits_update(&state, &n, sizeof n);  // length-prefixed: no ambiguous joins
    XXH3_128bits_update(&state, s.data(), s.size());
  };
  feed(concat("ropejit-entry-v", kCacheFormatVersion, " nvrtc ", nvrtc_major, ".", nvrtc_minor));
  feed(target);
  for (const std::string& o : options) feed(o);
  for (const EmbeddedFile& f : embedded_headers()) {
    feed(f.name);
    feed(f.text);
  }
  feed(source);
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

void ignore_relative_env(const char* name, const std::string& value, const std::string& instead) {
  warn_once(concat("relative-env:", name, "=", value),
            concat(name, " ('", clipped_path(value),
                   "') is a relative path and is ignored: it would name another place from each "
                   "working directory; using ",
                   clipped_path(instead), " instead"));
}

namespace {

constexpr const char* kNoCacheDir = "no disk cache (compiled kernels cached in memory only)";

// $XDG_CACHE_HOME/ropejit, else ~/.cache/ropejit, else "" (no disk cache).
std::string user_cache_dir() {
  std::string home_dir;
  if (const char* h = std::getenv("HOME"); h && h[0]) home_dir = std::string(h) + "/.cache/ropejit";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0]) {
    if (x[0] == '/') return std::string(x) + "/ropejit";
    ignore_relative_env("XDG_CACHE_HOME", x, home_dir.empty() ? kNoCacheDir : home_dir);
  }
  return home_dir;
}

}  // namespace

std::string DiskCache::default_dir() {
  if (const char* d = std::getenv("ROPEJIT_CACHE_DIR")) {
    const std::string s = d;
    if (s.empty() || s == "off") return {};
    if (s[0] == '/') return s;
    const std::string instead = user_cache_dir();
    ignore_relative_env("ROPEJIT_CACHE_DIR", s, instead.empty() ? kNoCacheDir : instead);
    return instead;
  }
  return user_cache_dir();
}

DiskCache::DiskCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) {
    disabled_reason_ = "disabled (ROPEJIT_CACHE_DIR=off or no home directory)";
    return;
  }
  std::string why;
  struct stat st {};
  // Messages quote the directory clipped: it comes from the environment and may be any length.
  if (!make_private_dirs(dir_, &why)) {
    disabled_reason_ = clipped_middle(why, 160);
  } else if (::stat(dir_.c_str(), &st) != 0) {
    disabled_reason_ = concat("cannot stat ", clipped_path(dir_), ": ", std::strerror(errno));
  } else if (const std::string distrust = untrusted_reason(st.st_uid, st.st_mode);
             !distrust.empty()) {
    // Another user who can write here could plant a cubin this process would run.
    disabled_reason_ = concat(clipped_path(dir_), " is ", distrust, "; refusing to use it");
  } else if (::access(dir_.c_str(), R_OK | X_OK) != 0) {
    disabled_reason_ = concat(clipped_path(dir_), " is not readable");
  } else if (::access(dir_.c_str(), W_OK) != 0) {
    trusted_ = true;
    read_only_ = true;
    disabled_reason_ = "read-only: its entries are read, kernels it lacks are compiled into memory";
    warn_once("cache-dir", concat("kernel cache directory ", clipped_path(dir_),
                                  " is read-only: its entries are read, kernels it lacks are "
                                  "compiled into memory only"));
    return;
  } else {
    trusted_ = true;
    enabled_ = true;
    remove_stale_temp_files(dir_, kStaleTempSeconds);
    return;
  }
  warn_once("cache-dir", concat("kernel cache directory unusable (", disabled_reason_,
                                "); caching compiled kernels in memory only"));
}

std::string DiskCache::status() const {
  if (enabled()) return "ok";
  return disabled_reason_.empty() ? "disabled after a failed write" : disabled_reason_;
}

std::string DiskCache::path_for(const std::string& hash) const {
  return dir_ + "/" + hash + kSuffix;
}

bool DiskCache::load(const std::string& hash, const std::string& key, CacheEntry* out) const {
  if (!trusted_) return false;
  const FileRead file = read_regular_file(path_for(hash), kMaxEntryBytes, Links::refuse);
  if (file.status == ReadStatus::missing) return false;  // a plain miss
  std::string why = file.why;
  CacheEntry e;
  bool ok = file.status == ReadStatus::ok;
  if (ok) why = untrusted_reason(file.owner, file.mode);
  ok = ok && why.empty() && decode_entry(file.bytes, &e, &why);
  if (ok) ok = (why = image_problem(e.image, e.is_ptx)).empty();
  if (ok && e.key != key) {
    why = "made for " + e.key;
    ok = false;
  }
  if (!ok) {
    warn_once("cache-entry-" + hash, concat("ignoring cache entry ", clipped_path(dir_), "/", hash,
                                            kSuffix, " (", why, "); recompiling ", key));
    return false;
  }
  *out = std::move(e);
  return true;
}

std::string DiskCache::store(const std::string& hash, const CacheEntry& entry) {
  if (!enabled() || !image_problem(entry.image, entry.is_ptx).empty()) return {};
  const std::string path = path_for(hash);
  std::string why;
  if (!write_file_atomically(path, encode_entry(entry), &why, Links::refuse)) {
    enabled_ = false;
    warn_once("cache-write", concat("cannot write to kernel cache ", clipped_path(dir_), " (", why,
                                    "); caching compiled kernels in memory only"));
    return {};
  }
  return path;
}

EntryLock DiskCache::lock(const std::string& hash) const {
  EntryLock held;
  if (!enabled()) return held;
  const std::string path = dir_ + "/" + hash + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return held;
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(fd);
      return held;
    }
  }
  held.fd_ = fd;
  held.path_ = path;
  return held;
}

EntryLock::EntryLock(EntryLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

EntryLock& EntryLock::operator=(EntryLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

EntryLock::~EntryLock() { release(); }

void EntryLock::release() {
  if (fd_ < 0) return;
  // Removed only while it is still the file at its path: a process that came after the removal
  // may have made a new one, which its own holder removes.
  struct stat mine {
  }, named{};
  if (::fstat(fd_, &mine) == 0 && ::lstat(path_.c_str(), &named) == 0 &&
      mine.st_dev == named.st_dev && mine.st_ino == named.st_ino)
    ::unlink(path_.c_str());
  ::close(fd_);  // drops the lock
  fd_ = -1;
}

size_t DiskCache::count_entries() const {
  if (dir_.empty()) return 0;
  DIR* d = opendir(dir_.c_str());
  if (!d) return 0;
  size_t n = 0;
  const size_t suffix = std::strlen(kSuffix);
  while (const dirent* e = readdir(d)) {
    const size_t len = std::strlen(e->d_name);
    if (e->d_name[0] != '.' && len > suffix && std::strcmp(e->d_name + len - suffix, kSuffix) == 0)
      ++n;
  }
  closedir(d);
  return n;
}

}  // namespace ropejit::detail
