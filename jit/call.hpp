// Validation of a call's arguments against its spec, and the kernel argument block.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "jit/launch_config.hpp"
#include "templates/rope_params.cuh"

namespace ropejit::detail {

// Whether the key's frequencies are a scaled variant (per-pair turns from the host's float64
// table), and whether its argument block carries a PairTable (scaled frequencies, or mRoPE's
// per-pair position rows).
inline bool scaled_freqs(const Spec& c) {
  return c.freqs != Freqs::table && c.freqs != Freqs::computed;
}
inline bool needs_pair_table(const Spec& c) {
  return scaled_freqs(c) || c.positions == Positions::mrope;
}

// One strided dimension of an operand: `count` rows `stride` elements apart.
struct Dim {
  int64_t stride;
  int64_t count;
  const char* name;
};
using Dims = std::array<Dim, 3>;

// One operand as checked: its strides, the bytes it spans, whether the call writes it.
struct Operand {
  const char* name = nullptr;
  Dims dims{};
  int64_t elem = 0;              // bytes per element
  uintptr_t first = 0, end = 0;  // bytes [first, end); empty for an operand without elements
  bool written = false;
  int64_t row = 0;  // elements per row (head_dim; 1 for a tensor of per-head scales)
  // How a fused kernel's narrow variant indexes it (CallShape::narrow): all of it with 32-bit
  // offsets (q, k, v, outputs, scales), one page at a time (a KV cache and its scales: the
  // page's own offset is 64-bit), or never (norm weights).
  enum class Narrow : int8_t { whole, per_page, never } narrow = Narrow::never;
};

// Checks a strided operand of rows of `row` elements: pointer alignment, non-negative strides,
// no 64-bit overflow of its largest offset, and (when written) rows that never overlap. Returns
// the largest vector width, in its own elements, that its pointer and strides allow (<= 16
// bytes); fills `op`. Names in messages are `name`.`dims[i].name`.
int32_t check_strided(const char* name, const void* data, const Dims& dims, int64_t row,
                      int64_t elem, bool written, Operand* op);

// The cos/sin tables of a table key (rows of `width` elements of `table_dtype`): pointers,
// alignment, row count, stride (0: the width) and 64-bit overflow. Returns the row stride.
int64_t check_table(const void* cos, const void* sin, DType table_dtype, int64_t width,
                    int64_t table_rows, int64_t table_stride);

// A quantization scale: finite and > 0 (the message names `name` and the value).
void check_scale(float v, const char* name);
// A device pointer that must be set (`why` says which spec field needs it) and aligned to
// `bytes`.
void check_aligned(const void* p, uint64_t bytes, const char* name, const char* why);

// Rejects a written operand that shares memory with any other of the n, unless both are views
// of distinct rows of one tensor (q and k of a packed QKV output).
void check_no_overlap(const Operand* ops, size_t n);

// The bytes [first, end) a call touches through one argument; empty when it touches none.
struct Range {
  const char* name;
  uintptr_t first, end;
};
// `rows` rows of `row` elements of `elem` bytes, `stride` elements apart (empty for a null
// pointer or no rows); throws naming `name` when the span overflows 64-bit addresses.
Range range_of(const char* name, const void* p, int64_t rows, int64_t stride, int64_t row,
               int64_t elem);
// Rejects a written range that meets a read-only one: every kernel reads its inputs (tables,
// positions, page tables, weights) while it writes, so a shared byte is a race.
void check_untouched(const Range* written, size_t n_written, const Range* inputs, size_t n_inputs);
// RMSNorm's epsilon: a finite float >= 0 (the kernels add it in float).
void check_norm_eps(double eps);

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
// Reads no device memory. A call with zero tokens is valid and returns tokens == 0.
CallShape check_call(const Spec& canonical, const Args& args);

// The per-pair table of a key that needs one (needs_pair_table): each pair's turns per position
// (float64 inverse frequency / 2 pi, as jit/scaling.hpp defines the variant), the attention
// factor, and mRoPE's position row of each pair. Checks the scaling parameters and sections
// (throws Error naming them); remembers the last inputs per thread, so repeated calls cost a
// comparison.
struct PairData {
  std::vector<double> turns;
  double attention = 1.0;
  std::vector<int8_t> rows;
};
const PairData& pair_data(const Spec& canonical, const Args& args);

// A divisor d in [1, 2^32) as the kernels divide by it (templates/rope_fused.cuh, page_div):
// for every n < 2^32, n / d = (h + ((n - h) >> shift_a)) >> shift_b with h = (n * magic) >> 32.
// Other divisors give {0, 0, 0} (the kernels then divide).
struct Divisor {
  uint32_t magic;
  uint8_t shift_a, shift_b;
};
Divisor page_divisor(int64_t d);

// The kernel argument block for a checked call: plain kernels take its `rope` part, fused
// kernels all of it.
ropejit_dev::FusedParams make_params(const Spec& canonical, const Args& args,
                                     const CallShape& shape);

}  // namespace ropejit::detail
