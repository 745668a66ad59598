// libFuzzer target: the tuning-file reader. Any text is either refused with ropejit::Error or
// yields entries that all pass the legality rules; nothing crashes, hangs or overflows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "autotune/tuning_cache.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ropejit::autotune::Fingerprint here;
  here.gpu_name = "NVIDIA H100 80GB HBM3";  // the seed corpus's GPU
  here.cc = 90;
  here.sm_count = 132;
  try {
    const ropejit::autotune::TuningCache cache = ropejit::autotune::TuningCache::parse(text, here);
    for (const ropejit::autotune::TuningEntry& e : cache.entries())
      if (!ropejit::autotune::invalid_entry_reason(e).empty()) std::abort();
    (void)cache.to_json().dump();
  } catch (const ropejit::Error&) {
  }
  return 0;
}
