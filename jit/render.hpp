// Key + kernel variant -> CUDA source (the entry template with its constants bound).
#pragma once

#include <map>
#include <string>

#include "jit/launch_config.hpp"

namespace ropejit::detail {

struct RenderedKernel {
  std::string key;     // Spec::key()
  std::string entry;   // extern "C" symbol, unique per key and variant
  std::string source;  // translation unit handed to NVRTC (includes embedded headers)
};

// The kernel's C symbol: the key with '-' spelled 'Z' (keys have no capitals, so the
// mapping is one-to-one), then "__" and the variant's name.
std::string entry_name(const std::string& key, const std::string& variant_name);
inline std::string entry_name(const std::string& key, const KernelVariant& variant) {
  return entry_name(key, variant.name());
}

// `text` with every {{name}} replaced by vars[name]; an unbound name is an internal error.
std::string substitute_template(const std::string& text,
                                const std::map<std::string, std::string>& vars);

// A bool constant as an entry template spells it.
inline const char* flag(bool b) { return b ? "true" : "false"; }

// Kernel `variant` of `key`: the embedded entry template `entry_file` with {{key}}, {{variant}}
// and {{entry}} bound, and `vars` (the constants its family binds).
RenderedKernel render_entry(const std::string& key, const std::string& variant,
                            const char* entry_file, std::map<std::string, std::string> vars);

RenderedKernel render(const Spec& canonical, const KernelVariant& variant);

}  // namespace ropejit::detail
