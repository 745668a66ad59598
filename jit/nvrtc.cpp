// NVRTC compile stage. NVRTC is thread-safe; each call owns its program object.
#include "jit/nvrtc.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <utility>

#include "jit/embedded.hpp"
#include "jit/errors.hpp"

namespace ropejit::detail {
namespace {

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) fail(ErrorCode::compile, what, " failed: ", nvrtcGetErrorString(r));
}

// Ascending; never empty (a library reporting none is an error).
const std::vector<int>& supported_archs() {
  static const std::vector<int> archs = [] {
    int n = 0;
    check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
    std::vector<int> out(static_cast<size_t>(n));
    if (n > 0) check_nvrtc(nvrtcGetSupportedArchs(out.data()), "nvrtcGetSupportedArchs");
    std::sort(out.begin(), out.end());
    return out;
  }();
  if (archs.empty()) fail(ErrorCode::compile, "NVRTC reports no supported architectures");
  return archs;
}

std::string supported_list() {
  std::string out;
  for (const int a : supported_archs()) out += concat(out.empty() ? "" : ", ", "sm_", a);
  return out;
}

// Why an NVRTC option would change what is built rather than how, or null. Such options
// (e.g. -arch=sm_80 under an sm_90 key, or -dlto, which yields LTO IR instead of a cubin) would
// store images the key does not describe.
const char* target_changing(const std::string& option) {
  static const std::pair<const char*, const char*> kRefused[] = {
      {"--gpu-architecture", "sets the target architecture"},
      {"-arch", "sets the target architecture"},
      {"--dlink-time-opt", "asks for link-time IR instead of a cubin"},
      {"-dlto", "asks for link-time IR instead of a cubin"},
      {"--relocatable-device-code", "asks for relocatable code that needs a device link"},
      {"-rdc", "asks for relocatable code that needs a device link"},
      {"--extensible-whole-program", "asks for code that needs a device link"},
      {"-ewp", "asks for code that needs a device link"},
  };
  for (const auto& [name, why] : kRefused) {
    const size_t n = std::strlen(name);
    if (option.compare(0, n, name) == 0 && (option.size() == n || option[n] == '=')) return why;
  }
  return nullptr;
}

// True when an NVRTC option would change floating-point rounding: fast math, or flushing
// denormals, approximate division or square roots, or unfused multiply-adds. The kernels are
// accurate to one rounding of the float64 result (docs/cpp.md, "What a call can express") only
// with ropejit's own settings. NVRTC takes each with one dash or two; an option that repeats
// ropejit's (or NVRTC's default) value changes nothing and is let through.
bool rounding_changing(const std::string& option) {
  // Each option's name and the one value that keeps ropejit's rounding (none for fast math).
  static const std::pair<const char*, const char*> kRounding[] = {
      {"use_fast_math", nullptr}, {"ftz", "false"}, {"prec-div", "true"},
      {"prec-sqrt", "true"},      {"fmad", "true"},
  };
  size_t dashes = 0;
  while (dashes < 2 && dashes < option.size() && option[dashes] == '-') ++dashes;
  if (dashes == 0) return false;
  const size_t eq = option.find('=');
  const std::string name =
      option.substr(dashes, eq == std::string::npos ? std::string::npos : eq - dashes);
  for (const auto& [rounding, same] : kRounding)
    if (name == rounding) return !same || eq == std::string::npos || option.substr(eq + 1) != same;
  return false;
}

}  // namespace

NvrtcVersion nvrtc_version() {
  NvrtcVersion v;
  check_nvrtc(nvrtcVersion(&v.major, &v.minor), "nvrtcVersion");
  return v;
}

int parse_arch(const std::string& arch, const char* what) {
  // sm_ then 2 or 3 digits without a leading zero: sm_80, sm_90, sm_100, sm_120.
  if (arch.size() < 5 || arch.size() > 6 || arch.compare(0, 3, "sm_") != 0 || arch[3] == '0' ||
      arch.find_first_not_of("0123456789", 3) != std::string::npos)
    invalid(what, " ('", clipped(arch), "') must look like sm_90");
  return std::stoi(arch.substr(3));
}

std::string target_for(int cc) {
  const std::vector<int>& archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), cc) != archs.end()) return concat("sm_", cc);
  // Newer than NVRTC knows: PTX of its newest target, which the driver finishes for the GPU.
  if (cc > archs.back()) return concat("compute_", archs.back());
  fail(ErrorCode::compile, "sm_", cc, " (compute capability ", cc / 10, ".", cc % 10,
       ") is not an architecture this NVRTC supports: ", supported_list());
}

std::string target_note(int cc) {
  const std::string target = target_for(cc);
  if (target.rfind("compute_", 0) != 0) return {};
  const NvrtcVersion v = nvrtc_version();
  return concat("sm_", cc, " is newer than this NVRTC (", v.major, ".", v.minor, ") supports (sm_",
                supported_archs().front(), " to sm_", supported_archs().back(),
                "); building PTX for ", target,
                " instead, which the driver compiles when it loads it on the GPU, as it does for "
                "such a GPU at run time");
}

std::vector<std::string> base_compile_options() {
  // No fast math: the accuracy bar is one rounding from float64 (docs/cpp.md, "What a call can
  // express"), and --use_fast_math would turn sincospif/exp2 into approximations.
  // -minimal drops the runtime-API declarations the kernels never use (a shorter front end).
  return {"--std=c++17", "--fmad=true", "-lineinfo", "--device-as-default-execution-space",
          "-minimal"};
}

std::vector<std::string> user_compile_options() {
  std::vector<std::string> options;
  // Expert knob for experiments and debugging (e.g. "--Ofast-compile=min"): appended, and part
  // of the cache key like every option.
  const char* extra = std::getenv("ROPEJIT_NVRTC_FLAGS");
  if (!extra) return options;
  std::istringstream words(extra);
  for (std::string w; words >> w;) {
    if (const char* what = target_changing(w))
      invalid("ROPEJIT_NVRTC_FLAGS: '", clipped(w), "' ", what,
              "; ropejit chooses the target per device and caches what it built under it, so "
              "such options are refused");
    if (rounding_changing(w))
      invalid("ROPEJIT_NVRTC_FLAGS: '", clipped(w),
              "' changes floating-point rounding; ropejit's kernels are accurate to one rounding "
              "of the float64 result only as ropejit compiles them, so such options are refused");
    options.push_back(w);
  }
  return options;
}

std::vector<std::string> compile_options(const std::string& target) {
  std::vector<std::string> options = {"--gpu-architecture=" + target};
  for (std::string& o : base_compile_options()) options.push_back(std::move(o));
  for (std::string& o : user_compile_options()) options.push_back(std::move(o));
  return options;
}

std::string image_problem(const std::string& image, bool is_ptx) {
  if (image.empty()) return "empty image";
  if (is_ptx) {
    if (image.back() != '\0' || image.find(".version") == std::string::npos)
      return "not NUL-terminated PTX text";
  } else if (image.size() < 64 || image.compare(0, 4,
                                                "\x7f"
                                                "ELF") != 0) {
    return "not an ELF cubin";
  }
  return {};
}

CompileResult compile(const std::string& source, const std::string& name, const std::string& key,
                      const std::string& target) {
  std::vector<const char*> header_text, header_names;
  for (const EmbeddedFile& f : embedded_headers()) {
    header_text.push_back(f.text);
    header_names.push_back(f.name);
  }
  nvrtcProgram prog = nullptr;
  check_nvrtc(nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), int(header_text.size()),
                                 header_text.data(), header_names.data()),
              "nvrtcCreateProgram");
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });

  const std::vector<std::string> options = compile_options(target);
  std::vector<const char*> opts;
  for (const std::string& o : options) opts.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, int(opts.size()), opts.data());

  CompileResult out;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  out.log.resize(log_size);
  if (log_size) nvrtcGetProgramLog(prog, out.log.data());
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  if (r != NVRTC_SUCCESS) {
    std::string opt_line;
    for (const std::string& o : options) opt_line += " " + o;
    fail(ErrorCode::compile, "NVRTC failed to compile ", key, " for ", target, " (",
         nvrtcGetErrorString(r), ")\noptions:", opt_line, "\nlog:\n", out.log);
  }

  out.is_ptx = target.rfind("compute_", 0) == 0;
  size_t size = 0;
  if (out.is_ptx) {
    check_nvrtc(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
    out.image.resize(size);
    check_nvrtc(nvrtcGetPTX(prog, out.image.data()), "nvrtcGetPTX");
  } else {
    check_nvrtc(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    out.image.resize(size);
    check_nvrtc(nvrtcGetCUBIN(prog, out.image.data()), "nvrtcGetCUBIN");
  }
  if (const std::string bad = image_problem(out.image, out.is_ptx); !bad.empty()) {
    std::string opt_line;
    for (const std::string& o : options) opt_line += " " + o;
    fail(ErrorCode::compile, "NVRTC compiled ", key, " for ", target,
         " but gave no loadable image (", bad, ")\noptions:", opt_line);
  }
  return out;
}

}  // namespace ropejit::detail
