// A RoPE problem that owns its data: random host inputs, device buffers with poisoned
// outputs and guard regions, and a float64 CPU reference to check results against. Used by
// the GPU tests, `ropejit demo`, the tuner (which never touches callers' data) and bench/.
// Fused keys add v, QK-norm weights, FP8 outputs and a KV cache (guard elements after every
// page, every byte the call does not address checked unchanged).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "oracle/device_buffers.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

struct Sizes {
  int64_t batch = 2;
  int64_t seq_len = 5;            // dense layouts
  std::vector<int64_t> seq_lens;  // thd: per-sequence token counts
  int64_t padding_tokens = 0;     // thd: tokens after the last sequence (left unchanged)
  int32_t q_heads = 3;
  int32_t k_heads = 1;          // 0: no k
  bool packed_qkv = false;      // q, k and v interleaved in one buffer
  int64_t head_gap = 0;         // extra elements between heads (strided views)
  int32_t misalign_elems = 0;   // shift every tensor by this many elements
  int64_t position_offset = 0;  // Positions::offset
  int64_t max_position = 0;     // largest random seq offset / id (0: table_rows - 1 or 4095)
  int64_t table_rows = 0;       // 0: just enough for the positions used
  bool combined_table = false;  // half-width cos|sin in one row (vLLM cos_sin_cache)
  double base = 10000.0;
  uint64_t seed = 1;

  // Scaled frequencies: parameters of the key's variant (a factor of 1, the default, picks
  // typical published values for the variant); longrope's per-pair factors are made up when
  // not given. mRoPE: sections (all 0: a split like Qwen2-VL's) and their order.
  RopeScaling scaling;
  std::vector<double> short_factor, long_factor;
  int32_t mrope_section[3] = {0, 0, 0};
  bool mrope_interleaved = false;

  // Fused keys.
  bool with_v = true;  // a KV-cache call also appends v
  double norm_eps = 1e-6;
  float out_quant_scale = 1.0f;  // e4m3 q_out / k_out
  float k_quant_scale = 1.0f;    // e4m3 cache
  float v_quant_scale = 1.0f;
  int64_t page_size = 16;     // tokens per cache page (contiguous: derived from the lengths)
  bool cache_hnd = false;     // pages [head][slot][d] instead of [slot][head][d]
  int64_t page_gap = 8;       // guard elements after every page, checked untouched
  int32_t bad_tokens = 0;     // tokens whose slot or page is outside the cache (skipped, counted)
  int32_t padding_slots = 0;  // slots: tokens with slot -1 (not written, not counted)
  // A malformed entry for sequence 0 (token 0 for slots) in the cache's table, as device memory
  // may hold it; the reference skips and counts what the kernel must (hostile_tables values):
  // paged 1 end == start, 2 start INT_MIN, 3 end INT_MAX (> num_indices), 4 last_page_len 0,
  // 5 last_page_len > page_size, 6 end < start; contiguous 1 seq_lens -1, 2 INT_MIN,
  // 3 INT_MAX; slots 1 INT64_MAX, 2 INT64_MIN (negative: not written, not counted), 3 the first
  // slot past the cache.
  int32_t hostile_table = 0;
};

// How many hostile_table values a cache kind has.
constexpr int32_t hostile_tables(KvCache cache) {
  return cache == KvCache::paged ? 6 : cache == KvCache::none ? 0 : 3;
}

struct CheckReport {
  bool ok = true;
  int64_t checked = 0;  // elements compared
  int64_t mismatches = 0;
  double max_rel_l2 = 0;  // relative L2 error of computed elements against float64
  double max_abs_err = 0;
  std::string first_failure;  // operand, element, got, expected, tolerance
};

// problem.check() with `*path` (the problem's sizes' path) set to `as` for the call and restored
// after, also when it throws: the projection and FFN problems' check_as.
template <class Problem>
CheckReport check_on_path(Problem& problem, ProjPath* path, ProjPath as) {
  struct Restore {
    ProjPath* slot;
    ProjPath kept;
    ~Restore() { *slot = kept; }
  } restore{path, *path};
  *path = as;
  return problem.check();
}

class Workload {
 public:
  // Generates host data only; needs no GPU.
  Workload(const Spec& spec, const Sizes& sizes);
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  const Spec& spec() const { return spec_; }
  int64_t tokens() const { return tokens_; }

  // Allocates device buffers and uploads inputs, with outputs poisoned (NaN bytes). Calling
  // it again restores the inputs (and the cache's initial bytes) and re-poisons the outputs.
  void upload();
  // The same state as upload() leaves, restored from a device-side copy of it taken on the first
  // call (which uploads): a device-to-device copy per buffer instead of host transfers, at the
  // cost of twice the device memory. Where that copy cannot be allocated, it uploads instead.
  // The tuner's reset before each candidate (at 32768 tokens of a fused key, ~400 MB of inputs
  // from pageable host memory per candidate).
  void reset();
  // Frees reset()'s device-side copy (the next reset() takes a new one).
  void drop_reset_copy();
  // Arguments pointing at the device buffers.
  Args args(void* stream = nullptr) const;
  // Copies outputs back and compares every byte of every output allocation (guards, gaps and
  // untouched cache bytes included) with the float64 reference (built on first use).
  CheckReport check();
  // Waits for the device and returns the raw bytes of every output allocation (the tuner's
  // bit-identity comparison, which needs no reference).
  const std::vector<std::vector<uint8_t>>& download();

  // Bytes a kernel must move: q and k (and v, and the cache writes) once, plus table rows.
  int64_t bytes_moved() const;

 private:
  using Buffer = DeviceBuffers::Buffer;
  // What check() compares: a buffer, its element kind (a DType value, kE4m3 or kI32), and
  // whether its device copy starts poisoned (outputs) or as the host bytes (in-place inputs,
  // caches, counters).
  struct Output {
    int buffer;
    int kind;
    bool poison;
  };
  static constexpr int kE4m3 = 3;
  static constexpr int kI32 = 4;

  Buffer& add_buffer(std::vector<uint8_t> host);
  int buffer_index(const void* host) const;
  void add_output(const void* host, int kind, bool poison);
  // The constructor's steps: q/k/v (and outputs), positions, tables, then the fused stages'
  // weights and KV cache with its addressing.
  void add_operands();
  int64_t add_positions();
  void add_tables(int64_t max_position);
  void add_fusion();
  void add_cache();
  // add_cache's steps: the addressing of each cache kind (the contiguous cache's returns its
  // capacity, the page size), then the pages, their scales and the skipped counter.
  void add_slot_mapping(int64_t page_size);
  void add_page_table(const std::vector<int64_t>& held, const std::vector<int64_t>& appended,
                      int64_t page_size);
  int64_t add_sequence_lengths(const std::vector<int64_t>& held,
                               const std::vector<int64_t>& appended);
  void add_cache_pages(int64_t page_size);
  void add_scaling();
  // The reference (oracle/reference.cpp), its steps in a helper of its own.
  struct Reference;
  void build_reference();

  Spec spec_;
  Sizes sizes_;
  std::mt19937_64 rng_;
  int64_t tokens_ = 0;
  DeviceBuffers buffers_;
  Args host_args_;  // pointers into host copies
  std::vector<Output> outputs_;
  // Per output: expected double value and tolerance (< 0: byte-exact against the host copy;
  // for e4m3 elements, the interval around the value that the kernel's fp32 result may fall in
  // before rounding).
  std::vector<std::vector<double>> expect_, tol_;
  std::vector<std::vector<uint8_t>> downloaded_;
  std::vector<double> short_factor_, long_factor_;  // what args.scaling points to
  bool initial_failed_ = false;  // reset() could not allocate its copies: it uploads
};

}  // namespace ropejit::oracle
