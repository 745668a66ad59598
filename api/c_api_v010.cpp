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

}  // namespace

namespace ropejit::capi {

Spec spec_v010(const void* p) {
  SpecV010 s;
  std::memcpy(&s, p, sizeof s);
  Spec o;
  spec_v010_fields(s, &o, flag);
  return o;
}

Args args_v010(const void* p) {
  ArgsV010 a;
  std::memcpy(&a, p, sizeof a);
  Args o;
  args_v010_fields(a, &o);
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
