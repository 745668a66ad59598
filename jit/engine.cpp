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
#include "jit/launching.hpp"
#include "jit/nvrtc.hpp"
#include "jit/render.hpp"

namespace ropejit::detail {
namespace {
constexpr int kMaxPairs = 256;  // head_dim <= 512
static_assert(offsetof(ropejit_dev::PairTable<kMaxPairs>, turns) == 8, "PairTable layout");
static_assert(sizeof(ropejit_dev::RopeParams) % 8 == 0 && sizeof(ropejit_dev::FusedParams) % 8 == 0,
              "a PairTable starts right after the block");

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

}  // namespace

namespace {

uint64_t hash_spec(const void* ctx, const Spec& s) {
  uint64_t h = std::hash<const void*>()(ctx);
  hash_mix(h, uint64_t(s.layout) | uint64_t(s.dtype) << 4 | uint64_t(s.style) << 8 |
                  uint64_t(s.positions) << 12 | uint64_t(s.index_type) << 16 |
                  uint64_t(s.freqs) << 20 | uint64_t(s.table_dtype) << 24 |
                  uint64_t(s.table_width) << 28 | uint64_t(s.direction) << 32 |
                  uint64_t(s.in_place) << 36 | uint64_t(s.fusion) << 40 | uint64_t(s.norm) << 44 |
                  uint64_t(s.out_store) << 48 | uint64_t(s.cache) << 52 |
                  uint64_t(s.cache_store) << 56);
  hash_mix(h, uint64_t(uint32_t(s.head_dim)) << 32 | uint32_t(s.rotary_dim));
  return h;
}

}  // namespace

size_t Engine::FunctionKeyHash::operator()(const FunctionKey& k) const {
  uint64_t h = hash_spec(k.ctx, k.spec);
  hash_mix(h, uint64_t(uint32_t(k.variant.vec)) << 40 |
                  uint64_t(uint32_t(k.variant.heads_per_thread)) << 20 |
                  uint64_t(k.variant.table_vec) << 60 | uint64_t(k.variant.grid_stride) << 61 |
                  uint64_t(k.variant.narrow) << 62 | uint32_t(k.variant.max_threads) |
                  uint64_t(uint32_t(k.variant.ring)) << 12);
  return size_t(h);
}

size_t Engine::PlanKeyHash::operator()(const PlanKey& k) const {
  uint64_t h = hash_spec(k.ctx, k.spec);
  hash_mix(h, uint64_t(k.bucket));
  hash_mix(h, uint64_t(uint32_t(k.q_heads)) << 32 | uint32_t(k.k_heads));
  hash_mix(h, uint64_t(uint32_t(k.v_heads)));
  hash_mix(h, uint64_t(uint32_t(k.align)) | uint64_t(uint32_t(k.table_align)) << 32 |
                  uint64_t(k.narrow) << 63);
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

void Engine::load_variants(CUcontext ctx, const Spec& c, const CallShape& shape, CUstream stream) {
  for (const KernelVariant& v : policy().variants(c, shape, device_info(ctx)))
    function(ctx, c, v, stream);
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

const Engine::LoadedFunction& Engine::named_function(
    CUcontext ctx, const std::string& key, const std::string& variant, CUstream stream,
    const std::function<const CacheEntry&()>& image) {
  const std::string ident = concat(static_cast<const void*>(ctx), '/', key, "__", variant);
  FunctionSlot* slot = nullptr;  // slots are never erased
  {
    std::shared_lock<std::shared_mutex> lock(named_mutex_);
    const auto it = named_functions_.find(ident);
    if (it != named_functions_.end()) slot = it->second.get();
  }
  if (!slot) {
    std::unique_lock<std::shared_mutex> lock(named_mutex_);
    std::unique_ptr<FunctionSlot>& s = named_functions_[ident];
    if (!s) s = std::make_unique<FunctionSlot>();
    slot = s.get();
  }
  load_once(
      slot, stream, [&] { return concat(key, " (", variant, ")"); }, image,
      [&] { return entry_name(key, variant); });
  return slot->loaded;
}

}  // namespace ropejit::detail
