// Launch policy: tuning file first, then the built-in heuristic; optional tune-on-miss.
#include "autotune/policy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "autotune/tuner.hpp"
#include "autotune/tuning_cache.hpp"
#include "jit/decode/proj.hpp"
#include "jit/errors.hpp"

namespace ropejit::autotune {
namespace {

std::atomic<size_t> g_tunings{0};

// One tuning cache per kind of GPU in this process, read from the tuning file on first use.
class TuningStore {
 public:
  static TuningStore& instance() {
    static TuningStore store;
    return store;
  }

  std::optional<detail::LaunchConfig> find(const detail::DeviceInfo& dev, const std::string& key,
                                           int64_t bucket, int32_t q, int32_t k) {
    std::lock_guard<std::mutex> lock(mutex_);
    const TuningEntry* e = cache_for(dev).find(key, bucket, q, k);
    if (!e) return std::nullopt;
    return e->config;
  }

  std::vector<TuningEntry> entries_for(const detail::DeviceInfo& dev, const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<TuningEntry> out;
    for (const TuningEntry& e : cache_for(dev).entries())
      if (e.key == key) out.push_back(e);
    return out;
  }

  void add(const detail::DeviceInfo& dev, const TuningEntry& entry, const Fingerprint& here) {
    std::lock_guard<std::mutex> lock(mutex_);
    TuningCache& cache = cache_for(dev);
    cache.put(entry);
    if (path_.empty()) return;
    TuningCache one;
    one.set_fingerprint(here);
    one.put(entry);
    try {
      one.save(path_);  // merges with what other processes wrote meanwhile
    } catch (const Error& e) {
      detail::warn_once("tuning-save", std::string(e.what()) + "; keeping tuned entries in memory");
    }
  }

  std::optional<ProjTuningEntry> find_proj(const detail::DeviceInfo& dev, const std::string& key,
                                           int64_t bucket, int64_t hidden, int64_t columns) {
    std::lock_guard<std::mutex> lock(mutex_);
    const ProjTuningEntry* e = cache_for(dev).find_proj(key, bucket, hidden, columns);
    if (!e) return std::nullopt;
    return *e;
  }

  // The key's projection entries; with columns > 0, those of that weight shape only.
  std::vector<ProjTuningEntry> proj_entries_for(const detail::DeviceInfo& dev,
                                                const std::string& key, int64_t hidden,
                                                int64_t columns) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ProjTuningEntry> out;
    for (const ProjTuningEntry& e : cache_for(dev).proj_entries())
      if (e.key == key && (columns <= 0 || (e.hidden == hidden && e.columns == columns)))
        out.push_back(e);
    return out;
  }

  const std::string& path() const { return path_; }

 private:
  TuningStore() : path_(default_tuning_path()) {}

  TuningCache& cache_for(const detail::DeviceInfo& dev) {
    const std::string id = detail::concat(dev.name, "/", dev.cc, "/", dev.sm_count);
    auto it = caches_.find(id);
    if (it == caches_.end()) {
      Fingerprint here;
      here.gpu_name = dev.name;
      here.cc = dev.cc;
      here.sm_count = dev.sm_count;
      it =
          caches_.emplace(id, path_.empty() ? TuningCache() : TuningCache::load(path_, here)).first;
    }
    return it->second;
  }

  std::mutex mutex_;
  std::string path_;
  std::map<std::string, TuningCache> caches_;
};

}  // namespace

TuningMode tuning_mode() {
  if (const char* a = std::getenv("ROPEJIT_AUTOTUNE"); a && std::string(a) == "1")
    return TuningMode::autotune;
  const char* t = std::getenv("ROPEJIT_TUNING");
  if (!t || !t[0]) return TuningMode::use;
  const std::string v = t;
  if (v == "off") return TuningMode::off;
  if (v == "use") return TuningMode::use;
  if (v == "auto") return TuningMode::autotune;
  if (v == "frozen") return TuningMode::frozen;
  detail::invalid("ROPEJIT_TUNING ('", detail::clipped(v),
                  "') must be one of: off, use, auto, frozen");
}

size_t tunings_performed() { return g_tunings.load(); }

detail::LaunchConfig select_config(const Spec& c, const detail::CallShape& shape,
                                   const detail::DeviceInfo& device, bool capturing) {
  const TuningMode mode = tuning_mode();
  const detail::LaunchConfig fallback = heuristic_config(c, shape, device);
  if (mode == TuningMode::off) return fallback;
  TuningStore& store = TuningStore::instance();
  const std::string key = c.key();
  const int64_t bucket = detail::token_bucket(shape.tokens);
  if (std::optional<detail::LaunchConfig> tuned =
          store.find(device, key, bucket, shape.q_heads, shape.k_heads)) {
    // Narrow offsets are the call's to decide, not the tuning file's.
    tuned->kernel.narrow = shape.narrow;
    // A tuned entry assumes 16-byte alignment (q/k and cos/sin); a less aligned call keeps
    // the heuristic.
    if (detail::illegal_reason(c, shape, *tuned, device).empty()) return *tuned;
    return fallback;
  }
  if (mode == TuningMode::frozen)
    detail::invalid("no tuned configuration for ", key, " at ", bucket, " tokens with ",
                    shape.q_heads, "/", shape.k_heads, " heads in ",
                    store.path().empty() ? "(no tuning file)" : detail::clipped_path(store.path()),
                    " and ROPEJIT_TUNING=frozen; run `ropejit tune` for this shape");
  if (mode == TuningMode::autotune && !capturing && shape.align_bytes == 16) {
    const TuneReport report = tune(c, bucket, shape.q_heads, shape.k_heads);
    ++g_tunings;
    store.add(device, report.best, current_fingerprint());
    // Tuned on aligned buffers of its own: this call (e.g. a misaligned table) may not run it.
    detail::LaunchConfig best = report.best.config;
    best.kernel.narrow = shape.narrow;
    if (detail::illegal_reason(c, shape, best, device).empty()) return best;
    return fallback;
  }
  return fallback;
}

std::vector<detail::KernelVariant> policy_variants(const Spec& c, const detail::CallShape& shape,
                                                   const detail::DeviceInfo& device) {
  std::vector<detail::KernelVariant> out =
      detail::default_variants(c, shape.align_bytes, shape.table_align);
  // Where heuristic_config() drops the prefill variant's ring (no cp.async; or a GPU granting
  // a block less than the 64 KB its launches can ask for), the variant it runs instead.
  const bool no_ring = device.cc < 80;
  const bool both = !no_ring && device.max_shared_per_block < 64 * 1024;
  for (size_t i = 0, n = out.size(); i < n; ++i) {
    if (out[i].ring == 0 || !(no_ring || both)) continue;
    detail::KernelVariant plain = out[i];
    plain.ring = 0;
    if (no_ring)
      out[i] = plain;
    else if (std::find(out.begin(), out.end(), plain) == out.end())
      out.push_back(plain);
  }
  if (tuning_mode() == TuningMode::off) return out;
  for (const TuningEntry& e : TuningStore::instance().entries_for(device, c.key())) {
    // The entry's own call, at this call's alignment: what select_config() would accept.
    detail::CallShape s = shape;
    s.tokens = e.bucket;
    s.q_heads = e.q_heads;
    s.k_heads = e.k_heads;
    detail::LaunchConfig cfg = e.config;
    cfg.kernel.narrow = false;  // entries carry no offset width; both forms are prepared
    if (!detail::illegal_reason(c, s, cfg, device).empty()) continue;
    for (const detail::KernelVariant& form : detail::offset_forms(c, cfg.kernel))
      if (std::find(out.begin(), out.end(), form) == out.end()) out.push_back(form);
  }
  return out;
}

namespace {

// The tuning file's entry for a projection or FFN call's bucket and weight shape.
std::optional<ProjTuningEntry> proj_entry(const std::string& key, const detail::ProjShape& shape,
                                          const detail::DeviceInfo& device) {
  if (tuning_mode() == TuningMode::off) return std::nullopt;
  return TuningStore::instance().find_proj(device, key, detail::proj_path_bucket(shape.tokens),
                                           shape.hidden, 2 * shape.pairs);
}

// An entry's variant where this device can run it (clusters need sm_90; the file was tuned on
// this kind of GPU, so only a hand-edited one could ask otherwise).
std::optional<detail::ProjVariant> usable_variant(const ProjTuningEntry& e,
                                                  const detail::DeviceInfo& device) {
  detail::ProjVariant v;
  if (e.variant.empty() || !detail::parse_proj_variant(e.variant, &v)) return std::nullopt;
  if (v.cluster > 1 && device.cc < 90) return std::nullopt;
  return v;
}

// `base` and the variants of the key's entries (of `shape`'s weight shape, when given) that are
// not in it yet.
std::vector<detail::ProjVariant> with_tuned(std::vector<detail::ProjVariant> base,
                                            const std::string& key, int64_t hidden, int64_t columns,
                                            const detail::DeviceInfo& device) {
  if (tuning_mode() == TuningMode::off) return base;
  for (const ProjTuningEntry& e :
       TuningStore::instance().proj_entries_for(device, key, hidden, columns))
    if (const auto v = usable_variant(e, device))
      if (std::find(base.begin(), base.end(), *v) == base.end()) base.push_back(*v);
  return base;
}

}  // namespace

ProjPath select_proj_path(const QkvProjSpec& c, const detail::ProjShape& shape,
                          const detail::DeviceInfo& device) {
  const auto e = proj_entry(c.key(), shape, device);
  return e ? e->path : proj_heuristic_path(c, shape, device);
}

ProjPath select_ffn_path(const FfnSpec& c, const detail::ProjShape& shape,
                         const detail::DeviceInfo& device) {
  const auto e = proj_entry(c.key(), shape, device);
  return e ? e->path : ffn_heuristic_path(c, shape, device);
}

detail::ProjVariant select_proj_variant(const QkvProjSpec& c, const detail::ProjShape& shape,
                                        const detail::DeviceInfo& device) {
  if (const auto e = proj_entry(c.key(), shape, device))
    if (const auto v = usable_variant(*e, device)) return *v;
  return proj_heuristic(c, shape, device);
}

detail::ProjVariant select_ffn_variant(const FfnSpec& c, const detail::ProjShape& shape,
                                       const detail::DeviceInfo& device) {
  if (const auto e = proj_entry(c.key(), shape, device))
    if (const auto v = usable_variant(*e, device)) return *v;
  return ffn_heuristic(c, shape, device);
}

std::vector<detail::ProjVariant> select_proj_variants(const QkvProjSpec& c,
                                                      const detail::ProjShape& shape,
                                                      const detail::DeviceInfo& device) {
  return with_tuned(proj_heuristic_variants(c, shape, device), c.key(), shape.hidden,
                    2 * shape.pairs, device);
}

std::vector<detail::ProjVariant> select_ffn_variants(const FfnSpec& c,
                                                     const detail::DeviceInfo& device) {
  return with_tuned(ffn_heuristic_variants(c, device), c.key(), 0, 0, device);
}

namespace {

class TuningPolicy final : public detail::LaunchPolicy, public detail::DecodePolicy {
 public:
  detail::LaunchConfig choose(const Spec& c, const detail::CallShape& shape,
                              const detail::DeviceInfo& device, bool capturing) override {
    return select_config(c, shape, device, capturing);
  }
  std::vector<detail::KernelVariant> variants(const Spec& c, const detail::CallShape& shape,
                                              const detail::DeviceInfo& device) override {
    return policy_variants(c, shape, device);
  }
  detail::ProjVariant choose_proj(const QkvProjSpec& c, const detail::ProjShape& shape,
                                  const detail::DeviceInfo& device) override {
    return select_proj_variant(c, shape, device);
  }
  std::vector<detail::ProjVariant> proj_variants(const QkvProjSpec& c,
                                                 const detail::ProjShape& shape,
                                                 const detail::DeviceInfo& device) override {
    return select_proj_variants(c, shape, device);
  }
  ProjPath choose_proj_path(const QkvProjSpec& c, const detail::ProjShape& shape,
                            const detail::DeviceInfo& device) override {
    return select_proj_path(c, shape, device);
  }
  detail::ProjVariant choose_ffn(const FfnSpec& c, const detail::ProjShape& shape,
                                 const detail::DeviceInfo& device) override {
    return select_ffn_variant(c, shape, device);
  }
  std::vector<detail::ProjVariant> ffn_variants(const FfnSpec& c,
                                                const detail::DeviceInfo& device) override {
    return select_ffn_variants(c, device);
  }
  ProjPath choose_ffn_path(const FfnSpec& c, const detail::ProjShape& shape,
                           const detail::DeviceInfo& device) override {
    return select_ffn_path(c, shape, device);
  }
};

}  // namespace

namespace {

TuningPolicy& the_policy() {
  static TuningPolicy policy;
  return policy;
}

}  // namespace

detail::LaunchPolicy& tuning_policy() { return the_policy(); }

detail::DecodePolicy& decode_tuning_policy() { return the_policy(); }

}  // namespace ropejit::autotune
