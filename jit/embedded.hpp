// Device headers from templates/, embedded into the library at build time
// (cmake/embed.cmake) so the library never reads the source tree at run time.
#pragma once

#include <vector>

namespace ropejit::detail {

struct EmbeddedFile {
  const char* name;  // as written in #include "..."
  const char* text;
};

// Every templates/*.cuh header.
const std::vector<EmbeddedFile>& embedded_headers();
// One file by name (e.g. "rope_entry.cu.in"); throws Error(internal) when absent.
const char* embedded_file(const char* name);

}  // namespace ropejit::detail
