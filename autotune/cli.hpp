// Subcommands of the `ropejit` command that live in their own files.
#pragma once

#include <cstdint>
#include <string>

namespace ropejit::cli {

struct DemoOptions {
  std::string preset = "llama3-8b";
  int64_t tokens = 4096;
  std::string dtype = "bf16";
};

// JIT-compiles the preset's kernel, runs it on random data, checks it against float64 and
// prints times and GB/s; without a GPU it compiles and caches, and says the GPU part was
// skipped. Returns the process exit code.
int run_demo(const DemoOptions& options);

}  // namespace ropejit::cli
