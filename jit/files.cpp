// Private directories, bounded non-blocking reads, ownership checks and atomic replacement
// (kernel cache entries, tuning files, model configs).
#include "jit/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "jit/errors.hpp"

namespace ropejit::detail {
namespace {

bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

constexpr const char* kTempSuffix = ".tmp";

// The file a chain of symbolic links at `path` ends at (at most 40 links, as the kernel
// allows); `path` itself when it is no link.
std::string resolve_links(std::string path) {
  for (int i = 0; i < 40; ++i) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::string target(PATH_MAX, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    if (n <= 0 || size_t(n) >= target.size()) return path;
    target.resize(size_t(n));
    if (target[0] != '/') {
      const size_t slash = path.rfind('/');
      if (slash != std::string::npos) target = path.substr(0, slash + 1) + target;
    }
    path = target;
  }
  return path;
}

}  // namespace

std::string untrusted_reason(uid_t owner, mode_t mode) {
  // Root may own it too: whoever is root can replace this library itself (an image's caches are
  // built as root and read by the service's user).
  if (owner != ::geteuid() && owner != 0)
    return concat("owned by uid ", owner, ", not by this user (uid ", ::geteuid(), ") or root");
  if (mode & (S_IWGRP | S_IWOTH))
    return concat("writable by ", (mode & S_IWOTH) ? "others" : "its group", " (mode ", std::oct,
                  (mode & 07777), ")");
  return {};
}

FileRead read_regular_file(const std::string& path, size_t max_bytes, Links links) {
  FileRead out;
  const int nofollow = links == Links::refuse ? O_NOFOLLOW : 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | nofollow);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return out;
    out.status = ReadStatus::refused;
    // O_NOFOLLOW on a link fails with ELOOP.
    out.why = nofollow && errno == ELOOP ? std::string("is a symbolic link")
                                         : concat("cannot open: ", std::strerror(errno));
    return out;
  }
  out.status = ReadStatus::refused;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    out.why = concat("cannot stat: ", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    out.why = S_ISDIR(st.st_mode)                          ? "is a directory"
              : S_ISFIFO(st.st_mode)                       ? "is a named pipe, not a regular file"
              : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "is a device, not a regular file"
                                                           : "is not a regular file";
  } else if (uint64_t(st.st_size) > max_bytes) {
    out.why = concat("is ", st.st_size, " bytes, more than the ", max_bytes, " allowed");
  } else {
    out.owner = st.st_uid;
    out.mode = st.st_mode;
    // Reads until end of file, stopping one byte past the limit: a file that grew since fstat
    // is noticed, and nothing reads without bound.
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        out.why = concat("cannot read: ", std::strerror(errno));
        break;
      }
      if (n == 0) break;
      out.bytes.append(buf, size_t(n));
      if (out.bytes.size() > max_bytes) {
        out.why = concat("is more than the ", max_bytes, " bytes allowed");
        break;
      }
    }
    if (out.why.empty()) out.status = ReadStatus::ok;
  }
  ::close(fd);
  if (out.status != ReadStatus::ok) out.bytes.clear();
  return out;
}

bool make_private_dirs(const std::string& dir, std::string* why) {
  std::string partial = !dir.empty() && dir[0] == '/' ? "/" : "";
  std::stringstream ss(dir);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      // A directory that exists on a read-only file system may answer EROFS, not EEXIST.
      const int err = errno;
      struct stat existing {};
      if (::stat(partial.c_str(), &existing) != 0 || !S_ISDIR(existing.st_mode)) {
        *why = concat("cannot create ", partial, ": ", std::strerror(err));
        return false;
      }
    }
    partial += '/';
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = concat(dir, " is not a directory");
    return false;
  }
  return true;
}

bool write_file_atomically(const std::string& link_or_path, const std::string& bytes,
                           std::string* why, Links links) {
  // rename() replaces a link at its destination, never the link's target.
  const std::string path = links == Links::follow ? resolve_links(link_or_path) : link_or_path;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::random_device rd;
  const std::string tmp =
      concat(dir, "/.", path.substr(slash + 1), ".", ::getpid(), ".",
             std::hash<std::thread::id>()(std::this_thread::get_id()), ".", rd(), kTempSuffix);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = std::strerror(errno);
    return false;
  }
  int err = 0;
  if (!write_all(fd, bytes) || ::fsync(fd) != 0) err = errno != 0 ? errno : EIO;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    *why = std::strerror(err);
    return false;
  }
  // Make the rename itself durable; best effort, the file is complete either way.
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return true;
}

namespace {

// The writer's pid in a temp file name ".<name>.<pid>.<thread>.<random>.tmp", or 0.
pid_t writer_pid(const std::string& file) {
  // Three dots before the suffix: <pid>.<thread>.<random>.
  size_t end = file.size() - std::strlen(kTempSuffix);
  for (int field = 0; field < 2; ++field) {
    end = file.rfind('.', end - 1);
    if (end == std::string::npos || end == 0) return 0;
  }
  const size_t begin = file.rfind('.', end - 1);
  if (begin == std::string::npos || end - begin < 2 || end - begin > 11) return 0;
  long pid = 0;
  for (size_t i = begin + 1; i < end; ++i) {
    if (file[i] < '0' || file[i] > '9') return 0;
    pid = pid * 10 + (file[i] - '0');
  }
  return pid > 0 && pid <= INT_MAX ? pid_t(pid) : 0;
}

}  // namespace

int remove_stale_temp_files(const std::string& dir, long seconds, const std::string& name) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const time_t now = ::time(nullptr);
  const size_t suffix = std::strlen(kTempSuffix);
  const std::string prefix = name.empty() ? "." : "." + name + ".";
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string file = e->d_name;
    if (file.size() <= prefix.size() + suffix || file.compare(0, prefix.size(), prefix) != 0 ||
        file.compare(file.size() - suffix, suffix, kTempSuffix) != 0)
      continue;
    const std::string path = dir + "/" + file;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const long age = long(now - st.st_mtime);
    // A writer that died (no such process here) left it: gone after a short grace, which keeps
    // the file of a live writer in another pid namespace sharing the directory.
    const pid_t pid = writer_pid(file);
    const bool dead = pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
    if ((age >= seconds || (dead && age >= kDeadWriterGraceSeconds)) && ::unlink(path.c_str()) == 0)
      ++removed;
  }
  ::closedir(d);
  return removed;
}

size_t json_nesting_depth(const std::string& text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace ropejit::detail
