// Argument block of the MLA kernels (templates/mla_kernel.cuh), shared by the host
// (jit/mla/mla.cpp) and the generated kernels. Plain C types only; strides in elements of the
// tensor's own storage (bytes for e4m3).
#pragma once

namespace ropejit_dev {

struct MlaParams {
  const void* kv_c;  // [tokens][kv_rank]
  const void* k_pe;  // [tokens][rope_dim]
  const void* w;     // [kv_rank], with the norm
  void* cache;       // [cache_slots][kv_rank + rope_dim]; null: no cache row is written
  const long long* slots;
  const float* cache_scale;
  int* skipped;        // null: not counted
  void* q_pe;          // [tokens][heads][rope_dim]
  const void* q_nope;  // assemble: [tokens][heads][kv_rank]
  void* q_out;         // assemble: [tokens][heads][kv_rank + rope_dim]
  const float* q_scale;
  const void* ids;  // [tokens]
  const void* cos;  // [table_rows][rope_dim / 2]
  const void* sin;
  long long kv_c_stride;
  long long k_pe_stride;
  long long cache_stride;
  long long cache_slots;
  long long q_pe_token_stride;
  long long q_pe_head_stride;
  long long q_nope_token_stride;
  long long q_nope_head_stride;
  long long q_out_token_stride;
  long long q_out_head_stride;
  long long table_rows;
  long long table_stride;
  long long tokens;
  long long heads;
  // The grid (jit/mla/mla.cpp, make_mla_params): cache_blocks blocks of cache rows, then the
  // query's blocks, tokens_per_block tokens by heads_per_block heads each (head_groups a tile).
  long long cache_blocks;
  long long tokens_per_block;
  long long heads_per_block;
  long long head_groups;
  float eps;
  int q_pe_vectors;  // q_pe's pointer and strides allow 16-byte vectors
  // rope(k_pe) in the dtype for every token (null: not written; k_pe itself: in place).
  void* k_pe_out;
  long long k_pe_out_stride;
  // The rows' rope part in its own cache (null: after kv_rank in the cache row).
  void* cache_pe;
  long long cache_pe_stride;
  // How a token finds its cache row: slots (0), its own index (1), or the page table (2).
  int addressing;
  const int* kv_indices;
  const int* kv_indptr;
  const int* batch_indices;
  const int* page_positions;
  long long batch;
  long long num_indices;
  long long page_size;
  // assemble: the query's rope part in a tensor of its own (null: after kv_rank in q_out).
  void* q_out_pe;
  long long q_out_pe_token_stride;
  long long q_out_pe_head_stride;
  // Blocks of cache rows (0: rows one stride apart): a slot's row is at block * block stride +
  // row in block * row stride.
  long long cache_block_size;
  long long cache_block_stride;
  long long cache_pe_block_stride;
};

// MlaParams::addressing
enum : int { kMlaSlots = 0, kMlaRowsByToken = 1, kMlaPageTable = 2 };

}  // namespace ropejit_dev
