// Workload: the fused stages' data: QK-norm weights and a KV cache (pages with guard elements,
// NHD or HND, in the activation dtype or e4m3, with per-token scales for a dynamic FP8 cache)
// with its addressing (slot mapping, page table or
// per-sequence lengths), including tokens whose slot is negative or out of range.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "oracle/numbers.hpp"
#include "oracle/workload.hpp"

namespace ropejit::oracle {

using detail::element_bytes;

namespace {

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

void Workload::add_fusion() {
  const Spec& c = spec_;
  Args& a = host_args_;
  a.norm_eps = sizes_.norm_eps;
  a.out_quant_scale = sizes_.out_quant_scale;
  if (c.norm != Norm::none) {
    // Trained norm weights sit near 1 (near 0 in Gemma's 1 + w form).
    const double center = c.norm == Norm::rms_one_plus ? 0.0 : 1.0;
    std::uniform_real_distribution<double> w(center - 0.5, center + 0.5);
    const int64_t e = element_bytes(c.dtype);
    auto weights = [&](int64_t heads) {
      const int64_t n = (c.norm == Norm::rms_all_heads ? heads : 1) * c.head_dim;
      std::vector<uint8_t> bytes(size_t(n * e));
      for (int64_t i = 0; i < n; ++i) store_value(c.dtype, &bytes[size_t(i * e)], w(rng_));
      return add_buffer(std::move(bytes)).host.data();
    };
    a.q_norm_weight = weights(sizes_.q_heads);
    if (sizes_.k_heads) a.k_norm_weight = weights(sizes_.k_heads);
  }
  if (c.cache != KvCache::none) add_cache();
}

void Workload::add_cache() {
  const Spec& c = spec_;
  const Args& a = host_args_;
  const bool dense = c.layout != Layout::thd;
  const int64_t batch = a.batch;
  std::vector<int64_t> appended(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    appended[size_t(b)] = dense ? a.seq_len : sizes_.seq_lens[size_t(b)];
  std::uniform_int_distribution<int64_t> earlier(0, 2 * sizes_.page_size);
  std::vector<int64_t> held(
      static_cast<size_t>(batch));  // tokens each sequence held before the call
  for (int64_t& h : held) h = earlier(rng_);
  int64_t page_size = sizes_.page_size;
  switch (c.cache) {
    case KvCache::slots:
      add_slot_mapping(page_size);
      break;
    case KvCache::paged:
      add_page_table(held, appended, page_size);
      break;
    case KvCache::contiguous:
      page_size = add_sequence_lengths(held, appended);
      break;
    case KvCache::none:
      return;
  }
  add_cache_pages(page_size);
}

void Workload::add_slot_mapping(int64_t page_size) {
  KvCacheArgs& k = host_args_.cache;
  k.pages = (tokens_ + page_size - 1) / page_size + 2;
  std::vector<int64_t> free(size_t(k.pages * page_size));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng_);
  std::vector<int64_t> slots(static_cast<size_t>(tokens_));
  for (int64_t t = 0; t < tokens_; ++t) slots[size_t(t)] = free[size_t(t)];
  // Padding tokens (negative: not written) and tokens whose slot is beyond the cache.
  std::vector<int64_t> order(static_cast<size_t>(tokens_));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  size_t next = 0;
  for (int32_t i = 0; i < sizes_.padding_slots && next < order.size(); ++i)
    slots[size_t(order[next++])] = -1 - i;
  for (int32_t i = 0; i < sizes_.bad_tokens && next < order.size(); ++i)
    slots[size_t(order[next++])] = k.pages * page_size + i;
  if (sizes_.hostile_table && !slots.empty()) {
    const int64_t hostile[] = {std::numeric_limits<int64_t>::max(),
                               std::numeric_limits<int64_t>::min(), k.pages * page_size};
    slots[0] = hostile[(sizes_.hostile_table - 1) % 3];
  }
  k.slot_mapping = reinterpret_cast<const int64_t*>(add_buffer(bytes_of(slots)).host.data());
}

void Workload::add_page_table(const std::vector<int64_t>& held,
                              const std::vector<int64_t>& appended, int64_t page_size) {
  KvCacheArgs& k = host_args_.cache;
  const int64_t batch = int64_t(held.size());
  std::vector<int32_t> indptr(static_cast<size_t>(batch + 1), 0), last(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t after = held[size_t(b)] + appended[size_t(b)];
    const int64_t pages = std::max<int64_t>(1, (after + page_size - 1) / page_size);
    indptr[size_t(b + 1)] = int32_t(indptr[size_t(b)] + pages);
    last[size_t(b)] = int32_t(after - (pages - 1) * page_size);
    if (after == 0) last[size_t(b)] = 1;  // an empty sequence still owns a page
  }
  k.num_indices = indptr.back();
  k.pages = k.num_indices + 2;
  std::vector<int32_t> indices(size_t(k.pages));
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), rng_);
  indices.resize(size_t(k.num_indices));
  // A page number beyond the cache: the tokens that land in it are skipped and counted.
  if (sizes_.bad_tokens > 0 && !indices.empty()) indices[0] = int32_t(k.pages + 3);
  if (batch > 0) {
    constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
    constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
    switch (sizes_.hostile_table) {
      case 1:
        indptr[1] = indptr[0];
        break;
      case 2:
        indptr[0] = kMin;
        break;
      case 3:
        indptr[1] = kMax;
        break;
      case 4:
        last[0] = 0;
        break;
      case 5:
        last[0] = int32_t(page_size + 1);
        break;
      case 6:
        indptr[0] = indptr[1] + 1;
        break;
      default:
        break;
    }
  }
  k.indptr = reinterpret_cast<const int32_t*>(add_buffer(bytes_of(indptr)).host.data());
  k.indices = reinterpret_cast<const int32_t*>(add_buffer(bytes_of(indices)).host.data());
  k.last_page_len = reinterpret_cast<const int32_t*>(add_buffer(bytes_of(last)).host.data());
}

int64_t Workload::add_sequence_lengths(const std::vector<int64_t>& held,
                                       const std::vector<int64_t>& appended) {
  KvCacheArgs& k = host_args_.cache;
  const int64_t batch = int64_t(held.size());
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b)
    longest = std::max(longest, held[size_t(b)] + appended[size_t(b)]);
  const int64_t capacity = longest + 3;  // the cache's sequence capacity: its page size
  k.pages = batch + 1;
  std::vector<int32_t> lens(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) lens[size_t(b)] = int32_t(held[size_t(b)]);
  // A sequence that is nearly full: its tokens past the capacity are skipped and counted.
  if (sizes_.bad_tokens > 0 && batch > 0) lens[0] = int32_t(capacity - 1);
  if (sizes_.hostile_table && batch > 0) {
    const int32_t hostile[] = {-1, std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max()};
    lens[0] = hostile[(sizes_.hostile_table - 1) % 3];
  }
  k.seq_lens = reinterpret_cast<const int32_t*>(add_buffer(bytes_of(lens)).host.data());
  return capacity;
}

void Workload::add_cache_pages(int64_t page_size) {
  const Spec& c = spec_;
  Args& a = host_args_;
  KvCacheArgs& k = a.cache;
  const int64_t hk = sizes_.k_heads, D = c.head_dim;
  k.page_size = page_size;
  if (sizes_.cache_hnd) {
    k.stride_slot = D;
    k.stride_head = page_size * D;
  } else {
    k.stride_head = D;
    k.stride_slot = hk * D;
  }
  k.stride_page = hk * page_size * D + sizes_.page_gap;
  const int64_t ce = is_fp8(c.cache_store) ? 1 : element_bytes(c.dtype);
  const int kind = is_fp8(c.cache_store) ? kE4m3 : int(c.dtype);
  // Caches start with random bytes: whatever the call does not address must keep them.
  std::uniform_int_distribution<int> byte(0, 255);
  auto make_cache = [&]() {
    std::vector<uint8_t> bytes(size_t(k.pages * k.stride_page * ce));
    for (uint8_t& x : bytes) x = uint8_t(byte(rng_));
    uint8_t* p = add_buffer(std::move(bytes)).host.data();
    add_output(p, kind, false);
    return p;
  };
  k.k = make_cache();
  if (a.v.data) k.v = make_cache();
  k.k_quant_scale = sizes_.k_quant_scale;
  k.v_quant_scale = sizes_.v_quant_scale;
  if (c.cache_store == Store::e4m3_dynamic) {
    // A float per slot and head, in the rows' order (NHD or HND), with a gap after each page;
    // random bytes like the cache, checked unchanged where the call does not write.
    if (sizes_.cache_hnd) {
      k.scale_stride_slot = 1;
      k.scale_stride_head = page_size;
    } else {
      k.scale_stride_head = 1;
      k.scale_stride_slot = hk;
    }
    k.scale_stride_page = hk * page_size + 2;
    auto make_scales = [&]() {
      std::vector<uint8_t> bytes(size_t(k.pages * k.scale_stride_page * 4));
      for (uint8_t& x : bytes) x = uint8_t(byte(rng_));
      float* p = reinterpret_cast<float*>(add_buffer(std::move(bytes)).host.data());
      add_output(p, int(DType::f32), false);
      return p;
    };
    k.k_scales = make_scales();
    if (a.v.data) k.v_scales = make_scales();
  }
  std::vector<uint8_t> counter(4, 0);
  k.skipped = reinterpret_cast<int32_t*>(add_buffer(std::move(counter)).host.data());
  add_output(k.skipped, kI32, false);
}

}  // namespace ropejit::oracle
