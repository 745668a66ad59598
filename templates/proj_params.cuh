// Argument block of the decode block's projection kernels (templates/proj_kernel.cuh), shared
// by the host (jit/proj.cpp) and the generated kernels. Plain C types only.
#pragma once

namespace ropejit_dev {

// One output of the projection (q, k or v): [tokens][heads][head_dim], element strides.
struct ProjOutput {
  void* data;
  long long stride_token;
  long long stride_head;
  int heads;
  int pad_;
};

// The KV cache k and v are appended to (Cfg::kCache); element offsets from k / v. slots: row
// slots[token] (page slot / page_size, row slot % page_size). Without cu_seqlens token t is
// sequence t's one new token: paged, the last page of sequence t (indices[indptr[t + 1] - 1]),
// row last_page_len[t] - 1; contiguous, page t, row seq_lens[t]. With cu_seqlens, token t is
// token s of the n new tokens of sequence b (cu_seqlens[b] <= t < cu_seqlens[b + 1]): paged,
// position held - n + s of the sequence after the append (held = (pages - 1) * page_size +
// last_page_len[b]); contiguous, page b, row seq_lens[b] + s.
struct ProjCache {
  void* k;
  void* v;
  const long long* slots;  // per token; negative: not written; >= slot_count: counted, skipped
  const int* indptr;
  const int* indices;
  const int* last_page_len;
  const int* seq_lens;
  const int* cu_seqlens;  // null: one token per sequence
  int* skipped;           // optional counter of tokens whose row falls outside the cache
  long long num_indices;
  long long pages;
  long long stride_page;
  long long stride_slot;
  long long stride_head;
  long long page_size;
  long long slot_count;  // pages * page_size
  long long batch;       // with cu_seqlens: its entries minus one
  float k_scale;         // e4m3 cache: stored = value * scale
  float v_scale;
};

struct ProjParams {
  const void* x;          // [tokens][hidden] activations, row stride x_stride
  const void* norm_w;     // [hidden] RMSNorm weight (null without a norm)
  const void* w;          // [columns][hidden] weight: row n is output column n (torch's Linear)
  const void* w2;         // the GLU epilogue's up weight [pairs][hidden] (QKV: w)
  const float* w_scale;   // e4m3 weights: a float scale per row of w (else null)
  const float* w2_scale;  // and of w2
  const void* bias;       // QKV: [columns] in the activation dtype, added before RoPE (or null)
  long long x_stride;
  long long w_stride;
  long long tokens;
  long long hidden;
  long long pairs;    // output column pairs: columns / 2 (GLU: the intermediate columns)
  ProjOutput out[3];  // q, k, v (k's and v's data may be null with a cache)
  ProjCache cache;
  const void* positions;  // per-token ids (index dtype of the key), or null with an offset
  long long pos_offset;
  const void* cos;  // table rows, row r holds position r
  const void* sin;
  long long table_stride;
  long long table_rows;
  double log2_base;
  float norm_eps;
  int pad_;
};

}  // namespace ropejit_dev
