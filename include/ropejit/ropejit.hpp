// ropejit: Rotary Position Embedding kernels generated at run time (NVRTC + CUDA Driver API).
// The whole C++ surface: value types describing a call, one error type, and apply().
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ropejit {

inline constexpr const char* kVersion = "0.1.0";

// ---------------------------------------------------------------------------------------
// The specialization key: everything that selects a compiled kernel.
// ---------------------------------------------------------------------------------------

// Memory layout of q/k. bshd, sbhd and bhsd differ only in default strides (any strides are
// accepted); thd packs variable-length sequences described by cu_seqlens.
enum class Layout : int32_t { bshd = 0, sbhd = 1, bhsd = 2, thd = 3 };
enum class DType : int32_t { f32 = 0, f16 = 1, bf16 = 2 };
// neox pairs (x[i], x[i + R/2]); gptj pairs (x[2i], x[2i + 1]).
enum class Style : int32_t { neox = 0, gptj = 1 };
// offset: position = index in sequence + Args::position_offset.
// seq_offsets: position = index in sequence + Args::seq_offsets[sequence] (device tensor).
// ids: position = Args::position_ids[token] (device tensor).
enum class Positions : int32_t { offset = 0, seq_offsets = 1, ids = 2 };
enum class IndexType : int32_t { i32 = 0, i64 = 1 };
// table: cos/sin read from Args::cos / Args::sin; computed: from Args::base in the kernel.
enum class Freqs : int32_t { table = 0, computed = 1 };
// half: a row holds R/2 values (flash-attn, vLLM cos_sin_cache); full: R values, each
// frequency repeated (HF rotate_half tables for neox, repeat_interleave for gptj).
enum class TableWidth : int32_t { half = 0, full = 1 };
enum class Direction : int32_t { forward = 0, backward = 1 };
// What one launch does besides rotating: today q and k together (k optional). Next axes:
// QKV split, KV-cache append, QK-norm, FP8 output.
enum class Fusion : int32_t { qk = 0 };

struct Spec {
  Layout layout = Layout::bshd;
  DType dtype = DType::bf16;
  int32_t head_dim = 128;
  int32_t rotary_dim = 0;  // 0 means head_dim (full rotary)
  Style style = Style::neox;
  Positions positions = Positions::offset;
  IndexType index_type = IndexType::i64;  // of seq_offsets / position_ids
  Freqs freqs = Freqs::table;
  DType table_dtype = DType::f32;
  TableWidth table_width = TableWidth::half;
  Direction direction = Direction::forward;
  bool in_place = true;
  Fusion fusion = Fusion::qk;

  // Throws Error naming the first invalid field.
  void validate() const;
  // Same kernel, canonical field values (rotary_dim resolved, unused axes reset), so that
  // two specs compare equal exactly when they select the same kernel.
  Spec canonical() const;
  // Readable canonical key, e.g. rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip.
  std::string key() const;

  friend bool operator==(const Spec& a, const Spec& b);
  friend bool operator!=(const Spec& a, const Spec& b) { return !(a == b); }
};

// Parses a key produced by Spec::key(); throws Error on anything else.
Spec parse_key(const std::string& key);

// Names used in keys, the CLI and messages ("bshd", "bf16", "neox", ...).
const char* to_string(Layout v);
const char* to_string(DType v);
const char* to_string(Style v);
const char* to_string(Positions v);
const char* to_string(IndexType v);
const char* to_string(Freqs v);
const char* to_string(TableWidth v);
const char* to_string(Direction v);
const char* to_string(Fusion v);

// ---------------------------------------------------------------------------------------
// Call arguments: device pointers, sizes, strides (in elements), stream.
// ---------------------------------------------------------------------------------------

// One operand (q or k, or an output). Logical shape [batch, seq, heads, head_dim] for the
// dense layouts, [tokens, heads, head_dim] for thd; the last dimension is contiguous.
struct Tensor {
  void* data = nullptr;
  int64_t heads = 0;
  int64_t stride_batch = 0;  // dense layouts only
  int64_t stride_seq = 0;    // token stride for thd
  int64_t stride_head = 0;
};

// Strides of a contiguous tensor in `layout` (for thd, `batch` is ignored and `seq` is the
// number of tokens). Throws Error(invalid_argument) for negative sizes or sizes whose product
// overflows int64.
Tensor contiguous(Layout layout, void* data, int64_t batch, int64_t seq, int64_t heads,
                  int64_t head_dim);

struct Args {
  int64_t batch = 1;    // sequences; thd: entries of cu_seqlens minus one
  int64_t seq_len = 0;  // tokens per sequence; thd: total tokens
  Tensor q;
  Tensor k;      // k.data == nullptr: q only
  Tensor q_out;  // out-of-place outputs (ignored in place)
  Tensor k_out;
  int64_t position_offset = 0;          // Positions::offset
  const void* seq_offsets = nullptr;    // Positions::seq_offsets: [batch]
  const void* position_ids = nullptr;   // Positions::ids: [batch * seq_len] or [tokens]
  const int32_t* cu_seqlens = nullptr;  // thd (unless Positions::ids): [batch + 1]
  const void* cos = nullptr;            // Freqs::table
  const void* sin = nullptr;
  int64_t table_stride = 0;  // elements between rows; 0: the row width of the spec
  int64_t table_rows = 0;    // positions the table covers; device positions outside give NaN
  double base = 10000.0;     // Freqs::computed
  void* stream = nullptr;    // CUstream; nullptr is the legacy default stream
};

// ---------------------------------------------------------------------------------------
// Errors and the entry points.
// ---------------------------------------------------------------------------------------

enum class ErrorCode : int32_t {
  invalid_argument = 1,
  compile = 2,
  no_driver = 3,
  driver = 4,
  internal = 5,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Applies RoPE to q (and k) in one launch on args.stream. The first call for a spec compiles
// (or loads from the disk cache); later calls are a lookup and one cuLaunchKernel, safe
// inside CUDA graph capture. Nothing is launched when an argument is invalid.
void apply(const Spec& spec, const Args& args);

// Compiles a spec for `arch` (e.g. "sm_90") into the disk cache without needing a GPU: the
// kernels the library launches by default (prefill's and decode's). Returns the cache files
// ("" for each when caching is memory-only).
std::vector<std::string> precompile(const Spec& spec, const std::string& arch);

// Library facts for `ropejit info`.
struct Info {
  std::string version;
  int nvrtc_major = 0, nvrtc_minor = 0;
  std::string cache_dir;     // empty when caching is memory-only
  std::string cache_status;  // "ok" or why the disk cache is off
  size_t cache_entries = 0;
  int driver_version = 0;            // 0 when no driver could be loaded
  std::string driver_status;         // "ok" or the reason
  std::vector<std::string> devices;  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"
};
Info info();

}  // namespace ropejit
