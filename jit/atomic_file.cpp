// Private directories and atomic file replacement (kernel cache entries, tuning files).
#include "jit/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

}  // namespace

bool make_private_dirs(const std::string& dir, std::string* why) {
  std::string partial = !dir.empty() && dir[0] == '/' ? "/" : "";
  std::stringstream ss(dir);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = concat("cannot create ", partial, ": ", std::strerror(errno));
      return false;
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

bool write_file_atomically(const std::string& path, const std::string& bytes, std::string* why) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::random_device rd;
  const std::string tmp =
      concat(dir, "/.", path.substr(slash + 1), ".", ::getpid(), ".",
             std::hash<std::thread::id>()(std::this_thread::get_id()), ".", rd(), ".tmp");
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

}  // namespace ropejit::detail
