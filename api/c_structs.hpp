// How the C API reads and writes its callers' structs: only as many bytes as a struct's header
// says the caller has, the library's defaults for the rest (include/ropejit/ropejit.h, "ABI").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "jit/errors.hpp"
#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"

namespace ropejit::capi {

// A header claiming more than this is not a struct of ours (and scanning its tail could run off
// the caller's memory).
constexpr uint32_t kMaxStructBytes = 1 << 16;

// The first sized layout of each struct (ropejit 0.2.0's): a smaller one cannot be a caller's.
// When a field is appended to a struct, this stays its 0.2.0 size (tests/test_c_api.cpp pins
// those sizes), so that callers built before the append keep working.
template <class T>
inline constexpr size_t kFirstSize = sizeof(T);
template <>
inline constexpr size_t kFirstSize<ropejit_model> = 216;  // before kv_lora_rank
template <>
inline constexpr size_t kFirstSize<ropejit_qkv_proj_args> = 480;  // before bias
template <>
inline constexpr size_t kFirstSize<ropejit_mla_spec> = 48;  // before scale_multiplies
template <>
inline constexpr size_t kFirstSize<ropejit_mla_args> = 248;  // before k_pe_out

inline bool has_header(const void* p) {
  ropejit_header h;
  std::memcpy(&h, p, sizeof h);
  return h.tag == ROPEJIT_STRUCT_TAG;
}

// The caller's size of a struct filled by its _init, checked: large enough, not absurd.
template <class T>
uint32_t checked_size(size_t size, const char* name) {
  if (size < kFirstSize<T> || size > kMaxStructBytes)
    detail::invalid(name, " size (", size, ") must be in [", kFirstSize<T>, ", ", kMaxStructBytes,
                    "]: pass sizeof the struct (the _init macros do)");
  return uint32_t(size);
}

// *p as this library's T: the caller's bytes up to its header's size over `defaults`. Bytes past
// this library's struct must be zero (fields of a newer header, left at their defaults). Callers
// keep `defaults` in a function-local static: every call copies them, none rebuilds them.
template <class T>
T read_struct(const T* p, const char* name, const T& defaults) {
  ropejit_header h;
  std::memcpy(&h, p, sizeof h);
  if (h.tag != ROPEJIT_STRUCT_TAG)
    detail::invalid(name, " was not filled by its _init function (header.tag is ", h.tag,
                    "): initialise it with the macro of ropejit.h before setting fields");
  checked_size<T>(h.size, name);
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = sizeof(T); i < h.size; ++i)
    if (bytes[i] != 0)
      detail::invalid(name, " sets a field this library (ropejit ", kVersion,
                      ") does not have (byte ", i, " of ", h.size, "; it knows ", sizeof(T),
                      "): use a newer libropejit or leave that field zero");
  T out = defaults;
  std::memcpy(&out, p, h.size < sizeof(T) ? h.size : sizeof(T));
  out.header = h;
  return out;
}

// Writes `value` into the caller's `size` bytes at p: this library's fields as far as they fit,
// zero past them, and the header.
template <class T>
void write_struct(T* p, uint32_t size, T value) {
  value.header = ropejit_header{size, ROPEJIT_STRUCT_TAG};
  std::memcpy(p, &value, size < sizeof(T) ? size : sizeof(T));
  if (size > sizeof(T))
    std::memset(reinterpret_cast<unsigned char*>(p) + sizeof(T), 0, size - sizeof(T));
}

// The caller's size of an output struct, from the header its _init wrote.
template <class T>
uint32_t output_size(const T* p, const char* name) {
  ropejit_header h;
  std::memcpy(&h, p, sizeof h);
  if (h.tag != ROPEJIT_STRUCT_TAG)
    detail::invalid(name, " was not filled by its _init function (header.tag is ", h.tag,
                    "): the library writes only as many bytes as its header says");
  return checked_size<T>(h.size, name);
}

// The fields 0.1.0's ropejit_spec and ropejit_args have, which today's keep under the same
// names: one copy for both layouts. `flag` turns a C int into a bool (0 or 1, else an error).
template <class S, class Flag>
void spec_v010_fields(const S& s, Spec* o, Flag flag) {
  o->layout = Layout(s.layout);
  o->dtype = DType(s.dtype);
  o->head_dim = s.head_dim;
  o->rotary_dim = s.rotary_dim;
  o->style = Style(s.style);
  o->positions = Positions(s.positions);
  o->index_type = IndexType(s.index_type);
  o->freqs = Freqs(s.freqs);
  o->table_dtype = DType(s.table_dtype);
  o->table_width = TableWidth(s.table_width);
  o->direction = Direction(s.direction);
  o->in_place = flag(s.in_place, "spec.in_place");
  o->fusion = Fusion(s.fusion);
}

inline Tensor to_tensor(const ropejit_tensor& t) {
  return {t.data, t.heads, t.stride_batch, t.stride_seq, t.stride_head};
}

template <class A>
void args_v010_fields(const A& a, Args* o) {
  o->batch = a.batch;
  o->seq_len = a.seq_len;
  o->q = to_tensor(a.q);
  o->k = to_tensor(a.k);
  o->q_out = to_tensor(a.q_out);
  o->k_out = to_tensor(a.k_out);
  o->position_offset = a.position_offset;
  o->seq_offsets = a.seq_offsets;
  o->position_ids = a.position_ids;
  o->cu_seqlens = a.cu_seqlens;
  o->cos = a.cos;
  o->sin = a.sin;
  o->table_stride = a.table_stride;
  o->table_rows = a.table_rows;
  o->base = a.base;
  o->stream = a.stream;
}

// A C int that stands for a bool: only 0 and 1, so that a stray value is caught, not taken as
// true.
inline bool flag(int32_t v, const char* name) {
  if (v != 0 && v != 1) detail::invalid(name, " (", v, ") must be 0 or 1");
  return v == 1;
}

// Programs built against the 0.1.0 header (api/c_api_v010.cpp): their ropejit_spec and
// ropejit_args have no header, and the library reads only their fields.
Spec spec_v010(const void* spec);
Args args_v010(const void* args);

}  // namespace ropejit::capi
