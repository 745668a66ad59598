// Which keys the kernel templates can express in this build (see coverage.hpp).
#include "jit/coverage.hpp"

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {

std::string missing_kernel(const Spec& c) {
  (void)c;  // every axis value has device code
  return "";
}

void require_kernel(const Spec& c) {
  const std::string missing = missing_kernel(c);
  if (!missing.empty()) invalid(c.key(), ": ", missing, " has no kernel in this build yet");
}

}  // namespace ropejit::detail
