// Legality rules for launch configurations (shared by the heuristic, the tuner and launch).
#include "jit/launch_config.hpp"

#include <algorithm>

#include "jit/errors.hpp"

namespace ropejit::detail {

std::string KernelVariant::name() const {
  return concat('v', vec, 'h', heads_per_thread, 't', max_threads, table_vec ? "" : "s",
                grid_stride ? "p" : "", narrow ? "n" : "",
                ring ? concat('a', ring) : std::string());
}

std::string LaunchConfig::name() const {
  const std::string base =
      concat(kernel.name(), "_r", rows, "_z", tokens_per_block, "_g", blocks_per_sm);
  return head_groups == 1 ? base : concat(base, "_y", head_groups);
}

double peak_memory_gbps(const std::string& device_name, int memory_clock_khz, int bus_width_bits) {
  if (device_name.find(" MIG ") != std::string::npos) return 0;
  return double(memory_clock_khz) * 1e3 * bus_width_bits * 2 / 8 / 1e9;
}

int32_t element_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

int32_t max_vec(const Spec& c, int32_t align_bytes) {
  const int32_t elem = element_bytes(c.dtype);
  const int32_t pairs = c.rotary_dim / 2;
  const int32_t tail = c.head_dim - c.rotary_dim;
  for (int32_t vec = 16 / elem; vec >= 1; vec /= 2) {
    if (vec * elem > align_bytes) continue;
    const bool style_ok =
        c.style == Style::neox ? pairs % vec == 0 : (vec >= 2 && c.rotary_dim % vec == 0);
    const bool tail_ok = (c.in_place && !c.fused()) || tail % vec == 0;
    if (style_ok && tail_ok) return vec;
  }
  return 0;
}

bool table_vectors_ok(const Spec& c, int32_t vec, int32_t table_align) {
  if (c.freqs != Freqs::table) return true;
  // Full-width gptj tables repeat each frequency (f0 f0 f1 f1 ...): read element by element
  // whatever the alignment, so the flag makes no difference there.
  if (c.table_width == TableWidth::full && c.style == Style::gptj) return true;
  return table_align >= table_vector_bytes(c, vec);
}

int32_t table_vector_bytes(const Spec& c, int32_t vec) {
  const int32_t telem = element_bytes(c.table_dtype);
  const int32_t pairs_per_chunk = c.style == Style::neox ? vec : vec / 2;
  return std::min(16 / telem, pairs_per_chunk) * telem;  // as rope_kernel.cuh's kPerLoad
}

int32_t chunks(const Spec& c, int32_t vec) {
  const int32_t per_chunk = c.style == Style::neox ? vec : vec / 2;  // pairs per chunk
  if (per_chunk < 1) return 0;  // gptj needs whole pairs: no such kernel (variant_problem)
  const int32_t rot = (c.rotary_dim / 2) / per_chunk;
  // The pass-through tail is touched out of place (copied) and by fused keys (normalized,
  // stored, cached), never by plain in-place kernels.
  const int32_t tail = c.in_place && !c.fused() ? 0 : (c.head_dim - c.rotary_dim) / vec;
  if (!c.fused()) return rot + tail;
  // Fused kernels reduce over a head's lanes with shuffles: a power of two up to a warp, else
  // whole warps (templates/rope_fused.cuh).
  int32_t lanes = 1;
  while (lanes < rot + tail && lanes < 32) lanes *= 2;
  return rot + tail <= 32 ? lanes : (rot + tail + 31) / 32 * 32;
}

std::string variant_problem(const Spec& c, const KernelVariant& k) {
  const int32_t elem = element_bytes(c.dtype);
  if (k.vec < 1 || k.vec > 8 || (k.vec & (k.vec - 1)))
    return concat("vec (", k.vec, ") must be 1, 2, 4 or 8");
  if (k.vec * elem > 16)
    return concat("vec (", k.vec, ") exceeds 16 bytes of ", to_string(c.dtype));
  if (c.style == Style::neox ? (c.rotary_dim / 2) % k.vec != 0
                             : (k.vec < 2 || c.rotary_dim % k.vec != 0))
    return concat("vec (", k.vec, ") is wider than ", c.key(), " allows (", max_vec(c, 16),
                  "): it must divide the rotary pairs");
  if ((!c.in_place || c.fused()) && (c.head_dim - c.rotary_dim) % k.vec != 0)
    return concat("vec (", k.vec, ") is wider than ", c.key(), " allows (", max_vec(c, 16),
                  "): it must divide the pass-through tail");
  if (k.heads_per_thread < 1 || k.heads_per_thread > 8)
    return concat("heads_per_thread (", k.heads_per_thread, ") must be in 1..8");
  if (k.max_threads < 32 || k.max_threads > 1024 || k.max_threads % 32)
    return concat("max_threads (", k.max_threads, ") must be a multiple of 32 in 32..1024");
  if (k.ring != 0) {
    if (k.ring < 2 || k.ring > 4) return concat("ring (", k.ring, ") must be 0 or 2..4");
    if (!c.fused()) return concat("ring (", k.ring, ") is for fused keys");
    if (k.heads_per_thread > 2)
      return concat("ring (", k.ring, ") needs one or two heads per thread, not ",
                    k.heads_per_thread);
    if (k.vec * elem != 16)
      return concat("ring (", k.ring, ") needs 16-byte vectors, not ", k.vec * elem);
  }
  return {};
}

std::string launch_problem(const Spec& c, const LaunchConfig& cfg) {
  const KernelVariant& k = cfg.kernel;
  if (std::string why = variant_problem(c, k); !why.empty()) return why;
  if (cfg.rows < 1 || cfg.rows > 1024) return concat("rows (", cfg.rows, ") must be in 1..1024");
  if (cfg.tokens_per_block < 1 || cfg.tokens_per_block > 64)
    return concat("tokens_per_block (", cfg.tokens_per_block, ") must be in 1..64");
  if (cfg.blocks_per_sm < 0 || cfg.blocks_per_sm > 32)
    return concat("blocks_per_sm (", cfg.blocks_per_sm, ") must be in 0..32");
  if (cfg.head_groups < 1 || cfg.head_groups > kMaxHeadGroups)
    return concat("head_groups (", cfg.head_groups, ") must be in 1..", kMaxHeadGroups);
  // A norm over all heads needs every q and k head of a token in one block.
  if (c.norm == Norm::rms_all_heads && cfg.head_groups != 1)
    return concat("head_groups (", cfg.head_groups,
                  ") must be 1 for a norm over all heads (every head of a token in one block)");
  if (k.grid_stride != (cfg.blocks_per_sm > 0))
    return k.grid_stride
               ? "a grid-stride variant is for persistent grids (blocks_per_sm > 0), not 0"
               : concat("a persistent grid (blocks_per_sm ", cfg.blocks_per_sm,
                        ") needs a grid-stride variant");
  const int64_t threads = int64_t(chunks(c, k.vec)) * cfg.rows * cfg.tokens_per_block;
  if (threads > k.max_threads)
    return concat(threads, " threads per block exceed max_threads (", k.max_threads, ")");
  if (shared_bytes(c, cfg) > shared_limit(k))
    return concat(cfg.tokens_per_block, " tokens per block need ", shared_bytes(c, cfg),
                  " bytes of shared memory, more than ", shared_limit(k));
  return {};
}

std::string illegal_reason(const Spec& c, const CallShape& shape, const LaunchConfig& cfg,
                           const DeviceInfo& device) {
  if (std::string why = launch_problem(c, cfg); !why.empty()) return why;
  const KernelVariant& k = cfg.kernel;
  const int32_t elem = element_bytes(c.dtype);
  if (k.vec * elem > shape.align_bytes)
    return concat("vec (", k.vec, ") needs ", k.vec * elem, "-byte alignment, the call has ",
                  shape.align_bytes);
  if (k.narrow && !shape.narrow)
    return c.fused() ? "32-bit offsets (a narrow variant) do not hold every offset of the call"
                     : "narrow variants are for fused keys";
  if (k.table_vec && !table_vectors_ok(c, k.vec, shape.table_align))
    return concat("vector table loads need cos, sin and the table row stride aligned to ",
                  table_vector_bytes(c, k.vec), " bytes, the call has ", shape.table_align);
  const int32_t heads = shape.q_heads + shape.k_heads + shape.v_heads;
  if (cfg.rows > std::max(heads, 1))
    return concat("rows ", cfg.rows, " exceed the ", heads, " heads");
  if (int64_t(cfg.rows) * (cfg.head_groups - 1) >= std::max(heads, 1))
    return concat("head_groups (", cfg.head_groups, ") leave blocks without heads: ", heads,
                  " heads in rows of ", cfg.rows);
  const int32_t qk = shape.q_heads + shape.k_heads;
  if (c.norm == Norm::rms_all_heads && cfg.rows * k.heads_per_thread < qk)
    return concat("a norm over all heads needs every q and k head in one pass: rows (", cfg.rows,
                  ") x heads per thread (", k.heads_per_thread, ") < ", qk, " heads");
  const int64_t limit = k.ring > 0 ? std::min<int64_t>(shared_limit(k), device.max_shared_per_block)
                                   : kMaxSharedBytes;
  if (shared_bytes(c, cfg, qk) > limit)
    return concat(cfg.tokens_per_block, " tokens per block need ", shared_bytes(c, cfg, qk),
                  " bytes of shared memory, more than ", limit,
                  k.ring > 0 ? " (this GPU's most per block)" : "");
  const int64_t threads = int64_t(chunks(c, k.vec)) * cfg.rows * cfg.tokens_per_block;
  if (cfg.blocks_per_sm > 0 && threads * cfg.blocks_per_sm > device.max_threads_per_sm)
    return "persistent blocks do not fit on one SM";
  return {};
}

int64_t token_bucket(int64_t tokens) {
  int64_t b = 1;
  while (b < tokens && b < (int64_t(1) << 62)) b <<= 1;
  return b;
}

namespace {

// The widest vectors the call allows, `hpt` heads per thread, at least `threads` as the bound.
KernelVariant variant_with(const Spec& c, int32_t align_bytes, int32_t table_align, int32_t hpt,
                           int32_t threads) {
  KernelVariant v;
  v.vec = max_vec(c, align_bytes);
  v.table_vec = table_vectors_ok(c, v.vec, table_align);
  v.heads_per_thread = hpt;
  const int32_t x = chunks(c, v.vec);
  v.max_threads = threads;
  while (v.max_threads < x) v.max_threads *= 2;
  return v;
}

}  // namespace

// 512 threads: the bound the tuner's winners share on the H100 and the H200
// (bench/history/2026-11-22.md, "Memory roofline, H200" and "Memory roofline, H100"); 2 heads
// per thread for prefill, which fetches cos/sin once for both. Fused keys take 256: the tuner's
// winners at 4096 and 32768 tokens on both GPUs (more registers for the norm, FP8 and cache
// placement; bench/history/2026-11-24.md, "Fused decode"), except a
// norm over all heads, whose block holds every q and k head of a token (up to 2 x 512 / chunks).
// Dynamic FP8 keys too: a head is finished, its scale reduced and the head stored before the
// thread's next head (templates/rope_fused.cuh), so two heads fit the registers.
KernelVariant prefill_variant(const Spec& c, int32_t align_bytes, int32_t table_align) {
  const bool fused_256 = c.fused() && c.norm != Norm::rms_all_heads;
  // Two heads per thread, fused keys too, bf16, static and dynamic FP8 alike. With the next
  // pass's heads loaded ahead, two heads beat four on the H100's FP8 serving step, and one with
  // dynamic scales (twice the bytes in flight per thread; bench/history/2026-11-25.md, "The next
  // pass's heads loaded ahead" and "Dynamic FP8 prefill: two heads per thread").
  KernelVariant v = variant_with(c, align_bytes, table_align, 2, fused_256 ? 256 : 512);
  // Where the vectors are 16 bytes wide, their later passes' heads in flight through a ring of
  // three slots (bench/history/2026-11-26.md, "A cp.async ring").
  if (fused_256 && v.vec * element_bytes(c.dtype) == 16) v.ring = kPrefillRing;
  return v;
}

// One head per thread: fewer registers and less code before the first load, faster per
// graph-replayed decode call than the two-head kernel running one head
// (bench/history/2026-11-22.md, "Decode under graph replay, per launch").
KernelVariant decode_variant(const Spec& c, int32_t align_bytes, int32_t table_align) {
  return variant_with(c, align_bytes, table_align, 1, 512);
}

std::vector<KernelVariant> offset_forms(const Spec& c, const KernelVariant& v) {
  if (!c.fused()) return {v};
  KernelVariant wide = v, narrow = v;
  wide.narrow = false;
  narrow.narrow = true;
  return {wide, narrow};
}

std::vector<KernelVariant> default_variants(const Spec& c, int32_t align_bytes,
                                            int32_t table_align) {
  std::vector<KernelVariant> out;
  for (const KernelVariant& v :
       {prefill_variant(c, align_bytes, table_align), decode_variant(c, align_bytes, table_align)})
    for (const KernelVariant& form : offset_forms(c, v)) out.push_back(form);
  return out;
}

int64_t shared_limit(const KernelVariant& k) {
  return k.ring > 0 ? kMaxOptinSharedBytes : kMaxSharedBytes;
}

int64_t shared_bytes(const Spec& c, const LaunchConfig& cfg, int32_t qk_heads) {
  // Computed frequencies: each token's (cos, sin) pairs, shared by the block.
  int64_t bytes =
      c.freqs == Freqs::table ? 0 : int64_t(cfg.tokens_per_block) * (c.rotary_dim / 2) * 8;
  if (!c.fused()) return bytes;
  // The ring: 16 bytes per slot, head, half (lo, hi) and thread (templates/rope_fused.cuh).
  if (cfg.kernel.ring > 0)
    bytes += int64_t(cfg.kernel.ring) * cfg.kernel.heads_per_thread * 2 *
             chunks(c, cfg.kernel.vec) * cfg.rows * cfg.tokens_per_block * 16;
  // Fused: partial sums of heads wider than a warp, and per-head sums for a norm over all heads.
  const int32_t lanes = chunks(c, cfg.kernel.vec);
  if (lanes > 32)
    bytes +=
        int64_t(cfg.rows) * cfg.tokens_per_block * (lanes / 32) * cfg.kernel.heads_per_thread * 4;
  if (c.norm == Norm::rms_all_heads) bytes += int64_t(cfg.tokens_per_block) * qk_heads * 4;
  return bytes;
}

void set_persistent(LaunchConfig& cfg, int32_t blocks_per_sm) {
  cfg.blocks_per_sm = blocks_per_sm;
  cfg.kernel.grid_stride = blocks_per_sm > 0;
}

int64_t grid_blocks(const CallShape& shape, const LaunchConfig& cfg, const DeviceInfo& device) {
  const int64_t groups = (shape.tokens + cfg.tokens_per_block - 1) / cfg.tokens_per_block;
  if (cfg.blocks_per_sm == 0) return groups;
  return std::min<int64_t>(groups, int64_t(device.sm_count) * cfg.blocks_per_sm);
}

}  // namespace ropejit::detail
