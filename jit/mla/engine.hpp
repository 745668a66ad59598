// MLA's engine: checks a call, compiles the key's kernel on first use (the core engine's
// images and modules, jit/engine.hpp) and launches it (a token's cache row and its blocks of query
// heads). One process-wide instance; every method is thread-safe.
#pragma once

#include <cuda.h>

#include <shared_mutex>
#include <string>
#include <unordered_map>

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
  // A repeated call's plan: the loaded function per context and spec, so that the launch path
  // is one lookup and one launch (no key string, no engine-wide map).
  struct PlanKey {
    CUcontext ctx;
    MlaSpec spec;
    bool operator==(const PlanKey& o) const { return ctx == o.ctx && spec == o.spec; }
  };
  struct PlanKeyHash {
    size_t operator()(const PlanKey& k) const;
  };
  struct Plan {
    const Engine::LoadedFunction* fn;
    int sm_count;  // the context's GPU: how many blocks the query's heads split into
  };
  Engine& core_;
  mutable std::shared_mutex mutex_;  // plans_
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
};

}  // namespace ropejit::detail
