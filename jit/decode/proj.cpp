// The QKV projection's variants, call checks, argument block and rendering.
#include "jit/decode/proj.hpp"

#include <cfloat>
#include <climits>
#include <cmath>
#include <map>

#include "jit/call.hpp"
#include "jit/decode/dequant.hpp"
#include "jit/decode/norm.hpp"
#include "jit/driver.hpp"
#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "jit/launching.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {
namespace {

// Kernel limits: token groups go to gridDim.y (at most 65535 of up to 64 tokens); the
// hidden dimension's mean is taken in fp32, exact up to 2^24.
constexpr int64_t kMaxHidden = int64_t(1) << 24;
constexpr int64_t kMaxHeads = 65536;
constexpr int64_t kMaxGridY = 65535;

bool power_of_two(int32_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

namespace {

void check_index(const void* p, IndexType t, const char* name) {
  if (!p) invalid(name, " is null but spec.positions is ids");
  const uint64_t bytes = t == IndexType::i64 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    invalid(name, " (", p, ") is not aligned to its ", bytes, "-byte elements");
}

}  // namespace

void check_matrix(const char* name, const char* stride_name, const void* p, int64_t rows,
                  int64_t cols, int64_t stride, int64_t elem) {
  if (!p) invalid(name, " is null");
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    invalid(name, " (", p, ") is not 16-byte aligned (the kernel reads 16-byte vectors)");
  if (stride < cols)
    invalid(stride_name, " (", stride, ") is smaller than a row (", cols, " elements)");
  if (stride % (16 / elem) != 0)
    invalid(stride_name, " (", stride, ") is not a multiple of ", 16 / elem,
            " elements (16-byte rows)");
  int64_t span = 0;
  if (__builtin_mul_overflow(rows, stride, &span) || __builtin_mul_overflow(span, elem, &span) ||
      reinterpret_cast<uintptr_t>(p) > UINTPTR_MAX - uint64_t(span))
    invalid(name, ": ", rows, " rows of ", stride, " elements overflow 64-bit offsets");
}

void check_workspace(const void* workspace, size_t bytes, const Range* others, size_t n) {
  if (!workspace) return;
  const uintptr_t w0 = reinterpret_cast<uintptr_t>(workspace);
  if (w0 % 256 != 0) invalid("args.workspace (", workspace, ") is not 256-byte aligned");
  if (w0 > UINTPTR_MAX - bytes)
    invalid("args.workspace_bytes (", bytes, ") overflows the address space");
  const uintptr_t w1 = w0 + bytes;
  for (size_t i = 0; i < n; ++i) {
    const Range& r = others[i];
    if (w0 < w1 && r.first < r.end && w0 < r.end && r.first < w1)
      invalid("args.workspace and ", r.name, " overlap in memory (the workspace spans [", workspace,
              ", ", reinterpret_cast<const void*>(w1), "))");
  }
}

std::string ProjVariant::name() const {
  return concat('m', token_tiles, 's', splits, 'u', unroll) + (wide ? "w" : "") +
         (swap ? "t" : "") + (rows > 1 ? concat('r', rows) : std::string()) +
         (cluster > 1 ? concat('c', cluster) : std::string());
}

bool parse_proj_variant(const std::string& name, ProjVariant* out) {
  size_t at = 0;
  // The number after `tag` at `at`: 1..99, no sign, no leading zero.
  auto field = [&](char tag, int32_t* value) {
    if (at >= name.size() || name[at] != tag) return false;
    ++at;
    const size_t first = at;
    while (at < name.size() && at - first < 3 && name[at] >= '0' && name[at] <= '9') ++at;
    const size_t digits = at - first;
    if (digits == 0 || digits > 2 || name[first] == '0') return false;
    *value = int32_t(std::stoi(name.substr(first, digits)));
    return true;
  };
  ProjVariant v;
  if (!field('m', &v.token_tiles) || !field('s', &v.splits) || !field('u', &v.unroll)) return false;
  if (at < name.size() && name[at] == 'w') {
    v.wide = true;
    ++at;
  }
  if (at < name.size() && name[at] == 't') {
    v.swap = true;
    ++at;
  }
  if (at < name.size() && name[at] == 'r' && (!field('r', &v.rows) || v.rows == 1))
    return false;  // name() never writes r1
  const bool clustered = at < name.size();
  if (clustered && !field('c', &v.cluster)) return false;
  if (at != name.size() || (clustered && v.cluster == 1)) return false;  // name() never writes c1
  *out = v;
  return true;
}

std::string proj_variant_problem(const ProjVariant& v, bool fp8_weights) {
  if (!power_of_two(v.token_tiles) || v.token_tiles > 8)
    return concat("token_tiles (", v.token_tiles, ") must be 1, 2, 4 or 8");
  if (v.splits < 1 || v.splits > 8) return concat("splits (", v.splits, ") must be in [1, 8]");
  if (!power_of_two(v.unroll) || v.unroll > 4)
    return concat("unroll (", v.unroll, ") must be 1, 2 or 4");
  if (!power_of_two(v.cluster) || v.cluster > 8)
    return concat("cluster (", v.cluster, ") must be 1, 2, 4 or 8");
  if (v.wide && !fp8_weights) return "wide (64-element chunks of e4m3 codes) needs e4m3 weights";
  if (v.wide && v.token_tiles != 2 && v.token_tiles != 4)
    return concat("wide needs 2 or 4 token tiles (", v.token_tiles,
                  "): one tile always reads 64-element chunks of e4m3 codes");
  if (v.swap && fp8_weights) return "swap (tokens as the 16-row operand) needs 16-bit weights";
  if (v.swap && v.token_tiles == 1)
    return "swap needs 2, 4 or 8 token tiles (the 16-row operand takes two)";
  const bool chunk64 = fp8_weights && (v.token_tiles == 1 || v.wide);
  if (!power_of_two(v.rows) || v.rows > 8)
    return concat("rows (", v.rows, ") must be 1, 2, 4 or 8");
  if (v.rows > 1) {
    if (chunk64)
      return "rows (staged activations) needs 32-element chunks: not e4m3 weights at one token "
             "tile, nor wide";
    if (v.splits * v.rows > 8)
      return concat("splits (", v.splits, ") x rows (", v.rows, ") must be <= 8 (warps)");
    if (!power_of_two(v.splits) || v.unroll * v.splits > 8)
      return concat(
          "unroll (", v.unroll, ") x splits (", v.splits,
          ") must be a power of two <= 8 with rows (a token's staged vectors in one warp)");
    if ((v.token_tiles * v.unroll) % v.rows != 0)
      return concat("token_tiles (", v.token_tiles, ") x unroll (", v.unroll,
                    ") must be a multiple of rows (", v.rows, "): whole vectors per thread");
    // Shared memory (48 KB static): two stages of operands, later the warps' partial sums.
    const int64_t ring = 1024 * int64_t(v.token_tiles) * v.unroll * v.splits;
    const int64_t part = 512 * int64_t(v.token_tiles) * v.splits * v.rows;
    if (std::max(ring, part) > 32768)
      return concat("token_tiles (", v.token_tiles, "), unroll (", v.unroll, "), splits (",
                    v.splits, ") and rows (", v.rows, ") need ", std::max(ring, part),
                    " bytes of shared memory; at most 32768");
  }
  // A stage's activations: token_tiles * unroll vectors of 16 bytes per lane, at most 16
  // (e4m3 weights with one token tile, or wide: twice as many, each chunk 64 elements); staged,
  // token_tiles * unroll / rows per thread.
  const int32_t vectors = v.token_tiles * v.unroll * (chunk64 ? 2 : 1) / v.rows;
  if (vectors > 16)
    return concat("token_tiles (", v.token_tiles, ") x unroll (", v.unroll, ") must be <= 16",
                  " (registers)");
  return "";
}

int32_t proj_token_tiles(int64_t tokens) {
  const int64_t tiles = (tokens + 7) / 8;
  int32_t t = 1;
  while (t < tiles && t < 8) t *= 2;
  return t;
}

bool aligned_product(std::initializer_list<int64_t> factors, size_t* bytes) {
  uint64_t product = 1;
  for (const int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(product, uint64_t(f), &product)) return false;
  if (product > SIZE_MAX - 255) return false;
  *bytes = size_t((product + 255) / 256 * 256);
  return true;
}

size_t workspace_sum(std::initializer_list<size_t> parts, const std::string& what) {
  size_t sum = 0;
  for (const size_t part : parts)
    if (__builtin_add_overflow(sum, part, &sum))
      invalid("the unfused path's workspace for ", what, " overflows size_t");
  return sum;
}

size_t norm_workspace_bytes(DType dtype, Norm norm, int64_t tokens, int64_t hidden) {
  if (norm == Norm::none) return 0;
  size_t bytes = 0;
  if (!aligned_product({tokens, hidden, element_bytes(dtype)}, &bytes))
    invalid("args.tokens (", tokens, ") x args.hidden (", hidden, ") x ", element_bytes(dtype),
            " bytes (the normalized activation) overflows size_t");
  return bytes;
}

size_t proj_norm_bytes(const QkvProjSpec& c, int64_t tokens, int64_t hidden) {
  return norm_workspace_bytes(c.dtype, c.norm, tokens, hidden);
}

void check_proj_heads(int64_t q_heads, int64_t kv_heads) {
  if (q_heads < 1 || q_heads > kMaxHeads)
    invalid("args.q_heads (", q_heads, ") must be in [1, ", kMaxHeads, "]");
  if (kv_heads < 1 || kv_heads > kMaxHeads)
    invalid("args.kv_heads (", kv_heads, ") must be in [1, ", kMaxHeads, "]");
}

size_t proj_chunk_bytes(const QkvProjSpec& c, int64_t hidden, int64_t q_heads, int64_t kv_heads) {
  if (c.weights != Weights::e4m3) return 0;
  check_proj_heads(q_heads, kv_heads);  // bounds the rows below
  return dequant_workspace_bytes(c.dtype, c.weights, hidden,
                                 (q_heads + 2 * kv_heads) * int64_t(c.head_dim));
}

size_t proj_workspace_bytes(const QkvProjSpec& c, int64_t tokens, int64_t hidden, int64_t q_heads,
                            int64_t kv_heads) {
  return workspace_sum({proj_norm_bytes(c, tokens, hidden),
                        proj_chunk_bytes(c, hidden, q_heads, kv_heads), kGemmWorkspaceBytes},
                       concat("args.tokens (", tokens, ") and args.hidden (", hidden, ")"));
}

RmsNormSpec proj_norm_spec(const QkvProjSpec& c) {
  RmsNormSpec n;
  n.dtype = c.dtype;
  n.norm = c.norm;
  return n;
}

// With a KV cache the RoPE step is a fused key that also appends k and v: in one sequence of
// `tokens` for slots, one sequence per token for a decode step into a paged or contiguous cache
// (bshd, batch = tokens, seq_len 1), and the call's sequences (thd, cu_seqlens) for a chunk.
static Layout proj_rope_layout(const QkvProjSpec& c, const QkvProjArgs& a) {
  if (c.cache == KvCache::paged || c.cache == KvCache::contiguous)
    return a.cu_seqlens ? Layout::thd : Layout::bshd;
  return Layout::bshd;
}

static bool proj_rope_per_token(const QkvProjSpec& c, const QkvProjArgs& a) {
  return (c.cache == KvCache::paged || c.cache == KvCache::contiguous) && !a.cu_seqlens;
}

Spec proj_rope_spec(const QkvProjSpec& c, const QkvProjArgs& a) {
  Spec r;
  r.layout = proj_rope_layout(c, a);
  r.dtype = c.dtype;
  r.head_dim = c.head_dim;
  r.rotary_dim = c.rotary_dim;
  r.style = c.style;
  r.positions = c.positions;
  r.index_type = c.index_type;
  r.freqs = c.freqs;
  r.table_dtype = c.table_dtype;
  r.table_width = c.table_width;
  if (c.cache != KvCache::none) {
    r.cache = c.cache;
    r.cache_store = c.cache_store;
  }
  return r;
}

Args proj_rope_args(const QkvProjSpec& c, const QkvProjArgs& a) {
  Args r;
  const bool thd = proj_rope_layout(c, a) == Layout::thd;
  const bool per_token = proj_rope_per_token(c, a);
  r.batch = thd ? a.batch : per_token ? a.tokens : 1;
  r.seq_len = per_token ? 1 : a.tokens;
  r.cu_seqlens = thd ? a.cu_seqlens : nullptr;
  auto view = [&](const Tensor& t, int64_t heads) {
    // Dense with one token per sequence: the batch stride steps over tokens.
    return Tensor{t.data, heads, per_token ? t.stride_seq : 0, t.stride_seq, t.stride_head};
  };
  r.q = view(a.q, a.q_heads);
  r.k = view(a.k, a.kv_heads);
  r.position_offset = a.position_offset;
  r.position_ids = a.position_ids;
  r.cos = a.cos;
  r.sin = a.sin;
  r.table_stride = a.table_stride;
  r.table_rows = a.table_rows;
  r.base = a.base;
  r.stream = a.stream;
  if (c.cache != KvCache::none) {
    r.v = view(a.v, a.kv_heads);
    r.cache = a.cache;
  }
  return r;
}

std::string proj_unfused_key(const QkvProjSpec& c, const QkvProjArgs& a) {
  return concat(c.key(), '/', proj_rope_spec(c, a).canonical().key());
}

int64_t proj_path_bucket(int64_t tokens) {
  int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

std::string proj_fused_problem(const QkvProjSpec& c) {
  if (c.cache_store == Store::e4m3_dynamic)
    return "spec.cache_store (e4m3dyn) needs each head's amax, and the fused kernel's blocks each "
           "hold 16 columns of a head: such keys take the unfused path, whose RoPE step computes "
           "the scales";
  return "";
}

std::string proj_split_problem(const QkvProjSpec& c, const QkvProjArgs& a, const ProjShape& s,
                               bool need_workspace) {
  if (a.bias)
    return "args.bias is set: the unfused path's GEMM takes no bias (the fused kernel adds it)";
  if (c.cache != KvCache::none) {
    if (!a.k.data || !a.v.data)
      return concat("args.", a.k.data ? "v" : "k",
                    ".data is null (the cache only): the unfused path's GEMM writes k and v "
                    "before the RoPE step appends them to the cache");
    if (proj_rope_per_token(c, a) && c.positions != Positions::ids)
      return concat("spec.positions is ", to_string(c.positions), " with a ", to_string(c.cache),
                    " cache and no args.cu_seqlens: the unfused path's RoPE step takes a decode "
                    "step's tokens as sequences of one, at position ids");
    if (c.cache != KvCache::slots && a.cu_seqlens && c.positions != Positions::ids)
      return concat("spec.positions is ", to_string(c.positions),
                    " with args.cu_seqlens: the unfused path's RoPE step places a chunk's "
                    "tokens by position ids");
  }
  const Tensor* ts[3] = {&a.q, &a.k, &a.v};
  const char* names[3] = {"args.q", "args.k", "args.v"};
  const int64_t heads[3] = {s.q_heads, s.kv_heads, s.kv_heads};
  for (int i = 0; i < 3; ++i) {
    if (heads[i] > 1 && ts[i]->stride_head != c.head_dim)
      return concat(names[i], ".stride_head (", ts[i]->stride_head, ") is not head_dim (",
                    c.head_dim, "): the unfused path's GEMM writes a token's heads as one row");
    if (s.tokens > 1 && ts[i]->stride_seq < heads[i] * c.head_dim)
      return concat(names[i], ".stride_seq (", ts[i]->stride_seq, ") is smaller than a token's ",
                    heads[i] * c.head_dim, " elements: the unfused path's GEMM writes rows");
  }
  const int64_t elem = element_bytes(c.dtype);
  if (c.norm != Norm::none && s.hidden * elem > int64_t(kNormThreads) * 16 * 16)
    return concat("args.hidden (", s.hidden, ") exceeds the RMSNorm key's ",
                  int64_t(kNormThreads) * 16 * 16 / elem, " elements per row (unfused path)");
  // The RoPE step's own checks, before anything of the path is launched (offset positions
  // past the table, say, which the fused kernel writes as NaN but the RoPE key refuses).
  if (s.tokens > 0) {
    try {
      check_call(proj_rope_spec(c, a).canonical(), proj_rope_args(c, a));
    } catch (const Error& e) {
      const std::string why = e.what();
      const std::string tag = "ropejit: ";
      return concat("the unfused path's RoPE step refuses the call: ",
                    why.compare(0, tag.size(), tag) == 0 ? why.substr(tag.size()) : why);
    }
  }
  if (need_workspace) {
    const size_t need = proj_workspace_bytes(c, s.tokens, s.hidden, s.q_heads, s.kv_heads);
    if (!a.workspace)
      return concat("args.workspace is null; the unfused path needs ", need,
                    " bytes (qkv_projection_workspace_bytes)");
    if (a.workspace_bytes < need)
      return concat("args.workspace_bytes (", a.workspace_bytes, ") is smaller than the ", need,
                    " bytes the unfused path needs at ", s.tokens, " tokens of ", s.hidden,
                    " (qkv_projection_workspace_bytes)");
  }
  return "";
}

uint32_t proj_grid_x(const ProjShape& s, const ProjVariant& v) {
  const int64_t per_block = 8 * int64_t(v.rows);  // pairs
  return uint32_t((s.pairs + per_block - 1) / per_block);
}

uint32_t proj_grid_y(const ProjShape& s, const ProjVariant& v) {
  const int64_t per_block = int64_t(v.token_tiles) * 8;
  return uint32_t((s.tokens + per_block - 1) / per_block);
}

void check_hidden(int64_t hidden, Weights weights) {
  const bool w8 = weights == Weights::e4m3;
  const int64_t kmul = w8 ? 16 : 8;  // elements of a lane's 16-byte weight vector
  if (hidden < kmul || hidden % kmul != 0 || hidden > kMaxHidden)
    invalid("args.hidden (", hidden, ") must be a multiple of ", kmul, " in [", kmul, ", ",
            kMaxHidden, "] (16-byte vectors", w8 ? " of e4m3 weights" : "", ")");
}

namespace {

// The operands a call writes: q, k, v, the cache's k and v, a dynamic FP8 cache's scales.
constexpr size_t kProjWritten = 7;

// What check_proj_call derives once and its steps share.
struct ProjCallFacts {
  int64_t elem = 0;      // activation bytes
  int64_t welem = 0;     // weight bytes (1 for e4m3)
  int64_t columns = 0;   // rows of the packed weight: (q_heads + 2 kv_heads) · head_dim
  int64_t x_stride = 0;  // the defaults (0: hidden) resolved
  int64_t w_stride = 0;
  int64_t sequences = 0;  // what the paged / contiguous addressing arrays describe
  bool cached = false;
};

// x, the weight and its scales, the norm weight.
void check_proj_inputs(const QkvProjSpec& c, const QkvProjArgs& a, const ProjCallFacts& f) {
  check_matrix("args.x", "args.x_stride", a.x, a.tokens, a.hidden, f.x_stride, f.elem);
  check_matrix("args.weight", "args.weight_stride", a.weight, f.columns, a.hidden, f.w_stride,
               f.welem);
  if (c.weights == Weights::e4m3) {
    if (!a.weight_scale) invalid("args.weight_scale is null but spec.weights is e4m3");
    if (reinterpret_cast<uintptr_t>(a.weight_scale) % 4 != 0)
      invalid("args.weight_scale (", static_cast<const void*>(a.weight_scale),
              ") is not aligned to its 4-byte floats");
  }
  if (c.norm != Norm::none) {
    if (!a.norm_weight) invalid("args.norm_weight is null but spec.norm is ", to_string(c.norm));
    check_matrix("args.norm_weight", "args.hidden", a.norm_weight, 1, a.hidden, a.hidden, f.elem);
    check_norm_eps(a.norm_eps);
  }
  const uintptr_t bias = reinterpret_cast<uintptr_t>(a.bias);
  if (bias % uintptr_t(f.elem) != 0)
    invalid("args.bias (", a.bias, ") is not aligned to its ", f.elem, "-byte elements");
}

// Outputs: rows of head_dim that never overlap; q, k and v may be heads of one tensor.
void check_proj_outputs(const QkvProjSpec& c, const QkvProjArgs& a, const ProjCallFacts& f,
                        Operand outs[3]) {
  const char* names[3] = {"args.q", "args.k", "args.v"};
  const Tensor* ts[3] = {&a.q, &a.k, &a.v};
  const int64_t heads[3] = {a.q_heads, a.kv_heads, a.kv_heads};
  for (int i = 0; i < 3; ++i) {
    if (i > 0 && f.cached && !ts[i]->data) continue;  // k or v to the cache only
    if (ts[i]->data && ts[i]->heads != heads[i])
      invalid(names[i], ".heads (", ts[i]->heads, ") must be ", heads[i]);
    const Dims dims = {Dim{ts[i]->stride_seq, a.tokens, "stride_seq"},
                       Dim{ts[i]->stride_head, heads[i], "stride_head"}, Dim{0, 1, "-"}};
    check_strided(names[i], ts[i]->data, dims, c.head_dim, f.elem, true, &outs[i]);
  }
}

// The KV cache's addressing for its mode.
void check_proj_cache_addressing(const QkvProjSpec& c, const QkvProjArgs& a,
                                 const ProjCallFacts& f) {
  const KvCacheArgs& kc = a.cache;
  switch (c.cache) {
    case KvCache::slots:
      check_aligned(kc.slot_mapping, 8, "args.cache.slot_mapping", "spec.cache is slots");
      break;
    case KvCache::paged:
      check_aligned(kc.indptr, 4, "args.cache.indptr", "spec.cache is paged");
      check_aligned(kc.indices, 4, "args.cache.indices", "spec.cache is paged");
      check_aligned(kc.last_page_len, 4, "args.cache.last_page_len", "spec.cache is paged");
      if (kc.num_indices < 0 || kc.num_indices > INT32_MAX)
        invalid("args.cache.num_indices (", kc.num_indices, ") must be in [0, 2^31)");
      // Positions are page counts read from the table (int32) times the page size.
      if (kc.page_size > INT32_MAX)
        invalid("args.cache.page_size (", kc.page_size, ") must be below 2^31 for a paged cache");
      break;
    case KvCache::contiguous:
      check_aligned(kc.seq_lens, 4, "args.cache.seq_lens", "spec.cache is cont");
      if (kc.pages < f.sequences)
        invalid("args.cache.pages (", kc.pages, ") holds fewer sequences than ",
                a.cu_seqlens ? "args.batch (" : "args.tokens (", f.sequences,
                a.cu_seqlens ? ")" : "): token t appends to sequence t");
      break;
    case KvCache::none:
      break;
  }
}

// The KV cache: rows of head_dim at page · stride_page + row · stride_slot + head ·
// stride_head, k and v alike (page and row from the addressing, read on the device); a dynamic
// FP8 cache's scales, a float per cached row and head, placed like the rows.
void check_proj_cache(const QkvProjSpec& c, const QkvProjArgs& a, const ProjCallFacts& f,
                      Operand caches[2], Operand scales[2]) {
  if (a.cu_seqlens) {
    if (c.cache != KvCache::paged && c.cache != KvCache::contiguous)
      invalid("args.cu_seqlens is given but spec.cache is ", to_string(c.cache),
              ": it places tokens in a paged or contiguous cache");
    check_aligned(a.cu_seqlens, 4, "args.cu_seqlens", "it is given");
    if (a.batch < 1 || a.batch >= INT32_MAX)
      invalid("args.batch (", a.batch, ") must be in [1, 2^31 - 1) with args.cu_seqlens");
  }
  if (!f.cached) return;
  const KvCacheArgs& kc = a.cache;
  const int64_t celem = is_fp8(c.cache_store) ? 1 : f.elem;
  if (kc.pages < 1) invalid("args.cache.pages (", kc.pages, ") must be >= 1");
  if (kc.page_size < 1) invalid("args.cache.page_size (", kc.page_size, ") must be >= 1");
  int64_t slots = 0;
  if (__builtin_mul_overflow(kc.pages, kc.page_size, &slots))
    invalid("args.cache.pages (", kc.pages, ") x args.cache.page_size (", kc.page_size,
            ") overflows 64 bits");
  if (!kc.v) invalid("args.cache.v is null: the projection appends k and v");
  const Dims dims = {Dim{kc.stride_page, kc.pages, "stride_page"},
                     Dim{kc.stride_slot, kc.page_size, "stride_slot"},
                     Dim{kc.stride_head, a.kv_heads, "stride_head"}};
  check_strided("args.cache.k", kc.k, dims, c.head_dim, celem, true, &caches[0]);
  check_strided("args.cache.v", kc.v, dims, c.head_dim, celem, true, &caches[1]);
  if (c.cache_store == Store::e4m3) {
    check_scale(kc.k_quant_scale, "args.cache.k_quant_scale");
    check_scale(kc.v_quant_scale, "args.cache.v_quant_scale");
  }
  check_proj_cache_addressing(c, a, f);
  if (reinterpret_cast<uintptr_t>(kc.skipped) % 4 != 0)
    invalid("args.cache.skipped (", static_cast<const void*>(kc.skipped),
            ") is not 4-byte aligned");
  if (c.cache_store == Store::e4m3_dynamic) {
    const Dims sdims = {Dim{kc.scale_stride_page, kc.pages, "scale_stride_page"},
                        Dim{kc.scale_stride_slot, kc.page_size, "scale_stride_slot"},
                        Dim{kc.scale_stride_head, a.kv_heads, "scale_stride_head"}};
    check_strided("args.cache.k_scales", kc.k_scales, sdims, 1, 4, true, &scales[0]);
    check_strided("args.cache.v_scales", kc.v_scales, sdims, 1, 4, true, &scales[1]);
  }
}

// Positions and frequencies; returns the table's row stride and width (0 without a table).
std::pair<int64_t, int64_t> check_proj_frequencies(const QkvProjSpec& c, const QkvProjArgs& a) {
  if (c.positions == Positions::ids) {
    check_index(a.position_ids, c.index_type, "args.position_ids");
  } else if (a.position_offset < 0 || a.position_offset > (int64_t(1) << 62) - a.tokens) {
    invalid("args.position_offset (", a.position_offset, ") must be in [0, 2^62 - tokens]");
  }
  if (c.freqs == Freqs::computed) {
    if (!(std::isfinite(a.base) && a.base > 1.0))
      invalid("args.base (", a.base, ") must be a finite number > 1");
    return {0, 0};
  }
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  return {check_table(a.cos, a.sin, c.table_dtype, width, a.table_rows, a.table_stride), width};
}

// Nothing read may be written: every output (and the workspace) against every input.
void check_proj_reads_and_writes(const QkvProjSpec& c, const QkvProjArgs& a, const ProjCallFacts& f,
                                 const Operand (&written)[7], int64_t table_stride, int64_t width) {
  const int64_t ibytes = c.index_type == IndexType::i64 ? 8 : 4;
  const int64_t telem = element_bytes(c.table_dtype);
  const bool w8 = c.weights == Weights::e4m3;
  const Range inputs[] = {
      range_of("args.x", a.x, a.tokens, f.x_stride, a.hidden, f.elem),
      range_of("args.weight", a.weight, f.columns, f.w_stride, a.hidden, f.welem),
      range_of("args.weight_scale", w8 ? a.weight_scale : nullptr, f.columns, 1, 1, 4),
      range_of("args.norm_weight", c.norm != Norm::none ? a.norm_weight : nullptr, 1, a.hidden,
               a.hidden, f.elem),
      range_of("args.bias", a.bias, 1, f.columns, f.columns, f.elem),
      range_of("args.position_ids", c.positions == Positions::ids ? a.position_ids : nullptr,
               a.tokens, 1, 1, ibytes),
      range_of("args.cos", c.freqs == Freqs::table ? a.cos : nullptr, a.table_rows, table_stride,
               width, telem),
      range_of("args.sin", c.freqs == Freqs::table ? a.sin : nullptr, a.table_rows, table_stride,
               width, telem),
      range_of("args.cache.slot_mapping",
               c.cache == KvCache::slots ? a.cache.slot_mapping : nullptr, a.tokens, 1, 1, 8),
      range_of("args.cache.indptr", c.cache == KvCache::paged ? a.cache.indptr : nullptr,
               f.sequences + 1, 1, 1, 4),
      range_of("args.cache.indices", c.cache == KvCache::paged ? a.cache.indices : nullptr,
               a.cache.num_indices, 1, 1, 4),
      range_of("args.cache.last_page_len",
               c.cache == KvCache::paged ? a.cache.last_page_len : nullptr, f.sequences, 1, 1, 4),
      range_of("args.cache.seq_lens", c.cache == KvCache::contiguous ? a.cache.seq_lens : nullptr,
               f.sequences, 1, 1, 4),
      range_of("args.cu_seqlens", a.cu_seqlens, a.batch + 1, 1, 1, 4)};
  Range all[std::size(inputs) + kProjWritten + 1];
  std::copy(std::begin(inputs), std::end(inputs), all);
  Range* outputs = all + std::size(inputs);
  for (size_t i = 0; i < kProjWritten; ++i)
    outputs[i] = Range{written[i].name, written[i].first, written[i].end};
  outputs[kProjWritten] =
      range_of("args.cache.skipped", f.cached ? a.cache.skipped : nullptr, 1, 1, 1, 4);
  // The workspace is written by the unfused path: it may overlap nothing.
  check_workspace(a.workspace, a.workspace_bytes, all, std::size(all));
  check_untouched(outputs, kProjWritten + 1, inputs, std::size(inputs));
}

}  // namespace

ProjShape check_proj_call(const QkvProjSpec& c, const QkvProjArgs& a) {
  ProjShape s;
  ProjCallFacts f;
  f.elem = element_bytes(c.dtype);
  if (!is_valid(a.path)) invalid("args.path (", int32_t(a.path), ") is not a known value");
  if (a.tokens < 0) invalid("args.tokens (", a.tokens, ") must be >= 0");
  if (a.tokens > kMaxGridY * 8)  // the smallest token group a variant takes
    invalid("args.tokens (", a.tokens, ") exceeds ", kMaxGridY * 8,
            "; the fused projection is for decode-sized calls");
  f.welem = c.weights == Weights::e4m3 ? 1 : f.elem;
  check_hidden(a.hidden, c.weights);
  check_proj_heads(a.q_heads, a.kv_heads);
  s.tokens = a.tokens;
  s.hidden = a.hidden;
  s.q_heads = int32_t(a.q_heads);
  s.kv_heads = int32_t(a.kv_heads);
  f.columns = (a.q_heads + 2 * a.kv_heads) * c.head_dim;
  s.pairs = f.columns / 2;
  f.x_stride = a.x_stride == 0 ? a.hidden : a.x_stride;
  f.w_stride = a.weight_stride == 0 ? a.hidden : a.weight_stride;
  f.cached = c.cache != KvCache::none;
  f.sequences = a.cu_seqlens ? a.batch : a.tokens;
  check_proj_inputs(c, a, f);
  Operand outs[3], caches[2], scales[2];
  check_proj_outputs(c, a, f, outs);
  check_proj_cache(c, a, f, caches, scales);
  const Operand written[kProjWritten] = {outs[0],   outs[1],   outs[2],  caches[0],
                                         caches[1], scales[0], scales[1]};
  check_no_overlap(written, kProjWritten);
  const auto [table_stride, width] = check_proj_frequencies(c, a);
  if (a.tokens > 0) check_proj_reads_and_writes(c, a, f, written, table_stride, width);
  if (a.path == ProjPath::unfused)
    if (const std::string why = proj_split_problem(c, a, s, true); !why.empty())
      invalid(why, " (args.path is unfused)");
  return s;
}

ropejit_dev::ProjParams make_proj_params(const QkvProjSpec& c, const QkvProjArgs& a,
                                         const ProjShape& s) {
  ropejit_dev::ProjParams p{};
  p.x = a.x;
  p.norm_w = c.norm != Norm::none ? a.norm_weight : nullptr;
  p.w = a.weight;
  p.w2 = a.weight;
  p.w_scale = c.weights == Weights::e4m3 ? a.weight_scale : nullptr;
  p.w2_scale = p.w_scale;
  p.bias = a.bias;
  p.x_stride = a.x_stride == 0 ? a.hidden : a.x_stride;
  p.w_stride = a.weight_stride == 0 ? a.hidden : a.weight_stride;
  p.tokens = s.tokens;
  p.hidden = s.hidden;
  p.pairs = s.pairs;
  const Tensor* ts[3] = {&a.q, &a.k, &a.v};
  const int32_t heads[3] = {s.q_heads, s.kv_heads, s.kv_heads};
  for (int i = 0; i < 3; ++i) {
    p.out[i].data = ts[i]->data;
    p.out[i].stride_token = ts[i]->stride_seq;
    p.out[i].stride_head = ts[i]->stride_head;
    p.out[i].heads = heads[i];
  }
  if (c.cache != KvCache::none) {
    const KvCacheArgs& kc = a.cache;
    p.cache.k = kc.k;
    p.cache.v = kc.v;
    p.cache.slots = reinterpret_cast<const long long*>(kc.slot_mapping);
    p.cache.indptr = kc.indptr;
    p.cache.indices = kc.indices;
    p.cache.last_page_len = kc.last_page_len;
    p.cache.seq_lens = kc.seq_lens;
    p.cache.cu_seqlens = a.cu_seqlens;
    p.cache.batch = a.cu_seqlens ? a.batch : 0;
    p.cache.num_indices = kc.num_indices;
    p.cache.pages = kc.pages;
    p.cache.skipped = kc.skipped;
    p.cache.stride_page = kc.stride_page;
    p.cache.stride_slot = kc.stride_slot;
    p.cache.stride_head = kc.stride_head;
    p.cache.page_size = kc.page_size;
    p.cache.slot_count = kc.pages * kc.page_size;
    p.cache.k_scale = c.cache_store == Store::e4m3 ? kc.k_quant_scale : 1.0f;
    p.cache.v_scale = c.cache_store == Store::e4m3 ? kc.v_quant_scale : 1.0f;
  }
  p.positions = c.positions == Positions::ids ? a.position_ids : nullptr;
  p.pos_offset = a.position_offset;
  p.cos = a.cos;
  p.sin = a.sin;
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  p.table_stride = a.table_stride == 0 ? width : a.table_stride;
  p.table_rows = a.table_rows;
  p.log2_base = c.freqs == Freqs::computed ? std::log2(a.base) : 0.0;
  p.norm_eps = float(a.norm_eps);
  return p;
}

RenderedKernel render(const QkvProjSpec& c, const ProjVariant& v) {
  if (const std::string why = proj_fused_problem(c); !why.empty())
    invalid(c.key(), " has no fused kernel: ", why);
  if (const std::string why = proj_variant_problem(v, c.weights == Weights::e4m3); !why.empty())
    invalid("projection variant ", v.name(), ": ", why);
  return render_entry(c.key(), v.name(), "proj_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(c.dtype))},
                          {"head_dim", std::to_string(c.head_dim)},
                          {"rotary_dim", std::to_string(c.rotary_dim)},
                          {"table_dtype", std::to_string(int(c.table_dtype))},
                          {"norm", std::to_string(int(c.norm))},
                          {"token_tiles", std::to_string(v.token_tiles)},
                          {"splits", std::to_string(v.splits)},
                          {"unroll", std::to_string(v.unroll)},
                          {"cluster", std::to_string(v.cluster)},
                          {"wide", flag(v.wide)},
                          {"swap", flag(v.swap)},
                          {"rows", std::to_string(v.rows)},
                          {"neox", flag(c.style == Style::neox)},
                          {"pos_ids", flag(c.positions == Positions::ids)},
                          {"idx64", flag(c.index_type == IndexType::i64)},
                          {"computed", flag(c.freqs == Freqs::computed)},
                          {"table_full", flag(c.table_width == TableWidth::full)},
                          {"act", "0"},
                          {"glu", "false"},
                          {"w8", flag(c.weights == Weights::e4m3)},
                          {"cache", std::to_string(int(c.cache))},
                          {"cache_e4m3", flag(c.cache_store == Store::e4m3)},
                          {"threads", std::to_string(v.threads())},
                          {"min_blocks", std::to_string(v.min_blocks(c.weights == Weights::e4m3))},
                      });
}

// A projection or FFN variant whose blocks form clusters needs sm_90; refused by name before
// anything is compiled for an older target.
void check_cluster_target(const ProjVariant& v, const std::string& target) {
  if (v.cluster > 1 && target_cc(target) < 90)
    invalid("projection variant ", v.name(), ": cluster (", v.cluster,
            ") needs thread-block clusters, sm_90 or newer (target ", target, ")");
}

// One launch of a projection or FFN kernel: grid (x, y, cluster), the cluster's blocks along z
// (rank = blockIdx.z) when the variant has one.
void launch_proj_kernel(CUfunction fn, const ProjShape& shape, const ProjVariant& v,
                        CUstream stream, void** kernel_args) {
  const Driver& d = driver();
  if (v.cluster <= 1) {
    check(d.LaunchKernel(fn, proj_grid_x(shape, v), proj_grid_y(shape, v), 1, unsigned(v.threads()),
                         1, 1, 0, stream, kernel_args, nullptr),
          "cuLaunchKernel");
    return;
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = 1;
  attr.value.clusterDim.y = 1;
  attr.value.clusterDim.z = unsigned(v.cluster);
  CUlaunchConfig config{};
  config.gridDimX = proj_grid_x(shape, v);
  config.gridDimY = proj_grid_y(shape, v);
  config.gridDimZ = unsigned(v.cluster);
  config.blockDimX = unsigned(v.threads());
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(d.LaunchKernelEx(&config, fn, kernel_args, nullptr), "cuLaunchKernelEx (cluster)");
}

}  // namespace ropejit::detail
