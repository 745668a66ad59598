// cuBLASLt loaded lazily (dlopen), and row-major GEMMs with their algorithm chosen once per
// shape. cuBLASLt is column major: the row-major D[m][n] = A[m][k] · B[n][k]ᵀ is the
// column-major Dᵀ[n][m] = op(B)·Aᵀ with B read transposed, so the call passes B first.
#include "jit/decode/gemm.hpp"

#include <cublasLt.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "jit/errors.hpp"

namespace ropejit::detail {
namespace {

// clang-format off
#define ROPEJIT_LT_ENTRY_POINTS(X)                                                              \
  X(Create) X(GetVersion) X(GetStatusString) X(MatmulDescCreate) X(MatmulDescDestroy)           \
  X(MatmulDescSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy)                        \
  X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute)          \
  X(MatmulAlgoGetHeuristic) X(Matmul)
// clang-format on

struct Lt {
#define ROPEJIT_DECLARE(name) decltype(&cublasLt##name) name;  // NOLINT(bugprone-macro-parentheses)
  ROPEJIT_LT_ENTRY_POINTS(ROPEJIT_DECLARE)
#undef ROPEJIT_DECLARE
};

struct LoadedLt {
  Lt lt{};
  std::string error;  // empty when usable
  std::string path;
};

// Candidates in order: the override, the soname, next to libnvrtc, the default toolkit.
std::vector<std::string> library_candidates() {
  const std::string soname = concat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  std::vector<std::string> out;
  if (const char* env = std::getenv("ROPEJIT_CUBLASLT"); env && *env) {
    out.emplace_back(env);
    return out;  // an explicit choice is not second-guessed
  }
  out.push_back(soname);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) && info.dli_fname) {
    const std::string nvrtc = info.dli_fname;
    const size_t slash = nvrtc.rfind('/');
    if (slash != std::string::npos) out.push_back(nvrtc.substr(0, slash + 1) + soname);
  }
  out.push_back("/usr/local/cuda/lib64/" + soname);
  return out;
}

LoadedLt load() {
  LoadedLt out;
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : library_candidates()) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      out.path = name;
      break;
    }
    const char* why = dlerror();
    // ROPEJIT_CUBLASLT may be any length, and dlerror() repeats it.
    tried += concat(tried.empty() ? "" : "; ", clipped_path(name), ": ",
                    why ? clipped_middle(why, 160) : "?");
  }
  if (!lib) {
    out.error = concat("cuBLASLt could not be loaded (", tried,
                       "); set ROPEJIT_CUBLASLT to the library's path");
    return out;
  }
  Lt& lt = out.lt;
#define ROPEJIT_RESOLVE(name)                                                                \
  lt.name = reinterpret_cast<decltype(lt.name)>(dlsym(lib, "cublasLt" #name));               \
  if (!lt.name) {                                                                            \
    out.error =                                                                              \
        concat("cuBLASLt (", clipped_path(out.path), ") has no entry point cublasLt" #name); \
    return out;                                                                              \
  }
  ROPEJIT_LT_ENTRY_POINTS(ROPEJIT_RESOLVE)
#undef ROPEJIT_RESOLVE
  if (lt.GetVersion() / 10000 != CUBLAS_VER_MAJOR)
    out.error = concat("cuBLASLt (", clipped_path(out.path), ") is version ", lt.GetVersion(),
                       "; this build needs major version ", CUBLAS_VER_MAJOR);
  return out;
}

const LoadedLt& loaded() {
  static const LoadedLt l = load();
  return l;
}

const Lt& lt() {
  const LoadedLt& l = loaded();
  if (!l.error.empty()) fail(ErrorCode::no_driver, l.error);
  return l.lt;
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const char* name = loaded().error.empty() ? loaded().lt.GetStatusString(s) : nullptr;
  if (name) fail(ErrorCode::driver, what, " failed: ", name, " (", int(s), ")");
  fail(ErrorCode::driver, what, " failed: cuBLAS status ", int(s));
}

// The largest power of two up to 256 that every row's address is a multiple of.
uint32_t alignment(const void* p, int64_t ld, int64_t elem) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | uint64_t(ld * elem) | 256;
  return uint32_t(bits & (~bits + 1));
}

struct GemmKey {
  CUcontext ctx;
  int32_t dtype;
  int64_t m, n, k, lda, ldb, ldd;
  uint32_t align_a, align_b, align_d;
  size_t workspace;
  bool operator==(const GemmKey& o) const {
    return ctx == o.ctx && dtype == o.dtype && m == o.m && n == o.n && k == o.k && lda == o.lda &&
           ldb == o.ldb && ldd == o.ldd && align_a == o.align_a && align_b == o.align_b &&
           align_d == o.align_d && workspace == o.workspace;
  }
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& g) const {
    size_t h = std::hash<const void*>()(g.ctx);
    for (const int64_t v :
         {int64_t(g.dtype), g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int64_t(g.align_a),
          int64_t(g.align_b), int64_t(g.align_d), int64_t(g.workspace)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// Descriptors and the chosen algorithm of one shape; kept for the process (a few hundred bytes
// per distinct token count).
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

std::shared_mutex plans_mutex;
std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> plans;
std::unordered_map<CUcontext, cublasLtHandle_t> handles;  // under plans_mutex

// Owns cuBLASLt's descriptors while a plan is being made: a failure midway releases them.
struct PlanParts {
  const Lt& l;
  GemmPlan p;
  cublasLtMatmulPreference_t pref = nullptr;
  bool keep = false;
  ~PlanParts() {
    if (pref) l.MatmulPreferenceDestroy(pref);
    if (keep) return;
    if (p.a) l.MatrixLayoutDestroy(p.a);
    if (p.b) l.MatrixLayoutDestroy(p.b);
    if (p.d) l.MatrixLayoutDestroy(p.d);
    if (p.desc) l.MatmulDescDestroy(p.desc);
  }
};

GemmPlan make_plan(const Lt& l, cublasLtHandle_t handle, const GemmKey& key) {
  const cudaDataType_t type = key.dtype == int32_t(DType::bf16) ? CUDA_R_16BF : CUDA_R_16F;
  PlanParts parts{l, {}};
  GemmPlan& p = parts.p;
  check_lt(l.MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t trans = CUBLAS_OP_T, none = CUBLAS_OP_N;
  check_lt(l.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans),
           "cublasLtMatmulDescSetAttribute");
  check_lt(l.MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none),
           "cublasLtMatmulDescSetAttribute");
  // Column major: the weight is k x n (ld ldb) read transposed, the activations k x m (ld lda),
  // the output n x m (ld ldd).
  check_lt(l.MatrixLayoutCreate(&p.a, type, uint64_t(key.k), uint64_t(key.n), key.ldb),
           "cublasLtMatrixLayoutCreate");
  check_lt(l.MatrixLayoutCreate(&p.b, type, uint64_t(key.k), uint64_t(key.m), key.lda),
           "cublasLtMatrixLayoutCreate");
  check_lt(l.MatrixLayoutCreate(&p.d, type, uint64_t(key.n), uint64_t(key.m), key.ldd),
           "cublasLtMatrixLayoutCreate");
  check_lt(l.MatmulPreferenceCreate(&parts.pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = key.workspace;
  check_lt(l.MatmulPreferenceSetAttribute(parts.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof ws),
           "cublasLtMatmulPreferenceSetAttribute");
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t values[4] = {key.align_b, key.align_a, key.align_d, key.align_d};  // Lt's A: B
  for (int i = 0; i < 4; ++i)
    check_lt(l.MatmulPreferenceSetAttribute(parts.pref, which[i], &values[i], sizeof values[i]),
             "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      l.MatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, parts.pref, 1, &result, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found < 1))
    fail(ErrorCode::driver, "cuBLASLt has no algorithm for a ", key.m, " x ", key.n, " x ", key.k,
         " GEMM with leading dimensions ", key.lda, "/", key.ldb, "/", key.ldd, ", alignments ",
         key.align_a, "/", key.align_b, "/", key.align_d, " and ", ws, " bytes of workspace");
  check_lt(s, "cublasLtMatmulAlgoGetHeuristic");
  p.algo = result.algo;
  parts.keep = true;
  return p;
}

}  // namespace

const std::string& gemm_unavailable() { return loaded().error; }

size_t gemm_library_version() { return loaded().error.empty() ? loaded().lt.GetVersion() : 0; }

void gemm_prepare(CUcontext ctx) {
  const Lt& l = lt();
  std::unique_lock<std::shared_mutex> lock(plans_mutex);
  cublasLtHandle_t& h = handles[ctx];
  if (!h) check_lt(l.Create(&h), "cublasLtCreate");
}

void gemm(CUcontext ctx, const GemmCall& c) {
  const Lt& l = lt();
  const int64_t elem = 2;
  const GemmKey key{ctx,
                    int32_t(c.dtype),
                    c.m,
                    c.n,
                    c.k,
                    c.lda,
                    c.ldb,
                    c.ldd,
                    alignment(c.a, c.lda, elem),
                    alignment(c.b, c.ldb, elem),
                    alignment(c.d, c.ldd, elem),
                    c.workspace ? c.workspace_bytes : 0};
  const GemmPlan* plan = nullptr;
  cublasLtHandle_t handle = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(plans_mutex);
    const auto it = plans.find(key);
    if (it != plans.end()) {
      plan = &it->second;  // nodes never move or die
      handle = handles.at(ctx);
    }
  }
  if (!plan) {
    std::unique_lock<std::shared_mutex> lock(plans_mutex);
    cublasLtHandle_t& h = handles[ctx];
    if (!h) check_lt(l.Create(&h), "cublasLtCreate");
    handle = h;
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(l, h, key)).first;
    plan = &it->second;
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Lt's A is the weight (our B), its B the activations (our A); C is D with beta 0.
  check_lt(l.Matmul(handle, plan->desc, &alpha, c.b, plan->a, c.a, plan->b, &beta, c.d, plan->d,
                    c.d, plan->d, &plan->algo, c.workspace, key.workspace,
                    reinterpret_cast<cudaStream_t>(c.stream)),
           "cublasLtMatmul");
}

}  // namespace ropejit::detail
