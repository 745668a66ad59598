// Small helpers shared by the test files: environment, temp directories, files, commands.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::testing {

// The message of the ropejit::Error that `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Sets (or unsets, with std::nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A fresh directory under /tmp, removed when the test binary exits.
inline std::string temp_dir() {
  struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      for (const std::string& d : dirs)
        if (std::system(("rm -rf '" + d + "'").c_str()) != 0) std::perror(d.c_str());
    }
  };
  static Cleanup cleanup;
  char dir[] = "/tmp/ropejit-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  cleanup.dirs.push_back(dir);
  return dir;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct CommandResult {
  int status;          // exit code, -1 when killed by a signal
  std::string output;  // stdout and stderr together
  double seconds;
};

// Runs a shell command line as a user would and captures everything it prints.
inline CommandResult run_command(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  CommandResult r{-1, {}, 0};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ropejit::testing
