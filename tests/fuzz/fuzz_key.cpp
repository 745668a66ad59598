// libFuzzer target: the key-string parser. Any input either throws ropejit::Error or parses to
// a spec whose canonical key is the input again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ropejit/ropejit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ropejit::Spec spec = ropejit::parse_key(text);
    if (spec.key() != text) std::abort();  // parse_key accepts canonical keys only
  } catch (const ropejit::Error&) {
  }
  return 0;
}
