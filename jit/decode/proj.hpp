// The decode block's QKV projection (QkvProjSpec): kernel variants, call checking, the argument
// block and rendering. The engine (jit/engine.cpp) compiles, caches and launches it like a RoPE
// key; autotune/ chooses the variant.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "jit/call.hpp"
#include "jit/render.hpp"
#include "templates/proj_params.cuh"

namespace ropejit::detail {

// Constants baked into a projection kernel (templates/proj_kernel.cuh).
struct ProjVariant {
  int32_t token_tiles = 1;  // tokens per block, in eights: 1, 2, 4 or 8
  int32_t splits = 4;       // warps per block, each a slice of the hidden dimension: 1..8
  int32_t unroll = 2;       // 32-element chunks per warp per loop iteration: 1, 2 or 4
  // Blocks of one thread-block cluster splitting the hidden dimension (sm_90+): 1 (none), 2, 4
  // or 8. Each block sums its slice; the cluster's partial sums meet in distributed shared
  // memory, added in rank order (deterministic), before the epilogue. For grids too small to
  // fill the GPU.
  int32_t cluster = 1;
  // e4m3 weights at two or four token tiles: 64-element chunks (16 codes, 16 bytes per lane and
  // row), as one tile always reads, instead of 32-element ones (8 bytes). Name suffix `w`.
  bool wide = false;
  // 16-bit weights at an even number of token tiles: the tokens as the mma's 16-row operand (two
  // tiles each) and the weights as its 8-column one, whose registers are then the loads' own
  // (weights as the 16-row operand take a move per register to interleave a lane's two rows).
  // Name suffix `t`.
  bool swap = false;
  // 16-row weight groups per block, `splits` warps each: 1, 2, 4 or 8. From 2 the block's
  // tokens' activations are staged in shared memory once per iteration, their norm products
  // formed once, and shared by the groups: a block of `rows` groups reads them once where
  // `rows` blocks of one group read them `rows` times (at 32-64 tokens that traffic, every
  // block's from L2, outgrows the weight's). Name suffix `r<rows>`.
  int32_t rows = 1;

  int32_t threads() const { return 32 * splits * rows; }
  // Blocks the kernel is compiled to keep resident per SM (__launch_bounds__), in threads'
  // worth: 1024 for one token tile (64 registers at 8 warps; a Llama-sized grid of 384 blocks
  // runs in one wave on 132 SMs), 768 with e4m3 weights there (a stage holds 64-element chunks:
  // 80 registers). Two tiles: 1024, but 768 for the projection with 16-bit weights (its 2-tile
  // variant spilled at 64 registers). Four and eight tiles: 512, but 384 for eight tiles in the
  // projection with 16-bit weights (three 4-warp blocks per SM, 168 registers). The exceptions
  // are what the H100 measures faster at 16 and 64 tokens; the FFN (`glu`), whose 1792-block
  // grid runs several waves, is slower with fewer resident blocks (bench/history/2026-11-24.md,
  // "A clean L2, a read-pass floor, and thread-block clusters").
  // The `wide` variants at two and four tiles hold twice a stage's activations: 512 and 384.
  int32_t min_blocks(bool fp8_weights = false, bool glu = false) const {
    const bool one_wide = fp8_weights && token_tiles == 1;
    const bool proj16 = !fp8_weights && !glu;
    int32_t worth = rows > 1                     ? 512
                    : wide                       ? (token_tiles == 2 ? 512 : 384)
                    : token_tiles == 1           ? (one_wide ? 768 : 1024)
                    : token_tiles == 2           ? (proj16 ? 768 : 1024)
                    : token_tiles == 8 && proj16 ? 384
                                                 : 512;
    return std::max(1, worth / threads());
  }
  std::string name() const;  // "m2s4u2", "m1s8u2c4", "m2s8u1w", "m2s8u1t", "m8s2u1tr4c2"
  friend bool operator==(const ProjVariant& a, const ProjVariant& b) {
    return a.token_tiles == b.token_tiles && a.splits == b.splits && a.unroll == b.unroll &&
           a.cluster == b.cluster && a.wide == b.wide && a.swap == b.swap && a.rows == b.rows;
  }
};

// The variant a name() spells ("m<tiles>s<splits>u<unroll>[w][t][r<rows>][c<cluster>]", decimal
// numbers without leading zeros); false for anything else (legality is proj_variant_problem's).
bool parse_proj_variant(const std::string& name, ProjVariant* out);

// "" when `v` may be compiled (for e4m3 weights when `fp8_weights`), else the reason, starting
// with the field's name.
std::string proj_variant_problem(const ProjVariant& v, bool fp8_weights = false);

// args.hidden of a projection or FFN call: a multiple of a lane's 16-byte weight vector (8
// elements, 16 with e4m3 weights) up to 2^24; throws naming it otherwise.
void check_hidden(int64_t hidden, Weights weights);

// Call-checking helpers shared with the FFN (jit/decode/ffn.cpp); ranges and overlaps are
// jit/call.hpp's.
// A read-only matrix of 16-byte rows: [rows][cols] with `stride`, 16-byte aligned.
void check_matrix(const char* name, const char* stride_name, const void* p, int64_t rows,
                  int64_t cols, int64_t stride, int64_t elem);

// A workspace (null: none) is 256-byte aligned, fits the address space, and overlaps none of
// `others` (the call's inputs and outputs).
void check_workspace(const void* workspace, size_t bytes, const Range* others, size_t n);

// What about a call decides its launch.
struct ProjShape {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int32_t q_heads = 0;
  int32_t kv_heads = 0;
  int64_t pairs = 0;  // output column pairs: (q_heads + 2 kv_heads) * head_dim / 2
};

// Token tiles a call needs, as a power of two: 1 (<= 8 tokens), 2, 4, or 8 (> 32 tokens).
int32_t proj_token_tiles(int64_t tokens);

// Throws Error(invalid_argument) naming the first bad argument; otherwise the call's shape.
// Reads no device memory. Zero tokens is valid (nothing to do).
ProjShape check_proj_call(const QkvProjSpec& canonical, const QkvProjArgs& args);

ropejit_dev::ProjParams make_proj_params(const QkvProjSpec& canonical, const QkvProjArgs& args,
                                         const ProjShape& shape);

// The unfused path (RMSNorm key -> cuBLASLt GEMM -> RoPE key). Its workspace holds the
// normalized activation (none without a norm), 256-byte aligned, with e4m3 weights a chunk of
// dequantized weight rows (jit/decode/dequant.hpp), then cuBLASLt's scratch.
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;
// Workspace sizes come from the caller's counts, so every product and sum is checked: one past
// size_t would otherwise wrap to a small size that the call then writes past.
// The product of `factors` rounded up to a multiple of 256; false when a factor is negative or
// the result does not fit in size_t.
bool aligned_product(std::initializer_list<int64_t> factors, size_t* bytes);
// The sum of a workspace's `parts`; Error(invalid_argument) naming `what` (the caller's counts)
// when it does not fit in size_t.
size_t workspace_sum(std::initializer_list<size_t> parts, const std::string& what);
// The normalized activation's bytes in a workspace (0 without a norm), 256-byte aligned;
// Error(invalid_argument) naming args.tokens and args.hidden when that overflows.
size_t norm_workspace_bytes(DType dtype, Norm norm, int64_t tokens, int64_t hidden);
size_t proj_norm_bytes(const QkvProjSpec& canonical, int64_t tokens, int64_t hidden);
// args.q_heads and args.kv_heads each in [1, 65536], else InvalidArgument naming the one.
void check_proj_heads(int64_t q_heads, int64_t kv_heads);
// With e4m3 weights, the chunk of dequantized rows for a weight of (q + 2 kv heads) · head_dim
// rows (jit/decode/dequant.hpp); 0 otherwise.
size_t proj_chunk_bytes(const QkvProjSpec& canonical, int64_t hidden, int64_t q_heads,
                        int64_t kv_heads);
size_t proj_workspace_bytes(const QkvProjSpec& canonical, int64_t tokens, int64_t hidden,
                            int64_t q_heads, int64_t kv_heads);

// "" when the key has a fused kernel, else why not: a dynamic FP8 cache (e4m3dyn) needs each
// head's amax, and the fused kernel's blocks each hold 16 columns of a head, so those keys take
// the unfused path, whose RoPE step (the fused RoPE key) computes the scales.
std::string proj_fused_problem(const QkvProjSpec& canonical);

// "" when a checked call can take the unfused path, else why not, starting with the argument's
// name: q/k/v heads contiguous within a token (stride_head == head_dim), rows the RMSNorm key
// takes, and (with `need_workspace`) a workspace of proj_workspace_bytes().
std::string proj_split_problem(const QkvProjSpec& canonical, const QkvProjArgs& args,
                               const ProjShape& shape, bool need_workspace);

// The unfused path's steps as calls of the other key families: the RMSNorm key, and the RoPE
// key in place on q and k (bshd, one sequence of `tokens`); with a KV cache, the fused RoPE key
// that also appends k and v (slots: that sequence; paged or contiguous: a sequence per token,
// or thd over args.cu_seqlens).
RmsNormSpec proj_norm_spec(const QkvProjSpec& canonical);
Spec proj_rope_spec(const QkvProjSpec& canonical, const QkvProjArgs& args);
Args proj_rope_args(const QkvProjSpec& canonical, const QkvProjArgs& args);

// What the unfused path's preparation is remembered by (per context): the projection's key and
// its RoPE step's (which depends on the cache addressing).
std::string proj_unfused_key(const QkvProjSpec& canonical, const QkvProjArgs& args);

// The token bucket a path choice is made for: tokens rounded up to a power of two.
int64_t proj_path_bucket(int64_t tokens);

// Grid of a launch: blocks of 8 column pairs (x) by groups of token_tiles * 8 tokens (y).
uint32_t proj_grid_x(const ProjShape& shape, const ProjVariant& v);
uint32_t proj_grid_y(const ProjShape& shape, const ProjVariant& v);

RenderedKernel render(const QkvProjSpec& canonical, const ProjVariant& variant);

// A projection or FFN variant whose blocks form clusters needs sm_90; refused by name before
// anything is compiled for an older target.
void check_cluster_target(const ProjVariant& v, const std::string& target);

// One launch of a projection or FFN kernel: grid (x, y, cluster), the cluster's blocks along z
// (rank = blockIdx.z) when the variant has one.
void launch_proj_kernel(CUfunction fn, const ProjShape& shape, const ProjVariant& v,
                        CUstream stream, void** kernel_args);

}  // namespace ropejit::detail
