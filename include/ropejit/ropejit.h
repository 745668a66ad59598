/* ropejit C API: the same engine as ropejit.hpp behind plain structs and status codes, for
 * callers without C++ (Python ctypes, Rust, Julia). Enum values match the C++ enums. */
#ifndef ROPEJIT_H_
#define ROPEJIT_H_

#include <stddef.h>
#include <stdint.h>

/* Only these functions are exported from libropejit.so; everything else is hidden so that
 * a host process (e.g. Python with PyTorch loaded) cannot interpose on ropejit's internals. */
#if defined(__GNUC__)
#define ROPEJIT_API __attribute__((visibility("default")))
#else
#define ROPEJIT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ROPEJIT_OK = 0,
  ROPEJIT_ERROR_INVALID_ARGUMENT = 1,
  ROPEJIT_ERROR_COMPILE = 2,
  ROPEJIT_ERROR_NO_DRIVER = 3,
  ROPEJIT_ERROR_DRIVER = 4,
  ROPEJIT_ERROR_INTERNAL = 5
} ropejit_status;

enum {
  ROPEJIT_LAYOUT_BSHD = 0,
  ROPEJIT_LAYOUT_SBHD = 1,
  ROPEJIT_LAYOUT_BHSD = 2,
  ROPEJIT_LAYOUT_THD = 3
};
enum { ROPEJIT_F32 = 0, ROPEJIT_F16 = 1, ROPEJIT_BF16 = 2 };
enum { ROPEJIT_NEOX = 0, ROPEJIT_GPTJ = 1 };
enum {
  ROPEJIT_POS_OFFSET = 0,
  ROPEJIT_POS_SEQ_OFFSETS = 1,
  ROPEJIT_POS_IDS = 2,
  ROPEJIT_POS_MROPE = 3
};
enum { ROPEJIT_I32 = 0, ROPEJIT_I64 = 1 };
enum {
  ROPEJIT_FREQS_TABLE = 0,
  ROPEJIT_FREQS_COMPUTED = 1,
  ROPEJIT_FREQS_LINEAR = 2,
  ROPEJIT_FREQS_DYNAMIC_NTK = 3,
  ROPEJIT_FREQS_LLAMA3 = 4,
  ROPEJIT_FREQS_YARN = 5,
  ROPEJIT_FREQS_LONGROPE = 6
};
enum { ROPEJIT_TABLE_HALF = 0, ROPEJIT_TABLE_FULL = 1 };
enum { ROPEJIT_FORWARD = 0, ROPEJIT_BACKWARD = 1 };
enum { ROPEJIT_FUSION_QK = 0, ROPEJIT_FUSION_Q = 1 };
enum {
  ROPEJIT_NORM_NONE = 0,
  ROPEJIT_NORM_RMS = 1,
  ROPEJIT_NORM_RMS_ONE_PLUS = 2,
  ROPEJIT_NORM_RMS_ALL_HEADS = 3
};
enum {
  ROPEJIT_CACHE_NONE = 0,
  ROPEJIT_CACHE_CONTIGUOUS = 1,
  ROPEJIT_CACHE_PAGED = 2,
  ROPEJIT_CACHE_SLOTS = 3
};
enum { ROPEJIT_STORE_SAME = 0, ROPEJIT_STORE_E4M3 = 1, ROPEJIT_STORE_E4M3_DYNAMIC = 2 };

/* ABI. Every struct the library reads or writes through a pointer begins with a header that its
 * _init function fills: the struct's size as the caller compiled it, and a tag. The library reads
 * only that many bytes and takes its own defaults for fields past them, so a program built
 * against an older ropejit.h keeps working with a newer library. Fields are only ever appended to
 * these top-level structs, and an appended field's default is all-zero bytes: a program built
 * against a newer header runs on an older library as long as it leaves the fields that library
 * lacks at zero (it is refused, by name, otherwise). The structs embedded in them
 * (ropejit_tensor, ropejit_scaling, ropejit_kv_cache) are frozen.
 * Programs built against the 0.1.0 header (no header member) keep working too: the library tells
 * their structs apart by the missing tag. */
#define ROPEJIT_STRUCT_TAG 0x314a5052u /* "RPJ1" in memory order on little-endian machines */

typedef struct {
  uint32_t size; /* sizeof the struct where the caller was compiled */
  uint32_t tag;  /* ROPEJIT_STRUCT_TAG */
} ropejit_header;

typedef struct {
  ropejit_header header;
  int32_t layout, dtype, head_dim, rotary_dim, style, positions, index_type, freqs;
  int32_t table_dtype, table_width, direction, in_place, fusion;
  int32_t norm, out_store, cache, cache_store;
} ropejit_spec;

typedef struct {
  void* data;
  int64_t heads, stride_batch, stride_seq, stride_head;
} ropejit_tensor;

/* Frequency scaling parameters: ropejit::RopeScaling. */
typedef struct {
  double factor, low_freq_factor, high_freq_factor;
  int64_t original_max_positions;
  double beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
  int32_t truncate; /* 0 or 1 */
  const double* short_factor;
  const double* long_factor;
  int64_t seq_len;
  int64_t factor_count; /* longrope: values in short_factor and in long_factor each (rotary_dim /
                           2); nothing past them is read */
} ropejit_scaling;

/* The KV cache of a fused call: ropejit::KvCacheArgs. */
typedef struct {
  void* k;
  void* v;
  int64_t pages, page_size, stride_page, stride_slot, stride_head;
  const int64_t* slot_mapping;
  const int32_t* indptr;
  const int32_t* indices;
  int64_t num_indices;
  const int32_t* last_page_len;
  const int32_t* seq_lens;
  float k_quant_scale, v_quant_scale;
  int32_t* skipped;
  /* Dynamic FP8 cache scales (ROPEJIT_STORE_E4M3_DYNAMIC). */
  float* k_scales;
  float* v_scales;
  int64_t scale_stride_page, scale_stride_slot, scale_stride_head;
} ropejit_kv_cache;

typedef struct {
  ropejit_header header;
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
  ropejit_scaling scaling;
  int32_t mrope_section[3];
  int32_t mrope_interleaved; /* 0 or 1 */
  ropejit_tensor v;
  const void* q_norm_weight;
  const void* k_norm_weight;
  double norm_eps;
  float out_quant_scale;
  ropejit_kv_cache cache;
  /* ROPEJIT_STORE_E4M3_DYNAMIC outputs: float32 dequantization scales per token and head of
   * q_out / k_out (ropejit::Args::q_out_scale; strides in floats, head_dim unused). */
  ropejit_tensor q_out_scale, k_out_scale;
} ropejit_args;

/* Fill with the C++ defaults (bshd, bf16, d128, neox, offset positions, f32 half table,
 * forward, in place, nothing fused; base 10000, the scaling and norm defaults, quant scales 1)
 * and the header. Call them through the macros, which pass the struct's size; bindings (ctypes,
 * cffi) call the _sized functions with their own struct's size. A size smaller than this
 * library's first sized layout is refused. */
ROPEJIT_API ropejit_status ropejit_spec_init_sized(ropejit_spec* spec, size_t size);
ROPEJIT_API ropejit_status ropejit_args_init_sized(ropejit_args* args, size_t size);
#define ropejit_spec_init(spec) ropejit_spec_init_sized((spec), sizeof *(spec))
#define ropejit_args_init(args) ropejit_args_init_sized((args), sizeof *(args))

/* Contiguous strides for a layout (thd: `batch` ignored, `seq` = tokens) into *out. Fails, with
 * *out untouched, for negative sizes or sizes whose product overflows int64. */
ROPEJIT_API ropejit_status ropejit_make_contiguous(int32_t layout, void* data, int64_t batch,
                                                   int64_t seq, int64_t heads, int64_t head_dim,
                                                   ropejit_tensor* out);
/* The same as a value: on failure an all-zero tensor (data NULL, so that ropejit_apply() refuses
 * it) and ropejit_last_error() says why. */
ROPEJIT_API ropejit_tensor ropejit_contiguous(int32_t layout, void* data, int64_t batch,
                                              int64_t seq, int64_t heads, int64_t head_dim);

/* Applies RoPE; on error nothing is launched and ropejit_last_error() says why. */
ROPEJIT_API ropejit_status ropejit_apply(const ropejit_spec* spec, const ropejit_args* args);

/* Writes the spec's canonical key (NUL-terminated) into buf; fails if it does not fit. */
ROPEJIT_API ropejit_status ropejit_key(const ropejit_spec* spec, char* buf, size_t size);

/* Compiles the spec for arch ("sm_90") into the disk cache; works without a GPU. */
ROPEJIT_API ropejit_status ropejit_precompile(const ropejit_spec* spec, const char* arch);

/* What a host table holds: ropejit::TableSpec (freqs: any value but ROPEJIT_FREQS_TABLE). */
typedef struct {
  ropejit_header header;
  int32_t freqs;
  double base;
  ropejit_scaling scaling;
  int64_t rows;       /* positions 0 .. rows - 1 */
  int64_t row_stride; /* elements between rows; 0: the row width */
} ropejit_table_spec;

/* Fill with the C++ defaults (computed frequencies, base 10000, the scaling defaults, no rows). */
ROPEJIT_API ropejit_status ropejit_table_spec_init_sized(ropejit_table_spec* table, size_t size);
#define ropejit_table_spec_init(table) ropejit_table_spec_init_sized((table), sizeof *(table))

/* Host cos/sin tables for a table key (spec->freqs == ROPEJIT_FREQS_TABLE): float64 values times
 * the attention factor, rounded once to spec->table_dtype (ropejit::build_tables). Nothing is
 * written on error. */
ROPEJIT_API ropejit_status ropejit_build_tables(const ropejit_spec* spec,
                                                const ropejit_table_spec* table, void* cos,
                                                void* sin);

/* The rotary_dim / 2 inverse frequencies (radians per position) of table->freqs with table->base
 * and table->scaling (rows and row_stride unused) into out[0 .. count), count >= rotary_dim / 2;
 * and its attention factor into *out. */
ROPEJIT_API ropejit_status ropejit_inverse_frequencies(const ropejit_table_spec* table,
                                                       int32_t rotary_dim, double* out,
                                                       size_t count);
ROPEJIT_API ropejit_status ropejit_attention_factor(const ropejit_table_spec* table,
                                                    int32_t rotary_dim, double* out);

/* A model's RoPE as its Hugging Face config.json describes it (ropejit::ModelRope). */
typedef struct {
  ropejit_header header;
  int32_t head_dim, rotary_dim, rotary_offset, q_heads, kv_heads, style, freqs;
  double base;
  /* short_factor / long_factor (longrope) point into memory of this thread that stays valid until
   * its next ropejit_*_hf_config call. */
  ropejit_scaling scaling;
  int32_t mrope, mrope_section[3], mrope_interleaved, norm;
  int64_t max_positions;
  double norm_eps, local_base, softmax_scale_multiplier;
  /* Appended after the first sized layout (216 bytes): MLA's kv_lora_rank (0: not MLA). */
  int32_t kv_lora_rank;
} ropejit_model;

ROPEJIT_API ropejit_status ropejit_model_init_sized(ropejit_model* model, size_t size);
#define ropejit_model_init(model) ropejit_model_init_sized((model), sizeof *(model))

/* Reads a config.json file (or its text) into *spec (ropejit::spec_from_model in `dtype`, bshd)
 * and, when model is not NULL, *model. Both are filled by their _init first (the library writes
 * only as many bytes as their headers say). Errors name the field and its value. */
ROPEJIT_API ropejit_status ropejit_spec_from_hf_config(const char* path, int32_t dtype,
                                                       ropejit_spec* spec, ropejit_model* model);
ROPEJIT_API ropejit_status ropejit_spec_from_hf_config_text(const char* json_text, int32_t dtype,
                                                            ropejit_spec* spec,
                                                            ropejit_model* model);

/* The calling thread's last error message ("" after success). */
ROPEJIT_API const char* ropejit_last_error(void);

ROPEJIT_API const char* ropejit_version(void);

/* What this process's kernel cache has done so far (ropejit::cache_counts): kernels compiled with
 * NVRTC, loaded from the disk cache, found in memory, modules loaded onto a device. A NULL
 * pointer skips that count. */
ROPEJIT_API void ropejit_cache_counts(uint64_t* compiled, uint64_t* disk_hits,
                                      uint64_t* memory_hits, uint64_t* module_loads);

/* sizeof(ropejit_spec) and sizeof(ropejit_args) as this library was built: bindings (ctypes,
 * cffi) check their own layouts against them. */
ROPEJIT_API void ropejit_struct_sizes(size_t* spec, size_t* args);
/* The same for the decode block's structs: ropejit_qkv_proj_spec / _args, ropejit_ffn_spec /
 * _args. */
ROPEJIT_API void ropejit_decode_struct_sizes(size_t* qkv_spec, size_t* qkv_args, size_t* ffn_spec,
                                             size_t* ffn_args);

/* The decode block's QKV projection: ropejit::QkvProjSpec / QkvProjArgs. */
typedef struct {
  ropejit_header header;
  int32_t dtype, head_dim, rotary_dim, style, positions, index_type, freqs;
  int32_t table_dtype, table_width, norm;
  int32_t weights; /* ropejit::Weights: 0 same as dtype, 1 e4m3 (with args.weight_scale) */
  /* ropejit::KvCache (0 none, 1 contiguous, 2 paged, 3 slots) and ropejit::Store (0 same,
   * 1 e4m3, 2 e4m3 with dynamic scales in args.cache.k_scales / v_scales: unfused path only):
   * k and v also appended to args.cache */
  int32_t cache, cache_store;
} ropejit_qkv_proj_spec;

typedef struct {
  ropejit_header header;
  int64_t tokens, hidden, q_heads, kv_heads;
  const void* x;
  int64_t x_stride;
  const void* norm_weight;
  double norm_eps;
  const void* weight;
  int64_t weight_stride;
  ropejit_tensor q, k, v;
  int64_t position_offset;
  const void* position_ids;
  const void* cos;
  const void* sin;
  int64_t table_stride, table_rows;
  double base;
  void* stream;
  int32_t path;              /* ropejit::ProjPath: 0 automatic, 1 fused, 2 unfused */
  void* workspace;           /* the unfused path's scratch (256-byte aligned device memory) */
  size_t workspace_bytes;    /* ropejit_qkv_projection_workspace_bytes() */
  const float* weight_scale; /* e4m3 weights: a float32 scale per weight row */
  ropejit_kv_cache cache;    /* spec.cache: k, v, pages, page_size, strides, the addressing
                                (slot_mapping; indptr/indices/last_page_len; seq_lens),
                                k/v_quant_scale, skipped */
  const int32_t* cu_seqlens; /* paged/contiguous cache: [batch + 1] sequences of the tokens
                                (null: one token per sequence) */
  int64_t batch;
  /* Appended after the first sized layout (480 bytes): optional biases of the weight rows,
   * [(q_heads + 2 kv_heads) * head_dim] in the activation dtype, added before RoPE (the fused
   * path; null: none). */
  const void* bias;
} ropejit_qkv_proj_args;

/* Fill with the C++ defaults (bf16, d128, neox, int64 ids, f32 half table, RMSNorm; eps 1e-6,
 * base 10000). */
ROPEJIT_API ropejit_status ropejit_qkv_proj_spec_init_sized(ropejit_qkv_proj_spec* spec,
                                                            size_t size);
ROPEJIT_API ropejit_status ropejit_qkv_proj_args_init_sized(ropejit_qkv_proj_args* args,
                                                            size_t size);
#define ropejit_qkv_proj_spec_init(spec) ropejit_qkv_proj_spec_init_sized((spec), sizeof *(spec))
#define ropejit_qkv_proj_args_init(args) ropejit_qkv_proj_args_init_sized((args), sizeof *(args))
/* y = RoPE(RMSNorm(x) · Wᵀ) into q, k, v in one launch; on error nothing is launched. */
ROPEJIT_API ropejit_status ropejit_qkv_projection(const ropejit_qkv_proj_spec* spec,
                                                  const ropejit_qkv_proj_args* args);
/* Bytes of workspace the unfused path needs for args->tokens and args->hidden (no GPU needed),
 * and the path (ropejit::ProjPath) a call with these arguments takes, the workspace not looked
 * at: provide one when it is 2 (unfused). */
ROPEJIT_API ropejit_status ropejit_qkv_projection_workspace_bytes(const ropejit_qkv_proj_spec* spec,
                                                                  const ropejit_qkv_proj_args* args,
                                                                  size_t* bytes);
ROPEJIT_API ropejit_status ropejit_qkv_projection_path(const ropejit_qkv_proj_spec* spec,
                                                       const ropejit_qkv_proj_args* args,
                                                       int32_t* path);
/* The FFN's gate/up half: ropejit::FfnSpec / FfnArgs.
 *   out = act(RMSNorm(x) · Wgᵀ) ⊙ (RMSNorm(x) · Wuᵀ) */
typedef struct {
  ropejit_header header;
  int32_t dtype, norm, act; /* act: 0 silu, 1 gelu_tanh */
  int32_t weights;          /* ropejit::Weights: 0 same as dtype, 1 e4m3 */
} ropejit_ffn_spec;

typedef struct {
  ropejit_header header;
  int64_t tokens, hidden, intermediate;
  const void* x;
  int64_t x_stride;
  const void* norm_weight;
  double norm_eps;
  const void* gate_weight;
  const void* up_weight;
  int64_t weight_stride;
  void* out;
  int64_t out_stride;
  int32_t path;
  void* workspace;
  size_t workspace_bytes;
  void* stream;
  const float* gate_scale; /* e4m3 weights: a float32 scale per gate row, and per up row */
  const float* up_scale;
} ropejit_ffn_args;

/* Fill with the C++ defaults (bf16, RMSNorm, SiLU; eps 1e-6, automatic path). */
ROPEJIT_API ropejit_status ropejit_ffn_spec_init_sized(ropejit_ffn_spec* spec, size_t size);
ROPEJIT_API ropejit_status ropejit_ffn_args_init_sized(ropejit_ffn_args* args, size_t size);
#define ropejit_ffn_spec_init(spec) ropejit_ffn_spec_init_sized((spec), sizeof *(spec))
#define ropejit_ffn_args_init(args) ropejit_ffn_args_init_sized((args), sizeof *(args))
ROPEJIT_API ropejit_status ropejit_ffn_gate_up(const ropejit_ffn_spec* spec,
                                               const ropejit_ffn_args* args);
ROPEJIT_API ropejit_status ropejit_ffn_gate_up_workspace_bytes(const ropejit_ffn_spec* spec,
                                                               const ropejit_ffn_args* args,
                                                               size_t* bytes);
ROPEJIT_API ropejit_status ropejit_ffn_gate_up_path(const ropejit_ffn_spec* spec,
                                                    const ropejit_ffn_args* args, int32_t* path);
ROPEJIT_API ropejit_status ropejit_ffn_key(const ropejit_ffn_spec* spec, char* buf, size_t size);
ROPEJIT_API ropejit_status ropejit_ffn_precompile(const ropejit_ffn_spec* spec, const char* arch);

/* The key string (NUL-terminated; an error when `size` is too small) and a no-GPU precompile
 * for `arch` (sm_80 or newer). */
ROPEJIT_API ropejit_status ropejit_qkv_proj_key(const ropejit_qkv_proj_spec* spec, char* buf,
                                                size_t size);
ROPEJIT_API ropejit_status ropejit_qkv_proj_precompile(const ropejit_qkv_proj_spec* spec,
                                                       const char* arch);

/* RMSNorm over the last dimension, alone: ropejit::RmsNormSpec / RmsNormArgs.
 *   out = x / sqrt(mean(x^2) + norm_eps) * w (norm ROPEJIT_NORM_RMS), or * (1 + w)
 *   (ROPEJIT_NORM_RMS_ONE_PLUS, Gemma), in fp32, rounded once; with residual = 1, x + residual
 *   is formed first (rounded once), written back to args.residual and normalized (vLLM's
 *   fused_add_rms_norm). */
typedef struct {
  ropejit_header header;
  int32_t dtype, norm;
  int32_t residual; /* 0 or 1 */
} ropejit_rms_norm_spec;

typedef struct {
  ropejit_header header;
  int64_t rows, hidden;
  const void* x;
  int64_t x_stride; /* elements; 0: hidden */
  void* residual;   /* spec.residual: read, then overwritten with x + residual */
  int64_t residual_stride;
  const void* weight; /* [hidden] */
  double norm_eps;
  void* out; /* may be x itself */
  int64_t out_stride;
  void* stream;
} ropejit_rms_norm_args;

/* Fill with the C++ defaults (bf16, rms, no residual; eps 1e-6). */
ROPEJIT_API ropejit_status ropejit_rms_norm_spec_init_sized(ropejit_rms_norm_spec* spec,
                                                            size_t size);
ROPEJIT_API ropejit_status ropejit_rms_norm_args_init_sized(ropejit_rms_norm_args* args,
                                                            size_t size);
#define ropejit_rms_norm_spec_init(spec) ropejit_rms_norm_spec_init_sized((spec), sizeof *(spec))
#define ropejit_rms_norm_args_init(args) ropejit_rms_norm_args_init_sized((args), sizeof *(args))
/* One launch; on error nothing is launched. */
ROPEJIT_API ropejit_status ropejit_rms_norm(const ropejit_rms_norm_spec* spec,
                                            const ropejit_rms_norm_args* args);
ROPEJIT_API ropejit_status ropejit_rms_norm_key(const ropejit_rms_norm_spec* spec, char* buf,
                                                size_t size);
ROPEJIT_API ropejit_status ropejit_rms_norm_precompile(const ropejit_rms_norm_spec* spec,
                                                       const char* arch);

/* MLA's step around RoPE: ropejit::MlaSpec / MlaArgs (docs/mla.md). Per token, the latent
 * cache row [RMSNorm(kv_c) * w | rope(k_pe)] at its slot (dtype, or e4m3 codes of value /
 * *cache_scale; slot -1 is padding, a slot outside the cache is skipped and counted), and the
 * query: rope(q_pe) in place (ROPEJIT_MLA_QUERY_IN_PLACE) or q_out = [q_nope | rope(q_pe)]
 * (ROPEJIT_MLA_QUERY_ASSEMBLE; dtype, or e4m3 codes of value / *q_scale). */
enum { ROPEJIT_MLA_QUERY_IN_PLACE = 0, ROPEJIT_MLA_QUERY_ASSEMBLE = 1 };

typedef struct {
  ropejit_header header;
  int32_t dtype;
  int32_t kv_rank, rope_dim;
  int32_t style, index_type, table_dtype, norm;
  int32_t cache_store, query, q_store;
  /* Appended (the first sized struct ends before it): 1 when e4m3 stores hold value * scale
   * (FlashInfer's) instead of value / scale. */
  int32_t scale_multiplies;
} ropejit_mla_spec;

typedef struct {
  ropejit_header header;
  int64_t tokens, heads;
  const void* kv_c;
  int64_t kv_c_stride; /* elements; 0: kv_rank */
  const void* k_pe;
  int64_t k_pe_stride;
  const void* norm_weight;
  double norm_eps;
  void* cache; /* [cache_slots][kv_rank + rope_dim] */
  int64_t cache_slots, cache_stride;
  const int64_t* slots;
  const float* cache_scale;
  int32_t* skipped; /* optional device counter */
  void* q_pe;       /* [tokens][heads][rope_dim] */
  int64_t q_pe_token_stride, q_pe_head_stride;
  const void* q_nope; /* assemble: [tokens][heads][kv_rank] */
  int64_t q_nope_token_stride, q_nope_head_stride;
  void* q_out; /* assemble: [tokens][heads][kv_rank + rope_dim] */
  int64_t q_out_token_stride, q_out_head_stride;
  const float* q_scale;
  const void* position_ids;
  const void* cos;
  const void* sin;
  int64_t table_rows, table_stride;
  void* stream;
  /* Appended (the first sized struct ends before them); the C++ fields of the same names. */
  void* k_pe_out; /* rope(k_pe) for every token; k_pe itself: in place */
  int64_t k_pe_out_stride;
  void* cache_pe; /* the rows' rope part in a cache of its own */
  int64_t cache_pe_stride;
  const int32_t* kv_indices; /* a page table addresses the cache (FlashInfer's) */
  const int32_t* kv_indptr;
  const int32_t* batch_indices;
  const int32_t* page_positions;
  int64_t batch, num_indices, page_size;
  int32_t rows_by_token; /* 1: token t writes cache row t */
  void* q_out_pe;        /* assemble: the query's rope part in a tensor of its own */
  int64_t q_out_pe_token_stride, q_out_pe_head_stride;
  int64_t cache_block_size; /* 0: cache rows one stride apart; else blocks of this many rows */
  int64_t cache_block_stride, cache_pe_block_stride;
} ropejit_mla_args;

/* Fill with the C++ defaults (bf16, kv_rank 512, rope_dim 64, gptj, i64 ids, f32 table, rms,
 * cache and query in the dtype, q_pe in place; eps 1e-6). */
ROPEJIT_API ropejit_status ropejit_mla_spec_init_sized(ropejit_mla_spec* spec, size_t size);
ROPEJIT_API ropejit_status ropejit_mla_args_init_sized(ropejit_mla_args* args, size_t size);
#define ropejit_mla_spec_init(spec) ropejit_mla_spec_init_sized((spec), sizeof *(spec))
#define ropejit_mla_args_init(args) ropejit_mla_args_init_sized((args), sizeof *(args))
/* One launch; on error nothing is launched. */
ROPEJIT_API ropejit_status ropejit_mla_prepare(const ropejit_mla_spec* spec,
                                               const ropejit_mla_args* args);
ROPEJIT_API ropejit_status ropejit_mla_key(const ropejit_mla_spec* spec, char* buf, size_t size);
ROPEJIT_API ropejit_status ropejit_mla_precompile(const ropejit_mla_spec* spec, const char* arch);

#ifdef __cplusplus
}
#endif
#endif /* ROPEJIT_H_ */
