// Kernel argument block shared by the host (jit/call.cpp, make_params) and the generated kernels.
// Plain C types only: NVRTC sees no system headers, and both compilers must agree on layout.
#pragma once

namespace ropejit_dev {

// One q or k operand: element strides (last dimension contiguous), 64-bit throughout.
struct HeadOperand {
  const void* in;
  void* out;               // equals `in` for in-place calls
  long long stride_batch;  // dense layouts only
  long long stride_seq;    // token stride for thd
  long long stride_head;
  long long out_stride_batch;
  long long out_stride_seq;
  long long out_stride_head;
  int heads;  // 0 when the operand is absent
  int pad_;
};

struct RopeParams {
  HeadOperand q;
  HeadOperand k;
  long long tokens;       // batch * seq_len for dense layouts, total tokens for thd
  long long seq_len;      // dense layouts: tokens per sequence
  long long batch;        // sequences (thd: entries in cu_seqlens minus one)
  long long pos_offset;   // scalar offset added to implicit positions
  const void* positions;  // per-sequence offsets or per-token ids (index dtype of the key)
  const int* cu_seqlens;  // thd only
  const void* cos;        // table rows, row r holds cos for position r
  const void* sin;
  long long table_stride;  // elements between table rows
  long long table_rows;    // valid positions are [0, table_rows)
  double log2_base;        // computed frequencies: log2(base)
};

// Where a fused call appends k and v (Spec::cache), as checked by the host; element strides of
// the cache's dtype. Indices read from device memory are checked again by the kernel.
struct CacheParams {
  void* k;
  void* v;  // null: only k is appended
  long long pages;
  long long page_size;
  long long stride_page;
  long long stride_slot;
  long long stride_head;
  const long long* slot_mapping;  // slots
  const int* indptr;              // paged
  const int* indices;
  long long num_indices;
  const int* last_page_len;
  const int* seq_lens;  // contiguous
  float k_scale;        // e4m3 cache: stored = value * scale
  float v_scale;
  int* skipped;  // optional: tokens not written because their slot or page was out of range
  // page_size as a multiplier and two shifts (n / page_size = (h + ((n - h) >> a)) >> b with
  // h = umulhi(n, page_magic), for n and page_size below 2^32; make_params, page_divisor).
  unsigned page_magic;
  unsigned char page_shift_a;
  unsigned char page_shift_b;
  unsigned short pad_;
  // e4m3_dynamic cache: a float dequantization scale per cached token and head, placed like the
  // rows with these strides (in floats).
  float* k_scales;
  float* v_scales;  // null: only k is appended
  long long scale_stride_page;
  long long scale_stride_slot;
  long long scale_stride_head;
};

// Where a dynamic FP8 output's per-token, per-head scales go: [batch][seq][head] (thd:
// [token][head]) by element strides in floats.
struct ScaleOperand {
  float* data;
  long long stride_batch;  // dense layouts only
  long long stride_seq;
  long long stride_head;
};

// The argument block of a fused kernel: the plain block first, then the fused stages'.
struct FusedParams {
  RopeParams rope;
  HeadOperand v;         // v heads (in only), appended to the cache next to k
  const void* q_norm_w;  // QK-norm weights, activation dtype
  const void* k_norm_w;
  float norm_eps;
  float out_scale;  // e4m3 q_out / k_out: stored = value * scale
  CacheParams cache;
  ScaleOperand q_scale;  // e4m3_dynamic q_out / k_out
  ScaleOperand k_scale;
};

// Per-pair frequency data of keys whose frequencies or positions differ by rotary pair (the
// scaled frequency variants, mRoPE), appended to the argument block; N = rotary pairs. The host
// writes the same layout (jit/engine.cpp, launch): attention and pad, then N doubles, then N
// bytes.
template <int N>
struct PairTable {
  float attention;  // cos and sin are multiplied by it (yarn, longrope); 1 otherwise
  int pad_;
  double turns[N];      // turns per position of each pair: inverse frequency / 2 pi, float64
  signed char rows[N];  // mRoPE: the position row (0 temporal, 1 height, 2 width) of each pair
};

template <class Params, int N>
struct WithPairs {
  Params base;
  PairTable<N> pairs;
};

}  // namespace ropejit_dev
