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

// `text` for an error message, cut to its first `shown` characters (and its length) when
// longer: messages quote what the caller passed, which may be anything.
inline std::string clipped(const std::string& text, size_t shown = 64) {
  if (text.size() <= shown) return text;
  return concat(text.substr(0, shown), "... (", text.size(), " characters)");
}

// A path for a message (cache directory, tuning file, config file, a value of ROPEJIT_*):
// clipped() with room for the deep paths real file systems have.
inline std::string clipped_path(const std::string& path) { return clipped(path, 256); }

// `text` cut to its first and last `shown` characters (and its length) when longer: a reason
// whose middle may quote a path or token of any length and whose end says what went wrong.
inline std::string clipped_middle(const std::string& text, size_t shown = 64) {
  if (text.size() <= 2 * shown) return text;
  return concat(text.substr(0, shown), "... (", text.size(), " characters) ...",
                text.substr(text.size() - shown));
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
