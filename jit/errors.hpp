// Helpers that build ropejit::Error messages naming the offending argument and value.
#pragma once

#include <sstream>
#include <string>

#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// `text` for an error message, cut to its first 64 characters (and its length) when longer:
// messages quote what the caller passed, which may be anything.
inline std::string clipped(const std::string& text) {
  constexpr size_t kShown = 64;
  if (text.size() <= kShown) return text;
  return concat(text.substr(0, kShown), "... (", text.size(), " characters)");
}

template <class... Parts>
[[noreturn]] void fail(ErrorCode code, const Parts&... parts) {
  throw Error(code, concat("ropejit: ", parts...));
}

template <class... Parts>
[[noreturn]] void invalid(const Parts&... parts) {
  fail(ErrorCode::invalid_argument, parts...);
}

// One warning per distinct `topic` per process, on stderr (silenced by ROPEJIT_QUIET=1).
void warn_once(const std::string& topic, const std::string& message);

}  // namespace ropejit::detail
