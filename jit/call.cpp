// Call checking: every pointer, size and stride of Args against the spec, with messages that
// name the argument and its value. Nothing here touches the GPU.
#include "jit/call.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <utility>

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
using Dims = std::array<Dim, 3>;

// The first dimension whose stride does not step over everything the smaller strides span
// (rows of head_dim elements would then overlap), or null; `needed` gets the stride it needed.
const Dim* overlapping_dim(const Dims& dims, int64_t head_dim, int64_t* needed) {
  Dims live = dims;
  std::sort(live.begin(), live.end(),
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

// One operand as checked: its strides, the bytes it spans, whether the call writes it.
struct Operand {
  const char* name = nullptr;
  const Tensor* tensor = nullptr;
  Dims dims{};
  uintptr_t first = 0, end = 0;  // bytes [first, end); empty for an operand without elements
  bool written = false;
};

// Checks one operand's strides, that its rows never overlap (for operands that are written),
// and that its largest element offset fits in 64-bit byte arithmetic. Returns the alignment
// (bytes) its pointer and strides allow; fills `op`.
int32_t check_operand(const char* name, const Tensor& t, bool dense, int64_t batch, int64_t seq,
                      int64_t heads, const Spec& c, bool written, Operand* op) {
  const int64_t elem = element_bytes(c.dtype);
  if (!t.data) invalid(name, ".data is null");
  if (reinterpret_cast<uintptr_t>(t.data) % uint64_t(elem) != 0)
    invalid(name, ".data (", t.data, ") is not aligned to its ", elem, "-byte elements");
  if (t.heads != heads) invalid(name, ".heads (", t.heads, ") must be ", heads);
  // Fixed-size arrays: this runs on every call, which must not allocate.
  const Dims dims = {Dim{t.stride_seq, seq, "stride_seq"}, Dim{t.stride_head, heads, "stride_head"},
                     Dim{t.stride_batch, dense ? batch : 1, "stride_batch"}};
  *op = Operand{name, &t, dims, 0, 0, written};
  if (seq == 0) return 16;  // no elements: nothing is read or written
  int64_t end_offset = c.head_dim;
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
      reinterpret_cast<uintptr_t>(t.data) > UINTPTR_MAX - uint64_t(end_bytes))
    invalid(name, ": largest offset (", end_offset, " elements) overflows 64-bit byte offsets");
  op->first = reinterpret_cast<uintptr_t>(t.data);
  op->end = op->first + uint64_t(end_bytes);
  int64_t needed = 0;
  if (written)
    if (const Dim* d = overlapping_dim(dims, c.head_dim, &needed))
      invalid(name, ".", d->name, " (", d->stride, ") makes rows overlap (needs >= ", needed, ")");
  int32_t align = low_alignment(reinterpret_cast<uintptr_t>(t.data));
  for (const Dim& d : dims)
    if (d.count > 1) align = std::min(align, low_alignment(uint64_t(d.stride * elem)));
  return align;
}

// Whether two operands whose byte spans intersect still share no element: views of different
// heads of one tensor, such as q and k in a packed QKV projection output. That holds when their
// strides are equal, b starts a whole number of heads after a, their head ranges do not meet,
// and one tensor covering both head ranges has rows that never overlap.
bool distinct_heads(const Operand& a, const Operand& b, int64_t head_dim, int64_t elem) {
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (a.dims[i].stride != b.dims[i].stride && (a.dims[i].count > 1 || b.dims[i].count > 1))
      return false;
  const int64_t head_bytes = a.dims[1].stride * elem;
  const int64_t delta = int64_t(b.first - a.first);  // two's complement: negative when b < a
  if (head_bytes <= 0 || delta % head_bytes != 0) return false;
  const int64_t shift = delta / head_bytes;  // b's head 0 is a's head `shift`
  const int64_t a_heads = a.dims[1].count, b_heads = b.dims[1].count;
  if (shift < a_heads && -shift < b_heads) return false;  // the head ranges meet
  Dims both = a.dims;
  both[1].count = std::max(a_heads, shift + b_heads) - std::min<int64_t>(0, shift);
  int64_t needed = 0;
  return overlapping_dim(both, head_dim, &needed) == nullptr;
}

// Rejects a written operand that shares memory with any other operand of the call.
void check_no_overlap(const Operand* ops, size_t n, int64_t head_dim, int64_t elem) {
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const Operand& a = ops[i];
      const Operand& b = ops[j];
      if (!(a.written || b.written) || a.first == a.end || b.first == b.end) continue;
      if (a.end <= b.first || b.end <= a.first) continue;
      const bool a_first = a.first <= b.first;
      if (distinct_heads(a_first ? a : b, a_first ? b : a, head_dim, elem)) continue;
      invalid(a.name, " and ", b.name, " overlap in memory (", a.name, " spans [",
              reinterpret_cast<const void*>(a.first), ", ", reinterpret_cast<const void*>(a.end),
              "), ", b.name, " [", reinterpret_cast<const void*>(b.first), ", ",
              reinterpret_cast<const void*>(b.end), ")) and ",
              a.written && b.written ? "both are" : "one is",
              " written; give each its own memory (or distinct heads of one tensor)");
    }
}

void check_index_pointer(const void* p, IndexType t, const char* name, const char* why) {
  if (!p) invalid(name, " is null but ", why);
  const uint64_t bytes = t == IndexType::i64 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    invalid(name, " (", p, ") is not aligned to its ", bytes, "-byte elements");
}

}  // namespace

CallShape check_call(const Spec& c, const Args& a) {
  // Keys of the axes whose kernels are still being built (tracked in the issues).
  if (c.fused() || c.positions == Positions::mrope ||
      (c.freqs != Freqs::table && c.freqs != Freqs::computed))
    fail(ErrorCode::invalid_argument, c.key(), ": this axis value has no kernel in this build yet");
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

  constexpr int64_t kMaxHeads = int64_t(1) << 30;  // q + k heads stay below 2^31
  if (a.q.heads < 1 || a.q.heads > kMaxHeads)
    invalid("args.q.heads (", a.q.heads, ") must be in [1, 2^30]");
  const bool has_k = a.k.data != nullptr;
  if (!has_k && a.k.heads != 0)
    invalid("args.k.heads (", a.k.heads, ") is set but args.k.data is null");
  if (has_k && (a.k.heads < 1 || a.k.heads > kMaxHeads))
    invalid("args.k.heads (", a.k.heads, ") must be in [1, 2^30]");
  shape.q_heads = int32_t(a.q.heads);
  shape.k_heads = has_k ? int32_t(a.k.heads) : 0;

  const int64_t seq = dense ? a.seq_len : tokens;
  std::array<Operand, 4> ops{};
  size_t n_ops = 0;
  int32_t align =
      check_operand("args.q", a.q, dense, a.batch, seq, a.q.heads, c, c.in_place, &ops[n_ops++]);
  if (has_k)
    align = std::min(align, check_operand("args.k", a.k, dense, a.batch, seq, a.k.heads, c,
                                          c.in_place, &ops[n_ops++]));
  if (c.in_place) {
    // In place, q and k are the outputs: an output tensor given too would be silently ignored.
    for (const auto& [t, name] :
         {std::pair{&a.q_out, "args.q_out"}, std::pair{&a.k_out, "args.k_out"}})
      if (t->data)
        invalid(name,
                ".data is set but spec.in_place is true (in place, q and k are written); "
                "set spec.in_place = false to write ",
                name);
  } else {
    align = std::min(align, check_operand("args.q_out", a.q_out, dense, a.batch, seq, a.q.heads, c,
                                          true, &ops[n_ops++]));
    if (has_k)
      align = std::min(align, check_operand("args.k_out", a.k_out, dense, a.batch, seq, a.k.heads,
                                            c, true, &ops[n_ops++]));
    else if (a.k_out.data)
      invalid("args.k_out.data is set but args.k.data is null");
  }
  check_no_overlap(ops.data(), n_ops, c.head_dim, element_bytes(c.dtype));
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
  // Positions are position_offset + an index below `tokens`: keep them far from int64 overflow.
  constexpr int64_t kMaxPosition = int64_t(1) << 62;
  if (c.positions == Positions::offset && a.position_offset > kMaxPosition - tokens)
    invalid("args.position_offset (", a.position_offset, ") + ", tokens,
            " tokens exceeds the largest position (2^62)");

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
        a.position_offset > a.table_rows - a.seq_len)  // no overflow: both are checked above
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
