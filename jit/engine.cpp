// Engine: image cache (memory -> disk -> NVRTC), per-context modules, and the launch path.
// A cached apply() is: validate, one shared-locked hash lookup (the plan holds the function
// and the device facts), one cuLaunchKernel.
#include "jit/engine.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <system_error>

#include "jit/driver.hpp"
#include "jit/errors.hpp"
#include "jit/gemm.hpp"
#include "jit/nvrtc.hpp"
#include "jit/render.hpp"

namespace ropejit::detail {
namespace {
constexpr int kMaxPairs = 256;  // head_dim <= 512
static_assert(offsetof(ropejit_dev::PairTable<kMaxPairs>, turns) == 8, "PairTable layout");
static_assert(sizeof(ropejit_dev::RopeParams) % 8 == 0 && sizeof(ropejit_dev::FusedParams) % 8 == 0,
              "a PairTable starts right after the block");

// One kernel launch: function, grid, block, dynamic shared memory, stream.
struct KernelLaunch {
  CUfunction fn;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  CUstream stream;
};

// Programmatic dependent launches need kernels compiled for sm_90 or later: their
// griddepcontrol.wait is compiled in for those targets only, so the decision follows the
// target the device's kernels are compiled for (DeviceInfo::image_cc), not the device (an NVRTC
// without sm_90 would give an sm_90 device PTX for an older target, with no wait in it).
// ROPEJIT_PDL=0 turns them off, to compare or to rule them out.
bool programmatic_launch(int image_cc) {
  static const bool allowed = [] {
    const char* env = std::getenv("ROPEJIT_PDL");
    return !(env && std::string(env) == "0");
  }();
  return allowed && image_cc >= 90;
}

// The target's compute capability: "sm_90" -> 90, "compute_100" -> 100.
int target_cc(const std::string& target) {
  const size_t at = target.find('_');
  return at == std::string::npos ? 0 : std::atoi(target.c_str() + at + 1);
}

// Launches `k`; `programmatic` lets it start while the stream's previous kernel finishes (the
// kernel waits for that grid's writes at entry: wait_for_producer in templates/rope_types.cuh).
void launch_kernel(const KernelLaunch& k, void** kernel_args, bool programmatic) {
  const Driver& d = driver();
  if (!programmatic) {
    check(d.LaunchKernel(k.fn, k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                         k.shared_bytes, k.stream, kernel_args, nullptr),
          "cuLaunchKernel");
    return;
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = k.grid[0];
  config.gridDimY = k.grid[1];
  config.gridDimZ = k.grid[2];
  config.blockDimX = k.block[0];
  config.blockDimY = k.block[1];
  config.blockDimZ = k.block[2];
  config.sharedMemBytes = k.shared_bytes;
  config.hStream = k.stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(d.LaunchKernelEx(&config, k.fn, kernel_args, nullptr), "cuLaunchKernelEx (programmatic)");
}
}  // namespace

struct Engine::ImageSlot {
  std::once_flag once;
  CacheEntry entry;
  std::string path;
};

struct Engine::FunctionSlot {
  std::once_flag once;
  LoadedFunction loaded;
};

namespace {

// The image cache's name for one compiled kernel (also the disk cache entry's identity).
std::string image_ident(const Spec& c, const KernelVariant& variant, const std::string& target) {
  return c.key() + "__" + variant.name() + "@" + target;
}

// Makes the primary context of the device owning `ptr` current for the scope of one call,
// when the calling thread has no current context.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext* ctx, const void* ptr, const char* name = "args.q.data")
      : d_(d) {
    check(d.CtxGetCurrent(ctx), "cuCtxGetCurrent");
    if (*ctx) return;
    int ordinal = 0;
    if (d.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
      invalid(name, " (", ptr, ") is not device memory and no CUDA context is current");
    CUdevice dev = 0;
    check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
    check(d.DevicePrimaryCtxRetain(ctx, dev), "cuDevicePrimaryCtxRetain");
    check(d.CtxPushCurrent(*ctx), "cuCtxPushCurrent");
    pushed_ = true;
  }
  ~ContextScope() {
    CUcontext ignored = nullptr;
    if (pushed_) d_.CtxPopCurrent(&ignored);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const Driver& d_;
  bool pushed_ = false;
};

}  // namespace

namespace {

void mix(uint64_t& h, uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

uint64_t hash_spec(const void* ctx, const Spec& s) {
  uint64_t h = std::hash<const void*>()(ctx);
  mix(h, uint64_t(s.layout) | uint64_t(s.dtype) << 4 | uint64_t(s.style) << 8 |
             uint64_t(s.positions) << 12 | uint64_t(s.index_type) << 16 | uint64_t(s.freqs) << 20 |
             uint64_t(s.table_dtype) << 24 | uint64_t(s.table_width) << 28 |
             uint64_t(s.direction) << 32 | uint64_t(s.in_place) << 36 | uint64_t(s.fusion) << 40 |
             uint64_t(s.norm) << 44 | uint64_t(s.out_store) << 48 | uint64_t(s.cache) << 52 |
             uint64_t(s.cache_store) << 56);
  mix(h, uint64_t(uint32_t(s.head_dim)) << 32 | uint32_t(s.rotary_dim));
  return h;
}

}  // namespace

size_t Engine::FunctionKeyHash::operator()(const FunctionKey& k) const {
  uint64_t h = hash_spec(k.ctx, k.spec);
  mix(h, uint64_t(uint32_t(k.variant.vec)) << 40 |
             uint64_t(uint32_t(k.variant.heads_per_thread)) << 20 |
             uint64_t(k.variant.table_vec) << 60 | uint64_t(k.variant.grid_stride) << 61 |
             uint64_t(k.variant.narrow) << 62 | uint32_t(k.variant.max_threads) |
             uint64_t(uint32_t(k.variant.ring)) << 12);
  return size_t(h);
}

size_t Engine::PlanKeyHash::operator()(const PlanKey& k) const {
  uint64_t h = hash_spec(k.ctx, k.spec);
  mix(h, uint64_t(k.bucket));
  mix(h, uint64_t(uint32_t(k.q_heads)) << 32 | uint32_t(k.k_heads));
  mix(h, uint64_t(uint32_t(k.v_heads)));
  mix(h, uint64_t(uint32_t(k.align)) | uint64_t(uint32_t(k.table_align)) << 32 |
             uint64_t(k.narrow) << 63);
  return size_t(h);
}

size_t Engine::ProjPlanKeyHash::operator()(const ProjPlanKey& k) const {
  const QkvProjSpec& s = k.spec;
  uint64_t h = std::hash<const void*>()(k.ctx);
  mix(h, uint64_t(s.dtype) | uint64_t(s.style) << 4 | uint64_t(s.positions) << 8 |
             uint64_t(s.index_type) << 12 | uint64_t(s.freqs) << 16 |
             uint64_t(s.table_dtype) << 20 | uint64_t(s.table_width) << 24 |
             uint64_t(s.norm) << 28);
  mix(h, uint64_t(uint32_t(s.head_dim)) << 32 | uint32_t(s.rotary_dim));
  mix(h, uint64_t(k.bucket));
  mix(h, uint64_t(k.hidden));
  mix(h, uint64_t(uint32_t(k.q_heads)) << 32 | uint32_t(k.kv_heads));
  return size_t(h);
}

size_t Engine::FfnPlanKeyHash::operator()(const FfnPlanKey& k) const {
  uint64_t h = std::hash<const void*>()(k.ctx);
  mix(h, uint64_t(k.spec.dtype) | uint64_t(k.spec.norm) << 8 | uint64_t(k.spec.act) << 16 |
             uint64_t(k.spec.weights) << 24);
  mix(h, uint64_t(k.bucket));
  mix(h, uint64_t(k.hidden));
  mix(h, uint64_t(k.intermediate));
  return size_t(h);
}

size_t Engine::NormPlanKeyHash::operator()(const NormPlanKey& k) const {
  uint64_t h = std::hash<const void*>()(k.ctx);
  mix(h, uint64_t(k.spec.dtype) | uint64_t(k.spec.norm) << 8 | uint64_t(k.spec.residual) << 16 |
             uint64_t(uint32_t(k.vecs)) << 32);
  return size_t(h);
}

Engine& Engine::instance() {
  static Engine engine;
  return engine;
}

Engine::Engine() : disk_(DiskCache::default_dir()) {}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void Engine::clear_memory_cache() {
  std::lock_guard<std::mutex> lock(images_mutex_);
  images_.clear();
}

const CacheEntry& Engine::image_by(const std::string& ident, const std::string& target,
                                   const std::function<RenderedKernel()>& render,
                                   std::string* path) {
  std::shared_ptr<ImageSlot> slot;
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(images_mutex_);
    std::shared_ptr<ImageSlot>& s = images_[ident];
    if (!s) {
      s = std::make_shared<ImageSlot>();
      fresh = true;
    }
    slot = s;
  }
  // Only the first caller for `ident` compiles; others wait here without any global lock.
  std::call_once(slot->once, [&] {
    const RenderedKernel r = render();
    const NvrtcVersion nv = nvrtc_version();
    const std::string hash =
        content_hash(r.source, compile_options(target), target, nv.major, nv.minor);
    auto loaded = [&] {
      if (!disk_.load(hash, ident, &slot->entry)) return false;
      slot->path = disk_.path_for(hash);
      std::lock_guard<std::mutex> lock(stats_mutex_);
      ++stats_.disk_hits;
      return true;
    };
    if (loaded()) return;
    // Another process may be compiling this entry: wait for it, then take what it published.
    const EntryLock held = disk_.lock(hash);
    if (held.held() && loaded()) return;
    CompileResult cr = compile(r.source, r.entry + ".cu", r.key, target);
    slot->entry = CacheEntry{ident, std::move(cr.image), cr.is_ptx};
    slot->path = disk_.store(hash, slot->entry);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.nvrtc_compiles;
  });
  if (!fresh) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.memory_hits;
  }
  if (path) *path = slot->path;
  return slot->entry;
}

const CacheEntry& Engine::image(const Spec& c, const KernelVariant& variant,
                                const std::string& target, std::string* path) {
  return image_by(
      image_ident(c, variant, target), target, [&] { return render(c, variant); }, path);
}

namespace {

// `work` on another thread, or on this one when no thread can be created; the future carries
// its outcome.
std::future<void> on_another_thread(std::function<void()> work) {
  try {
    return std::async(std::launch::async, work);
  } catch (const std::system_error&) {
    std::promise<void> done;  // no thread to spare: do it here
    try {
      work();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
    return done.get_future();
  }
}

}  // namespace

std::future<void> Engine::image_async(const Spec& c, const KernelVariant& variant,
                                      const std::string& target, std::string* path) {
  return on_another_thread([this, c, variant, target, path] { image(c, variant, target, path); });
}

bool Engine::sibling_failed(const std::string& ident) const {
  std::lock_guard<std::mutex> lock(failed_mutex_);
  return failed_siblings_.count(ident) > 0;
}

bool Engine::image_requested(const Spec& c, const KernelVariant& variant,
                             const std::string& target) const {
  std::lock_guard<std::mutex> lock(images_mutex_);
  return images_.count(image_ident(c, variant, target)) > 0;
}

const DeviceInfo& Engine::device_info(CUcontext ctx) {
  {
    std::shared_lock<std::shared_mutex> lock(devices_mutex_);
    const auto it = devices_.find(ctx);
    if (it != devices_.end()) return it->second;
  }
  const Driver& d = driver();
  CUdevice dev = 0;
  check(d.CtxGetDevice(&dev), "cuCtxGetDevice");
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    check(d.DeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
    return v;
  };
  DeviceInfo info;
  info.ordinal = int(dev);
  info.cc = 10 * attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) +
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  info.max_shared_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  char name[256] = {};
  check(d.DeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  info.name = name;
  info.memory_gbps = peak_memory_gbps(info.name, attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
                                      attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH));
  try {
    info.image_cc = target_cc(target_for(info.cc));
  } catch (const Error&) {
    info.image_cc = 0;  // a GPU this NVRTC cannot target: its first compile says so
  }
  std::unique_lock<std::shared_mutex> lock(devices_mutex_);
  return devices_.emplace(ctx, std::move(info)).first->second;  // nodes never move or die
}

void Engine::load_once(FunctionSlot* slot, CUstream stream,
                       const std::function<std::string()>& what,
                       const std::function<const CacheEntry&()>& image,
                       const std::function<std::string()>& entry, int shared_optin) {
  std::call_once(slot->once, [&] {
    const Driver& d = driver();
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    check(d.StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
      invalid("first call of ", what(),
              " happens during CUDA graph capture; loading a module there could break the "
              "capture: call it once before capturing (or precompile with `ropejit compile`)");
    const CacheEntry& e = image();
    CUmodule module = nullptr;
    check(d.ModuleLoadData(&module, e.image.data()), "cuModuleLoadData");
    check(d.ModuleGetFunction(&slot->loaded.fn, module, entry().c_str()), "cuModuleGetFunction");
    check(d.FuncGetAttribute(&slot->loaded.max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                             slot->loaded.fn),
          "cuFuncGetAttribute");
    check(d.FuncGetAttribute(&slot->loaded.regs, CU_FUNC_ATTRIBUTE_NUM_REGS, slot->loaded.fn),
          "cuFuncGetAttribute");
    if (shared_optin > 0) {
      // Past 48 KB of dynamic shared memory a kernel must ask: up to what the device allows a
      // block, less the kernel's static shared memory.
      int static_bytes = 0;
      check(d.FuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, slot->loaded.fn),
            "cuFuncGetAttribute");
      check(d.FuncSetAttribute(slot->loaded.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               shared_optin - static_bytes),
            "cuFuncSetAttribute");
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.module_loads;
  });
}

const Engine::LoadedFunction& Engine::function(CUcontext ctx, const Spec& c,
                                               const KernelVariant& variant, CUstream stream) {
  const FunctionKey key{ctx, c, variant};
  FunctionSlot* slot = nullptr;  // slots are never erased, so the pointer outlives the lock
  {
    std::shared_lock<std::shared_mutex> lock(functions_mutex_);
    const auto it = functions_.find(key);
    if (it != functions_.end()) slot = it->second.get();
  }
  if (!slot) {
    std::unique_lock<std::shared_mutex> lock(functions_mutex_);
    std::unique_ptr<FunctionSlot>& s = functions_[key];
    if (!s) s = std::make_unique<FunctionSlot>();
    slot = s.get();
  }
  load_once(
      slot, stream, [&] { return concat(c.key(), " (", variant.name(), ")"); },
      [&]() -> const CacheEntry& { return image(c, variant, target_for(device_info(ctx).cc)); },
      [&] { return entry_name(c.key(), variant); },
      variant.ring > 0 ? device_info(ctx).max_shared_per_block : 0);
  return slot->loaded;
}

std::pair<LaunchConfig, int> Engine::planned(const Spec& spec, const Args& args) {
  const Spec c = spec.canonical();
  const CallShape shape = check_call(c, args);
  CUcontext ctx = nullptr;
  const ContextScope scope(driver(), &ctx, args.q.data);
  const Plan& p = plan(ctx, c, shape, static_cast<CUstream>(args.stream));
  return {p.cfg, p.fn->regs};
}

Engine::Plan Engine::make_plan(CUcontext ctx, const Spec& c, const CallShape& shape,
                               const LaunchConfig& cfg, const DeviceInfo& device, CUstream stream) {
  Plan p{cfg, &function(ctx, c, cfg.kernel, stream), &device};
  p.block_x = unsigned(chunks(c, cfg.kernel.vec));
  p.shared_bytes = unsigned(shared_bytes(c, cfg, shape.q_heads + shape.k_heads));
  const int64_t threads = int64_t(p.block_x) * cfg.rows * cfg.tokens_per_block;
  if (threads > p.fn->max_threads)
    fail(ErrorCode::internal, c.key(), ": ", threads, " threads exceed the kernel's limit of ",
         p.fn->max_threads);
  return p;
}

LaunchPolicy& Engine::policy() const {
  LaunchPolicy* p = policy_.load(std::memory_order_acquire);
  if (!p)
    fail(ErrorCode::internal,
         "no launch policy is installed: launch through ropejit::apply (api/), which installs "
         "autotune's");
  return *p;
}

const Engine::Plan* Engine::find_plan(const PlanKey& key) {
  std::shared_lock<std::shared_mutex> lock(plans_mutex_);
  const auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : &it->second;  // nodes never move or die
}

LaunchConfig Engine::choose_config(const Spec& c, const CallShape& shape, const DeviceInfo& device,
                                   bool capturing) {
  const LaunchConfig cfg = policy().choose(c, shape, device, capturing);
  if (const std::string why = illegal_reason(c, shape, cfg, device); !why.empty())
    fail(ErrorCode::internal, "policy chose ", cfg.name(), " for ", c.key(), ": ", why);
  return cfg;
}

std::vector<KernelVariant> Engine::sibling_variants(const Spec& c, const CallShape& shape,
                                                    const DeviceInfo& device,
                                                    const KernelVariant& chosen) {
  const std::string target = target_for(device.cc);
  std::vector<KernelVariant> out;
  for (const KernelVariant& v : policy().variants(c, shape, device))
    if (!(v == chosen) && !sibling_failed(image_ident(c, v, target))) out.push_back(v);
  return out;
}

void Engine::load_siblings(CUcontext ctx, const Spec& c, const std::vector<KernelVariant>& siblings,
                           std::vector<std::future<void>>& compiling, const std::string& target,
                           CUstream stream) {
  for (std::future<void>& f : compiling) {
    try {
      f.get();
    } catch (const std::exception&) {
      // function() below meets the same error and records it.
    }
  }
  for (const KernelVariant& v : siblings) {
    try {
      function(ctx, c, v, stream);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(failed_mutex_);
        failed_siblings_.insert(image_ident(c, v, target));
      }
      warn_once(concat("variant-", c.key(), "__", v.name()),
                concat("could not prepare ", c.key(), " (", v.name(),
                       ") for other shapes of the call: ", e.what()));
    }
  }
}

const Engine::Plan& Engine::plan(CUcontext ctx, const Spec& c, const CallShape& shape,
                                 CUstream stream) {
  const PlanKey key{ctx,
                    c,
                    token_bucket(shape.tokens),
                    shape.q_heads,
                    shape.k_heads,
                    shape.align_bytes,
                    shape.table_align,
                    shape.narrow};
  if (const Plan* known = find_plan(key)) return *known;
  // Decided outside any lock: the policy may read the tuning file, or tune (which launches
  // through this engine).
  const DeviceInfo& device = device_info(ctx);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  const bool capturing = capture != CU_STREAM_CAPTURE_STATUS_NONE;
  const LaunchConfig cfg = choose_config(c, shape, device, capturing);
  // The other variants the policy may pick for this key (other buckets' kernels) are compiled
  // alongside, concurrently, and loaded now, outside any capture, so that a later shape never
  // loads a module. A sibling that failed once is not tried again here; the call that needs
  // it reports why.
  const std::string target = target_for(device.cc);
  std::vector<KernelVariant> siblings;
  std::vector<std::future<void>> compiling;
  if (!capturing) {
    siblings = sibling_variants(c, shape, device, cfg.kernel);
    for (const KernelVariant& v : siblings)
      if (!image_requested(c, v, target)) compiling.push_back(image_async(c, v, target));
  }
  const Plan p = make_plan(ctx, c, shape, cfg, device, stream);
  load_siblings(ctx, c, siblings, compiling, target, stream);
  std::unique_lock<std::shared_mutex> lock(plans_mutex_);
  return plans_.emplace(key, p).first->second;  // a racing thread's equal plan may win
}

void Engine::apply(const Spec& spec, const Args& args) {
  const Spec c = spec.canonical();
  const CallShape shape = check_call(c, args);
  if (shape.tokens == 0) return;
  launch(c, args, shape, nullptr);
}

void Engine::launch(const Spec& c, const Args& args, const CallShape& shape,
                    const LaunchConfig* requested) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.q.data);
  CUstream stream = static_cast<CUstream>(args.stream);
  const Plan* p = nullptr;
  Plan explicit_plan{};
  if (requested) {
    const DeviceInfo& dev = device_info(ctx);
    if (const std::string why = illegal_reason(c, shape, *requested, dev); !why.empty())
      invalid("launch configuration ", requested->name(), " is not legal for ", c.key(), ": ", why);
    explicit_plan = make_plan(ctx, c, shape, *requested, dev, stream);
    p = &explicit_plan;
  } else {
    p = &plan(ctx, c, shape, stream);
  }
  const LaunchConfig& cfg = p->cfg;
  // Plain kernels take the plain block, fused ones the whole (which starts with it); keys with
  // per-pair data append a PairTable (templates/rope_params.cuh) in a buffer of the block's
  // layout. The driver copies as many bytes as the kernel declares.
  ropejit_dev::FusedParams params = make_params(c, args, shape);
  void* block = c.fused() ? static_cast<void*>(&params) : static_cast<void*>(&params.rope);
  alignas(16) unsigned char
      with_pairs[sizeof(ropejit_dev::FusedParams) + sizeof(ropejit_dev::PairTable<kMaxPairs>)];
  if (needs_pair_table(c)) {
    const size_t head = c.fused() ? sizeof(params) : sizeof(params.rope);
    const PairData& pairs = pair_data(c, args);
    const size_t n = pairs.turns.size();
    const float attention = float(pairs.attention);
    std::memcpy(with_pairs, block, head);
    std::memcpy(with_pairs + head, &attention, sizeof attention);
    std::memset(with_pairs + head + 4, 0, 4);
    std::memcpy(with_pairs + head + 8, pairs.turns.data(), n * sizeof(double));
    std::memcpy(with_pairs + head + 8 + n * sizeof(double), pairs.rows.data(), n);
    block = with_pairs;
  }
  void* kernel_args[] = {block};
  const KernelLaunch k{
      p->fn->fn,
      {unsigned(grid_blocks(shape, cfg, *p->device)), unsigned(cfg.head_groups), 1},
      {p->block_x, unsigned(cfg.rows), unsigned(cfg.tokens_per_block)},
      p->shared_bytes,
      stream};
  launch_kernel(k, kernel_args, programmatic_launch(p->device->image_cc));
}

// ---------------------------------------------------------------------------------------------
// The decode block's QKV projection.
// ---------------------------------------------------------------------------------------------

namespace {

// A projection or FFN variant whose blocks form clusters needs sm_90; refused by name before
// anything is compiled for an older target.
void check_cluster_target(const ProjVariant& v, const std::string& target) {
  if (v.cluster > 1 && target_cc(target) < 90)
    invalid("projection variant ", v.name(), ": cluster (", v.cluster,
            ") needs thread-block clusters, sm_90 or newer (target ", target, ")");
}

// One launch of a projection or FFN kernel: grid (x, y, cluster), the cluster's blocks along z
// (rank = blockIdx.z) when the variant has one.
void launch_proj_kernel(CUfunction fn, const ProjShape& shape, const ProjVariant& v,
                        CUstream stream, void** kernel_args) {
  const Driver& d = driver();
  if (v.cluster <= 1) {
    check(d.LaunchKernel(fn, proj_grid_x(shape, v), proj_grid_y(shape, v), 1, unsigned(v.threads()),
                         1, 1, 0, stream, kernel_args, nullptr),
          "cuLaunchKernel");
    return;
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = 1;
  attr.value.clusterDim.y = 1;
  attr.value.clusterDim.z = unsigned(v.cluster);
  CUlaunchConfig config{};
  config.gridDimX = proj_grid_x(shape, v);
  config.gridDimY = proj_grid_y(shape, v);
  config.gridDimZ = unsigned(v.cluster);
  config.blockDimX = unsigned(v.threads());
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(d.LaunchKernelEx(&config, fn, kernel_args, nullptr), "cuLaunchKernelEx (cluster)");
}

}  // namespace

const CacheEntry& Engine::image(const QkvProjSpec& c, const ProjVariant& variant,
                                const std::string& target, std::string* path) {
  check_cluster_target(variant, target);
  return image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

std::future<void> Engine::image_async(const QkvProjSpec& c, const ProjVariant& variant,
                                      const std::string& target, std::string* path) {
  return on_another_thread([this, c, variant, target, path] { image(c, variant, target, path); });
}

const Engine::LoadedFunction& Engine::named_function(
    CUcontext ctx, const std::string& key, const std::string& variant, CUstream stream,
    const std::function<const CacheEntry&()>& image) {
  const std::string ident = concat(static_cast<const void*>(ctx), '/', key, "__", variant);
  FunctionSlot* slot = nullptr;  // slots are never erased
  {
    std::shared_lock<std::shared_mutex> lock(proj_mutex_);
    const auto it = named_functions_.find(ident);
    if (it != named_functions_.end()) slot = it->second.get();
  }
  if (!slot) {
    std::unique_lock<std::shared_mutex> lock(proj_mutex_);
    std::unique_ptr<FunctionSlot>& s = named_functions_[ident];
    if (!s) s = std::make_unique<FunctionSlot>();
    slot = s.get();
  }
  load_once(
      slot, stream, [&] { return concat(key, " (", variant, ")"); }, image,
      [&] { return entry_name(key, variant); });
  return slot->loaded;
}

const Engine::LoadedFunction& Engine::proj_function(CUcontext ctx, const QkvProjSpec& c,
                                                    const ProjVariant& variant, CUstream stream) {
  return named_function(ctx, c.key(), variant.name(), stream, [&]() -> const CacheEntry& {
    return image(c, variant, target_for(device_info(ctx).cc));
  });
}

const Engine::ProjPlan& Engine::proj_plan(CUcontext ctx, const QkvProjSpec& c,
                                          const QkvProjArgs& args, const ProjShape& shape,
                                          CUstream stream) {
  const ProjPlanKey key{
      ctx, c, proj_path_bucket(shape.tokens), shape.hidden, shape.q_heads, shape.kv_heads};
  {
    std::shared_lock<std::shared_mutex> lock(proj_mutex_);
    const auto it = proj_plans_.find(key);
    if (it != proj_plans_.end()) return it->second;  // nodes never move or die
  }
  const DeviceInfo& device = device_info(ctx);
  if (device.cc < 80)
    invalid("the QKV projection (", c.key(), ") needs tensor cores of compute capability 8.0 or ",
            "newer; this GPU is sm_", device.cc);
  const ProjVariant chosen = policy().choose_proj(c, shape, device);
  if (const std::string why = proj_variant_problem(chosen, c.weights == Weights::e4m3);
      !why.empty())
    fail(ErrorCode::internal, "policy chose ", chosen.name(), " for ", c.key(), ": ", why);
  const ProjPath path = policy().choose_proj_path(c, shape, device);
  if (path != ProjPath::fused && path != ProjPath::unfused)
    fail(ErrorCode::internal, "policy chose path ", int(path), " for ", c.key());
  // Every variant the policy may pick for the key is compiled now, concurrently, and loaded,
  // so a later token count never compiles (nor loads a module inside a graph capture); the
  // unfused path's kernels too, where this call could take it.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  std::vector<ProjVariant> all;
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE) all = policy().proj_variants(c, shape, device);
  if (std::find(all.begin(), all.end(), chosen) == all.end()) all.push_back(chosen);
  const std::string target = target_for(device.cc);
  std::vector<std::future<void>> compiling;
  for (const ProjVariant& v : all) compiling.push_back(image_async(c, v, target));
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE && gemm_unavailable().empty() &&
      proj_split_problem(c, args, shape, false).empty())
    prepare_once(ctx, proj_unfused_key(c, args),
                 [&] { prepare_unfused(ctx, c, args, shape, stream); });
  for (std::future<void>& f : compiling) f.get();  // rethrows a compile error
  const LoadedFunction* fn = nullptr;
  for (const ProjVariant& v : all) {
    const LoadedFunction& loaded = proj_function(ctx, c, v, stream);
    if (v == chosen) fn = &loaded;
  }
  std::unique_lock<std::shared_mutex> lock(proj_mutex_);
  return proj_plans_.emplace(key, ProjPlan{path, chosen, fn}).first->second;
}

void Engine::load_norm(CUcontext ctx, const RmsNormSpec& ns, const void* x, const void* weight,
                       int64_t hidden, CUstream stream) {
  RmsNormArgs n;
  n.rows = 1;
  n.hidden = hidden;
  n.x = x;
  n.weight = weight;
  n.out = const_cast<void*>(x);  // checked only, never launched
  const NormShape norm_shape = check_norm_call(ns, n);
  named_function(ctx, ns.key(), norm_shape.variant.name(), stream, [&]() -> const CacheEntry& {
    return image(ns, norm_shape.variant, target_for(device_info(ctx).cc));
  });
}

GemmCall Engine::normalized_operand(const RmsNormSpec& ns, bool normalize, int64_t tokens,
                                    int64_t hidden, const void* x, int64_t x_stride,
                                    const void* weight, double eps, void* workspace, void* stream) {
  GemmCall g;
  g.dtype = ns.dtype;
  g.m = tokens;
  g.k = hidden;
  g.a = x;
  g.lda = x_stride == 0 ? hidden : x_stride;
  if (!normalize) return g;
  RmsNormArgs n;
  n.rows = tokens;
  n.hidden = hidden;
  n.x = x;
  n.x_stride = g.lda;
  n.weight = weight;
  n.norm_eps = eps;
  n.out = workspace;
  n.out_stride = hidden;
  n.stream = stream;
  rms_norm(ns, n);
  g.a = workspace;
  g.lda = hidden;
  return g;
}

void Engine::prepare_unfused(CUcontext ctx, const QkvProjSpec& c, const QkvProjArgs& args,
                             const ProjShape& shape, CUstream stream) {
  if (c.norm != Norm::none)
    load_norm(ctx, proj_norm_spec(c), args.x, args.norm_weight, shape.hidden, stream);
  // The RoPE key's kernels the policy may pick at this alignment, loaded without choosing a
  // launch (so nothing is tuned or looked up in the tuning file here).
  const Spec rs = proj_rope_spec(c, args).canonical();
  const CallShape rope_shape = check_call(rs, proj_rope_args(c, args));
  for (const KernelVariant& v : policy().variants(rs, rope_shape, device_info(ctx)))
    function(ctx, rs, v, stream);
  if (c.weights == Weights::e4m3) dequant_function(ctx, c.dtype, stream);
  gemm_prepare(ctx);  // cuBLASLt's handle for the context
}

bool Engine::unfused_ready(CUcontext ctx, const std::string& key) const {
  std::shared_lock<std::shared_mutex> lock(proj_mutex_);
  return unfused_ready_.count(concat(static_cast<const void*>(ctx), '/', key)) != 0;
}

void Engine::prepare_once(CUcontext ctx, const std::string& key,
                          const std::function<void()>& prepare) {
  if (unfused_ready(ctx, key)) return;
  try {
    prepare();
  } catch (const Error& e) {
    // The fused path does not need any of it: warn, and keep the unfused path off while
    // capturing (outside a capture a later call prepares what it needs).
    warn_once("unfused-prepare:" + key,
              concat("ropejit: the unfused path of ", key, " could not be prepared (", e.what(),
                     "); calls inside a CUDA graph capture run fused (or, for a key without a "
                     "fused kernel, fail there)"));
    return;
  }
  std::unique_lock<std::shared_mutex> lock(proj_mutex_);
  unfused_ready_.insert(concat(static_cast<const void*>(ctx), '/', key));
}

bool Engine::take_unfused(CUcontext ctx, const std::string& key, CUstream stream,
                          const std::function<void()>& plan_steps) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE && !unfused_ready(ctx, key)) return false;
  try {
    plan_steps();  // every step's launch decided before any is launched
  } catch (const Error& e) {
    warn_once(
        "unfused-plan:" + key,
        concat("ropejit: ", key, " runs fused where the unfused path was chosen (", e.what(), ")"));
    return false;
  }
  return true;
}

// Keys without a fused kernel (proj_fused_problem) take the unfused path at every size; a call
// that cannot take it, or asks for the fused path, is refused with both reasons.
static void check_unfused_only(const QkvProjSpec& c, const QkvProjArgs& args,
                               const ProjShape& shape, bool need_workspace) {
  const std::string fused = proj_fused_problem(c);
  if (fused.empty()) return;
  if (args.path == ProjPath::fused) invalid("args.path is fused, but ", fused);
  if (const std::string why = proj_split_problem(c, args, shape, need_workspace); !why.empty())
    invalid(why, " (", c.key(), " has the unfused path only: ", fused, ")");
}

void Engine::qkv_projection(const QkvProjSpec& spec, const QkvProjArgs& args) {
  const QkvProjSpec c = spec.canonical();
  const ProjShape shape = check_proj_call(c, args);
  check_unfused_only(c, args, shape, shape.tokens > 0);
  if (shape.tokens == 0) return;
  if (args.path == ProjPath::unfused || !proj_fused_problem(c).empty())
    return launch_proj_unfused(c, args, shape);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const ProjPlan& p = proj_plan(ctx, c, args, shape, stream);
  if (args.path == ProjPath::automatic && p.path == ProjPath::unfused &&
      gemm_unavailable().empty() && proj_split_problem(c, args, shape, true).empty() &&
      take_unfused(ctx, proj_unfused_key(c, args), stream,
                   [&] { planned(proj_rope_spec(c, args), proj_rope_args(c, args)); }))
    return launch_proj_unfused(c, args, shape);
  launch_fused(*p.fn, p.variant, c, args, shape, stream);
}

ProjPath Engine::qkv_projection_path(const QkvProjSpec& spec, const QkvProjArgs& args,
                                     bool ignore_workspace) {
  const QkvProjSpec c = spec.canonical();
  QkvProjArgs probe = args;  // a forced unfused call is checked below, its workspace as asked
  if (probe.path == ProjPath::unfused) probe.path = ProjPath::automatic;
  const ProjShape shape = check_proj_call(c, probe);
  check_unfused_only(c, args, shape, !ignore_workspace);
  if (!proj_fused_problem(c).empty()) return ProjPath::unfused;
  if (args.path == ProjPath::unfused)
    if (const std::string why = proj_split_problem(c, args, shape, !ignore_workspace); !why.empty())
      invalid(why, " (args.path is unfused)");
  if (args.path != ProjPath::automatic) return args.path;
  if (shape.tokens == 0) return ProjPath::fused;
  CUcontext ctx = nullptr;
  const ContextScope scope(driver(), &ctx, args.x, "args.x");
  const ProjPlan& p = proj_plan(ctx, c, args, shape, static_cast<CUstream>(args.stream));
  if (p.path == ProjPath::unfused && gemm_unavailable().empty() &&
      proj_split_problem(c, args, shape, !ignore_workspace).empty())
    return ProjPath::unfused;
  return ProjPath::fused;
}

void Engine::launch_proj(const QkvProjSpec& c, const QkvProjArgs& args, const ProjShape& shape,
                         const ProjVariant* requested) {
  if (const std::string why = proj_fused_problem(c); !why.empty())
    invalid(c.key(), " has no fused kernel: ", why);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  if (!requested) {
    const ProjPlan& p = proj_plan(ctx, c, args, shape, stream);
    return launch_fused(*p.fn, p.variant, c, args, shape, stream);
  }
  if (const std::string why = proj_variant_problem(*requested, c.weights == Weights::e4m3);
      !why.empty())
    invalid("projection variant ", requested->name(), " is not legal: ", why);
  if (device_info(ctx).cc < 80)
    invalid("the QKV projection (", c.key(), ") needs compute capability 8.0 or newer");
  launch_fused(proj_function(ctx, c, *requested, stream), *requested, c, args, shape, stream);
}

void Engine::launch_fused(const LoadedFunction& fn, const ProjVariant& variant,
                          const QkvProjSpec& c, const QkvProjArgs& args, const ProjShape& shape,
                          CUstream stream) {
  ropejit_dev::ProjParams params = make_proj_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(fn.fn, shape, variant, stream, kernel_args);
}

void Engine::launch_proj_unfused(const QkvProjSpec& c, const QkvProjArgs& args,
                                 const ProjShape& shape) {
  if (const std::string why = proj_split_problem(c, args, shape, true); !why.empty()) invalid(why);
  if (!gemm_unavailable().empty()) fail(ErrorCode::no_driver, gemm_unavailable());
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  if (device_info(ctx).cc < 80)
    invalid("the QKV projection (", c.key(), ") needs compute capability 8.0 or newer");
  CUstream stream = static_cast<CUstream>(args.stream);
  // A key without a fused kernel has no plan whose first use prepares this path: its first call
  // outside a capture does, once.
  if (!proj_fused_problem(c).empty()) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    check(d.StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
    if (capture == CU_STREAM_CAPTURE_STATUS_NONE)
      prepare_once(ctx, proj_unfused_key(c, args),
                   [&] { prepare_unfused(ctx, c, args, shape, stream); });
  }
  const int64_t elem = element_bytes(c.dtype);
  char* workspace = static_cast<char*>(args.workspace);
  const size_t norm_bytes = proj_norm_bytes(c, shape.tokens, shape.hidden);
  const size_t chunk_bytes = proj_chunk_bytes(c, shape.hidden, shape.q_heads, shape.kv_heads);
  // The RoPE step's launch is decided first, and the dequantization kernel of e4m3 weights
  // loaded: a refusal (ROPEJIT_TUNING=frozen without its entry, say) then comes before anything
  // is written.
  planned(proj_rope_spec(c, args), proj_rope_args(c, args));
  const LoadedFunction* dequant =
      c.weights == Weights::e4m3 ? &dequant_function(ctx, c.dtype, stream) : nullptr;

  // 1. RMSNorm into the workspace (rounded once to the dtype, as torch's module does).
  GemmCall g = normalized_operand(proj_norm_spec(c), c.norm != Norm::none, shape.tokens,
                                  shape.hidden, args.x, args.x_stride, args.norm_weight,
                                  args.norm_eps, workspace, args.stream);
  char* chunk = workspace + norm_bytes;  // e4m3 weights: dequantized rows
  g.workspace = chunk + chunk_bytes;
  g.workspace_bytes = args.workspace_bytes - norm_bytes - chunk_bytes;
  g.stream = stream;

  // 2. The projection: one GEMM when q, k and v are heads of one packed tensor, else one each.
  const int64_t wstride = args.weight_stride == 0 ? shape.hidden : args.weight_stride;
  const int64_t welem = c.weights == Weights::e4m3 ? 1 : elem;
  const int64_t D = c.head_dim;
  const Tensor* outs[3] = {&args.q, &args.k, &args.v};
  const int64_t heads[3] = {shape.q_heads, shape.kv_heads, shape.kv_heads};
  auto row_stride = [&](const Tensor& t, int64_t n) {
    return shape.tokens > 1 ? t.stride_seq : std::max(t.stride_seq, n);
  };
  const char* q0 = static_cast<const char*>(args.q.data);
  const bool packed = args.k.data == q0 + shape.q_heads * D * elem &&
                      args.v.data == q0 + (shape.q_heads + shape.kv_heads) * D * elem &&
                      args.k.stride_seq == args.q.stride_seq &&
                      args.v.stride_seq == args.q.stride_seq;
  if (packed) {
    const int64_t rows = (shape.q_heads + 2 * shape.kv_heads) * D;
    g.ldd = row_stride(args.q, rows);
    weight_gemm(ctx, g, dequant, args.weight, wstride, args.weight_scale, rows, args.q.data, chunk);
  } else {
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = heads[i] * D;
      g.ldd = row_stride(*outs[i], rows);
      weight_gemm(ctx, g, dequant, static_cast<const char*>(args.weight) + row * wstride * welem,
                  wstride, args.weight_scale ? args.weight_scale + row : nullptr, rows,
                  outs[i]->data, chunk);
      row += rows;
    }
  }

  // 3. RoPE in place on q and k (one launch, overlapping the GEMM's end where it can).
  apply(proj_rope_spec(c, args), proj_rope_args(c, args));
}

const CacheEntry& Engine::dequant_image(DType dtype, const std::string& target, std::string* path) {
  return image_by(
      dequant_key(dtype) + "__" + kDequantVariant + "@" + target, target,
      [&] { return render_dequant(dtype); }, path);
}

const Engine::LoadedFunction& Engine::dequant_function(CUcontext ctx, DType dtype,
                                                       CUstream stream) {
  return named_function(
      ctx, dequant_key(dtype), kDequantVariant, stream,
      [&]() -> const CacheEntry& { return dequant_image(dtype, target_for(device_info(ctx).cc)); });
}

void Engine::weight_gemm(CUcontext ctx, GemmCall g, const LoadedFunction* dequant,
                         const void* weight, int64_t wstride, const float* scale, int64_t rows,
                         void* d, void* chunk) {
  if (!dequant) {
    g.n = rows;
    g.b = weight;
    g.ldb = wstride;
    g.d = d;
    return gemm(ctx, g);
  }
  // The kernel's 16-code vectors: rows of a multiple of 16 codes, 16-byte aligned (check_hidden
  // and check_matrix saw to both).
  if (g.k % kDequantCodesPerThread != 0 || wstride % 16 != 0 ||
      reinterpret_cast<uintptr_t>(weight) % 16 != 0)
    fail(ErrorCode::internal, "e4m3 weights of ", g.k, " codes per row, ", wstride, " apart, at ",
         weight, ": not 16-byte vectors");
  const int64_t per_chunk = dequant_chunk_rows(g.dtype, g.k);
  const int64_t elem = element_bytes(g.dtype);
  for (int64_t first = 0; first < rows; first += per_chunk) {
    const int64_t n = std::min(per_chunk, rows - first);
    // Launched in stream order (not programmatically): it overwrites the chunk the previous
    // chunk's GEMM reads.
    ropejit_dev::DequantParams p = make_dequant_params(
        static_cast<const char*>(weight) + first * wstride, wstride, scale + first, chunk, n, g.k);
    void* kernel_args[] = {&p};
    const KernelLaunch k{dequant->fn,
                         {dequant_grid_x(g.k), dequant_grid_y(n), 1},
                         {unsigned(kDequantThreads), 1, 1},
                         0,
                         g.stream};
    launch_kernel(k, kernel_args, false);
    g.n = n;
    g.b = chunk;
    g.ldb = g.k;
    g.d = static_cast<char*>(d) + first * elem;
    gemm(ctx, g);
  }
}

// ---------------------------------------------------------------------------------------------
// The FFN's gate/up half.
// ---------------------------------------------------------------------------------------------

const CacheEntry& Engine::image(const FfnSpec& c, const ProjVariant& variant,
                                const std::string& target, std::string* path) {
  check_cluster_target(variant, target);
  return image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

std::future<void> Engine::image_async(const FfnSpec& c, const ProjVariant& variant,
                                      const std::string& target, std::string* path) {
  return on_another_thread([this, c, variant, target, path] { image(c, variant, target, path); });
}

const CacheEntry& Engine::glu_image(const FfnSpec& c, const GluVariant& variant,
                                    const std::string& target, std::string* path) {
  return image_by(
      glu_key(c) + "__" + variant.name() + "@" + target, target,
      [&] { return render_glu(c, variant); }, path);
}

const Engine::LoadedFunction& Engine::ffn_function(CUcontext ctx, const FfnSpec& c,
                                                   const ProjVariant& variant, CUstream stream) {
  return named_function(ctx, c.key(), variant.name(), stream, [&]() -> const CacheEntry& {
    return image(c, variant, target_for(device_info(ctx).cc));
  });
}

const Engine::LoadedFunction& Engine::glu_function(CUcontext ctx, const FfnSpec& c,
                                                   const GluVariant& variant, CUstream stream) {
  return named_function(ctx, glu_key(c), variant.name(), stream, [&]() -> const CacheEntry& {
    return glu_image(c, variant, target_for(device_info(ctx).cc));
  });
}

const Engine::ProjPlan& Engine::ffn_plan(CUcontext ctx, const FfnSpec& c, const FfnArgs& args,
                                         const FfnShape& shape, CUstream stream) {
  const FfnPlanKey key{ctx, c, proj_path_bucket(shape.tokens), shape.hidden, shape.intermediate};
  {
    std::shared_lock<std::shared_mutex> lock(proj_mutex_);
    const auto it = ffn_plans_.find(key);
    if (it != ffn_plans_.end()) return it->second;
  }
  const DeviceInfo& device = device_info(ctx);
  if (device.cc < 80)
    invalid("the FFN's gate/up (", c.key(), ") needs tensor cores of compute capability 8.0 or ",
            "newer; this GPU is sm_", device.cc);
  const ProjShape view = shape.proj();
  const ProjVariant chosen = policy().choose_ffn(c, view, device);
  if (const std::string why = proj_variant_problem(chosen, c.weights == Weights::e4m3);
      !why.empty())
    fail(ErrorCode::internal, "policy chose ", chosen.name(), " for ", c.key(), ": ", why);
  const ProjPath path = policy().choose_ffn_path(c, view, device);
  if (path != ProjPath::fused && path != ProjPath::unfused)
    fail(ErrorCode::internal, "policy chose path ", int(path), " for ", c.key());
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  std::vector<ProjVariant> all;
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE) all = policy().ffn_variants(c, device);
  if (std::find(all.begin(), all.end(), chosen) == all.end()) all.push_back(chosen);
  const std::string target = target_for(device.cc);
  std::vector<std::future<void>> compiling;
  for (const ProjVariant& v : all) compiling.push_back(image_async(c, v, target));
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE && gemm_unavailable().empty() &&
      ffn_split_problem(c, args, shape, false).empty())
    prepare_once(ctx, c.key(), [&] { prepare_ffn_unfused(ctx, c, args, shape, stream); });
  for (std::future<void>& f : compiling) f.get();
  const LoadedFunction* fn = nullptr;
  for (const ProjVariant& v : all) {
    const LoadedFunction& loaded = ffn_function(ctx, c, v, stream);
    if (v == chosen) fn = &loaded;
  }
  std::unique_lock<std::shared_mutex> lock(proj_mutex_);
  return ffn_plans_.emplace(key, ProjPlan{path, chosen, fn}).first->second;
}

void Engine::prepare_ffn_unfused(CUcontext ctx, const FfnSpec& c, const FfnArgs& args,
                                 const FfnShape& shape, CUstream stream) {
  if (c.norm != Norm::none)
    load_norm(ctx, RmsNormSpec{c.dtype, c.norm, false}, args.x, args.norm_weight, shape.hidden,
              stream);
  for (const int32_t vec : {8, 1}) glu_function(ctx, c, GluVariant{vec}, stream);
  if (c.weights == Weights::e4m3) dequant_function(ctx, c.dtype, stream);
  gemm_prepare(ctx);
}

void Engine::ffn_gate_up(const FfnSpec& spec, const FfnArgs& args) {
  const FfnSpec c = spec.canonical();
  const FfnShape shape = check_ffn_call(c, args);
  if (shape.tokens == 0) return;
  if (args.path == ProjPath::unfused) return launch_ffn_unfused(c, args, shape);
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const ProjPlan& p = ffn_plan(ctx, c, args, shape, stream);
  if (args.path == ProjPath::automatic && p.path == ProjPath::unfused &&
      gemm_unavailable().empty() && ffn_split_problem(c, args, shape, true).empty() &&
      take_unfused(ctx, c.key(), stream, [] {}))
    return launch_ffn_unfused(c, args, shape);
  ropejit_dev::ProjParams params = make_ffn_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(p.fn->fn, shape.proj(), p.variant, stream, kernel_args);
}

ProjPath Engine::ffn_gate_up_path(const FfnSpec& spec, const FfnArgs& args, bool ignore_workspace) {
  const FfnSpec c = spec.canonical();
  FfnArgs probe = args;
  if (probe.path == ProjPath::unfused) probe.path = ProjPath::automatic;
  const FfnShape shape = check_ffn_call(c, probe);
  if (args.path == ProjPath::unfused)
    if (const std::string why = ffn_split_problem(c, args, shape, !ignore_workspace); !why.empty())
      invalid(why, " (args.path is unfused)");
  if (args.path != ProjPath::automatic) return args.path;
  if (shape.tokens == 0) return ProjPath::fused;
  CUcontext ctx = nullptr;
  const ContextScope scope(driver(), &ctx, args.x, "args.x");
  const ProjPlan& p = ffn_plan(ctx, c, args, shape, static_cast<CUstream>(args.stream));
  if (p.path == ProjPath::unfused && gemm_unavailable().empty() &&
      ffn_split_problem(c, args, shape, !ignore_workspace).empty())
    return ProjPath::unfused;
  return ProjPath::fused;
}

void Engine::launch_ffn(const FfnSpec& c, const FfnArgs& args, const FfnShape& shape,
                        const ProjVariant* requested) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  ProjVariant variant;
  const LoadedFunction* fn = nullptr;
  if (requested) {
    if (const std::string why = proj_variant_problem(*requested, c.weights == Weights::e4m3);
        !why.empty())
      invalid("projection variant ", requested->name(), " is not legal: ", why);
    if (device_info(ctx).cc < 80)
      invalid("the FFN's gate/up (", c.key(), ") needs compute capability 8.0 or newer");
    variant = *requested;
    fn = &ffn_function(ctx, c, variant, stream);
  } else {
    const ProjPlan& p = ffn_plan(ctx, c, args, shape, stream);
    variant = p.variant;
    fn = p.fn;
  }
  ropejit_dev::ProjParams params = make_ffn_params(c, args, shape);
  void* kernel_args[] = {&params};
  launch_proj_kernel(fn->fn, shape.proj(), variant, stream, kernel_args);
}

void Engine::launch_ffn_unfused(const FfnSpec& c, const FfnArgs& args, const FfnShape& shape) {
  if (const std::string why = ffn_split_problem(c, args, shape, true); !why.empty()) invalid(why);
  if (!gemm_unavailable().empty()) fail(ErrorCode::no_driver, gemm_unavailable());
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  if (device_info(ctx).cc < 80)
    invalid("the FFN's gate/up (", c.key(), ") needs compute capability 8.0 or newer");
  CUstream stream = static_cast<CUstream>(args.stream);
  const int64_t elem = element_bytes(c.dtype);
  const int64_t I = shape.intermediate;
  char* workspace = static_cast<char*>(args.workspace);
  const size_t norm_bytes = norm_workspace_bytes(c.dtype, c.norm, shape.tokens, shape.hidden);
  const size_t product_bytes = ffn_product_bytes(c, shape.tokens, I);
  const size_t chunk_bytes =
      dequant_workspace_bytes(c.dtype, c.weights, shape.hidden, 2 * shape.intermediate);
  // Every kernel the path launches after the RMSNorm is loaded before it.
  const int64_t out_stride = args.out_stride == 0 ? I : args.out_stride;
  const bool wide =
      I % 8 == 0 && out_stride % 8 == 0 && reinterpret_cast<uintptr_t>(args.out) % 16 == 0;
  const GluVariant variant{wide ? 8 : 1};
  const LoadedFunction& glu = glu_function(ctx, c, variant, stream);
  const LoadedFunction* dequant =
      c.weights == Weights::e4m3 ? &dequant_function(ctx, c.dtype, stream) : nullptr;

  // 1. RMSNorm into the workspace (rounded once to the dtype).
  GemmCall g = normalized_operand(RmsNormSpec{c.dtype, c.norm, false}, c.norm != Norm::none,
                                  shape.tokens, shape.hidden, args.x, args.x_stride,
                                  args.norm_weight, args.norm_eps, workspace, args.stream);
  // 2. gate and up products, [tokens][2I] in the workspace: one GEMM when the weights are the
  // two halves of one tensor (vLLM's gate_up_proj), else one each.
  // With e4m3 weights, merged also means merged scales (up_scale = gate_scale + I).
  char* products = workspace + norm_bytes;
  char* chunk = products + product_bytes;  // e4m3 weights: dequantized rows
  g.workspace = chunk + chunk_bytes;
  g.workspace_bytes = args.workspace_bytes - norm_bytes - product_bytes - chunk_bytes;
  g.stream = stream;
  g.ldd = 2 * I;
  const bool w8 = c.weights == Weights::e4m3;
  const int64_t wstride = args.weight_stride == 0 ? shape.hidden : args.weight_stride;
  const int64_t welem = w8 ? 1 : elem;
  if (args.up_weight == static_cast<const char*>(args.gate_weight) + I * wstride * welem &&
      (!w8 || args.up_scale == args.gate_scale + I)) {
    weight_gemm(ctx, g, dequant, args.gate_weight, wstride, args.gate_scale, 2 * I, products,
                chunk);
  } else {
    weight_gemm(ctx, g, dequant, args.gate_weight, wstride, args.gate_scale, I, products, chunk);
    weight_gemm(ctx, g, dequant, args.up_weight, wstride, args.up_scale, I, products + I * elem,
                chunk);
  }
  // 3. out = act(gate) · up.
  ropejit_dev::GluParams p{};
  p.gate = products;
  p.up = products + I * elem;
  p.out = args.out;
  p.rows = shape.tokens;
  p.cols = I;
  p.gate_stride = p.up_stride = 2 * I;
  p.out_stride = out_stride;
  void* kernel_args[] = {&p};
  const int64_t per_block = int64_t(kGluThreads) * variant.vec;
  const KernelLaunch k{glu.fn,
                       {unsigned((I + per_block - 1) / per_block),
                        unsigned(std::min<int64_t>(shape.tokens, 65535)), 1},
                       {unsigned(kGluThreads), 1, 1},
                       0,
                       stream};
  launch_kernel(k, kernel_args, programmatic_launch(device_info(ctx).image_cc));  // behind the GEMM
}

// ---------------------------------------------------------------------------------------------
// RMSNorm.
// ---------------------------------------------------------------------------------------------

const CacheEntry& Engine::image(const RmsNormSpec& c, const NormVariant& variant,
                                const std::string& target, std::string* path) {
  return image_by(
      c.key() + "__" + variant.name() + "@" + target, target, [&] { return render(c, variant); },
      path);
}

void Engine::rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args) {
  const RmsNormSpec c = spec.canonical();
  const NormShape shape = check_norm_call(c, args);
  if (shape.rows == 0) return;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  const ContextScope scope(d, &ctx, args.x, "args.x");
  CUstream stream = static_cast<CUstream>(args.stream);
  const NormPlanKey key{ctx, c, shape.variant.vecs};
  const LoadedFunction* fn = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(proj_mutex_);
    const auto it = norm_plans_.find(key);
    if (it != norm_plans_.end()) fn = it->second;
  }
  if (!fn) {
    fn = &named_function(ctx, c.key(), shape.variant.name(), stream, [&]() -> const CacheEntry& {
      return image(c, shape.variant, target_for(device_info(ctx).cc));
    });
    std::unique_lock<std::shared_mutex> lock(proj_mutex_);
    norm_plans_.emplace(key, fn);
  }
  ropejit_dev::NormParams params = make_norm_params(c, args);
  void* kernel_args[] = {&params};
  check(d.LaunchKernel(fn->fn, unsigned(shape.rows), 1, 1, unsigned(kNormThreads), 1, 1, 0, stream,
                       kernel_args, nullptr),
        "cuLaunchKernel");
}

}  // namespace ropejit::detail
