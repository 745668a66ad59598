// MLA's engine: checks a call, compiles the key's kernel on first use (the core engine's
// images and modules, jit/engine.hpp) and launches it, one block per token. One process-wide
// instance; every method is thread-safe.
#pragma once

#include <cuda.h>

#include <string>

#include "jit/engine.hpp"
#include "jit/mla/mla.hpp"

namespace ropejit::detail {

class MlaEngine {
 public:
  static MlaEngine& instance();

  void mla_prepare(const MlaSpec& spec, const MlaArgs& args);
  const CacheEntry& image(const MlaSpec& canonical, const std::string& target,
                          std::string* path = nullptr);

 private:
  MlaEngine();
  Engine& core_;
};

}  // namespace ropejit::detail
