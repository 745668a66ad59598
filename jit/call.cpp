// Call checking: every pointer, size and stride of Args against the spec, with messages that
// name the argument and its value. Nothing here touches the GPU.
#include "jit/call.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <tuple>
#include <utility>

#include "jit/coverage.hpp"
#include "jit/errors.hpp"
#include "jit/scaling.hpp"

namespace ropejit::detail {
namespace {

// Kernels index tokens with 32-bit arithmetic (templates/rope_kernel.cuh, locate()).
constexpr int64_t kMaxTokens = INT32_MAX;

int32_t low_alignment(uint64_t v) {
  if (v == 0) return 16;
  int32_t a = 1;
  while (a < 16 && (v & uint64_t(a)) == 0) a *= 2;
  return a;
}

// The first dimension whose stride does not step over everything the smaller strides span
// (rows of head_dim elements would then overlap), or null; `needed` gets the stride it needed.
// Equal strides keep the caller's order (a stable sort), so the answer does not depend on the
// sort's whims; the message then names both (see tied_dim).
const Dim* overlapping_dim(const Dims& dims, int64_t head_dim, int64_t* needed) {
  Dims live = dims;
  std::stable_sort(live.begin(), live.end(),
                   [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t extent = head_dim;
  for (const Dim& d : live) {
    if (d.count <= 1) continue;
    if (d.stride < extent) {
      *needed = extent;
      for (const Dim& original : dims)
        if (original.name == d.name) return &original;
    }
    extent = d.stride * (d.count - 1) + extent;
  }
  return nullptr;
}

// Another dimension with more than one index and the same stride as `d`: either of the two may
// be the one the caller got wrong.
const Dim* tied_dim(const Dims& dims, const Dim& d) {
  for (const Dim& other : dims)
    if (&other != &d && other.count > 1 && other.stride == d.stride) return &other;
  return nullptr;
}

}  // namespace

int32_t check_strided(const char* name, const void* data, const Dims& dims, int64_t row,
                      int64_t elem, bool written, Operand* op) {
  if (!data) invalid(name, ".data is null");
  if (reinterpret_cast<uintptr_t>(data) % uint64_t(elem) != 0)
    invalid(name, ".data (", data, ") is not aligned to its ", elem, "-byte elements");
  *op = Operand{name, dims, elem, 0, 0, written, row};
  for (const Dim& d : dims)
    if (d.count == 0) return int32_t(16 / elem);  // no elements: nothing is read or written
  int64_t end_offset = row;
  for (const Dim& d : dims) {
    if (d.stride < 0) invalid(name, ".", d.name, " (", d.stride, ") must be >= 0");
    int64_t span = 0;
    if (d.count > 1 && (__builtin_mul_overflow(d.stride, d.count - 1, &span) ||
                        __builtin_add_overflow(end_offset, span, &end_offset)))
      invalid(name, ".", d.name, " (", d.stride, ") times ", d.count - 1,
              " overflows 64-bit offsets");
  }
  int64_t end_bytes = 0;
  if (__builtin_mul_overflow(end_offset, elem, &end_bytes) ||
      reinterpret_cast<uintptr_t>(data) > UINTPTR_MAX - uint64_t(end_bytes))
    invalid(name, ": largest offset (", end_offset, " elements) overflows 64-bit byte offsets");
  op->first = reinterpret_cast<uintptr_t>(data);
  op->end = op->first + uint64_t(end_bytes);
  int64_t needed = 0;
  if (written)
    if (const Dim* d = overlapping_dim(dims, row, &needed)) {
      if (const Dim* t = tied_dim(dims, *d))
        invalid(name, ".", t->name, " and ", d->name, " are both ", d->stride,
                ", which makes rows overlap: one of them must be >= ", needed);
      invalid(name, ".", d->name, " (", d->stride, ") makes rows overlap (needs >= ", needed, ")");
    }
  int32_t align = low_alignment(reinterpret_cast<uintptr_t>(data));
  for (const Dim& d : dims)
    if (d.count > 1) align = std::min(align, low_alignment(uint64_t(d.stride * elem)));
  return int32_t(align / elem);
}

namespace {

// A tensor of the call laid out [batch, seq, heads, row] or [tokens, heads, row]: q/k/v and
// their outputs (row = head_dim), the dynamic FP8 scales (row = 1).
int32_t check_operand(const char* name, const Tensor& t, bool dense, int64_t batch, int64_t seq,
                      int64_t heads, int64_t row, int64_t elem, bool written, Operand* op) {
  if (t.data && t.heads != heads) invalid(name, ".heads (", t.heads, ") must be ", heads);
  const Dims dims = {Dim{t.stride_seq, seq, "stride_seq"}, Dim{t.stride_head, heads, "stride_head"},
                     Dim{t.stride_batch, dense ? batch : 1, "stride_batch"}};
  return check_strided(name, t.data, dims, row, elem, written, op);
}

// Whether two operands whose byte spans intersect still share no element: views of different
// heads (or tokens, or pages) of one tensor, such as q and k in a packed QKV projection output,
// or k and v pages interleaved in one cache. That holds when their strides and element sizes
// are equal, b starts a whole number of steps of one axis after a, their ranges on that axis do
// not meet, and one tensor covering both ranges has rows that never overlap.
bool distinct_rows(const Operand& a, const Operand& b) {
  if (a.elem != b.elem || a.row != b.row) return false;
  const int64_t row = a.row;
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (a.dims[i].stride != b.dims[i].stride && (a.dims[i].count > 1 || b.dims[i].count > 1))
      return false;
  const int64_t delta = int64_t(b.first - a.first);  // two's complement: negative when b < a
  for (size_t axis = 0; axis < a.dims.size(); ++axis) {
    const int64_t step = a.dims[axis].stride * a.elem;
    if (step <= 0 || delta % step != 0) continue;
    const int64_t shift = delta / step;  // b's index 0 on this axis is a's index `shift`
    const int64_t na = a.dims[axis].count, nb = b.dims[axis].count;
    bool same_elsewhere = true;
    for (size_t i = 0; i < a.dims.size(); ++i)
      same_elsewhere = same_elsewhere && (i == axis || a.dims[i].count == b.dims[i].count);
    if (!same_elsewhere || (shift < na && -shift < nb)) continue;  // the ranges meet
    Dims both = a.dims;
    both[axis].count = std::max(na, shift + nb) - std::min<int64_t>(0, shift);
    int64_t needed = 0;
    if (overlapping_dim(both, row, &needed) == nullptr) return true;
  }
  return false;
}

// a's and b's elements are different columns of one tensor's rows (vLLM's kv_c and k_pe split
// from one projection's output, FlashInfer's ckv and kpe parts of one cache): equal element
// sizes, axes and counts, b's columns starting at or after a's row ends, and rows as wide as
// both together that never overlap. `a` starts first.
bool distinct_columns(const Operand& a, const Operand& b) {
  if (a.elem != b.elem) return false;
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (a.dims[i].count != b.dims[i].count ||
        (a.dims[i].stride != b.dims[i].stride && a.dims[i].count > 1))
      return false;
  const int64_t delta = int64_t(b.first - a.first);
  if (delta % a.elem != 0 || delta / a.elem < a.row) return false;
  int64_t needed = 0;
  return overlapping_dim(a.dims, delta / a.elem + b.row, &needed) == nullptr;
}

}  // namespace

int64_t check_table(const void* cos, const void* sin, DType table_dtype, int64_t width,
                    int64_t table_rows, int64_t table_stride) {
  const int64_t telem = element_bytes(table_dtype);
  if (!cos || !sin) invalid("args.", cos ? "sin" : "cos", " is null but freqs is tab");
  for (const void* p : {cos, sin})
    if (reinterpret_cast<uintptr_t>(p) % uint64_t(telem) != 0)
      invalid("args.", p == cos ? "cos" : "sin", " (", p, ") is not aligned to its ", telem,
              "-byte elements");
  if (table_rows < 1) invalid("args.table_rows (", table_rows, ") must be >= 1");
  const int64_t stride = table_stride == 0 ? width : table_stride;
  if (stride < width)
    invalid("args.table_stride (", table_stride, ") is smaller than the row width (", width, ")");
  int64_t span = 0;
  if (__builtin_mul_overflow(table_rows, stride, &span) ||
      __builtin_mul_overflow(span, telem, &span))
    invalid("args.table_rows (", table_rows, ") * table_stride overflows");
  return stride;
}

void check_no_overlap(const Operand* ops, size_t n) {
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const Operand& a = ops[i];
      const Operand& b = ops[j];
      if (!(a.written || b.written) || a.first == a.end || b.first == b.end) continue;
      if (a.end <= b.first || b.end <= a.first) continue;
      const bool a_first = a.first <= b.first;
      const Operand& lo = a_first ? a : b;
      const Operand& hi = a_first ? b : a;
      if (distinct_rows(lo, hi) || distinct_columns(lo, hi)) continue;
      invalid(a.name, " and ", b.name, " overlap in memory (", a.name, " spans [",
              reinterpret_cast<const void*>(a.first), ", ", reinterpret_cast<const void*>(a.end),
              "), ", b.name, " [", reinterpret_cast<const void*>(b.first), ", ",
              reinterpret_cast<const void*>(b.end), ")) and ",
              a.written && b.written ? "both are" : "one is",
              " written; give each its own memory (or distinct heads or columns of one tensor)");
    }
}

Range range_of(const char* name, const void* p, int64_t rows, int64_t stride, int64_t row,
               int64_t elem) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  if (!p || rows <= 0) return Range{name, first, first};
  int64_t span = 0;
  if (__builtin_mul_overflow(rows - 1, stride, &span) || __builtin_add_overflow(span, row, &span) ||
      __builtin_mul_overflow(span, elem, &span) || span < 0 || first > UINTPTR_MAX - uint64_t(span))
    invalid(name, ": ", rows, " rows of ", row, " elements, ", stride,
            " apart, overflow 64-bit addresses");
  return Range{name, first, first + uint64_t(span)};
}

void check_untouched(const Range* written, size_t n_written, const Range* inputs, size_t n_inputs) {
  for (size_t i = 0; i < n_written; ++i)
    for (size_t j = 0; j < n_inputs; ++j) {
      const Range& o = written[i];
      const Range& in = inputs[j];
      if (o.first < o.end && in.first < in.end && o.first < in.end && in.first < o.end)
        invalid(o.name, " and ", in.name, " overlap in memory (", o.name, " spans [",
                reinterpret_cast<const void*>(o.first), ", ", reinterpret_cast<const void*>(o.end),
                "), ", in.name, " [", reinterpret_cast<const void*>(in.first), ", ",
                reinterpret_cast<const void*>(in.end), ")) and ", o.name, " is written while ",
                in.name, " is read: give each its own memory");
    }
}

void check_norm_eps(double eps) {
  if (!(std::isfinite(eps) && eps >= 0 && eps <= FLT_MAX))
    invalid("args.norm_eps (", eps, ") must be a finite number in [0, FLT_MAX] (a float)");
}

namespace {

void check_index_pointer(const void* p, IndexType t, const char* name, const char* why) {
  if (!p) invalid(name, " is null but ", why);
  const uint64_t bytes = t == IndexType::i64 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    invalid(name, " (", p, ") is not aligned to its ", bytes, "-byte elements");
}

// Every memory region a call touches, as checked so far (a fixed array: checking runs on every
// call, which must not allocate).
struct Operands {
  std::array<Operand, 14> ops{};
  size_t n = 0;
  int32_t vec = 16;  // the widest vector (activation elements) every operand allows
  Operand* next() { return &ops[n++]; }
  void allow(int32_t elements) { vec = std::min(vec, elements); }
  // The operand checked last is indexed this way by the narrow variant.
  void indexed(Operand::Narrow how) { ops[n - 1].narrow = how; }
};

// Whether a fused kernel's narrow variant holds an operand's offsets: every stride in bytes below
// 2^31, and its byte span (per_page: leaving out the first dimension, the pages) too.
bool narrow_fits(const Operand& op) {
  constexpr uint64_t kLimit = uint64_t(1) << 31;
  if (op.narrow == Operand::Narrow::never || op.first == op.end) return true;
  // Strides are >= 0 and stride * (count - 1) fits in 64 bits (check_strided); each term is
  // compared before it is added, so nothing here wraps.
  const uint64_t elem = uint64_t(op.elem);
  uint64_t span = uint64_t(op.row) * elem;
  for (size_t i = 0; i < op.dims.size(); ++i) {
    const Dim& d = op.dims[i];
    if (uint64_t(d.stride) >= kLimit / elem) return false;
    if (d.count > 1 && !(i == 0 && op.narrow == Operand::Narrow::per_page)) {
      if (uint64_t(d.count - 1) >= kLimit) return false;
      span += uint64_t(d.stride) * elem * uint64_t(d.count - 1);
      if (span >= kLimit) return false;
    }
  }
  return span < kLimit;
}

// Tokens and heads.
void check_sizes(const Spec& c, const Args& a, CallShape* shape) {
  const bool dense = c.layout != Layout::thd;
  if (dense && a.batch < 1) invalid("args.batch (", a.batch, ") must be >= 1");
  if (!dense && a.batch < 0) invalid("args.batch (", a.batch, ") must be >= 0");
  if (a.seq_len < 0) invalid("args.seq_len (", a.seq_len, ") must be >= 0");
  int64_t tokens = a.seq_len;
  if (dense && __builtin_mul_overflow(a.batch, a.seq_len, &tokens))
    invalid("args.batch (", a.batch, ") * args.seq_len (", a.seq_len, ") overflows");
  if (tokens > kMaxTokens)
    invalid("token count (", tokens, ") exceeds ", kMaxTokens, "; split the call");
  shape->tokens = tokens;

  constexpr int64_t kMaxHeads = int64_t(1) << 29;  // q + k + v heads stay below 2^31
  if (a.q.heads < 1 || a.q.heads > kMaxHeads)
    invalid("args.q.heads (", a.q.heads, ") must be in [1, 2^29]");
  const bool has_k = a.k.data != nullptr;
  if (!has_k && a.k.heads != 0)
    invalid("args.k.heads (", a.k.heads, ") is set but args.k.data is null");
  if (has_k && (a.k.heads < 1 || a.k.heads > kMaxHeads))
    invalid("args.k.heads (", a.k.heads, ") must be in [1, 2^29]");
  shape->q_heads = int32_t(a.q.heads);
  shape->k_heads = has_k ? int32_t(a.k.heads) : 0;
  if (c.cache != KvCache::none && !has_k)
    invalid("args.k.data is null but spec.cache is ", to_string(c.cache),
            ": k is what the cache receives");
  if (a.v.data && c.cache == KvCache::none)
    invalid("args.v.data is set but spec.cache is none: v goes only to a KV cache");
  if (!a.v.data && a.v.heads != 0)
    invalid("args.v.heads (", a.v.heads, ") is set but args.v.data is null");
  shape->v_heads = a.v.data ? shape->k_heads : 0;
}

// q, k, v and the outputs: strides, alignment, rows that never overlap.
void check_tensors(const Spec& c, const Args& a, const CallShape& shape, Operands* o) {
  const bool dense = c.layout != Layout::thd;
  const int64_t seq = dense ? a.seq_len : shape.tokens;
  const int64_t elem = element_bytes(c.dtype);
  const int64_t out_elem = is_fp8(c.out_store) ? 1 : elem;
  const bool has_k = shape.k_heads > 0;
  const bool k_written = c.fusion == Fusion::qk;
  o->allow(check_operand("args.q", a.q, dense, a.batch, seq, a.q.heads, c.head_dim, elem,
                         c.in_place, o->next()));
  o->indexed(Operand::Narrow::whole);
  if (has_k) {
    o->allow(check_operand("args.k", a.k, dense, a.batch, seq, a.k.heads, c.head_dim, elem,
                           c.in_place && k_written, o->next()));
    o->indexed(Operand::Narrow::whole);
  }
  if (a.v.data) {
    o->allow(check_operand("args.v", a.v, dense, a.batch, seq, a.k.heads, c.head_dim, elem, false,
                           o->next()));
    o->indexed(Operand::Narrow::whole);
  }
  if (c.in_place) {
    // In place, q and k are the outputs: an output tensor given too would be silently ignored.
    for (const auto& [t, name] :
         {std::pair{&a.q_out, "args.q_out"}, std::pair{&a.k_out, "args.k_out"}})
      if (t->data)
        invalid(name,
                ".data is set but spec.in_place is true (in place, q and k are written); "
                "set spec.in_place = false to write ",
                name);
    return;
  }
  // Widths count elements whatever their size: an e4m3 output allows vec elements at vec-byte
  // alignment.
  o->allow(check_operand("args.q_out", a.q_out, dense, a.batch, seq, a.q.heads, c.head_dim,
                         out_elem, true, o->next()));
  o->indexed(Operand::Narrow::whole);
  if (has_k && k_written) {
    o->allow(check_operand("args.k_out", a.k_out, dense, a.batch, seq, a.k.heads, c.head_dim,
                           out_elem, true, o->next()));
    o->indexed(Operand::Narrow::whole);
  } else if (a.k_out.data)
    invalid("args.k_out.data is set but ",
            has_k ? "spec.fusion is q: k is written only to the cache" : "args.k.data is null");
}

// Where positions come from: offsets, per-sequence offsets, ids, cu_seqlens.
void check_positions(const Spec& c, const Args& a, const CallShape& shape) {
  const bool dense = c.layout != Layout::thd;
  // A cache addressed by sequence needs each token's sequence, which thd finds in cu_seqlens.
  const bool by_sequence = c.cache == KvCache::paged || c.cache == KvCache::contiguous;
  const bool by_id = c.positions == Positions::ids || c.positions == Positions::mrope;
  const bool needs_cu = !dense && (!by_id || by_sequence);
  if (needs_cu) {
    if (!a.cu_seqlens)
      invalid("args.cu_seqlens is null but layout thd needs it",
              by_id ? " (the KV cache is addressed by sequence)" : "");
    if (reinterpret_cast<uintptr_t>(a.cu_seqlens) % 4 != 0)
      invalid("args.cu_seqlens (", static_cast<const void*>(a.cu_seqlens),
              ") is not 4-byte aligned");
    if (a.batch < 1) invalid("args.batch (", a.batch, ") must be >= 1 with cu_seqlens");
  }
  if (c.positions == Positions::seq_offsets)
    check_index_pointer(a.seq_offsets, c.index_type, "args.seq_offsets", "positions is seqoff");
  if (c.positions == Positions::ids)
    check_index_pointer(a.position_ids, c.index_type, "args.position_ids", "positions is ids");
  if (c.positions == Positions::mrope)
    check_index_pointer(a.position_ids, c.index_type, "args.position_ids",
                        "positions is mrope (three rows of ids)");
  if (c.positions == Positions::offset && a.position_offset < 0)
    invalid("args.position_offset (", a.position_offset, ") must be >= 0");
  // Positions are position_offset + an index below `tokens`: keep them far from int64 overflow.
  constexpr int64_t kMaxPosition = int64_t(1) << 62;
  if (c.positions == Positions::offset && a.position_offset > kMaxPosition - shape.tokens)
    invalid("args.position_offset (", a.position_offset, ") + ", shape.tokens,
            " tokens exceeds the largest position (2^62)");
}

// cos/sin tables, or the base of computed frequencies.
void check_frequencies(const Spec& c, const Args& a, CallShape* shape) {
  if (c.freqs != Freqs::table) {
    if (!(std::isfinite(a.base) && a.base > 1.0))
      invalid("args.base (", a.base, ") must be a finite number > 1");
    return;
  }
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  const int64_t telem = element_bytes(c.table_dtype);
  const int64_t stride =
      check_table(a.cos, a.sin, c.table_dtype, width, a.table_rows, a.table_stride);
  shape->table_align = low_alignment(reinterpret_cast<uintptr_t>(a.cos) |
                                     reinterpret_cast<uintptr_t>(a.sin) | uint64_t(stride * telem));
  const bool dense = c.layout != Layout::thd;
  if (c.positions == Positions::offset && dense && shape->tokens > 0 &&
      a.position_offset > a.table_rows - a.seq_len)  // no overflow: both are checked above
    invalid("positions up to ", a.position_offset + a.seq_len - 1, " (position_offset ",
            a.position_offset, " + seq_len ", a.seq_len, " - 1) are beyond the table (table_rows ",
            a.table_rows, ")");
}

// The fused stages: norm weights, FP8 scales, the KV cache and its addressing.
void check_fusion(const Spec& c, const Args& a, const CallShape& shape, Operands* o) {
  const int64_t elem = element_bytes(c.dtype);
  if (c.norm != Norm::none) {
    check_norm_eps(a.norm_eps);
    const bool all = c.norm == Norm::rms_all_heads;
    for (const auto& [w, name, heads] :
         {std::tuple{a.q_norm_weight, "args.q_norm_weight", shape.q_heads},
          std::tuple{a.k_norm_weight, "args.k_norm_weight", shape.k_heads}}) {
      if (heads == 0) continue;
      check_aligned(w, uint64_t(elem), name, "spec.norm needs the weights");
      // Read-only rows of weights: head_dim elements (one per head for a norm over all heads).
      const Dims dims = {Dim{0, 1, "weights"}, Dim{c.head_dim, all ? heads : 1, "heads"},
                         Dim{0, 1, "-"}};
      o->allow(check_strided(name, w, dims, c.head_dim, elem, false, o->next()));
    }
  }
  if (c.out_store == Store::e4m3) check_scale(a.out_quant_scale, "args.out_quant_scale");
  // Dynamic FP8 outputs: a float per token and head of q_out (and k_out), written.
  const bool dense = c.layout != Layout::thd;
  const int64_t seq = dense ? a.seq_len : shape.tokens;
  const bool k_out = shape.k_heads > 0 && c.fusion == Fusion::qk;
  for (const auto& [t, name, heads, used] :
       {std::tuple{&a.q_out_scale, "args.q_out_scale", int64_t(shape.q_heads), true},
        std::tuple{&a.k_out_scale, "args.k_out_scale", int64_t(shape.k_heads), k_out}}) {
    if (c.out_store != Store::e4m3_dynamic || !used) {
      if (t->data)
        invalid(name, ".data is set but ",
                c.out_store != Store::e4m3_dynamic
                    ? "spec.out_store is not e4m3dyn: only dynamic FP8 outputs have scales"
                    : "no k is written out (spec.fusion is q, or args.k.data is null)");
      continue;
    }
    if (!t->data) invalid(name, ".data is null but spec.out_store is e4m3dyn");
    check_operand(name, *t, dense, a.batch, seq, heads, 1, 4, true, o->next());
    o->indexed(Operand::Narrow::whole);
  }
  const KvCacheArgs& k = a.cache;
  if (c.cache_store != Store::e4m3_dynamic)
    for (const auto& [p, name] : {std::pair{k.k_scales, "args.cache.k_scales"},
                                  std::pair{k.v_scales, "args.cache.v_scales"}})
      if (p)
        invalid(name,
                " is set but spec.cache_store is not e4m3dyn: only a dynamic FP8 cache "
                "has per-token scales");
  if (c.cache == KvCache::none) return;

  const int64_t celem = is_fp8(c.cache_store) ? 1 : elem;
  if (k.pages < 1) invalid("args.cache.pages (", k.pages, ") must be >= 1");
  if (k.page_size < 1) invalid("args.cache.page_size (", k.page_size, ") must be >= 1");
  const Dims dims = {Dim{k.stride_page, k.pages, "stride_page"},
                     Dim{k.stride_slot, k.page_size, "stride_slot"},
                     Dim{k.stride_head, shape.k_heads, "stride_head"}};
  o->allow(check_strided("args.cache.k", k.k, dims, c.head_dim, celem, true, o->next()));
  o->indexed(Operand::Narrow::per_page);
  if (a.v.data && !k.v) invalid("args.cache.v is null but args.v is given: v needs a cache too");
  if (!a.v.data && k.v) invalid("args.cache.v is set but args.v.data is null");
  if (k.v) {
    o->allow(check_strided("args.cache.v", k.v, dims, c.head_dim, celem, true, o->next()));
    o->indexed(Operand::Narrow::per_page);
  }
  if (c.cache_store == Store::e4m3) {
    check_scale(k.k_quant_scale, "args.cache.k_quant_scale");
    if (k.v) check_scale(k.v_quant_scale, "args.cache.v_quant_scale");
  }
  if (c.cache_store == Store::e4m3_dynamic) {
    // A float per cached token and head, placed like the rows.
    const Dims sdims = {Dim{k.scale_stride_page, k.pages, "scale_stride_page"},
                        Dim{k.scale_stride_slot, k.page_size, "scale_stride_slot"},
                        Dim{k.scale_stride_head, shape.k_heads, "scale_stride_head"}};
    if (!k.k_scales) invalid("args.cache.k_scales is null but spec.cache_store is e4m3dyn");
    check_strided("args.cache.k_scales", k.k_scales, sdims, 1, 4, true, o->next());
    o->indexed(Operand::Narrow::per_page);
    if (k.v && !k.v_scales)
      invalid("args.cache.v_scales is null but spec.cache_store is e4m3dyn and v is cached");
    if (!k.v && k.v_scales) invalid("args.cache.v_scales is set but args.v.data is null");
    if (k.v) {
      check_strided("args.cache.v_scales", k.v_scales, sdims, 1, 4, true, o->next());
      o->indexed(Operand::Narrow::per_page);
    }
  }
  if (k.skipped && reinterpret_cast<uintptr_t>(k.skipped) % 4 != 0)
    invalid("args.cache.skipped (", static_cast<const void*>(k.skipped), ") is not 4-byte aligned");
  const int64_t sequences = a.batch;
  switch (c.cache) {
    case KvCache::slots:
      check_aligned(k.slot_mapping, 8, "args.cache.slot_mapping", "spec.cache is slots");
      break;
    case KvCache::paged:
      check_aligned(k.indptr, 4, "args.cache.indptr", "spec.cache is paged");
      check_aligned(k.indices, 4, "args.cache.indices", "spec.cache is paged");
      check_aligned(k.last_page_len, 4, "args.cache.last_page_len", "spec.cache is paged");
      if (k.num_indices < 0) invalid("args.cache.num_indices (", k.num_indices, ") must be >= 0");
      // A sequence's positions are page counts read from the table (int32) times the page size:
      // 64-bit whatever the table holds.
      if (k.page_size > INT32_MAX)
        invalid("args.cache.page_size (", k.page_size, ") must be below 2^31 for a paged cache");
      break;
    case KvCache::contiguous:
      check_aligned(k.seq_lens, 4, "args.cache.seq_lens", "spec.cache is cont");
      if (sequences > k.pages)
        invalid("args.cache.pages (", k.pages, ") holds fewer sequences than args.batch (",
                sequences, ")");
      break;
    case KvCache::none:
      break;
  }
}

// The read-only arrays a call reads (tables, positions, sequence bounds, the cache's addressing)
// against everything it writes.
void check_inputs_untouched(const Spec& c, const Args& a, const CallShape& shape,
                            const Operands& ops) {
  if (shape.tokens == 0) return;
  const bool dense = c.layout != Layout::thd;
  const int64_t ibytes = c.index_type == IndexType::i64 ? 8 : 4;
  const int64_t sequences = a.batch;
  const bool table = c.freqs == Freqs::table;
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  const int64_t stride = a.table_stride == 0 ? width : a.table_stride;
  const KvCacheArgs& k = a.cache;
  const bool by_id = c.positions == Positions::ids || c.positions == Positions::mrope;
  const Range inputs[] = {
      range_of("args.cos", table ? a.cos : nullptr, a.table_rows, stride, width,
               element_bytes(c.table_dtype)),
      range_of("args.sin", table ? a.sin : nullptr, a.table_rows, stride, width,
               element_bytes(c.table_dtype)),
      range_of("args.position_ids", by_id ? a.position_ids : nullptr,
               c.positions == Positions::mrope ? 3 : 1, shape.tokens, shape.tokens, ibytes),
      range_of("args.seq_offsets", c.positions == Positions::seq_offsets ? a.seq_offsets : nullptr,
               sequences, 1, 1, ibytes),
      range_of("args.cu_seqlens", dense ? nullptr : a.cu_seqlens, sequences + 1, 1, 1, 4),
      range_of("args.cache.slot_mapping", c.cache == KvCache::slots ? k.slot_mapping : nullptr,
               shape.tokens, 1, 1, 8),
      range_of("args.cache.indptr", c.cache == KvCache::paged ? k.indptr : nullptr, sequences + 1,
               1, 1, 4),
      range_of("args.cache.indices", c.cache == KvCache::paged ? k.indices : nullptr, k.num_indices,
               1, 1, 4),
      range_of("args.cache.last_page_len", c.cache == KvCache::paged ? k.last_page_len : nullptr,
               sequences, 1, 1, 4),
      range_of("args.cache.seq_lens", c.cache == KvCache::contiguous ? k.seq_lens : nullptr,
               sequences, 1, 1, 4)};
  std::array<Range, std::tuple_size<decltype(ops.ops)>::value + 1> written{};
  size_t n = 0;
  for (size_t i = 0; i < ops.n; ++i)
    if (ops.ops[i].written) written[n++] = Range{ops.ops[i].name, ops.ops[i].first, ops.ops[i].end};
  written[n++] =
      range_of("args.cache.skipped", c.cache != KvCache::none ? k.skipped : nullptr, 1, 1, 1, 4);
  check_untouched(written.data(), n, inputs, std::size(inputs));
}

}  // namespace

void check_scale(float v, const char* name) {
  if (!(std::isfinite(v) && v > 0.0f)) invalid(name, " (", v, ") must be a finite number > 0");
}

void check_aligned(const void* p, uint64_t bytes, const char* name, const char* why) {
  if (!p) invalid(name, " is null but ", why);
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    invalid(name, " (", p, ") is not aligned to its ", bytes, "-byte elements");
}

CallShape check_call(const Spec& c, const Args& a) {
  require_kernel(c);  // axis values whose device code has not landed (jit/coverage.cpp)
  CallShape shape;
  Operands ops;
  check_sizes(c, a, &shape);
  check_tensors(c, a, shape, &ops);
  check_positions(c, a, shape);
  check_frequencies(c, a, &shape);
  check_fusion(c, a, shape, &ops);
  check_no_overlap(ops.ops.data(), ops.n);
  check_inputs_untouched(c, a, shape, ops);
  if (needs_pair_table(c)) pair_data(c, a);  // checks the scaling parameters and mRoPE sections
  shape.align_bytes = std::min<int32_t>(16, ops.vec * element_bytes(c.dtype));
  shape.narrow = c.fused() && std::all_of(ops.ops.begin(), ops.ops.begin() + ptrdiff_t(ops.n),
                                          [](const Operand& op) { return narrow_fits(op); });
  if (max_vec(c, shape.align_bytes) == 0)
    invalid("gptj needs q/k pointers and strides aligned to a pair of elements (",
            2 * element_bytes(c.dtype), " bytes); the call allows ", shape.align_bytes);
  return shape;
}

const PairData& pair_data(const Spec& c, const Args& a) {
  // The last inputs and what they gave, per thread: a call repeats them, and recomputing R/2
  // pow()s per launch would cost microseconds of host time.
  struct Cached {
    Freqs freqs = Freqs::table;
    int32_t rotary_dim = 0;
    double base = 0;
    RopeScaling scaling;
    std::vector<double> short_factor, long_factor;
    int32_t section[3] = {0, 0, 0};
    bool interleaved = false;
    bool mrope = false;
    bool valid = false;
    PairData data;
  };
  thread_local Cached cache;
  const int32_t pairs = c.rotary_dim / 2;
  const RopeScaling& s = a.scaling;
  // Only longrope reads the factor arrays, and only after their length matched the pairs.
  const bool factors = c.freqs == Freqs::longrope;
  auto same_factors = [&](const std::vector<double>& kept, const double* given) {
    if (!factors) return true;
    return given && s.factor_count == pairs && int32_t(kept.size()) == pairs &&
           std::memcmp(kept.data(), given, sizeof(double) * size_t(pairs)) == 0;
  };
  const bool mrope = c.positions == Positions::mrope;
  const bool hit =
      cache.valid && cache.freqs == c.freqs && cache.rotary_dim == c.rotary_dim &&
      cache.base == a.base && cache.mrope == mrope && cache.interleaved == a.mrope_interleaved &&
      std::memcmp(cache.section, a.mrope_section, sizeof cache.section) == 0 &&
      std::memcmp(&cache.scaling, &s, offsetof(RopeScaling, short_factor)) == 0 &&
      cache.scaling.seq_len == s.seq_len && same_factors(cache.short_factor, s.short_factor) &&
      same_factors(cache.long_factor, s.long_factor);
  if (hit) return cache.data;
  cache.valid = false;
  PairData d;
  d.turns.assign(size_t(pairs), 0.0);
  d.rows.assign(size_t(pairs), 0);
  if (scaled_freqs(c)) {
    validate_scaling(c.freqs, c.rotary_dim, s);
    const std::vector<double> inv =
        detail::inverse_frequencies(c.freqs, c.rotary_dim, a.base, s, "args.scaling");
    for (int32_t i = 0; i < pairs; ++i) d.turns[size_t(i)] = inv[size_t(i)] / (2 * M_PI);
    d.attention = detail::attention_factor(c.freqs, c.rotary_dim, s, "args.scaling");
  }
  if (mrope) d.rows = mrope_pair_rows(c.rotary_dim, a.mrope_section, a.mrope_interleaved);
  cache.freqs = c.freqs;
  cache.rotary_dim = c.rotary_dim;
  cache.base = a.base;
  cache.scaling = s;
  cache.short_factor.clear();
  cache.long_factor.clear();
  if (factors) {  // validate_scaling() checked both arrays and their length
    cache.short_factor.assign(s.short_factor, s.short_factor + pairs);
    cache.long_factor.assign(s.long_factor, s.long_factor + pairs);
  }
  std::memcpy(cache.section, a.mrope_section, sizeof cache.section);
  cache.interleaved = a.mrope_interleaved;
  cache.mrope = mrope;
  cache.data = std::move(d);
  cache.valid = true;
  return cache.data;
}

// Granlund and Montgomery's round-up method: with s = ceil(log2 d), magic = floor(2^32 (2^s - d)
// / d) + 1 < 2^32; d = 1 (s = 0) takes magic 1 and no shifts, so h = 0 and n / 1 = n.
Divisor page_divisor(int64_t d) {
  if (d < 1 || d > int64_t(UINT32_MAX)) return {0, 0, 0};
  int s = 0;
  while ((uint64_t(1) << s) < uint64_t(d)) ++s;
  const uint64_t magic =
      ((uint64_t(1) << 32) * ((uint64_t(1) << s) - uint64_t(d))) / uint64_t(d) + 1;
  return {uint32_t(magic), uint8_t(s > 0 ? 1 : 0), uint8_t(s > 0 ? s - 1 : 0)};
}

ropejit_dev::FusedParams make_params(const Spec& c, const Args& a, const CallShape& shape) {
  ropejit_dev::FusedParams f{};
  ropejit_dev::RopeParams& p = f.rope;
  auto operand = [&](const Tensor& in, const Tensor& out, int32_t heads) {
    ropejit_dev::HeadOperand o{};
    if (heads == 0) return o;
    const Tensor& w = c.in_place || !out.data ? in : out;
    o.in = in.data;
    o.out = w.data;
    o.stride_batch = in.stride_batch;
    o.stride_seq = in.stride_seq;
    o.stride_head = in.stride_head;
    o.out_stride_batch = w.stride_batch;
    o.out_stride_seq = w.stride_seq;
    o.out_stride_head = w.stride_head;
    o.heads = heads;
    return o;
  };
  p.q = operand(a.q, a.q_out, shape.q_heads);
  p.k = operand(a.k, a.k_out, shape.k_heads);
  p.tokens = shape.tokens;
  p.seq_len = a.seq_len;
  p.batch = a.batch;
  p.pos_offset = a.position_offset;
  p.positions = c.positions == Positions::ids || c.positions == Positions::mrope ? a.position_ids
                                                                                 : a.seq_offsets;
  p.cu_seqlens = a.cu_seqlens;
  p.cos = a.cos;
  p.sin = a.sin;
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  p.table_stride = a.table_stride == 0 ? width : a.table_stride;
  p.table_rows = a.table_rows;
  p.log2_base = c.freqs == Freqs::computed ? std::log2(a.base) : 0.0;
  if (!c.fused()) return f;
  f.v = operand(a.v, Tensor{}, shape.v_heads);
  f.q_norm_w = a.q_norm_weight;
  f.k_norm_w = a.k_norm_weight;
  f.norm_eps = float(a.norm_eps);
  f.out_scale = a.out_quant_scale;
  const KvCacheArgs& k = a.cache;
  ropejit_dev::CacheParams& cp = f.cache;
  cp.k = k.k;
  cp.v = k.v;
  cp.pages = k.pages;
  cp.page_size = k.page_size;
  const Divisor page = page_divisor(k.page_size);
  cp.page_magic = page.magic;
  cp.page_shift_a = page.shift_a;
  cp.page_shift_b = page.shift_b;
  cp.stride_page = k.stride_page;
  cp.stride_slot = k.stride_slot;
  cp.stride_head = k.stride_head;
  cp.slot_mapping = reinterpret_cast<const long long*>(k.slot_mapping);
  cp.indptr = k.indptr;
  cp.indices = k.indices;
  cp.num_indices = k.num_indices;
  cp.last_page_len = k.last_page_len;
  cp.seq_lens = k.seq_lens;
  cp.k_scale = k.k_quant_scale;
  cp.v_scale = k.v_quant_scale;
  cp.skipped = k.skipped;
  cp.k_scales = k.k_scales;
  cp.v_scales = k.v_scales;
  cp.scale_stride_page = k.scale_stride_page;
  cp.scale_stride_slot = k.scale_stride_slot;
  cp.scale_stride_head = k.scale_stride_head;
  auto scales = [](const Tensor& t) {
    return ropejit_dev::ScaleOperand{static_cast<float*>(t.data), t.stride_batch, t.stride_seq,
                                     t.stride_head};
  };
  f.q_scale = scales(a.q_out_scale);
  f.k_scale = scales(a.k_out_scale);
  return f;
}

}  // namespace ropejit::detail
