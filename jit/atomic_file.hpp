// Files other processes may read at any moment: private directories and atomic replacement.
#pragma once

#include <string>

namespace ropejit::detail {

// mkdir -p; every directory it creates gets mode 0700. False with `why` on failure.
bool make_private_dirs(const std::string& dir, std::string* why);

// Replaces `path` with `bytes` so that readers see the old file or the whole new one: a
// unique temp file in the same directory (rename is atomic only within one file system),
// fsync, rename, then fsync of the directory. False with `why` (errno text) on failure.
bool write_file_atomically(const std::string& path, const std::string& bytes, std::string* why);

}  // namespace ropejit::detail
