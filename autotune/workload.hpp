// A RoPE problem that owns its data: random host inputs, device buffers with poisoned
// outputs and guard regions, and a float64 CPU reference to check results against. Used by
// the GPU tests, `ropejit demo`, the tuner (which never touches callers' data) and bench/.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::autotune {

struct Sizes {
  int64_t batch = 2;
  int64_t seq_len = 5;            // dense layouts
  std::vector<int64_t> seq_lens;  // thd: per-sequence token counts
  int64_t padding_tokens = 0;     // thd: tokens after the last sequence (left unchanged)
  int32_t q_heads = 3;
  int32_t k_heads = 1;          // 0: no k
  bool packed_qkv = false;      // q, k (and an untouched v) interleaved in one buffer
  int64_t head_gap = 0;         // extra elements between heads (strided views)
  int32_t misalign_elems = 0;   // shift every tensor by this many elements
  int64_t position_offset = 0;  // Positions::offset
  int64_t max_position = 0;     // largest random seq offset / id (0: table_rows - 1 or 4095)
  int64_t table_rows = 0;       // 0: just enough for the positions used
  bool combined_table = false;  // half-width cos|sin in one row (vLLM cos_sin_cache)
  double base = 10000.0;
  uint64_t seed = 1;
};

struct CheckReport {
  bool ok = true;
  int64_t checked = 0;  // elements compared
  int64_t mismatches = 0;
  double max_rel_l2 = 0;  // relative L2 error of rotated elements against float64
  double max_abs_err = 0;
  std::string first_failure;  // operand, element, got, expected, tolerance
};

class Workload {
 public:
  // Generates host data only; needs no GPU.
  Workload(const Spec& spec, const Sizes& sizes);
  ~Workload();
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  const Spec& spec() const { return spec_; }
  int64_t tokens() const { return tokens_; }

  // Allocates device buffers and uploads inputs, with outputs poisoned (NaN bytes). Calling
  // it again restores the inputs and re-poisons the outputs.
  void upload();
  // Arguments pointing at the device buffers.
  Args args(void* stream = nullptr) const;
  // Copies outputs back and compares every byte of every output allocation (guards and
  // gaps included) with the float64 reference (built on first use: 16 bytes per element).
  CheckReport check();
  // Waits for the device and returns the raw bytes of every output allocation (the tuner's
  // bit-identity comparison, which needs no reference).
  const std::vector<std::vector<uint8_t>>& download();

  // Bytes a kernel must move: q and k read and written once, plus table rows read.
  int64_t bytes_moved() const;

 private:
  struct Buffer;
  Buffer& add_buffer(std::vector<uint8_t> host);
  // The constructor's steps: q/k (and outputs), positions, tables.
  void add_operands();
  int64_t add_positions();
  void add_tables(int64_t max_position);
  void build_reference();

  Spec spec_;
  Sizes sizes_;
  std::mt19937_64 rng_;
  int64_t tokens_ = 0;
  std::vector<Buffer*> buffers_;
  Args host_args_;                   // pointers into host copies
  std::vector<int> output_buffers_;  // indices into buffers_ checked by check()
  // Per output buffer: expected double value and tolerance (< 0: byte-exact).
  std::vector<std::vector<double>> expect_, tol_;
  std::vector<std::vector<uint8_t>> downloaded_;
};

}  // namespace ropejit::autotune
