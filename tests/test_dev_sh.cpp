// tools/dev.sh's GPU detection, against stand-in `ropejit` and `nvidia-smi` commands: the
// README's test command must run the GPU suite wherever a GPU is usable, and must fail (never
// skip) where the driver lists a GPU that ropejit cannot see.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "test_util.hpp"

namespace {

using ropejit::testing::CommandResult;

bool has(const CommandResult& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

// A build folder inside the source tree (relative ROPEJIT_BUILD_DIR, as users set it) holding a
// stand-in `ropejit` whose `info` prints `info_output`; a bin folder with a stand-in
// `nvidia-smi` listing `smi_output` (no GPU when empty). Both are removed at scope exit.
class StandIn {
 public:
  StandIn(const std::string& info_output, const std::string& smi_output) {
    name_ = "build-devsh-test-" + std::to_string(::getpid()) + "-" + std::to_string(++count_);
    dir_ = std::string(ROPEJIT_SOURCE_DIR) + "/" + name_;
    bin_ = ropejit::testing::temp_dir();
    REQUIRE(ropejit::testing::run_command("mkdir -p '" + dir_ + "'").status == 0);
    script(dir_ + "/ropejit", "printf '%s\\n' '" + info_output + "'");
    // Always a stand-in nvidia-smi, so that a real one (on a GPU host) never answers instead.
    script(bin_ + "/nvidia-smi", smi_output.empty()
                                     ? std::string("echo 'No devices were found'; exit 6")
                                     : "printf '%s\\n' '" + smi_output + "'");
  }
  ~StandIn() { ropejit::testing::run_command("rm -rf '" + dir_ + "'"); }
  StandIn(const StandIn&) = delete;
  StandIn& operator=(const StandIn&) = delete;

  // Runs `tools/dev.sh ARGS` from another working directory, with ctest replaced by `ctest`
  // (by default `echo CTEST`), the Python step by `pytest` and `env` (NAME=VALUE ...) added to
  // the environment.
  CommandResult dev_sh(const std::string& args, const std::string& ctest = "echo CTEST",
                       const std::string& pytest = "echo PYTEST",
                       const std::string& env = "") const {
    return ropejit::testing::run_command("cd / && unset ROPEJIT_CACHE_DIR && PATH='" + bin_ +
                                         "':\"$PATH\" ROPEJIT_BUILD_DIR=" + name_ +
                                         " ROPEJIT_SKIP_BUILD=1 ROPEJIT_CTEST='" + ctest +
                                         "' ROPEJIT_PYTEST='" + pytest + "' " + env + " bash '" +
                                         ROPEJIT_SOURCE_DIR + "/tools/dev.sh' " + args);
  }
  // A stand-in command `name` on the PATH dev.sh runs with, its body a shell script.
  std::string command(const std::string& name, const std::string& body) const {
    script(bin_ + "/" + name, body);
    return bin_ + "/" + name;
  }
  const std::string& dir() const { return dir_; }

 private:
  static void script(const std::string& path, const std::string& body) {
    ropejit::testing::write_file(path, "#!/bin/sh\n" + body + "\n");
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
  }
  static inline int count_ = 0;
  std::string name_, dir_, bin_;
};

const char* const kInfoGpu =
    "ropejit 0.1.0\ndriver       CUDA 13.0\ngpu          NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)";
const char* const kInfoNone = "ropejit 0.1.0\ndriver       none: libcuda.so.1 could not be loaded";

}  // namespace

TEST_CASE("dev.sh test runs the GPU suite when ropejit sees a GPU") {
  const StandIn s(kInfoGpu, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)");
  const CommandResult r = s.dev_sh("test");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "GPU found: running the CPU and GPU suites"));
  CHECK(has(r, "--output-on-failure -LE exhaustive\n"));
  CHECK(has(r, "-N -L exhaustive"));  // the sweeps left out are counted
  CHECK(has(r, "tools/dev.sh exhaustive runs them"));
  CHECK_FALSE(has(r, "-LE gpu"));
  CHECK_FALSE(has(r, "SKIPPED"));
  CHECK(has(r, "the Python package\nPYTEST\n"));
  CHECK(has(r, "dev.sh: all stages passed"));
  CHECK(s.dev_sh("gpu").output == "yes\n");
}

TEST_CASE("dev.sh test skips the GPU suite visibly on a machine without a GPU") {
  const StandIn s(kInfoNone, "");
  const CommandResult r = s.dev_sh("test");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "no usable GPU here (none: libcuda.so.1 could not be loaded)"));
  CHECK(has(r, "--output-on-failure -LE gpu"));
  CHECK(has(r, "GPU tests SKIPPED"));
  CHECK(has(r, "the Python package\nPYTEST\n"));
}

TEST_CASE("dev.sh test fails where the driver lists a GPU that ropejit cannot use") {
  const StandIn s(kInfoNone, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)");
  const CommandResult r = s.dev_sh("test");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(has(r, "nvidia-smi lists a GPU but"));
  CHECK_FALSE(has(r, "CTEST"));
  CHECK_FALSE(has(r, "PYTEST"));
}

TEST_CASE("dev.sh test runs every stage when one fails and names the failures at the end") {
  const StandIn s(kInfoNone, "");
  const CommandResult r = s.dev_sh("test", "false");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(has(r, "GPU tests SKIPPED"));             // reported although the CPU suite failed
  CHECK(has(r, "the Python package\nPYTEST\n"));  // and the Python tests still ran
  CHECK(has(r, "dev.sh: FAILED: ctest (CPU suite)\n"));
  CHECK_FALSE(has(r, "all stages passed"));
}

TEST_CASE("dev.sh test fails when the ropejit command is missing") {
  const StandIn s(kInfoGpu, "");
  ropejit::testing::run_command("rm -f '" + s.dir() + "/ropejit'");
  const CommandResult r = s.dev_sh("test");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(has(r, "is missing or not executable"));
  CHECK_FALSE(has(r, "CTEST"));
}

TEST_CASE("dev.sh test gives the run's test processes one fresh kernel cache, removed after") {
  const StandIn s(kInfoGpu, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)");
  s.command("show-cache", "echo \"$1 cache=$ROPEJIT_CACHE_DIR\"; test -d \"$ROPEJIT_CACHE_DIR\"");
  const CommandResult r = s.dev_sh("test", "show-cache CTEST", "show-cache PYTEST");
  INFO(r.output);
  CHECK(r.status == 0);
  const std::string prefix = "CTEST cache=" + s.dir() + "/test-kernels.";
  const size_t at = r.output.find(prefix);
  REQUIRE(at != std::string::npos);
  const std::string dir = r.output.substr(at + 12, r.output.find('\n', at) - at - 12);
  CHECK(has(r, "PYTEST cache=" + dir + "\n"));  // the Python stage shares it
  CHECK(ropejit::testing::run_command("test -e '" + dir + "'").status != 0);  // removed

  // A cache directory the caller names is used as it is, and kept.
  const std::string own = ropejit::testing::temp_dir();
  const CommandResult mine =
      s.dev_sh("test", "show-cache CTEST", "show-cache PYTEST", "ROPEJIT_CACHE_DIR='" + own + "'");
  INFO(mine.output);
  CHECK(mine.status == 0);
  CHECK(has(mine, "CTEST cache=" + own + "\n"));
  CHECK(has(mine, "PYTEST cache=" + own + "\n"));
  CHECK(ropejit::testing::run_command("test -d '" + own + "'").status == 0);
}

TEST_CASE("dev.sh exhaustive runs the sweeps over every variant, and needs a GPU") {
  const StandIn gpu(kInfoGpu, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)");
  const CommandResult r = gpu.dev_sh("exhaustive");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r, "--output-on-failure -L exhaustive\n"));
  CHECK_FALSE(has(r, "PYTEST"));

  const StandIn none(kInfoNone, "");
  const CommandResult n = none.dev_sh("exhaustive");
  INFO(n.output);
  CHECK(n.status == 2);
  CHECK(has(n, "the exhaustive sweeps need a usable GPU; here: none: libcuda.so.1"));
  CHECK_FALSE(has(n, "CTEST"));
}
