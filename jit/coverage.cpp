// Which keys the kernel templates can express in this build (see coverage.hpp).
#include "jit/coverage.hpp"

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {

std::string missing_kernel(const Spec& c) {
  if (c.freqs != Freqs::table && c.freqs != Freqs::computed)
    return concat("freqs comp-", name_of(c.freqs));
  if (c.positions == Positions::mrope) return "positions mrope";
  return "";
}

void require_kernel(const Spec& c) {
  const std::string missing = missing_kernel(c);
  if (!missing.empty()) invalid(c.key(), ": ", missing, " has no kernel in this build yet");
}

}  // namespace ropejit::detail
