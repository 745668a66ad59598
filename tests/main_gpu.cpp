// doctest main for the GPU suite: exits 77 (CTest: skipped) when no device is usable, so a
// machine without a GPU never reports these tests as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "jit/driver.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "list") || std::strcmp(argv[i], "-ltc") == 0 ||
        std::strcmp(argv[i], "-lts") == 0)
      listing = true;
  if (!listing) {
    std::string why;
    if (!ropejit::detail::try_driver(&why)) {
      std::printf("SKIPPED: GPU tests need a usable CUDA device: %s\n", why.c_str());
      return 77;
    }
    if (!std::getenv("ROPEJIT_CACHE_DIR")) {
      char dir[] = "/tmp/ropejit-gpu-tests-XXXXXX";
      if (!mkdtemp(dir)) return 1;
      setenv("ROPEJIT_CACHE_DIR", dir, 1);
    }
  }
  doctest::Context context(argc, argv);
  return context.run();
}
