// MLA's call checks, argument block and rendering.
#include "jit/mla/mla.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "jit/call.hpp"
#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"

namespace ropejit::detail {
namespace {

// gridDim.x holds the cache rows' blocks (a quarter of the tokens) and the query's (at most one
// a token when there are this many).
constexpr int64_t kMaxTokens = int64_t(1) << 30;

int64_t or_default(int64_t stride, int64_t width) { return stride ? stride : width; }

// A [outer][inner][row] operand; `align`: the bytes its pointer and row starts must be aligned
// to (the kernel's vector accesses).
Operand check_operand(const char* name, const void* p, Dim outer, Dim inner, int64_t row,
                      int64_t elem, int64_t align, bool written) {
  if (!p) invalid(name, " is null");
  if (reinterpret_cast<uintptr_t>(p) % uint64_t(align) != 0)
    invalid(name, " (", p, ") is not ", align, "-byte aligned");
  for (const Dim& d : {outer, inner})
    if (d.count > 1 && (d.stride * elem) % align != 0)
      invalid(name, " ", d.name, " (", d.stride, ") is not a multiple of ", align / elem,
              " elements (", align, "-byte rows)");
  Operand op;
  check_strided(name, p, Dims{outer, inner, Dim{0, 1, "-"}}, row, elem, written, &op);
  return op;
}

void check_positions(const MlaSpec& c, const MlaArgs& a) {
  if (!a.position_ids) invalid("args.position_ids is null");
  const uint64_t isz = c.index_type == IndexType::i64 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(a.position_ids) % isz != 0)
    invalid("args.position_ids (", a.position_ids, ") is not aligned to its ", isz,
            "-byte elements");
  check_table(a.cos, a.sin, c.table_dtype, c.rope_dim / 2, a.table_rows, a.table_stride);
}

}  // namespace

namespace {

// How the call addresses the cache (MlaParams::addressing): exactly one way.
int addressing(const MlaArgs& a) {
  const bool table = a.kv_indices || a.kv_indptr || a.batch_indices || a.page_positions;
  const int ways = int(a.slots != nullptr) + int(a.rows_by_token) + int(table);
  if (ways != 1)
    invalid("args.slots (", static_cast<const void*>(a.slots), "), args.rows_by_token (",
            a.rows_by_token, ") and the page table (args.kv_indices ",
            static_cast<const void*>(a.kv_indices),
            ", ...) are three ways to address the cache: give exactly one, not ", ways);
  return a.slots           ? ropejit_dev::kMlaSlots
         : a.rows_by_token ? ropejit_dev::kMlaRowsByToken
                           : ropejit_dev::kMlaPageTable;
}

// The page table's sizes and its int32 arrays (the arrays join `ops`).
void check_page_table(const MlaArgs& a, Operand* ops, size_t* n) {
  if (a.page_size < 1 || a.page_size > (int64_t(1) << 20))
    invalid("args.page_size (", a.page_size, ") must be in [1, 2^20]");
  if (a.batch < 1 || a.batch > (int64_t(1) << 30))
    invalid("args.batch (", a.batch, ") must be in [1, 2^30]");
  if (a.num_indices < 1 || a.num_indices > (int64_t(1) << 31) - 1)
    invalid("args.num_indices (", a.num_indices, ") must be in [1, 2^31 - 1]");
  const Dim one{0, 1, "-"};
  const struct {
    const char* name;
    const int32_t* p;
    int64_t count;
  } arrays[] = {{"args.kv_indices", a.kv_indices, a.num_indices},
                {"args.kv_indptr", a.kv_indptr, a.batch + 1},
                {"args.batch_indices", a.batch_indices, a.tokens},
                {"args.page_positions", a.page_positions, a.tokens}};
  for (const auto& x : arrays) {
    if (!x.p) invalid(x.name, " is null but the page table addresses the cache");
    ops[(*n)++] = check_operand(x.name, x.p, one, one, x.count, 4, 4, false);
  }
}

// The cache, its rope part's cache, kv_c, k_pe, k_pe_out and the norm weight.
void check_cache(const MlaSpec& c, const MlaArgs& a, Operand* ops, size_t* n) {
  const int64_t elem = element_bytes(c.dtype);
  if (a.cache_slots < 1) invalid("args.cache_slots (", a.cache_slots, ") must be >= 1");
  const int how = addressing(a);
  if (how == ropejit_dev::kMlaRowsByToken && a.cache_slots < a.tokens)
    invalid("args.cache_slots (", a.cache_slots, ") is less than args.tokens (", a.tokens,
            "): with args.rows_by_token, token t writes row t");
  if (how == ropejit_dev::kMlaSlots && reinterpret_cast<uintptr_t>(a.slots) % 8 != 0)
    invalid("args.slots (", static_cast<const void*>(a.slots), ") is not 8-byte aligned");
  const bool fp8 = c.cache_store == Store::e4m3;
  const int64_t celem = fp8 ? 1 : elem;
  if (fp8) check_aligned(a.cache_scale, 4, "args.cache_scale", "spec.cache_store e4m3");
  if (a.skipped) check_aligned(a.skipped, 4, "args.skipped", "a skipped count");
  // With cache_pe the cache's rows hold kv_c's part alone.
  const int64_t row = int64_t(c.kv_rank) + (a.cache_pe ? 0 : c.rope_dim);
  const int64_t cstride = or_default(a.cache_stride, row);
  if (cstride < row)
    invalid("args.cache_stride (", a.cache_stride, ") is smaller than a row (", row,
            a.cache_pe ? " elements: kv_rank, the rope part in args.cache_pe)"
                       : " elements: kv_rank + rope_dim)");
  const Dim none{0, 1, "-"};
  // Blocks of rows, or one run of rows: the outer and inner axes of the checked operand.
  const int64_t bs = a.cache_block_size;
  if (bs < 0 || bs > a.cache_slots || (bs > 0 && a.cache_slots % bs != 0))
    invalid("args.cache_block_size (", bs, ") must be 0 or divide args.cache_slots (",
            a.cache_slots, ")");
  if (bs == 0 && (a.cache_block_stride || a.cache_pe_block_stride))
    invalid("args.cache_block_stride (", a.cache_block_stride, ") or cache_pe_block_stride (",
            a.cache_pe_block_stride, ") is set but args.cache_block_size is 0");
  const auto axes = [&](int64_t stride, int64_t block_stride, const char* stride_name,
                        const char* block_name) {
    if (bs == 0) return std::make_pair(Dim{stride, a.cache_slots, stride_name}, none);
    return std::make_pair(Dim{block_stride, a.cache_slots / bs, block_name},
                          Dim{stride, bs, stride_name});
  };
  const auto [c_outer, c_inner] = axes(cstride, or_default(a.cache_block_stride, bs * cstride),
                                       "cache_stride", "cache_block_stride");
  ops[(*n)++] =
      check_operand("args.cache", a.cache, c_outer, c_inner, row, celem, fp8 ? 8 : 16, true);
  if (a.cache_pe) {
    const int64_t pstride = or_default(a.cache_pe_stride, c.rope_dim);
    if (pstride < c.rope_dim)
      invalid("args.cache_pe_stride (", a.cache_pe_stride, ") is smaller than a row (", c.rope_dim,
              " elements: rope_dim)");
    const auto [p_outer, p_inner] = axes(pstride, or_default(a.cache_pe_block_stride, bs * pstride),
                                         "cache_pe_stride", "cache_pe_block_stride");
    ops[(*n)++] = check_operand("args.cache_pe", a.cache_pe, p_outer, p_inner, c.rope_dim, celem,
                                celem, true);
  }
  const int64_t kvs = or_default(a.kv_c_stride, c.kv_rank);
  ops[(*n)++] = check_operand("args.kv_c", a.kv_c, Dim{kvs, a.tokens, "kv_c_stride"}, none,
                              c.kv_rank, elem, 16, false);
  const int64_t kps = or_default(a.k_pe_stride, c.rope_dim);
  // k_pe rotated in place is one written operand; else k_pe is read and k_pe_out written.
  const bool in_place = a.k_pe_out == a.k_pe;
  if (in_place && or_default(a.k_pe_out_stride, c.rope_dim) != kps)
    invalid("args.k_pe_out is args.k_pe (in place) but args.k_pe_out_stride (", a.k_pe_out_stride,
            ") is not args.k_pe_stride (", a.k_pe_stride, ")");
  ops[(*n)++] = check_operand("args.k_pe", a.k_pe, Dim{kps, a.tokens, "k_pe_stride"}, none,
                              c.rope_dim, elem, elem, in_place);
  if (a.k_pe_out && !in_place)
    ops[(*n)++] =
        check_operand("args.k_pe_out", a.k_pe_out,
                      Dim{or_default(a.k_pe_out_stride, c.rope_dim), a.tokens, "k_pe_out_stride"},
                      none, c.rope_dim, elem, elem, true);
  if (c.norm == Norm::rms) {
    check_norm_eps(a.norm_eps);
    ops[(*n)++] =
        check_operand("args.norm_weight", a.norm_weight, none, none, c.kv_rank, elem, 16, false);
  }
  if (how == ropejit_dev::kMlaSlots)
    ops[(*n)++] = check_operand("args.slots", a.slots, none, none, a.tokens, 8, 1, false);
  if (how == ropejit_dev::kMlaPageTable) check_page_table(a, ops, n);
  if (fp8)
    ops[(*n)++] = check_operand("args.cache_scale", a.cache_scale, none, none, 1, 4, 1, false);
  if (a.skipped) ops[(*n)++] = check_operand("args.skipped", a.skipped, none, none, 1, 4, 1, true);
}

}  // namespace

void check_mla_call(const MlaSpec& c, const MlaArgs& a) {
  if (a.tokens < 0 || a.tokens > kMaxTokens)
    invalid("args.tokens (", a.tokens, ") must be in [0, ", kMaxTokens, "]");
  if (a.heads < 0 || a.heads > (int64_t(1) << 20))
    invalid("args.heads (", a.heads, ") must be in [0, 2^20]");
  if (a.tokens == 0) return;
  if (!a.cache && a.heads == 0)
    invalid("args.cache is null and args.heads is 0: the call would do nothing");
  if (!a.cache && (a.k_pe_out || a.cache_pe))
    invalid("args.", a.k_pe_out ? "k_pe_out" : "cache_pe",
            " is set but args.cache is null: the cache rows' warps write it");
  check_positions(c, a);
  const int64_t elem = element_bytes(c.dtype);
  const int64_t row = int64_t(c.kv_rank) + c.rope_dim;
  Operand ops[24];
  size_t n = 0;
  if (a.cache) check_cache(c, a, ops, &n);
  if (a.heads > 0) {
    const bool assemble = c.query == MlaQuery::assemble;
    const int64_t qhs = or_default(a.q_pe_head_stride, c.rope_dim);
    const int64_t qts = or_default(a.q_pe_token_stride, a.heads * qhs);
    ops[n++] =
        check_operand("args.q_pe", a.q_pe, Dim{qts, a.tokens, "q_pe_token_stride"},
                      Dim{qhs, a.heads, "q_pe_head_stride"}, c.rope_dim, elem, elem, !assemble);
    if (assemble) {
      const bool fp8 = c.q_store == Store::e4m3;
      if (fp8) check_aligned(a.q_scale, 4, "args.q_scale", "spec.q_store e4m3");
      const int64_t nhs = or_default(a.q_nope_head_stride, c.kv_rank);
      ops[n++] = check_operand(
          "args.q_nope", a.q_nope,
          Dim{or_default(a.q_nope_token_stride, a.heads * nhs), a.tokens, "q_nope_token_stride"},
          Dim{nhs, a.heads, "q_nope_head_stride"}, c.kv_rank, elem, 16, false);
      // With q_out_pe, q_out's heads hold the q_nope part alone.
      const int64_t qrow = a.q_out_pe ? int64_t(c.kv_rank) : row;
      const int64_t ohs = or_default(a.q_out_head_stride, qrow);
      ops[n++] = check_operand(
          "args.q_out", a.q_out,
          Dim{or_default(a.q_out_token_stride, a.heads * ohs), a.tokens, "q_out_token_stride"},
          Dim{ohs, a.heads, "q_out_head_stride"}, qrow, fp8 ? 1 : elem, fp8 ? 8 : 16, true);
      if (a.q_out_pe) {
        const int64_t phs = or_default(a.q_out_pe_head_stride, c.rope_dim);
        ops[n++] = check_operand("args.q_out_pe", a.q_out_pe,
                                 Dim{or_default(a.q_out_pe_token_stride, a.heads * phs), a.tokens,
                                     "q_out_pe_token_stride"},
                                 Dim{phs, a.heads, "q_out_pe_head_stride"}, c.rope_dim,
                                 fp8 ? 1 : elem, fp8 ? 1 : elem, true);
      }
    } else if (a.q_out_pe) {
      invalid("args.q_out_pe is set but spec.query is in_place: it is the assembled query's part");
    }
  }
  // The small inputs, so that none of them lies inside a written output.
  const Dim one{0, 1, "-"};
  ops[n++] = check_operand("args.position_ids", a.position_ids, one, one, a.tokens,
                           c.index_type == IndexType::i64 ? 8 : 4, 1, false);
  const int64_t telem = element_bytes(c.table_dtype);
  const int64_t tstride = or_default(a.table_stride, c.rope_dim / 2);
  ops[n++] = check_operand("args.cos", a.cos, Dim{tstride, a.table_rows, "table_stride"}, one,
                           c.rope_dim / 2, telem, 1, false);
  ops[n++] = check_operand("args.sin", a.sin, Dim{tstride, a.table_rows, "table_stride"}, one,
                           c.rope_dim / 2, telem, 1, false);
  if (a.heads > 0 && c.q_store == Store::e4m3)
    ops[n++] = check_operand("args.q_scale", a.q_scale, one, one, 1, 4, 1, false);
  check_no_overlap(ops, n);
}

std::string mla_variant_name() { return "t" + std::to_string(kMlaThreads); }

ropejit_dev::MlaParams make_mla_params(const MlaSpec& c, const MlaArgs& a, int sm_count,
                                       unsigned* blocks) {
  const int64_t row = int64_t(c.kv_rank) + c.rope_dim;
  ropejit_dev::MlaParams p{};
  p.kv_c = a.kv_c;
  p.k_pe = a.k_pe;
  p.w = a.norm_weight;
  p.cache = a.cache;
  p.slots = reinterpret_cast<const long long*>(a.slots);
  p.cache_scale = a.cache_scale;
  p.skipped = a.skipped;
  p.q_pe = a.q_pe;
  p.q_nope = a.q_nope;
  p.q_out = a.q_out;
  p.q_scale = a.q_scale;
  p.ids = a.position_ids;
  p.cos = a.cos;
  p.sin = a.sin;
  p.kv_c_stride = or_default(a.kv_c_stride, c.kv_rank);
  p.k_pe_stride = or_default(a.k_pe_stride, c.rope_dim);
  p.cache_stride = or_default(a.cache_stride, a.cache_pe ? int64_t(c.kv_rank) : row);
  p.cache_slots = a.cache_slots;
  p.q_pe_head_stride = or_default(a.q_pe_head_stride, c.rope_dim);
  p.q_pe_token_stride = or_default(a.q_pe_token_stride, a.heads * p.q_pe_head_stride);
  p.q_nope_head_stride = or_default(a.q_nope_head_stride, c.kv_rank);
  p.q_nope_token_stride = or_default(a.q_nope_token_stride, a.heads * p.q_nope_head_stride);
  p.q_out_head_stride = or_default(a.q_out_head_stride, a.q_out_pe ? int64_t(c.kv_rank) : row);
  p.q_out_pe = a.q_out_pe;
  p.q_out_pe_head_stride = or_default(a.q_out_pe_head_stride, c.rope_dim);
  p.q_out_pe_token_stride = or_default(a.q_out_pe_token_stride, a.heads * p.q_out_pe_head_stride);
  p.q_out_token_stride = or_default(a.q_out_token_stride, a.heads * p.q_out_head_stride);
  p.table_rows = a.table_rows;
  p.table_stride = or_default(a.table_stride, c.rope_dim / 2);
  p.heads = a.heads;
  p.eps = float(a.norm_eps);
  p.tokens = a.tokens;
  p.k_pe_out = a.k_pe_out;
  p.k_pe_out_stride = or_default(a.k_pe_out_stride, c.rope_dim);
  p.cache_pe = a.cache_pe;
  p.cache_pe_stride = or_default(a.cache_pe_stride, c.rope_dim);
  p.cache_block_size = a.cache_block_size;
  p.cache_block_stride = or_default(a.cache_block_stride, a.cache_block_size * p.cache_stride);
  p.cache_pe_block_stride =
      or_default(a.cache_pe_block_stride, a.cache_block_size * p.cache_pe_stride);
  p.addressing = a.slots           ? ropejit_dev::kMlaSlots
                 : a.rows_by_token ? ropejit_dev::kMlaRowsByToken
                                   : ropejit_dev::kMlaPageTable;
  p.kv_indices = a.kv_indices;
  p.kv_indptr = a.kv_indptr;
  p.batch_indices = a.batch_indices;
  p.page_positions = a.page_positions;
  p.batch = a.batch;
  p.num_indices = a.num_indices;
  p.page_size = a.page_size;
  const int64_t sms = std::max(sm_count, 1);
  p.cache_blocks = a.cache ? (a.tokens + kMlaWarps - 1) / kMlaWarps : 0;
  int64_t query_blocks = 0;
  if (a.heads > 0) {
    // A decode step's few tokens split their heads until the grid has two blocks an SM; a
    // prefill's tokens group (one block, one pass of kMlaUnitsPerBlock 16-byte units) while
    // four blocks an SM remain. At most 1024 blocks a token.
    const int64_t wanted = (2 * sms + a.tokens - 1) / a.tokens;
    int64_t groups = std::min({a.heads, std::max<int64_t>(wanted, 1), int64_t(1024)});
    p.heads_per_block = (a.heads + groups - 1) / groups;
    groups = (a.heads + p.heads_per_block - 1) / p.heads_per_block;
    p.head_groups = groups;
    p.tokens_per_block = 1;
    if (groups == 1) {
      const int64_t units =
          a.heads * ((c.rope_dim + 7) / 8 + (c.query == MlaQuery::assemble ? c.kv_rank / 8 : 0));
      p.tokens_per_block =
          std::max<int64_t>(1, std::min(kMlaUnitsPerBlock / units, a.tokens / (4 * sms)));
    }
    query_blocks = (a.tokens + p.tokens_per_block - 1) / p.tokens_per_block * groups;
  }
  *blocks = unsigned(p.cache_blocks + query_blocks);
  const int64_t elem = element_bytes(c.dtype);
  const auto aligned = [&](int64_t stride, int64_t count) {
    return count <= 1 || (stride * elem) % 16 == 0;
  };
  p.q_pe_vectors = a.q_pe && reinterpret_cast<uintptr_t>(a.q_pe) % 16 == 0 &&
                   aligned(p.q_pe_token_stride, a.tokens) && aligned(p.q_pe_head_stride, a.heads);
  if (a.q_out_pe) {  // its vectors are 16 bytes, or 8 of e4m3 codes
    const int64_t oelem = c.q_store == Store::e4m3 ? 1 : elem;
    const auto out_aligned = [&](int64_t stride, int64_t count) {
      return count <= 1 || (stride * oelem) % (8 * oelem) == 0;
    };
    p.q_pe_vectors = p.q_pe_vectors &&
                     reinterpret_cast<uintptr_t>(a.q_out_pe) % uint64_t(8 * oelem) == 0 &&
                     out_aligned(p.q_out_pe_token_stride, a.tokens) &&
                     out_aligned(p.q_out_pe_head_stride, a.heads);
  }
  return p;
}

RenderedKernel render(const MlaSpec& c) {
  return render_entry(c.key(), mla_variant_name(), "mla_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(c.dtype))},
                          {"table_dtype", std::to_string(int(c.table_dtype))},
                          {"kv_rank", std::to_string(c.kv_rank)},
                          {"rope_dim", std::to_string(c.rope_dim)},
                          {"threads", std::to_string(kMlaThreads)},
                          {"gptj", flag(c.style == Style::gptj)},
                          {"ids64", flag(c.index_type == IndexType::i64)},
                          {"norm", flag(c.norm == Norm::rms)},
                          {"cache_e4m3", flag(c.cache_store == Store::e4m3)},
                          {"assemble", flag(c.query == MlaQuery::assemble)},
                          {"q_e4m3", flag(c.q_store == Store::e4m3)},
                          {"scale_multiplies", flag(c.scale_multiplies)},
                      });
}

}  // namespace ropejit::detail
