// Files that other processes and users may touch: private directories, reads that never block
// or run away, ownership checks, and atomic replacement.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace ropejit::detail {

// mkdir -p; every directory it creates gets mode 0700. False with `why` on failure.
bool make_private_dirs(const std::string& dir, std::string* why);

// "" when a file or directory with this owner and mode may be trusted by this process: owned by
// its effective user or root, not writable by group or others (the rule OpenSSH applies to its
// keys and configuration), else why not.
std::string untrusted_reason(uid_t owner, mode_t mode);

// What reads and writes do with a symbolic link at the path itself. A kernel cache entry never
// follows one (a damaged or planted entry could otherwise make the cache read or overwrite any
// file the process can reach); a tuning file or model config the user named may be a link.
enum class Links {
  follow,  // read the file a link points to; replace that file and keep the link
  refuse,  // a link is refused when read, and replaced (never its target) when written
};

enum class ReadStatus {
  ok,       // `bytes` holds the whole file
  missing,  // no such file
  refused,  // exists but was not read: `why` says so (not a regular file, too large, ...)
};

struct FileRead {
  ReadStatus status = ReadStatus::missing;
  std::string bytes;
  std::string why;
  uid_t owner = 0;
  mode_t mode = 0;
};

// Reads `path` if it is a regular file of at most `max_bytes`. Never blocks and never reads
// without bound: it opens with O_NONBLOCK and checks the opened descriptor (a named pipe,
// a device such as /dev/zero reached through a symlink, or a directory is refused), then
// reads at most max_bytes + 1 bytes. With Links::refuse a symbolic link at `path` is refused.
FileRead read_regular_file(const std::string& path, size_t max_bytes, Links links = Links::follow);

// Replaces `path` with `bytes` so that readers see the old file or the whole new one: a unique
// temp file in the same directory (rename is atomic only within one file system), fsync,
// rename, then fsync of the directory. When `path` is a symbolic link, Links::follow replaces
// the file it points to and keeps the link; Links::refuse replaces the link itself, so nothing
// outside `path`'s directory is written. False with `why` (errno text) on failure.
bool write_file_atomically(const std::string& path, const std::string& bytes, std::string* why,
                           Links links);

// Seconds a temp file is kept: a writer's lives milliseconds; one whose writer no longer runs
// (its name holds the writer's pid) goes sooner.
constexpr long kStaleTempSeconds = 3600;
constexpr long kDeadWriterGraceSeconds = 60;

// Removes this user's temp files of write_file_atomically() in `dir` (those of `name` only, when
// given: a directory the user shares with other files) older than `seconds`, or older than
// kDeadWriterGraceSeconds when their writer is gone: what a writer killed between creating and
// renaming leaves behind. Returns how many.
int remove_stale_temp_files(const std::string& dir, long seconds, const std::string& name = "");

// Deepest nesting of arrays and objects in JSON text (strings skipped), counted before parsing
// so that a hostile file (100,000 nested '[') is refused instead of exhausting the parser's
// stack: tuning files and model configs check it first.
size_t json_nesting_depth(const std::string& text);

}  // namespace ropejit::detail
