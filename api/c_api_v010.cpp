// The C ABI of ropejit 0.1.0, for programs built against its header: ropejit_spec and
// ropejit_args without a header member, filled by the unsized ropejit_spec_init and
// ropejit_args_init. Their layouts are frozen here; the library reads only their fields.
#include <cstring>

#include "api/c_structs.hpp"

namespace {

struct SpecV010 {
  int32_t layout, dtype, head_dim, rotary_dim, style, positions, index_type, freqs;
  int32_t table_dtype, table_width, direction, in_place, fusion;
};

struct ArgsV010 {
  int64_t batch, seq_len;
  ropejit_tensor q, k, q_out, k_out;
  int64_t position_offset;
  const void* seq_offsets;
  const void* position_ids;
  const int32_t* cu_seqlens;
  const void* cos;
  const void* sin;
  int64_t table_stride, table_rows;
  double base;
  void* stream;
};

ropejit::Tensor tensor(const ropejit_tensor& t) {
  return {t.data, t.heads, t.stride_batch, t.stride_seq, t.stride_head};
}

}  // namespace

namespace ropejit::capi {

Spec spec_v010(const void* p) {
  SpecV010 s;
  std::memcpy(&s, p, sizeof s);
  if (s.in_place != 0 && s.in_place != 1)
    detail::invalid("spec.in_place (", s.in_place, ") must be 0 or 1");
  Spec o;
  o.layout = Layout(s.layout);
  o.dtype = DType(s.dtype);
  o.head_dim = s.head_dim;
  o.rotary_dim = s.rotary_dim;
  o.style = Style(s.style);
  o.positions = Positions(s.positions);
  o.index_type = IndexType(s.index_type);
  o.freqs = Freqs(s.freqs);
  o.table_dtype = DType(s.table_dtype);
  o.table_width = TableWidth(s.table_width);
  o.direction = Direction(s.direction);
  o.in_place = s.in_place == 1;
  o.fusion = Fusion(s.fusion);
  return o;
}

Args args_v010(const void* p) {
  ArgsV010 a;
  std::memcpy(&a, p, sizeof a);
  Args o;
  o.batch = a.batch;
  o.seq_len = a.seq_len;
  o.q = tensor(a.q);
  o.k = tensor(a.k);
  o.q_out = tensor(a.q_out);
  o.k_out = tensor(a.k_out);
  o.position_offset = a.position_offset;
  o.seq_offsets = a.seq_offsets;
  o.position_ids = a.position_ids;
  o.cu_seqlens = a.cu_seqlens;
  o.cos = a.cos;
  o.sin = a.sin;
  o.table_stride = a.table_stride;
  o.table_rows = a.table_rows;
  o.base = a.base;
  o.stream = a.stream;
  return o;
}

}  // namespace ropejit::capi

// The 0.1.0 names: the header's macros of the same names pass sizes to the _sized functions.
#undef ropejit_spec_init
#undef ropejit_args_init

extern "C" {

ROPEJIT_API void ropejit_spec_init(void* spec);
ROPEJIT_API void ropejit_args_init(void* args);

void ropejit_spec_init(void* spec) {
  if (!spec) return;
  const ropejit::Spec d;
  const SpecV010 s{int32_t(d.layout),      int32_t(d.dtype),     d.head_dim,
                   d.rotary_dim,           int32_t(d.style),     int32_t(d.positions),
                   int32_t(d.index_type),  int32_t(d.freqs),     int32_t(d.table_dtype),
                   int32_t(d.table_width), int32_t(d.direction), d.in_place ? 1 : 0,
                   int32_t(d.fusion)};
  std::memcpy(spec, &s, sizeof s);
}

void ropejit_args_init(void* args) {
  if (!args) return;
  const ropejit::Args d;
  ArgsV010 a{};
  a.batch = d.batch;
  a.base = d.base;
  std::memcpy(args, &a, sizeof a);
}

}  // extern "C"
