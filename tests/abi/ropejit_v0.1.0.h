/* ropejit 0.1.0's C header as released, frozen: tests/abi/old_caller.c is built against it to show
 * that programs built then still run on today's library. */
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
enum { ROPEJIT_POS_OFFSET = 0, ROPEJIT_POS_SEQ_OFFSETS = 1, ROPEJIT_POS_IDS = 2 };
enum { ROPEJIT_I32 = 0, ROPEJIT_I64 = 1 };
enum { ROPEJIT_FREQS_TABLE = 0, ROPEJIT_FREQS_COMPUTED = 1 };
enum { ROPEJIT_TABLE_HALF = 0, ROPEJIT_TABLE_FULL = 1 };
enum { ROPEJIT_FORWARD = 0, ROPEJIT_BACKWARD = 1 };

typedef struct {
  int32_t layout, dtype, head_dim, rotary_dim, style, positions, index_type, freqs;
  int32_t table_dtype, table_width, direction, in_place, fusion;
} ropejit_spec;

typedef struct {
  void* data;
  int64_t heads, stride_batch, stride_seq, stride_head;
} ropejit_tensor;

typedef struct {
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
} ropejit_args;

/* Fill with the C++ defaults (bshd, bf16, d128, neox, offset positions, f32 half table,
 * forward, in place; base 10000). */
ROPEJIT_API void ropejit_spec_init(ropejit_spec* spec);
ROPEJIT_API void ropejit_args_init(ropejit_args* args);

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

/* The calling thread's last error message ("" after success). */
ROPEJIT_API const char* ropejit_last_error(void);

ROPEJIT_API const char* ropejit_version(void);

#ifdef __cplusplus
}
#endif
#endif /* ROPEJIT_H_ */
