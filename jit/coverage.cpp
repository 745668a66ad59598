// Which keys the kernel templates can express in this build (see coverage.hpp).
#include "jit/coverage.hpp"

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {

std::string missing_kernel(const Spec& c) {
  if (c.freqs != Freqs::table && c.freqs != Freqs::computed)
    return concat("freqs comp-", name_of(c.freqs));
  if (c.positions == Positions::mrope) return "positions mrope";
  if (c.norm != Norm::none) return concat("norm ", name_of(c.norm));
  if (c.out_store != Store::same) return concat("out_store ", name_of(c.out_store));
  if (c.cache != KvCache::none) return concat("cache ", name_of(c.cache));
  if (c.fusion != Fusion::qk) return concat("fusion ", name_of(c.fusion));
  return "";
}

void require_kernel(const Spec& c) {
  const std::string missing = missing_kernel(c);
  if (!missing.empty()) invalid(c.key(), ": ", missing, " has no kernel in this build yet");
}

}  // namespace ropejit::detail
