// libFuzzer target: the kernel-cache entry reader. Any bytes either decode (and then encode
// back to the same bytes) or are refused with a reason; the image check never crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "jit/disk_cache.hpp"
#include "jit/nvrtc.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ropejit::detail::CacheEntry entry;
  std::string why;
  if (ropejit::detail::decode_entry(bytes, &entry, &why)) {
    if (ropejit::detail::encode_entry(entry) != bytes) std::abort();
    (void)ropejit::detail::image_problem(entry.image, entry.is_ptx);
  } else if (why.empty()) {
    std::abort();  // a refusal always says why
  }
  return 0;
}
