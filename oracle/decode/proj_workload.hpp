// A QKV projection problem (QkvProjSpec) that owns its data: random host inputs, device buffers
// with poisoned outputs and guard bytes, and a float64 reference with a tolerance derived from
// the kernel's arithmetic. Used by the GPU tests, the benchmark and `ropejit demo`.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "oracle/device_buffers.hpp"
#include "oracle/workload.hpp"
#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

struct ProjSizes {
  int64_t tokens = 3;
  int64_t hidden = 256;
  int32_t q_heads = 4;
  int32_t kv_heads = 2;
  int64_t x_gap = 0;            // extra elements after every x row (a multiple of 8)
  int64_t weight_gap = 0;       // extra elements after every weight row (a multiple of 8)
  bool packed_out = true;       // q, k and v as heads of one [tokens][q + 2 kv][d] buffer
  int64_t out_head_gap = 0;     // extra elements between output heads, checked untouched
  int64_t position_offset = 0;  // Positions::offset
  int64_t max_position = 4095;  // ids are drawn from [0, max_position]
  int32_t bad_positions = 0;    // ids outside the table: their rotated columns must be NaN
  double base = 10000.0;
  double norm_eps = 1e-6;
  double x_scale = 1.0;  // activations are uniform in [-2, 2] times this
  bool bias = false;     // args.bias: one per weight row, uniform in [-0.5, 0.5] (fused path)
  uint64_t seed = 1;
  // spec.cache: a poisoned, guarded cache of `cache_pages` pages (0: enough for every token) of
  // `cache_page_size` rows, NHD, `cache_slot_gap` elements after each row's heads. slots: every
  // token a distinct random slot, `padded_slots` tokens at -1 (not written); paged: each token
  // the newest of its own sequence, which held 0-2 pages' worth before, its pages random from
  // the pool; contiguous: sequence t at a random length. `cache_sequences` > 0 (paged,
  // contiguous): the tokens are that many sequences' new tokens instead (args.cu_seqlens,
  // random lengths, some empty). `bad_slots` tokens (slots) or sequences point outside the
  // cache (slot past the end; last_page_len 0 or past the page, or a last page number past the
  // cache; a full sequence): those tokens are not written and are counted in
  // args.cache.skipped (as is a contiguous sequence's token past its row). cache_only: args.k
  // and args.v null.
  int64_t cache_page_size = 16;
  int64_t cache_pages = 0;
  int32_t cache_sequences = 0;
  int64_t cache_slot_gap = 0;
  int32_t padded_slots = 0;
  int32_t bad_slots = 0;
  bool cache_only = false;
  // What args() asks for. unfused and automatic come with a poisoned workspace (guarded); with
  // automatic, check() accepts the result of either path and matched() says which.
  ProjPath path = ProjPath::fused;
  bool reference = true;  // false: no float64 reference (timing only; check() refuses)
};

class ProjProblem {
 public:
  // Generates host data and the reference; needs no GPU.
  ProjProblem(const QkvProjSpec& spec, const ProjSizes& sizes);
  ProjProblem(const ProjProblem&) = delete;
  ProjProblem& operator=(const ProjProblem&) = delete;

  const QkvProjSpec& spec() const { return spec_; }
  const ProjSizes& sizes() const { return sizes_; }

  // Allocates device buffers, uploads the inputs and poisons the outputs (again on every call).
  void upload();
  QkvProjArgs args(void* stream = nullptr) const;
  // Copies the outputs back and compares every byte of them (guards and gaps included) with the
  // reference.
  CheckReport check();

  // The weight's bytes (with e4m3 weights, their scales too; the projection's floor: they must
  // be read once) and everything a launch
  // moves (weight, activations, norm weight, outputs).
  int64_t weight_bytes() const;
  int64_t bytes_moved() const;

  // The float64 reference on host data: expected value and tolerance of output element
  // (token, column) of the projection, columns as in the weight (q heads, k heads, v heads).
  // NaN expected for rotated columns at a position outside the table.
  struct Expected {
    std::vector<double> value, tol;
  };
  const Expected& expected() const { return expected_; }
  // The unfused path's reference (sizes.path unfused or automatic): the normalized activation
  // and the projection each rounded to the dtype, as that path computes.
  const Expected& expected_unfused() const { return expected_unfused_; }
  // The path whose reference the last check() matched (automatic: fused tried first).
  ProjPath matched() const { return matched_; }
  // check() against one path's reference (sizes.path automatic builds both): what the tuner
  // uses, so that a wrong result that happens to fit the other path's tolerance fails.
  CheckReport check_as(ProjPath path);

 private:
  using Buffer = DeviceBuffers::Buffer;
  Buffer& add(std::vector<uint8_t> host);
  // The constructor's steps, in the order they draw from rng_.
  void add_inputs();
  void add_positions();
  void add_outputs();
  void add_cache();
  void place_slots(const std::vector<bool>& bad, const std::vector<int64_t>& pool);
  void place_paged(const std::vector<bool>& bad, const std::vector<int64_t>& pool,
                   const std::vector<int64_t>& held);
  void place_contiguous(const std::vector<bool>& bad, const std::vector<int64_t>& held);
  // Tokens of sequence b (cu_seqlens_).
  int64_t sequence_tokens(int64_t b) const;
  void build_reference();
  void build_unfused_reference();
  // RoPE of output column n (a rotated column) at `pos` from the sums y and their errors e:
  // the float64 value and the fp32 epilogue's error bound (partner's error, the products'
  // roundings, the computed angle's error). NaN for a table position outside the table.
  struct Rotated {
    double value = 0, err = 0;
  };
  Rotated rotate(int64_t pos, int64_t n, const std::vector<double>& y,
                 const std::vector<double>& e) const;
  CheckReport compare(const Expected& want, const std::vector<std::vector<uint8_t>>& got) const;
  // The KV cache against the fused reference (rows at each token's slot; every other byte
  // untouched) and the skipped counter, against `expected` (the path's reference); adds to `r`.
  void compare_cache(CheckReport& r, const Expected& expected) const;

  QkvProjSpec spec_;
  ProjSizes sizes_;
  std::mt19937_64 rng_;
  int64_t columns_ = 0, x_stride_ = 0, w_stride_ = 0, table_rows_ = 0, table_width_ = 0;
  DeviceBuffers buffers_;
  Buffer* x_ = nullptr;
  Buffer* w_ = nullptr;
  Buffer* scale_ = nullptr;  // e4m3 weights: a float per row
  Buffer* norm_ = nullptr;
  Buffer* bias_ = nullptr;
  Buffer* ids_ = nullptr;
  Buffer* cos_ = nullptr;
  Buffer* sin_ = nullptr;
  std::vector<Buffer*> outs_;  // one (packed) or three
  Buffer* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  Buffer* cache_k_ = nullptr;  // spec.cache: k and v caches, the slots, the skipped counter
  Buffer* cache_v_ = nullptr;
  // A dynamic FP8 cache (e4m3dyn): a float per cached row and head, [pages][page_size][kv_heads]
  // with a float's gap after each page, poisoned.
  Buffer* scales_k_ = nullptr;
  Buffer* scales_v_ = nullptr;
  int64_t scale_stride_page_ = 0;
  Buffer* slots_ = nullptr;   // slots: slot_mapping
  Buffer* indptr_ = nullptr;  // paged: indptr, indices, last_page_len (in lens_)
  Buffer* indices_ = nullptr;
  Buffer* lens_ = nullptr;  // paged: last_page_len; contiguous: seq_lens
  Buffer* skipped_ = nullptr;
  Buffer* cu_ = nullptr;  // cache_sequences: args.cu_seqlens
  std::vector<int32_t> cu_seqlens_;
  int64_t cache_pages_ = 0, slot_stride_ = 0, page_stride_ = 0, num_indices_ = 0;
  std::vector<int64_t> dest_page_, dest_row_;  // per token; -1: not written
  int32_t want_skipped_ = 0;
  std::vector<int64_t> positions_;
  Expected expected_, expected_unfused_;
  ProjPath matched_ = ProjPath::fused;
  // A key without a fused kernel (a dynamic FP8 cache): an automatic call is the unfused path.
  bool unfused_only_ = false;
};

}  // namespace ropejit::oracle
