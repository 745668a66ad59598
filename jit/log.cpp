// Process-wide "warn once" for cache and tuning-file problems that degrade but do not fail.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "jit/errors.hpp"

namespace ropejit::detail {

void warn_once(const std::string& topic, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen.insert(topic).second) return;
  const char* quiet = std::getenv("ROPEJIT_QUIET");
  if (quiet && quiet[0] == '1') return;
  std::fprintf(stderr, "ropejit: warning: %s\n", message.c_str());
}

}  // namespace ropejit::detail
