// NVRTC: rendered source (+ embedded headers) -> cubin for one sm_XY, or PTX for GPUs newer
// than this NVRTC knows.
#pragma once

#include <string>
#include <vector>

namespace ropejit::detail {

struct CompileResult {
  std::string image;  // cubin, or NUL-terminated PTX when `is_ptx`
  bool is_ptx = false;
  std::string log;  // NVRTC's log (warnings), may be empty
};

struct NvrtcVersion {
  int major = 0, minor = 0;
};
NvrtcVersion nvrtc_version();

// "sm_90" -> 90; throws Error naming `what` for anything else.
int parse_arch(const std::string& arch, const char* what);

// What this NVRTC emits for a device of compute capability `cc` (e.g. 90): "sm_90", or
// "compute_XY" (PTX for the driver to finish) when `cc` is newer than NVRTC supports. Throws
// Error(compile) listing the supported architectures for an older or unknown one.
std::string target_for(int cc);

// "" when target_for(cc) is sm_`cc` itself; else a sentence naming sm_`cc`, the range this NVRTC
// supports and the PTX target built instead, for commands that were asked for sm_`cc` by name.
std::string target_note(int cc);

// The NVRTC options used for `target` (part of every cache entry's content hash):
// "--gpu-architecture=<target>", base_compile_options(), then user_compile_options().
std::vector<std::string> compile_options(const std::string& target);
// ropejit's own options besides the target.
std::vector<std::string> base_compile_options();
// ROPEJIT_NVRTC_FLAGS, split at white space. Throws Error(invalid_argument) naming the option
// when one would change what is built (the target architecture, link-time IR, relocatable code),
// which would put images under keys that do not describe them, or floating-point rounding (fast
// math, flushed denormals, approximate division or square root, unfused multiply-adds), which
// would break the kernels' accuracy.
std::vector<std::string> user_compile_options();

// "" when `image` can be handed to cuModuleLoadData: an ELF cubin, or NUL-terminated PTX text;
// else why not. compile() never returns anything else, and the disk cache treats such an entry
// as a miss.
std::string image_problem(const std::string& image, bool is_ptx);

// Compiles `source` (named `name` in diagnostics) with the embedded headers. Throws
// Error(compile) carrying `key`, the full log and the options on failure.
CompileResult compile(const std::string& source, const std::string& name, const std::string& key,
                      const std::string& target);

}  // namespace ropejit::detail
