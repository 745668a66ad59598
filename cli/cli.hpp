// Subcommands of the `ropejit` command that live in their own files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ropejit::cli {

struct DemoOptions {
  std::string preset = "llama3-8b";
  std::string hf_config;  // a model's config.json instead of a preset
  int64_t tokens = 4096;
  std::string dtype = "bf16";
};

// JIT-compiles the preset's kernel, runs it on random data, checks it against float64 and
// prints times and GB/s; without a GPU it compiles and caches, and says the GPU part was
// skipped. Returns the process exit code.
int run_demo(const DemoOptions& options);

struct TuneOptions {
  std::vector<std::string> presets;
  std::vector<std::string> hf_configs;  // models' config.json files, tuned like presets
  std::vector<std::string> keys;        // explicit kernel keys (every axis), with `heads`
  std::vector<int32_t> heads;           // explicit shape: q heads[, k heads]
  int32_t head_dim = 128;
  int32_t rotary_dim = 0;
  std::string dtype = "bf16";
  std::string layout = "bshd";
  std::string style = "neox";
  std::string positions = "ids";
  std::string freqs = "tab";
  int64_t hidden = 0;           // projection keys (qkvproj_..., ffnglu_...): the hidden size
  int64_t intermediate = 0;     // FFN keys: the intermediate size
  std::vector<int64_t> tokens;  // default: 1, 16, 64, 256, 4096 (projections: 1, 2, 4 .. 4096)
  std::string out;              // default: the library's tuning file
  bool dry_run = false;
  int32_t top = 0;  // also print the N fastest candidates of each entry
};

// Tunes every (key, token bucket) and writes or merges the tuning file; --dry-run lists the
// candidates without a GPU.
int run_tune(const TuneOptions& options);

// `ropejit source KEY` or `ropejit source --hf-config FILE`: prints the CUDA source rendered for
// the key (the model's key), or says which axis value has no kernel in this build yet.
int run_source(const std::string& key, const std::string& hf_config, const std::string& dtype);

struct CompileOptions {
  std::vector<std::string> archs;  // default: sm_90, or the tuning file's GPU
  std::vector<std::string> presets;
  std::vector<std::string> hf_configs;  // models' config.json files, compiled like presets
  std::vector<std::string> keys;
  std::string from_tuning;  // a tuning file: its kernels and its keys' defaults
  std::string dtype = "bf16";
  unsigned jobs = 0;  // 0: one per core
};

// Precompiles kernels into the disk cache (no GPU needed), one line per kernel. A model's keys
// whose kernels this build does not have yet (jit/coverage.hpp) are listed as skipped; an
// explicit --key without a kernel is an error. Exit code 1 when a kernel failed or nothing could
// be saved (the disk cache is off).
int run_compile(const CompileOptions& options);

}  // namespace ropejit::cli
