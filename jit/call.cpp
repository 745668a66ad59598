// Call checking: every pointer, size and stride of Args against the spec, with messages that
// name the argument and its value. Nothing here touches the GPU.
#include "jit/call.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>

#include "jit/errors.hpp"

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

struct Dim {
  int64_t stride;
  int64_t count;
  const char* name;
};

// Checks one operand's strides, that its rows never overlap (for operands that are written),
// and that its largest element offset fits in 64-bit byte arithmetic. Returns the alignment
// (bytes) its pointer and strides allow.
int32_t check_operand(const char* name, const Tensor& t, bool dense, int64_t batch, int64_t seq,
                      int64_t heads, const Spec& c, bool written) {
  const int64_t elem = element_bytes(c.dtype);
  if (!t.data) invalid(name, ".data is null");
  if (reinterpret_cast<uintptr_t>(t.data) % uint64_t(elem) != 0)
    invalid(name, ".data (", t.data, ") is not aligned to its ", elem, "-byte elements");
  if (t.heads != heads) invalid(name, ".heads (", t.heads, ") must be ", heads);
  // Fixed-size arrays: this runs on every call, which must not allocate.
  std::array<Dim, 3> dims = {Dim{t.stride_seq, seq, "stride_seq"},
                             Dim{t.stride_head, heads, "stride_head"},
                             Dim{t.stride_batch, dense ? batch : 1, "stride_batch"}};
  if (seq == 0) return 16;  // no elements: nothing is read or written
  int64_t max_offset = c.head_dim;
  for (const Dim& d : dims) {
    if (d.stride < 0) invalid(name, ".", d.name, " (", d.stride, ") must be >= 0");
    int64_t span = 0;
    if (d.count > 1 && (__builtin_mul_overflow(d.stride, d.count - 1, &span) ||
                        __builtin_add_overflow(max_offset, span, &max_offset)))
      invalid(name, ".", d.name, " (", d.stride, ") times ", d.count - 1,
              " overflows 64-bit offsets");
  }
  int64_t max_bytes = 0;
  if (__builtin_mul_overflow(max_offset, elem, &max_bytes))
    invalid(name, ": largest offset (", max_offset, " elements) overflows 64-bit byte offsets");
  if (written) {
    // Rows of head_dim elements must not overlap: sorted by stride, each stride must step
    // over everything spanned by the smaller ones.
    std::array<Dim, 3> live = dims;
    std::sort(live.begin(), live.end(),
              [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
    int64_t extent = c.head_dim;
    for (const Dim& d : live) {
      if (d.count <= 1) continue;
      if (d.stride < extent)
        invalid(name, ".", d.name, " (", d.stride, ") makes rows overlap (needs >= ", extent, ")");
      extent = d.stride * (d.count - 1) + extent;
    }
  }
  int32_t align = low_alignment(reinterpret_cast<uintptr_t>(t.data));
  for (const Dim& d : dims)
    if (d.count > 1) align = std::min(align, low_alignment(uint64_t(d.stride * elem)));
  return align;
}

void check_index_pointer(const void* p, IndexType t, const char* name, const char* why) {
  if (!p) invalid(name, " is null but ", why);
  const uint64_t bytes = t == IndexType::i64 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    invalid(name, " (", p, ") is not aligned to its ", bytes, "-byte elements");
}

}  // namespace

CallShape check_call(const Spec& c, const Args& a) {
  const bool dense = c.layout != Layout::thd;
  if (dense && a.batch < 1) invalid("args.batch (", a.batch, ") must be >= 1");
  if (!dense && a.batch < 0) invalid("args.batch (", a.batch, ") must be >= 0");
  if (a.seq_len < 0) invalid("args.seq_len (", a.seq_len, ") must be >= 0");
  CallShape shape;
  int64_t tokens = a.seq_len;
  if (dense && __builtin_mul_overflow(a.batch, a.seq_len, &tokens))
    invalid("args.batch (", a.batch, ") * args.seq_len (", a.seq_len, ") overflows");
  if (tokens > kMaxTokens)
    invalid("token count (", tokens, ") exceeds ", kMaxTokens, "; split the call");
  shape.tokens = tokens;

  if (a.q.heads < 1 || a.q.heads > INT32_MAX / 2)
    invalid("args.q.heads (", a.q.heads, ") must be >= 1");
  const bool has_k = a.k.data != nullptr;
  if (!has_k && a.k.heads != 0)
    invalid("args.k.heads (", a.k.heads, ") is set but args.k.data is null");
  if (has_k && (a.k.heads < 1 || a.k.heads > INT32_MAX / 2))
    invalid("args.k.heads (", a.k.heads, ") must be >= 1");
  shape.q_heads = int32_t(a.q.heads);
  shape.k_heads = has_k ? int32_t(a.k.heads) : 0;

  const int64_t seq = dense ? a.seq_len : tokens;
  int32_t align = check_operand("args.q", a.q, dense, a.batch, seq, a.q.heads, c, c.in_place);
  if (has_k)
    align = std::min(align,
                     check_operand("args.k", a.k, dense, a.batch, seq, a.k.heads, c, c.in_place));
  if (!c.in_place) {
    align = std::min(align,
                     check_operand("args.q_out", a.q_out, dense, a.batch, seq, a.q.heads, c, true));
    if (has_k)
      align = std::min(
          align, check_operand("args.k_out", a.k_out, dense, a.batch, seq, a.k.heads, c, true));
    else if (a.k_out.data)
      invalid("args.k_out.data is set but args.k.data is null");
  }
  shape.align_bytes = align;
  if (max_vec(c, align) == 0)
    invalid("gptj needs q/k pointers and strides aligned to a pair of elements (",
            2 * element_bytes(c.dtype), " bytes); the call allows ", align);

  // Positions.
  const bool needs_cu = !dense && c.positions != Positions::ids;
  if (needs_cu) {
    if (!a.cu_seqlens) invalid("args.cu_seqlens is null but layout thd needs it");
    if (reinterpret_cast<uintptr_t>(a.cu_seqlens) % 4 != 0)
      invalid("args.cu_seqlens (", static_cast<const void*>(a.cu_seqlens),
              ") is not 4-byte aligned");
    if (a.batch < 1) invalid("args.batch (", a.batch, ") must be >= 1 with cu_seqlens");
  }
  if (c.positions == Positions::seq_offsets)
    check_index_pointer(a.seq_offsets, c.index_type, "args.seq_offsets", "positions is seqoff");
  if (c.positions == Positions::ids)
    check_index_pointer(a.position_ids, c.index_type, "args.position_ids", "positions is ids");
  if (c.positions == Positions::offset && a.position_offset < 0)
    invalid("args.position_offset (", a.position_offset, ") must be >= 0");

  // Frequencies.
  if (c.freqs == Freqs::table) {
    const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
    const int64_t telem = element_bytes(c.table_dtype);
    if (!a.cos || !a.sin) invalid("args.", a.cos ? "sin" : "cos", " is null but freqs is tab");
    for (const void* p : {a.cos, a.sin})
      if (reinterpret_cast<uintptr_t>(p) % uint64_t(telem) != 0)
        invalid("args.", p == a.cos ? "cos" : "sin", " (", p, ") is not aligned to its ", telem,
                "-byte elements");
    if (a.table_rows < 1) invalid("args.table_rows (", a.table_rows, ") must be >= 1");
    const int64_t stride = a.table_stride == 0 ? width : a.table_stride;
    if (stride < width)
      invalid("args.table_stride (", a.table_stride, ") is smaller than the row width (", width,
              ")");
    int64_t span = 0;
    if (__builtin_mul_overflow(a.table_rows, stride, &span) ||
        __builtin_mul_overflow(span, telem, &span))
      invalid("args.table_rows (", a.table_rows, ") * table_stride overflows");
    shape.table_align =
        low_alignment(reinterpret_cast<uintptr_t>(a.cos) | reinterpret_cast<uintptr_t>(a.sin) |
                      uint64_t(stride * telem));
    if (c.positions == Positions::offset && dense && tokens > 0 &&
        a.position_offset > a.table_rows - a.seq_len)
      invalid("positions up to ", a.position_offset + a.seq_len - 1, " (position_offset ",
              a.position_offset, " + seq_len ", a.seq_len,
              " - 1) are beyond the table (table_rows ", a.table_rows, ")");
  } else if (!(std::isfinite(a.base) && a.base > 1.0)) {
    invalid("args.base (", a.base, ") must be a finite number > 1");
  }
  return shape;
}

ropejit_dev::RopeParams make_params(const Spec& c, const Args& a, const CallShape& shape) {
  ropejit_dev::RopeParams p{};
  auto operand = [&](const Tensor& in, const Tensor& out, int32_t heads) {
    ropejit_dev::HeadOperand o{};
    if (heads == 0) return o;
    const Tensor& w = c.in_place ? in : out;
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
  p.positions = c.positions == Positions::ids ? a.position_ids : a.seq_offsets;
  p.cu_seqlens = a.cu_seqlens;
  p.cos = a.cos;
  p.sin = a.sin;
  const int64_t width = c.table_width == TableWidth::half ? c.rotary_dim / 2 : c.rotary_dim;
  p.table_stride = a.table_stride == 0 ? width : a.table_stride;
  p.table_rows = a.table_rows;
  p.log2_base = c.freqs == Freqs::computed ? std::log2(a.base) : 0.0;
  return p;
}

}  // namespace ropejit::detail
