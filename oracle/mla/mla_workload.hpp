// An MLA problem (MlaSpec) that owns its data: random kv_c, k_pe, q_pe and q_nope, a poisoned
// latent cache and query output with gaps and guard bytes, slots with padding and slots outside
// the cache, positions some of which lie outside the table, and the float64 reference.
#pragma once

#include <cstdint>
#include <vector>

#include "oracle/device_buffers.hpp"
#include "oracle/workload.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

struct MlaSizes {
  int64_t tokens = 5;
  int64_t heads = 4;  // 0: no query work
  int64_t table_rows = 64;
  int64_t cache_slots = 16;
  bool with_cache = true;
  int64_t row_gap = 0;    // extra elements after every row of kv_c, k_pe and the cache
  int64_t head_gap = 0;   // extra elements after every head of q_pe, q_nope and q_out
  int64_t table_gap = 0;  // extra elements after every cos/sin row
  int64_t padded = 0;     // tokens whose slot is -1
  int64_t bad_slots = 0;  // tokens whose slot is past the cache or below -1 (skipped, counted)
  int64_t off_table = 0;  // tokens whose position is outside the table (NaN in rotated parts)
  double eps = 1e-6;
  float cache_scale = 0.05f;  // e4m3 stores: the code of value / scale (× with _smul)
  float q_scale = 0.03f;
  // rope(k_pe) for every token: not written, into a tensor of its own, or into k_pe in place.
  enum class KpeOut { none, own, in_place } k_pe_out = KpeOut::none;
  bool cache_pe = false;  // the rows' rope part in a cache of its own
  bool q_out_pe = false;  // assemble: the query's rope part in a tensor of its own
  // How tokens find their rows: slots; their own index (padded and bad_slots must be 0, and
  // cache_slots at least the tokens); or a page table of page_size rows a page
  // (cache_slots rounded up to whole pages), two requests, padding as batch indices past the
  // batch, bad slots as pages past a request's own, negative positions and pages past the cache.
  enum class Addressing { slots, rows_by_token, page_table } addressing = Addressing::slots;
  int64_t page_size = 4;
  // The cache (and cache_pe) as blocks of block_size rows with block_gap elements after each
  // block (vLLM's per-layer view of a cache for all layers); 0: rows one stride apart.
  // cache_slots is rounded up to whole blocks.
  int64_t block_size = 0, block_gap = 0;
  uint64_t seed = 1;
};

class MlaProblem {
 public:
  MlaProblem(const MlaSpec& spec, const MlaSizes& sizes);
  MlaProblem(const MlaProblem&) = delete;
  MlaProblem& operator=(const MlaProblem&) = delete;

  void upload();
  MlaArgs args(void* stream = nullptr) const;
  // Every written element against float64 (fp32 arithmetic, one rounding), every other byte of
  // the cache, q_pe and q_out untouched, the skipped count.
  CheckReport check();

 private:
  using Buffer = DeviceBuffers::Buffer;
  // An element the kernel writes: its byte offset, store, the float64 value, and the bound of
  // the fp32 arithmetic's error before the final rounding (NaN expected when want is NaN).
  struct Expect {
    size_t at;
    bool fp8;
    double want, err;
  };
  Buffer& add(std::vector<uint8_t> host);
  // The constructor's last step: the float64 reference of the tokens' slots and positions.
  void build_reference(const std::vector<int64_t>& slots, const std::vector<int64_t>& pos);
  void expect_row(std::vector<Expect>* out, size_t at, const std::vector<double>& want,
                  const std::vector<double>& err, bool fp8, double scale) const;
  // The slots as the call addresses them: the page table's arrays, from the tokens' slots.
  void add_page_table(const std::vector<int64_t>& slots);
  void check_buffer(const char* name, const Buffer& b, const std::vector<uint8_t>& untouched,
                    const std::vector<Expect>& expect, CheckReport* r) const;

  MlaSpec spec_;
  MlaSizes sizes_;
  DeviceBuffers buffers_;
  Buffer *kv_c_ = nullptr, *k_pe_ = nullptr, *w_ = nullptr, *cache_ = nullptr, *slots_ = nullptr,
         *cache_scale_ = nullptr, *skipped_ = nullptr, *q_pe_ = nullptr, *q_nope_ = nullptr,
         *q_out_ = nullptr, *q_scale_ = nullptr, *ids_ = nullptr, *cos_ = nullptr, *sin_ = nullptr,
         *k_pe_out_ = nullptr, *cache_pe_ = nullptr, *kv_indices_ = nullptr, *kv_indptr_ = nullptr,
         *batch_indices_ = nullptr, *page_positions_ = nullptr, *q_out_pe_ = nullptr;
  int64_t num_indices_ = 0;
  // Elements from a cache's start to slot's row (rows `stride` apart, in blocks or not).
  int64_t row_at(int64_t slot, int64_t stride) const;
  int64_t block_stride(int64_t stride) const;
  // Element strides of the rows and heads (the gaps the sizes ask for) and of the tables.
  int64_t kv_stride_ = 0, pe_stride_ = 0, cache_stride_ = 0, qpe_hs_ = 0, nope_hs_ = 0, out_hs_ = 0,
          table_stride_ = 0, kout_stride_ = 0, cache_pe_stride_ = 0, out_pe_hs_ = 0;
  std::vector<Expect> cache_expect_, q_pe_expect_, q_out_expect_, k_pe_expect_, cache_pe_expect_,
      q_out_pe_expect_;
  int32_t want_skipped_ = 0;
};

}  // namespace ropejit::oracle
