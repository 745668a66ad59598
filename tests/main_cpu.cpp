// doctest main for the CPU suite: every run gets a fresh private kernel-cache directory.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  char dir[] = "/tmp/ropejit-cpu-tests-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  setenv("ROPEJIT_CACHE_DIR", (std::string(dir) + "/cache").c_str(), 1);
  setenv("ROPEJIT_TUNING_FILE", (std::string(dir) + "/tuning.json").c_str(), 1);
  doctest::Context context(argc, argv);
  const int rc = context.run();
  const std::string cleanup = std::string("rm -rf ") + dir;
  if (std::system(cleanup.c_str()) != 0) return rc ? rc : 1;
  return rc;
}
