// C ABI over the C++ API: converts structs, catches every exception, keeps the message in a
// thread-local buffer.
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "api/c_structs.hpp"
#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"

namespace {

using ropejit::capi::output_size;
using ropejit::capi::read_struct;
using ropejit::capi::write_struct;
using ropejit::detail::invalid;

thread_local std::string last_error;

using ropejit::capi::flag;
using ropejit::capi::to_tensor;

ropejit_spec from_spec(const ropejit::Spec& d);

ropejit::Spec to_spec(const ropejit_spec* p) {
  if (!ropejit::capi::has_header(p)) return ropejit::capi::spec_v010(p);
  static const auto defaults = from_spec(ropejit::Spec());
  const ropejit_spec s = read_struct(p, "spec", defaults);
  ropejit::Spec o;
  ropejit::capi::spec_v010_fields(s, &o, flag);
  o.norm = ropejit::Norm(s.norm);
  o.out_store = ropejit::Store(s.out_store);
  o.cache = ropejit::KvCache(s.cache);
  o.cache_store = ropejit::Store(s.cache_store);
  return o;
}

ropejit::RopeScaling to_scaling(const ropejit_scaling& c, const char* where) {
  ropejit::RopeScaling r;
  r.factor = c.factor;
  r.low_freq_factor = c.low_freq_factor;
  r.high_freq_factor = c.high_freq_factor;
  r.original_max_positions = c.original_max_positions;
  r.beta_fast = c.beta_fast;
  r.beta_slow = c.beta_slow;
  r.mscale = c.mscale;
  r.mscale_all_dim = c.mscale_all_dim;
  r.attention_factor = c.attention_factor;
  // The name is put together only for the message: this runs on every call.
  if (c.truncate != 0 && c.truncate != 1)
    invalid(where, ".truncate (", c.truncate, ") must be 0 or 1");
  r.truncate = c.truncate == 1;
  r.short_factor = c.short_factor;
  r.long_factor = c.long_factor;
  r.seq_len = c.seq_len;
  r.factor_count = c.factor_count;
  return r;
}

ropejit_scaling from_scaling(const ropejit::RopeScaling& r) {
  return ropejit_scaling{
      r.factor,           r.low_freq_factor,  r.high_freq_factor, r.original_max_positions,
      r.beta_fast,        r.beta_slow,        r.mscale,           r.mscale_all_dim,
      r.attention_factor, r.truncate ? 1 : 0, r.short_factor,     r.long_factor,
      r.seq_len,          r.factor_count};
}

ropejit_spec from_spec(const ropejit::Spec& d) {
  return ropejit_spec{
      ropejit_header{},   int32_t(d.layout),      int32_t(d.dtype),       d.head_dim,
      d.rotary_dim,       int32_t(d.style),       int32_t(d.positions),   int32_t(d.index_type),
      int32_t(d.freqs),   int32_t(d.table_dtype), int32_t(d.table_width), int32_t(d.direction),
      d.in_place ? 1 : 0, int32_t(d.fusion),      int32_t(d.norm),        int32_t(d.out_store),
      int32_t(d.cache),   int32_t(d.cache_store)};
}

// The last model read on this thread: ropejit_model's factor pointers point into it.
thread_local ropejit::ModelRope last_model;

ropejit_model from_model(const ropejit::ModelRope& r) {
  return ropejit_model{ropejit_header{},
                       r.head_dim,
                       r.rotary_dim,
                       r.rotary_offset,
                       r.q_heads,
                       r.kv_heads,
                       int32_t(r.style),
                       int32_t(r.freqs),
                       r.base,
                       from_scaling(r.scaling),
                       r.mrope ? 1 : 0,
                       {r.mrope_section[0], r.mrope_section[1], r.mrope_section[2]},
                       r.mrope_interleaved ? 1 : 0,
                       int32_t(r.norm),
                       r.max_positions,
                       r.norm_eps,
                       r.local_base,
                       r.softmax_scale_multiplier,
                       r.kv_lora_rank};
}

void model_out(ropejit::ModelRope m, int32_t dtype, ropejit_spec* spec, ropejit_model* model) {
  // Sizes first: nothing is written when either struct was not initialised.
  const uint32_t spec_size = output_size(spec, "spec");
  const uint32_t model_size = model ? output_size(model, "model") : 0;
  const ropejit::Spec s = ropejit::spec_from_model(m, ropejit::DType(dtype));
  last_model = std::move(m);
  write_struct(spec, spec_size, from_spec(s));
  if (model) write_struct(model, model_size, from_model(last_model));
}

ropejit::KvCacheArgs to_cache(const ropejit_kv_cache& a) {
  ropejit::KvCacheArgs c;
  c.k = a.k;
  c.v = a.v;
  c.pages = a.pages;
  c.page_size = a.page_size;
  c.stride_page = a.stride_page;
  c.stride_slot = a.stride_slot;
  c.stride_head = a.stride_head;
  c.slot_mapping = a.slot_mapping;
  c.indptr = a.indptr;
  c.indices = a.indices;
  c.num_indices = a.num_indices;
  c.last_page_len = a.last_page_len;
  c.seq_lens = a.seq_lens;
  c.k_quant_scale = a.k_quant_scale;
  c.v_quant_scale = a.v_quant_scale;
  c.skipped = a.skipped;
  c.k_scales = a.k_scales;
  c.v_scales = a.v_scales;
  c.scale_stride_page = a.scale_stride_page;
  c.scale_stride_slot = a.scale_stride_slot;
  c.scale_stride_head = a.scale_stride_head;
  return c;
}

ropejit_args default_args() {
  ropejit_args args{};
  const ropejit::Args d;
  args.batch = d.batch;
  args.base = d.base;
  args.scaling = from_scaling(d.scaling);
  args.norm_eps = d.norm_eps;
  args.out_quant_scale = d.out_quant_scale;
  args.cache.k_quant_scale = d.cache.k_quant_scale;
  args.cache.v_quant_scale = d.cache.v_quant_scale;
  return args;
}

ropejit::Args to_args(const ropejit_spec* spec, const ropejit_args* p) {
  // Both structs come from one header: a 0.1.0 spec means 0.1.0 args.
  if (!ropejit::capi::has_header(spec)) return ropejit::capi::args_v010(p);
  static const auto defaults = default_args();
  const ropejit_args a = read_struct(p, "args", defaults);
  ropejit::Args o;
  ropejit::capi::args_v010_fields(a, &o);
  o.scaling = to_scaling(a.scaling, "args.scaling");
  for (int i = 0; i < 3; ++i) o.mrope_section[i] = a.mrope_section[i];
  o.mrope_interleaved = flag(a.mrope_interleaved, "args.mrope_interleaved");
  o.v = to_tensor(a.v);
  o.q_norm_weight = a.q_norm_weight;
  o.k_norm_weight = a.k_norm_weight;
  o.norm_eps = a.norm_eps;
  o.out_quant_scale = a.out_quant_scale;
  o.cache = to_cache(a.cache);
  o.q_out_scale = to_tensor(a.q_out_scale);
  o.k_out_scale = to_tensor(a.k_out_scale);
  return o;
}

ropejit_table_spec from_table(const ropejit::TableSpec& d) {
  return ropejit_table_spec{ropejit_header{},        int32_t(d.freqs), d.base,
                            from_scaling(d.scaling), d.rows,           d.row_stride};
}

ropejit::TableSpec to_table(const ropejit_table_spec* p) {
  static const auto defaults = from_table(ropejit::TableSpec());
  const ropejit_table_spec c = read_struct(p, "table", defaults);
  ropejit::TableSpec t;
  t.freqs = ropejit::Freqs(c.freqs);
  t.base = c.base;
  t.scaling = to_scaling(c.scaling, "table.scaling");
  t.rows = c.rows;
  t.row_stride = c.row_stride;
  return t;
}

template <class Fn>
ropejit_status guarded(Fn&& fn) {
  try {
    fn();
    last_error.clear();
    return ROPEJIT_OK;
  } catch (const ropejit::Error& e) {
    last_error = e.what();
    return static_cast<ropejit_status>(e.code());
  } catch (const std::exception& e) {
    last_error = std::string("ropejit: internal error: ") + e.what();
  } catch (...) {
    last_error = "ropejit: internal error: unknown exception";
  }
  return ROPEJIT_ERROR_INTERNAL;
}

// A key into the caller's buffer of `size` bytes, NUL-terminated; too small is an error.
void copy_key(const std::string& key, char* buf, size_t size) {
  if (key.size() + 1 > size)
    throw ropejit::Error(
        ropejit::ErrorCode::invalid_argument,
        "ropejit: size (" + std::to_string(size) + ") is too small for key " + key);
  std::memcpy(buf, key.c_str(), key.size() + 1);
}

ropejit_status null_argument(const char* name) {
  last_error = std::string("ropejit: ") + name + " is null";
  return ROPEJIT_ERROR_INVALID_ARGUMENT;
}

// An _init_sized function: checks the caller's size, then writes the defaults and the header.
template <class T>
ropejit_status init_sized(T* p, size_t size, const char* name, const T& defaults) {
  if (!p) return null_argument(name);
  return guarded([&] { write_struct(p, ropejit::capi::checked_size<T>(size, name), defaults); });
}

// What every family's C entry points check before the C++ call: `spec` and `args` non-null (and
// an output pointer, named), then the call under guarded().
template <class S, class A, class F>
ropejit_status spec_args_call(const S* spec, const A* args, F&& call) {
  if (!spec) return null_argument("spec");
  if (!args) return null_argument("args");
  return guarded(std::forward<F>(call));
}

template <class S, class A, class O, class F>
ropejit_status spec_args_out_call(const S* spec, const A* args, const O* out, const char* out_name,
                                  F&& call) {
  if (!spec) return null_argument("spec");
  if (!args) return null_argument("args");
  if (!out) return null_argument(out_name);
  return guarded(std::forward<F>(call));
}

// A family's _key and _precompile entry points over its spec converter.
template <class S, class ToSpec>
ropejit_status family_key(const S* spec, char* buf, size_t size, ToSpec to_spec) {
  if (!spec) return null_argument("spec");
  if (!buf) return null_argument("buf");
  return guarded([&] { copy_key(to_spec(spec).key(), buf, size); });
}

template <class S, class ToSpec>
ropejit_status family_precompile(const S* spec, const char* arch, ToSpec to_spec) {
  if (!spec) return null_argument("spec");
  if (!arch) return null_argument("arch");
  return guarded([&] { ropejit::precompile(to_spec(spec), arch); });
}

}  // namespace

extern "C" {

ropejit_status ropejit_spec_init_sized(ropejit_spec* spec, size_t size) {
  return init_sized(spec, size, "spec", from_spec(ropejit::Spec()));
}

ropejit_status ropejit_args_init_sized(ropejit_args* args, size_t size) {
  return init_sized(args, size, "args", default_args());
}

ropejit_status ropejit_table_spec_init_sized(ropejit_table_spec* table, size_t size) {
  return init_sized(table, size, "table", from_table(ropejit::TableSpec()));
}

ropejit_status ropejit_model_init_sized(ropejit_model* model, size_t size) {
  return init_sized(model, size, "model", from_model(ropejit::ModelRope()));
}

void ropejit_cache_counts(uint64_t* compiled, uint64_t* disk_hits, uint64_t* memory_hits,
                          uint64_t* module_loads) {
  const ropejit::CacheCounts c = ropejit::cache_counts();
  if (compiled) *compiled = c.compiled;
  if (disk_hits) *disk_hits = c.disk_hits;
  if (memory_hits) *memory_hits = c.memory_hits;
  if (module_loads) *module_loads = c.module_loads;
}

void ropejit_struct_sizes(size_t* spec, size_t* args) {
  if (spec) *spec = sizeof(ropejit_spec);
  if (args) *args = sizeof(ropejit_args);
}

void ropejit_decode_struct_sizes(size_t* qkv_spec, size_t* qkv_args, size_t* ffn_spec,
                                 size_t* ffn_args) {
  if (qkv_spec) *qkv_spec = sizeof(ropejit_qkv_proj_spec);
  if (qkv_args) *qkv_args = sizeof(ropejit_qkv_proj_args);
  if (ffn_spec) *ffn_spec = sizeof(ropejit_ffn_spec);
  if (ffn_args) *ffn_args = sizeof(ropejit_ffn_args);
}

ropejit_status ropejit_make_contiguous(int32_t layout, void* data, int64_t batch, int64_t seq,
                                       int64_t heads, int64_t head_dim, ropejit_tensor* out) {
  if (!out) return null_argument("out");
  return guarded([&] {
    const ropejit::Tensor t =
        ropejit::contiguous(ropejit::Layout(layout), data, batch, seq, heads, head_dim);
    *out = ropejit_tensor{t.data, t.heads, t.stride_batch, t.stride_seq, t.stride_head};
  });
}

ropejit_tensor ropejit_contiguous(int32_t layout, void* data, int64_t batch, int64_t seq,
                                  int64_t heads, int64_t head_dim) {
  ropejit_tensor t{};
  if (ropejit_make_contiguous(layout, data, batch, seq, heads, head_dim, &t) != ROPEJIT_OK)
    t = ropejit_tensor{};  // data NULL: a later ropejit_apply() fails; ropejit_last_error() says
                           // why
  return t;
}

ropejit_status ropejit_apply(const ropejit_spec* spec, const ropejit_args* args) {
  return spec_args_call(spec, args, [&] { ropejit::apply(to_spec(spec), to_args(spec, args)); });
}

ropejit_status ropejit_key(const ropejit_spec* spec, char* buf, size_t size) {
  return family_key(spec, buf, size, to_spec);
}

ropejit_status ropejit_precompile(const ropejit_spec* spec, const char* arch) {
  return family_precompile(spec, arch, to_spec);
}

ropejit_status ropejit_build_tables(const ropejit_spec* spec, const ropejit_table_spec* table,
                                    void* cos, void* sin) {
  if (!spec) return null_argument("spec");
  if (!table) return null_argument("table");
  return guarded([&] { ropejit::build_tables(to_spec(spec), to_table(table), cos, sin); });
}

ropejit_status ropejit_inverse_frequencies(const ropejit_table_spec* table, int32_t rotary_dim,
                                           double* out, size_t count) {
  if (!table) return null_argument("table");
  if (!out) return null_argument("out");
  return guarded([&] {
    const ropejit::TableSpec t = to_table(table);
    const std::vector<double> inv =
        ropejit::inverse_frequencies(t.freqs, rotary_dim, t.base, t.scaling);
    if (count < inv.size())
      invalid("count (", count, ") is smaller than rotary_dim / 2 (", inv.size(), ")");
    std::memcpy(out, inv.data(), inv.size() * sizeof(double));
  });
}

ropejit_status ropejit_attention_factor(const ropejit_table_spec* table, int32_t rotary_dim,
                                        double* out) {
  if (!table) return null_argument("table");
  if (!out) return null_argument("out");
  return guarded([&] {
    const ropejit::TableSpec t = to_table(table);
    *out = ropejit::attention_factor(t.freqs, rotary_dim, t.scaling);
  });
}

ropejit_status ropejit_spec_from_hf_config(const char* path, int32_t dtype, ropejit_spec* spec,
                                           ropejit_model* model) {
  if (!path) return null_argument("path");
  if (!spec) return null_argument("spec");
  return guarded([&] { model_out(ropejit::model_from_hf_config_file(path), dtype, spec, model); });
}

ropejit_status ropejit_spec_from_hf_config_text(const char* json_text, int32_t dtype,
                                                ropejit_spec* spec, ropejit_model* model) {
  if (!json_text) return null_argument("json_text");
  if (!spec) return null_argument("spec");
  return guarded([&] { model_out(ropejit::model_from_hf_config(json_text), dtype, spec, model); });
}

const char* ropejit_last_error(void) { return last_error.c_str(); }

const char* ropejit_version(void) { return ropejit::kVersion; }

}  // extern "C"

namespace {

ropejit_qkv_proj_spec from_proj_spec(const ropejit::QkvProjSpec& d) {
  return ropejit_qkv_proj_spec{
      ropejit_header{},       int32_t(d.dtype),      d.head_dim,
      d.rotary_dim,           int32_t(d.style),      int32_t(d.positions),
      int32_t(d.index_type),  int32_t(d.freqs),      int32_t(d.table_dtype),
      int32_t(d.table_width), int32_t(d.norm),       int32_t(d.weights),
      int32_t(d.cache),       int32_t(d.cache_store)};
}

ropejit_qkv_proj_args default_proj_args() {
  const ropejit::QkvProjArgs d;
  ropejit_qkv_proj_args args{};
  args.norm_eps = d.norm_eps;
  args.base = d.base;
  args.cache.k_quant_scale = d.cache.k_quant_scale;
  args.cache.v_quant_scale = d.cache.v_quant_scale;
  return args;
}

ropejit::QkvProjSpec to_proj_spec(const ropejit_qkv_proj_spec* p) {
  static const auto defaults = from_proj_spec(ropejit::QkvProjSpec());
  const ropejit_qkv_proj_spec s = read_struct(p, "spec", defaults);
  ropejit::QkvProjSpec o;
  o.dtype = ropejit::DType(s.dtype);
  o.head_dim = s.head_dim;
  o.rotary_dim = s.rotary_dim;
  o.style = ropejit::Style(s.style);
  o.positions = ropejit::Positions(s.positions);
  o.index_type = ropejit::IndexType(s.index_type);
  o.freqs = ropejit::Freqs(s.freqs);
  o.table_dtype = ropejit::DType(s.table_dtype);
  o.table_width = ropejit::TableWidth(s.table_width);
  o.norm = ropejit::Norm(s.norm);
  o.weights = ropejit::Weights(s.weights);
  o.cache = ropejit::KvCache(s.cache);
  o.cache_store = ropejit::Store(s.cache_store);
  return o;
}

ropejit::QkvProjArgs to_proj_args(const ropejit_qkv_proj_args* p) {
  static const auto defaults = default_proj_args();
  const ropejit_qkv_proj_args a = read_struct(p, "args", defaults);
  ropejit::QkvProjArgs o;
  o.tokens = a.tokens;
  o.hidden = a.hidden;
  o.q_heads = a.q_heads;
  o.kv_heads = a.kv_heads;
  o.x = a.x;
  o.x_stride = a.x_stride;
  o.norm_weight = a.norm_weight;
  o.norm_eps = a.norm_eps;
  o.weight = a.weight;
  o.weight_stride = a.weight_stride;
  o.weight_scale = a.weight_scale;
  o.q = to_tensor(a.q);
  o.k = to_tensor(a.k);
  o.v = to_tensor(a.v);
  o.position_offset = a.position_offset;
  o.position_ids = a.position_ids;
  o.cos = a.cos;
  o.sin = a.sin;
  o.table_stride = a.table_stride;
  o.table_rows = a.table_rows;
  o.base = a.base;
  o.stream = a.stream;
  o.path = ropejit::ProjPath(a.path);
  o.workspace = a.workspace;
  o.workspace_bytes = a.workspace_bytes;
  o.cache = to_cache(a.cache);
  o.cu_seqlens = a.cu_seqlens;
  o.batch = a.batch;
  o.bias = a.bias;
  return o;
}

}  // namespace

ropejit_status ropejit_qkv_proj_spec_init_sized(ropejit_qkv_proj_spec* spec, size_t size) {
  return init_sized(spec, size, "spec", from_proj_spec(ropejit::QkvProjSpec()));
}

ropejit_status ropejit_qkv_proj_args_init_sized(ropejit_qkv_proj_args* args, size_t size) {
  return init_sized(args, size, "args", default_proj_args());
}

ropejit_status ropejit_qkv_projection(const ropejit_qkv_proj_spec* spec,
                                      const ropejit_qkv_proj_args* args) {
  return spec_args_call(spec, args,
                        [&] { ropejit::qkv_projection(to_proj_spec(spec), to_proj_args(args)); });
}

ropejit_status ropejit_qkv_projection_workspace_bytes(const ropejit_qkv_proj_spec* spec,
                                                      const ropejit_qkv_proj_args* args,
                                                      size_t* bytes) {
  return spec_args_out_call(spec, args, bytes, "bytes", [&] {
    *bytes = ropejit::qkv_projection_workspace_bytes(to_proj_spec(spec), to_proj_args(args));
  });
}

ropejit_status ropejit_qkv_projection_path(const ropejit_qkv_proj_spec* spec,
                                           const ropejit_qkv_proj_args* args, int32_t* path) {
  return spec_args_out_call(spec, args, path, "path", [&] {
    *path = int32_t(ropejit::qkv_projection_path(to_proj_spec(spec), to_proj_args(args)));
  });
}

ropejit_status ropejit_qkv_proj_key(const ropejit_qkv_proj_spec* spec, char* buf, size_t size) {
  return family_key(spec, buf, size, to_proj_spec);
}

ropejit_status ropejit_qkv_proj_precompile(const ropejit_qkv_proj_spec* spec, const char* arch) {
  return family_precompile(spec, arch, to_proj_spec);
}

namespace {

ropejit_ffn_spec from_ffn_spec(const ropejit::FfnSpec& d) {
  return ropejit_ffn_spec{ropejit_header{}, int32_t(d.dtype), int32_t(d.norm), int32_t(d.act),
                          int32_t(d.weights)};
}

ropejit_ffn_args default_ffn_args() {
  ropejit_ffn_args args{};
  args.norm_eps = ropejit::FfnArgs().norm_eps;
  return args;
}

ropejit::FfnSpec to_ffn_spec(const ropejit_ffn_spec* p) {
  static const auto defaults = from_ffn_spec(ropejit::FfnSpec());
  const ropejit_ffn_spec s = read_struct(p, "spec", defaults);
  ropejit::FfnSpec o;
  o.dtype = ropejit::DType(s.dtype);
  o.norm = ropejit::Norm(s.norm);
  o.act = ropejit::Activation(s.act);
  o.weights = ropejit::Weights(s.weights);
  return o;
}

ropejit::FfnArgs to_ffn_args(const ropejit_ffn_args* p) {
  static const auto defaults = default_ffn_args();
  const ropejit_ffn_args a = read_struct(p, "args", defaults);
  ropejit::FfnArgs o;
  o.tokens = a.tokens;
  o.hidden = a.hidden;
  o.intermediate = a.intermediate;
  o.x = a.x;
  o.x_stride = a.x_stride;
  o.norm_weight = a.norm_weight;
  o.norm_eps = a.norm_eps;
  o.gate_weight = a.gate_weight;
  o.up_weight = a.up_weight;
  o.weight_stride = a.weight_stride;
  o.gate_scale = a.gate_scale;
  o.up_scale = a.up_scale;
  o.out = a.out;
  o.out_stride = a.out_stride;
  o.path = ropejit::ProjPath(a.path);
  o.workspace = a.workspace;
  o.workspace_bytes = a.workspace_bytes;
  o.stream = a.stream;
  return o;
}

}  // namespace

ropejit_status ropejit_ffn_spec_init_sized(ropejit_ffn_spec* spec, size_t size) {
  return init_sized(spec, size, "spec", from_ffn_spec(ropejit::FfnSpec()));
}

ropejit_status ropejit_ffn_args_init_sized(ropejit_ffn_args* args, size_t size) {
  return init_sized(args, size, "args", default_ffn_args());
}

ropejit_status ropejit_ffn_gate_up(const ropejit_ffn_spec* spec, const ropejit_ffn_args* args) {
  return spec_args_call(spec, args,
                        [&] { ropejit::ffn_gate_up(to_ffn_spec(spec), to_ffn_args(args)); });
}

ropejit_status ropejit_ffn_gate_up_workspace_bytes(const ropejit_ffn_spec* spec,
                                                   const ropejit_ffn_args* args, size_t* bytes) {
  return spec_args_out_call(spec, args, bytes, "bytes", [&] {
    *bytes = ropejit::ffn_gate_up_workspace_bytes(to_ffn_spec(spec), to_ffn_args(args));
  });
}

ropejit_status ropejit_ffn_gate_up_path(const ropejit_ffn_spec* spec, const ropejit_ffn_args* args,
                                        int32_t* path) {
  return spec_args_out_call(spec, args, path, "path", [&] {
    *path = int32_t(ropejit::ffn_gate_up_path(to_ffn_spec(spec), to_ffn_args(args)));
  });
}

ropejit_status ropejit_ffn_key(const ropejit_ffn_spec* spec, char* buf, size_t size) {
  return family_key(spec, buf, size, to_ffn_spec);
}

ropejit_status ropejit_ffn_precompile(const ropejit_ffn_spec* spec, const char* arch) {
  return family_precompile(spec, arch, to_ffn_spec);
}

namespace {

ropejit_rms_norm_spec from_norm_spec(const ropejit::RmsNormSpec& d) {
  return ropejit_rms_norm_spec{ropejit_header{}, int32_t(d.dtype), int32_t(d.norm),
                               d.residual ? 1 : 0};
}

ropejit_rms_norm_args default_norm_args() {
  ropejit_rms_norm_args args{};
  args.norm_eps = ropejit::RmsNormArgs().norm_eps;
  return args;
}

ropejit::RmsNormSpec to_norm_spec(const ropejit_rms_norm_spec* p) {
  static const auto defaults = from_norm_spec(ropejit::RmsNormSpec());
  const ropejit_rms_norm_spec s = read_struct(p, "spec", defaults);
  ropejit::RmsNormSpec o;
  o.dtype = ropejit::DType(s.dtype);
  o.norm = ropejit::Norm(s.norm);
  o.residual = flag(s.residual, "spec.residual");
  return o;
}

ropejit::RmsNormArgs to_norm_args(const ropejit_rms_norm_args* p) {
  static const auto defaults = default_norm_args();
  const ropejit_rms_norm_args a = read_struct(p, "args", defaults);
  ropejit::RmsNormArgs o;
  o.rows = a.rows;
  o.hidden = a.hidden;
  o.x = a.x;
  o.x_stride = a.x_stride;
  o.residual = a.residual;
  o.residual_stride = a.residual_stride;
  o.weight = a.weight;
  o.norm_eps = a.norm_eps;
  o.out = a.out;
  o.out_stride = a.out_stride;
  o.stream = a.stream;
  return o;
}

}  // namespace

ropejit_status ropejit_rms_norm_spec_init_sized(ropejit_rms_norm_spec* spec, size_t size) {
  return init_sized(spec, size, "spec", from_norm_spec(ropejit::RmsNormSpec()));
}

ropejit_status ropejit_rms_norm_args_init_sized(ropejit_rms_norm_args* args, size_t size) {
  return init_sized(args, size, "args", default_norm_args());
}

ropejit_status ropejit_rms_norm(const ropejit_rms_norm_spec* spec,
                                const ropejit_rms_norm_args* args) {
  return spec_args_call(spec, args,
                        [&] { ropejit::rms_norm(to_norm_spec(spec), to_norm_args(args)); });
}

ropejit_status ropejit_rms_norm_key(const ropejit_rms_norm_spec* spec, char* buf, size_t size) {
  return family_key(spec, buf, size, to_norm_spec);
}

ropejit_status ropejit_rms_norm_precompile(const ropejit_rms_norm_spec* spec, const char* arch) {
  return family_precompile(spec, arch, to_norm_spec);
}

namespace {

ropejit_mla_spec from_mla_spec(const ropejit::MlaSpec& d) {
  return ropejit_mla_spec{ropejit_header{},
                          int32_t(d.dtype),
                          d.kv_rank,
                          d.rope_dim,
                          int32_t(d.style),
                          int32_t(d.index_type),
                          int32_t(d.table_dtype),
                          int32_t(d.norm),
                          int32_t(d.cache_store),
                          int32_t(d.query),
                          int32_t(d.q_store),
                          int32_t(d.scale_multiplies)};
}

ropejit_mla_args default_mla_args() {
  ropejit_mla_args args{};
  args.norm_eps = ropejit::MlaArgs().norm_eps;
  return args;
}

ropejit::MlaSpec to_mla_spec(const ropejit_mla_spec* p) {
  static const auto defaults = from_mla_spec(ropejit::MlaSpec());
  const ropejit_mla_spec s = read_struct(p, "spec", defaults);
  ropejit::MlaSpec o;
  o.dtype = ropejit::DType(s.dtype);
  o.kv_rank = s.kv_rank;
  o.rope_dim = s.rope_dim;
  o.style = ropejit::Style(s.style);
  o.index_type = ropejit::IndexType(s.index_type);
  o.table_dtype = ropejit::DType(s.table_dtype);
  o.norm = ropejit::Norm(s.norm);
  o.cache_store = ropejit::Store(s.cache_store);
  o.query = ropejit::MlaQuery(s.query);
  o.q_store = ropejit::Store(s.q_store);
  o.scale_multiplies = flag(s.scale_multiplies, "spec.scale_multiplies");
  return o;
}

ropejit::MlaArgs to_mla_args(const ropejit_mla_args* p) {
  static const auto defaults = default_mla_args();
  const ropejit_mla_args a = read_struct(p, "args", defaults);
  ropejit::MlaArgs o;
  o.tokens = a.tokens;
  o.heads = a.heads;
  o.kv_c = a.kv_c;
  o.kv_c_stride = a.kv_c_stride;
  o.k_pe = a.k_pe;
  o.k_pe_stride = a.k_pe_stride;
  o.norm_weight = a.norm_weight;
  o.norm_eps = a.norm_eps;
  o.cache = a.cache;
  o.cache_slots = a.cache_slots;
  o.cache_stride = a.cache_stride;
  o.slots = a.slots;
  o.cache_scale = a.cache_scale;
  o.skipped = a.skipped;
  o.q_pe = a.q_pe;
  o.q_pe_token_stride = a.q_pe_token_stride;
  o.q_pe_head_stride = a.q_pe_head_stride;
  o.q_nope = a.q_nope;
  o.q_nope_token_stride = a.q_nope_token_stride;
  o.q_nope_head_stride = a.q_nope_head_stride;
  o.q_out = a.q_out;
  o.q_out_token_stride = a.q_out_token_stride;
  o.q_out_head_stride = a.q_out_head_stride;
  o.q_scale = a.q_scale;
  o.position_ids = a.position_ids;
  o.cos = a.cos;
  o.sin = a.sin;
  o.table_rows = a.table_rows;
  o.table_stride = a.table_stride;
  o.stream = a.stream;
  o.k_pe_out = a.k_pe_out;
  o.k_pe_out_stride = a.k_pe_out_stride;
  o.cache_pe = a.cache_pe;
  o.cache_pe_stride = a.cache_pe_stride;
  o.rows_by_token = flag(a.rows_by_token, "args.rows_by_token");
  o.kv_indices = a.kv_indices;
  o.kv_indptr = a.kv_indptr;
  o.batch_indices = a.batch_indices;
  o.page_positions = a.page_positions;
  o.batch = a.batch;
  o.num_indices = a.num_indices;
  o.page_size = a.page_size;
  o.q_out_pe = a.q_out_pe;
  o.q_out_pe_token_stride = a.q_out_pe_token_stride;
  o.q_out_pe_head_stride = a.q_out_pe_head_stride;
  o.cache_block_size = a.cache_block_size;
  o.cache_block_stride = a.cache_block_stride;
  o.cache_pe_block_stride = a.cache_pe_block_stride;
  return o;
}

}  // namespace

ropejit_status ropejit_mla_spec_init_sized(ropejit_mla_spec* spec, size_t size) {
  return init_sized(spec, size, "spec", from_mla_spec(ropejit::MlaSpec()));
}

ropejit_status ropejit_mla_args_init_sized(ropejit_mla_args* args, size_t size) {
  return init_sized(args, size, "args", default_mla_args());
}

ropejit_status ropejit_mla_prepare(const ropejit_mla_spec* spec, const ropejit_mla_args* args) {
  return spec_args_call(spec, args,
                        [&] { ropejit::mla_prepare(to_mla_spec(spec), to_mla_args(args)); });
}

ropejit_status ropejit_mla_key(const ropejit_mla_spec* spec, char* buf, size_t size) {
  return family_key(spec, buf, size, to_mla_spec);
}

ropejit_status ropejit_mla_precompile(const ropejit_mla_spec* spec, const char* arch) {
  return family_precompile(spec, arch, to_mla_spec);
}
