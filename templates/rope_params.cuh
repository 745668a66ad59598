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

}  // namespace ropejit_dev
