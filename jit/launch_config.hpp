// Launch configurations: the compile-time kernel variant plus the run-time block/grid shape,
// and the rules that make a configuration legal for a spec and a call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

// Constants baked into a compiled kernel (part of its name and its cache entry).
struct KernelVariant {
  int32_t vec = 1;               // elements per vector access (2..16 bytes)
  int32_t heads_per_thread = 1;  // heads loaded before the first store
  int32_t max_threads = 256;     // __launch_bounds__
  bool table_vec = true;         // cos/sin rows read with vector loads (false: element by
                                 // element, for tables whose pointers or row stride are not
                                 // aligned to a vector; such a kernel's name ends in "s")
  bool grid_stride = false;      // blocks loop over token groups: what persistent grids
                                 // (blocks_per_sm > 0) need; one-shot grids compile without
                                 // the loop. Name ends in "p"
  bool narrow = false;           // fused keys: 32-bit offsets inside the tensors and cache pages,
                                 // for calls whose offsets all fit (CallShape::narrow); decided
                                 // per call like table_vec, never tuned. Name ends in "n"
  int32_t ring = 0;              // fused keys, one or two heads per thread, 16-byte vectors:
                                 // passes loaded ahead through a shared-memory ring of this many
                                 // slots (cp.async), 0 (none: the next pass into registers) or
                                 // 2..4. Name ends in "a" and the slots

  std::string name() const;  // "v8h2t256", "v8h2t256s", "v8h2t256p", "v8h1t512n", "v8h2t256na3"
  friend bool operator==(const KernelVariant& a, const KernelVariant& b) {
    return a.vec == b.vec && a.heads_per_thread == b.heads_per_thread &&
           a.max_threads == b.max_threads && a.table_vec == b.table_vec &&
           a.grid_stride == b.grid_stride && a.narrow == b.narrow && a.ring == b.ring;
  }
};

struct LaunchConfig {
  KernelVariant kernel;
  int32_t rows = 1;              // blockDim.y: head rows
  int32_t tokens_per_block = 1;  // blockDim.z
  int32_t blocks_per_sm = 0;     // 0: one block per token group; >0: persistent grid
                                 // (needs kernel.grid_stride; see set_persistent())
  int32_t head_groups = 1;       // gridDim.y: a token's heads dealt over this many blocks (row
                                 // y of block g takes heads g * rows + y, then every
                                 // rows * head_groups): decode spreads one token over SMs

  std::string name() const;  // "v8h2t256_r4_z2_g0", "v8h1t512_r8_z1_g0_y5" (head groups > 1)
  friend bool operator==(const LaunchConfig& a, const LaunchConfig& b) {
    return a.kernel == b.kernel && a.rows == b.rows && a.tokens_per_block == b.tokens_per_block &&
           a.blocks_per_sm == b.blocks_per_sm && a.head_groups == b.head_groups;
  }
};

// What about a call decides its launch: sizes and the alignment its pointers/strides allow.
struct CallShape {
  int64_t tokens = 0;
  int32_t q_heads = 0;
  int32_t k_heads = 0;
  int32_t v_heads = 0;       // fused keys with a KV cache: v heads appended next to k
  int32_t align_bytes = 16;  // largest power of two (<= 16) dividing every pointer and stride
  int32_t table_align = 16;  // the same for cos, sin and the table row stride (tables only)
  // Fused keys: every offset inside q, k, v, their outputs and scales, and inside one page of the
  // cache (and its scales), fits in 32 bits, in bytes, and so does every cache stride: the call
  // runs the kernels' narrow variant (KernelVariant::narrow).
  bool narrow = false;
};

// The facts about a GPU that launch decisions use.
struct DeviceInfo {
  int ordinal = 0;
  int cc = 0;        // 90 for sm_90
  int image_cc = 0;  // the target its kernels are compiled for (target_for(cc)): 90 for sm_90,
                     // 120 for compute_120; 0 when NVRTC has none for it
  int sm_count = 1;
  int max_threads_per_sm = 2048;
  int max_shared_per_block = 48 * 1024;  // bytes a block may ask for (the opt-in maximum)
  double memory_gbps = 0;  // peak DRAM bandwidth (memory clock x bus width); 0: unknown or MIG
  std::string name;
};

// Peak DRAM bandwidth in GB/s from the driver's memory clock (kHz) and bus width (bits),
// double data rate: H100 SXM 3352, H200 4917. 0 for a MIG slice (its name says "MIG"): it
// reports the whole GPU's clock and bus but only its own SMs, so per-SM bandwidth would be
// overstated.
double peak_memory_gbps(const std::string& device_name, int memory_clock_khz, int bus_width_bits);

int32_t element_bytes(DType t);

// Largest vector width (elements) legal for a canonical spec when pointers and strides are
// aligned to `align_bytes`; 0 when none is (gptj needs whole pairs).
int32_t max_vec(const Spec& canonical, int32_t align_bytes);

// Whether a kernel with data vectors of `vec` elements can read its cos/sin rows with vector
// loads when the table's pointers and row stride are aligned to `table_align` bytes (always
// true for computed frequencies, which read no table).
bool table_vectors_ok(const Spec& canonical, int32_t vec, int32_t table_align);

// Bytes of one vector table load for data vectors of `vec` elements: the alignment that
// table_vectors_ok asks of the table.
int32_t table_vector_bytes(const Spec& canonical, int32_t vec);

// blockDim.x for a canonical spec and vector width: the chunks of a head (fused keys: rounded up
// to a power of two, or to whole warps beyond 32).
int32_t chunks(const Spec& canonical, int32_t vec);

// Legality, decided here and nowhere else. Each returns "" when legal, else the reason; a
// reason about one field starts with the field's name ("vec (3) must be ...").
// What a compiled variant may be for this spec, whatever the call.
std::string variant_problem(const Spec& canonical, const KernelVariant& variant);
// What a launch configuration may be for this spec, whatever the call: its variant, block
// shape, grid mode and shared memory.
std::string launch_problem(const Spec& canonical, const LaunchConfig& cfg);
// Whether `cfg` may launch this call on this device: launch_problem(), then the call's
// alignment, head count and the device's SM capacity.
std::string illegal_reason(const Spec& canonical, const CallShape& shape, const LaunchConfig& cfg,
                           const DeviceInfo& device);

// Token-count bucket: the smallest power of two >= tokens (1 for tokens <= 1), saturating at
// 2^62. Launch decisions are made, remembered and tuned per bucket.
int64_t token_bucket(int64_t tokens);

// The kernel variants a key launches when nothing was tuned: the widest vectors the alignment
// allows, a 512-thread bound (or the chunk count when wider), and 2 heads per thread
// (prefill) or 1 (decode). They depend only on the spec and the alignment of the call's q/k
// and table, never on sizes, so that changing shapes never compiles anything.
KernelVariant prefill_variant(const Spec& canonical, int32_t align_bytes, int32_t table_align = 16);
KernelVariant decode_variant(const Spec& canonical, int32_t align_bytes, int32_t table_align = 16);
// Both, prefill first: what a key's first use prepares and `ropejit compile` builds. Fused keys
// get each with 64-bit and with 32-bit offsets (narrow: what calls up to 2 GiB run), so that a
// call of either kind after the first, a CUDA graph capture included, loads nothing new.
std::vector<KernelVariant> default_variants(const Spec& canonical, int32_t align_bytes,
                                            int32_t table_align = 16);
// `v`, and for a fused key also its other offset width: the kernels a variant's calls may need.
std::vector<KernelVariant> offset_forms(const Spec& canonical, const KernelVariant& v);

// Dynamic shared memory of a launch: computed frequencies share each token's (cos, sin) pairs
// across the block, 8 bytes per pair per token slot; fused kernels add a ring variant's slots and
// float norm weights, and reduction scratch, which for a norm over all heads grows with the
// q + k heads of the call (`qk_heads`).
int64_t shared_bytes(const Spec& canonical, const LaunchConfig& cfg, int32_t qk_heads = 0);
// The most a variant's launch may ask for whatever the GPU: kMaxSharedBytes, or for a ring
// variant (whose kernel asks for more when it loads) kMaxOptinSharedBytes.
int64_t shared_limit(const KernelVariant& variant);
constexpr int32_t kPrefillRing = 3;  // the ring of fused prefill variants (prefill_variant)
constexpr int64_t kMaxSharedBytes = 48 * 1024;  // available without an opt-in attribute
// What ring variants may ask for with the opt-in attribute on the largest GPUs (sm_90: 227 KB);
// each GPU's own maximum is checked per call (DeviceInfo::max_shared_per_block).
constexpr int64_t kMaxOptinSharedBytes = 227 * 1024;
constexpr int32_t kMaxHeadGroups = 64;  // more would leave blocks of a row or two

// Sets blocks_per_sm and the kernel variant that goes with it (grid_stride when > 0).
void set_persistent(LaunchConfig& cfg, int32_t blocks_per_sm);

// Grid size along x (token groups) for a legal configuration; y is cfg.head_groups.
int64_t grid_blocks(const CallShape& shape, const LaunchConfig& cfg, const DeviceInfo& device);

}  // namespace ropejit::detail
