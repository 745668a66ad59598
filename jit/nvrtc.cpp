// NVRTC compile stage. NVRTC is thread-safe; each call owns its program object.
#include "jit/nvrtc.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "jit/embedded.hpp"
#include "jit/errors.hpp"

namespace ropejit::detail {
namespace {

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) fail(ErrorCode::compile, what, " failed: ", nvrtcGetErrorString(r));
}

std::vector<int> supported_archs() {
  int n = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

}  // namespace

NvrtcVersion nvrtc_version() {
  NvrtcVersion v;
  check_nvrtc(nvrtcVersion(&v.major, &v.minor), "nvrtcVersion");
  return v;
}

int parse_arch(const std::string& arch, const char* what) {
  if (arch.size() < 5 || arch.size() > 7 || arch.compare(0, 3, "sm_") != 0 ||
      arch.find_first_not_of("0123456789", 3) != std::string::npos)
    invalid(what, " ('", arch, "') must look like sm_90");
  return std::stoi(arch.substr(3));
}

std::string target_for(int cc) {
  static const std::vector<int> archs = supported_archs();
  if (archs.empty()) fail(ErrorCode::compile, "NVRTC reports no supported architectures");
  if (std::find(archs.begin(), archs.end(), cc) != archs.end()) return concat("sm_", cc);
  const int newest = *std::max_element(archs.begin(), archs.end());
  if (cc > newest) return concat("compute_", newest);
  fail(ErrorCode::compile, "compute capability ", cc / 10, ".", cc % 10,
       " is not supported by this NVRTC (oldest is sm_", archs.front(), ")");
}

std::vector<std::string> compile_options(const std::string& target) {
  // No fast math: the accuracy bar is one rounding from float64 (README, "What a call can
  // express"), and
  // --use_fast_math would turn sincospif/exp2 into approximations.
  // -minimal drops the runtime-API declarations the kernels never use: about 10 ms less front
  // end per compile (bench/RESULTS.md, "Cold compile").
  std::vector<std::string> options = {
      "--gpu-architecture=" + target,        "--std=c++17", "--fmad=true", "-lineinfo",
      "--device-as-default-execution-space", "-minimal"};
  // Expert knob for experiments and debugging (e.g. "--Ofast-compile=min"): appended, and part
  // of the cache key like every option.
  if (const char* extra = std::getenv("ROPEJIT_NVRTC_FLAGS")) {
    std::istringstream words(extra);
    for (std::string w; words >> w;) options.push_back(w);
  }
  return options;
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
  return out;
}

}  // namespace ropejit::detail
