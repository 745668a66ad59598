// ropejit: Rotary Position Embedding kernels generated at run time (NVRTC + CUDA Driver API).
// The whole C++ surface: value types describing a call, one error type, and apply().
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ropejit {

inline constexpr const char* kVersion = "0.2.0";

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
// mrope: three positions per token (temporal, height, width; Qwen2-VL), Args::position_ids
//   [3][tokens]; rotary pair i takes the position of its section (Args::mrope_section).
enum class Positions : int32_t { offset = 0, seq_offsets = 1, ids = 2, mrope = 3 };
enum class IndexType : int32_t { i32 = 0, i64 = 1 };
// table: cos/sin read from Args::cos / Args::sin. computed: from Args::base in the kernel,
// θ_i = base^(-2i/R). The others are computed too, with the frequencies of a scaling variant
// (parameters in Args::scaling, so changing them compiles nothing):
//   linear: position interpolation, θ_i / factor;
//   dynamic_ntk: base rescaled from the sequence length (Args::scaling.seq_len);
//   llama3: Llama 3.1/3.2 (factor, low/high frequency factors, original max positions);
//   yarn: YaRN (factor, beta_fast/beta_slow, original max positions, mscale, mscale_all_dim),
//     cos and sin scaled by its attention factor;
//   longrope: LongRoPE / Phi-3 "su" (short or long per-pair factors by sequence length, attention
//     factor).
enum class Freqs : int32_t {
  table = 0,
  computed = 1,
  linear = 2,
  dynamic_ntk = 3,
  llama3 = 4,
  yarn = 5,
  longrope = 6,
};
// half: a row holds R/2 values (flash-attn, vLLM cos_sin_cache); full: R values, each
// frequency repeated (HF rotate_half tables for neox, repeat_interleave for gptj).
enum class TableWidth : int32_t { half = 0, full = 1 };
enum class Direction : int32_t { forward = 0, backward = 1 };
// Which of q and k the launch writes back (in place, or to q_out / k_out): both, or q only, when
// k goes only into the KV cache (Spec::cache).
enum class Fusion : int32_t { qk = 0, q = 1 };
// QK-norm before RoPE, in fp32: x / sqrt(mean(x^2) + eps) * w over each q and k head (rms;
// Qwen3), with w + 1 (rms_one_plus; Gemma 3), or over all q (and all k) heads of a token with
// one weight per element of the projection (rms_all_heads; OLMo2).
enum class Norm : int32_t { none = 0, rms = 1, rms_one_plus = 2, rms_all_heads = 3 };
// The KV cache k (and v) are appended to: none; contiguous ([sequence][position][head][d] at each
// sequence's current length); paged (a page table: indptr / indices / last_page_len, as
// FlashInfer); slots (a flat slot per token, as vLLM's slot_mapping; negative: not written).
enum class KvCache : int32_t { none = 0, contiguous = 1, paged = 2, slots = 3 };
// How an output is stored: in the activation dtype; FP8 e4m3 with a static per-tensor scale
// (value * quant scale, rounded to nearest even, saturating to +-448); or FP8 e4m3 with a scale
// per token and head computed by the kernel (e4m3_dynamic): over each head's values after norm
// and RoPE, a = max(amax, 2^-9) in fp32; the head is stored as value * (448 / a) and the
// float32 dequantization scale a / 448 is written next to it (Args::q_out_scale and
// k_out_scale for outputs, KvCacheArgs::k_scales and v_scales for the cache), so that
// stored * scale gives the value back.
enum class Store : int32_t { same = 0, e4m3 = 1, e4m3_dynamic = 2 };
// Whether a store is FP8 (one byte per element).
inline bool is_fp8(Store s) { return s != Store::same; }

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
  Norm norm = Norm::none;
  Store out_store = Store::same;  // q_out / k_out (out of place only)
  KvCache cache = KvCache::none;
  Store cache_store = Store::same;

  // Throws Error naming the first invalid field (or combination of fields).
  void validate() const;
  // Whether any fused stage is on (norm, FP8 outputs, KV cache, k only to the cache).
  bool fused() const;
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
const char* to_string(Norm v);
const char* to_string(KvCache v);
const char* to_string(Store v);

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

// Frequency scaling parameters (Hugging Face `rope_scaling` / `rope_parameters`), for the
// scaled Freqs values. Fields a variant does not use are ignored.
struct RopeScaling {
  double factor = 1.0;                   // linear, dynamic_ntk, llama3, yarn, longrope
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_positions = 0;    // llama3, yarn, longrope, dynamic_ntk
  double beta_fast = 32.0;               // yarn
  double beta_slow = 1.0;                // yarn
  double mscale = 0.0;                   // yarn (DeepSeek): 0 when not given
  double mscale_all_dim = 0.0;           // yarn (DeepSeek): 0 when not given
  double attention_factor = 0.0;         // yarn, longrope: 0 = from the variant's definition
  bool truncate = true;                  // yarn: round the correction range to whole dimensions
  const double* short_factor = nullptr;  // longrope: rotary_dim / 2 factors (host memory)
  const double* long_factor = nullptr;   // longrope: rotary_dim / 2 factors (host memory)
  int64_t seq_len = 0;  // dynamic_ntk, longrope: the sequence length that picks the scaling
  // longrope: how many values short_factor and long_factor each hold (must be rotary_dim / 2);
  // nothing is read past it.
  int64_t factor_count = 0;
};

// The KV cache a fused call appends k and v to (Spec::cache). Strides in elements of the
// cache's dtype (the activation dtype, or bytes for e4m3); NHD pages are [page][slot][head][d],
// HND pages [page][head][slot][d]: both are just strides.
struct KvCacheArgs {
  void* k = nullptr;      // device memory
  void* v = nullptr;      // may be null: only k is appended
  int64_t pages = 0;      // pages (paged, slots), or sequences (contiguous)
  int64_t page_size = 0;  // tokens per page, or per sequence (contiguous)
  int64_t stride_page = 0;
  int64_t stride_slot = 0;
  int64_t stride_head = 0;
  // slots: a flat slot (page * page_size + offset) per token, indexed like position ids:
  // [batch * seq_len] in (sequence, index) order for dense layouts, [tokens] for thd.
  const int64_t* slot_mapping = nullptr;
  const int32_t* indptr = nullptr;         // paged: [batch + 1] ranges of indices per sequence
  const int32_t* indices = nullptr;        // paged: page numbers
  int64_t num_indices = 0;                 // paged: entries in indices
  const int32_t* last_page_len = nullptr;  // paged: tokens in each sequence's last page, after
                                           // the append
  const int32_t* seq_lens = nullptr;       // contiguous: tokens each sequence held before
  float k_quant_scale = 1.0f;              // cache_store e4m3: stored = value * scale
  float v_quant_scale = 1.0f;
  // cache_store e4m3_dynamic: a float32 dequantization scale per cached token and head, placed
  // like the rows: page * scale_stride_page + slot * scale_stride_slot + head *
  // scale_stride_head (elements of float; contiguous: page is the sequence, slot its position).
  float* k_scales = nullptr;
  float* v_scales = nullptr;  // with v
  int64_t scale_stride_page = 0;
  int64_t scale_stride_slot = 0;
  int64_t scale_stride_head = 0;
  // Optional device counter: tokens whose slot or page (read on the device) fell outside the
  // cache; they are not written. A negative slot is not counted: it means "do not write".
  int32_t* skipped = nullptr;
};

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
  double base = 10000.0;     // computed frequencies (Freqs other than table)
  RopeScaling scaling;       // Freqs linear .. longrope
  int32_t mrope_section[3] = {0, 0, 0};  // Positions::mrope: rotary pairs per position row
  bool mrope_interleaved = false;        // sections interleaved pair by pair (Qwen3-VL)
  // Fused keys.
  Tensor v;                             // appended to the cache next to k (KvCache other than none)
  const void* q_norm_weight = nullptr;  // Norm: [head_dim] ([q heads * head_dim] for all heads)
  const void* k_norm_weight = nullptr;  //   in the activation dtype
  double norm_eps = 1e-6;
  float out_quant_scale = 1.0f;  // out_store e4m3: q_out / k_out = value * scale
  // out_store e4m3_dynamic: the float32 dequantization scale of every token and head of q_out
  // (k_out), [batch, seq, heads] (thd: [tokens, heads]) by Tensor's strides in floats (heads
  // as q's and k's; head_dim does not apply).
  Tensor q_out_scale;
  Tensor k_out_scale;
  KvCacheArgs cache;
  void* stream = nullptr;  // CUstream; nullptr is the legacy default stream
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

// What this process's kernel cache has done so far, over every key family: kernels compiled
// with NVRTC, loaded from the disk cache, found in memory (another key or thread built them), and
// modules loaded onto a device. A warm start (every kernel in the disk cache) compiles nothing;
// ranks sharing one cache directory compile each kernel once between them.
struct CacheCounts {
  uint64_t compiled = 0;
  uint64_t disk_hits = 0;
  uint64_t memory_hits = 0;
  uint64_t module_loads = 0;
};
CacheCounts cache_counts();

// ---------------------------------------------------------------------------------------
// The decode block: RMSNorm -> QKV projection -> RoPE in one kernel.
// ---------------------------------------------------------------------------------------

// What selects a QKV projection kernel. For a few tokens (decode), one launch computes
//   y = RoPE(RMSNorm(x) · Wᵀ)
// for the packed weight W ([(q_heads + 2 kv_heads) · head_dim][hidden], torch's Linear layout:
// q's columns, then k's, then v's) and writes q, k (both rotated) and v. Tensor cores with fp32
// accumulation (sm_80 or newer); RMSNorm's statistics in fp32 and rstd applied to the fp32 sums;
// RoPE on the fp32 sums, rounded once at the store.
// How a projection's weights are stored (QkvProjSpec::weights, FfnSpec::weights).
enum class Weights : int32_t {
  same = 0,  // in the activation dtype
  // FP8 e4m3 codes (torch.float8_e4m3fn), one byte each, with a float32 scale per output column
  // (weight row): W_nk = code_nk · scale_n. The kernel widens the codes to the activation dtype
  // exactly and applies the scale to the column's fp32 sum. Codes must be finite (the NaN codes
  // 0x7f/0xff read as ±480); hidden must be a multiple of 16. The unfused path (cuBLASLt's FP8
  // GEMMs take FP8 activations) first dequantizes the weight chunk by chunk into its workspace as
  // torch does, dtype(fp32(code · scale)), then runs the GEMM on it; f16 needs |code · scale|
  // below 65504 there. An automatic call runs fused (until that path has been measured on a
  // GPU) unless the tuning file chooses the unfused path.
  e4m3 = 1,
};

struct QkvProjSpec {
  DType dtype =
      DType::bf16;         // x, the norm weight and the outputs (and W, unless e4m3): bf16 or f16
  int32_t head_dim = 128;  // a multiple of 16, <= 512
  int32_t rotary_dim = 0;  // 0 means head_dim; the first rotary_dim elements of q/k heads rotate
  Style style = Style::neox;
  Positions positions = Positions::ids;   // offset or ids
  IndexType index_type = IndexType::i64;  // of position_ids
  Freqs freqs = Freqs::table;             // table or computed
  DType table_dtype = DType::f32;
  TableWidth table_width = TableWidth::half;
  // RMSNorm of x before the projection: none, rms (x / sqrt(mean(x^2) + eps) * w), or
  // rms_one_plus (Gemma's (1 + w)). The normalized activation x_k * w_k is rounded once to the
  // dtype for the tensor cores (in f16, |x_k * w_k| must stay below 65504); rstd is applied to
  // the fp32 sums.
  Norm norm = Norm::rms;
  Weights weights = Weights::same;
  // k and v also appended to a KV cache (QkvProjArgs::cache), in the activation dtype or e4m3
  // with a static scale per cache (k and v rounded once from the fp32 values, value · scale,
  // saturating at ±448): none; slots (a flat slot per token, vLLM's slot_mapping: page =
  // slot / page_size, row slot % page_size; a negative slot is not written); paged or
  // contiguous, where each token is the newest of its own sequence (a decode step: sequence t
  // is token t): paged, the last page of the sequence (kv_indices[kv_indptr[t + 1] - 1]) at row
  // last_page_len[t] - 1, FlashInfer's layout after the append; contiguous, row seq_lens[t]
  // (the tokens it held before) of sequence t.
  KvCache cache = KvCache::none;
  Store cache_store = Store::same;  // same or e4m3

  // Throws Error naming the first invalid field.
  void validate() const;
  QkvProjSpec canonical() const;
  // e.g. qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms; e4m3 weights append _we4m3,
  // a cache _c<slots|paged|cont> (FP8: _cslots-e4m3)
  std::string key() const;

  friend bool operator==(const QkvProjSpec& a, const QkvProjSpec& b);
  friend bool operator!=(const QkvProjSpec& a, const QkvProjSpec& b) { return !(a == b); }
};

// Parses a key produced by QkvProjSpec::key(); throws Error on anything else.
QkvProjSpec parse_qkv_proj_key(const std::string& key);

// How a projection call computes (QkvProjArgs::path).
enum class ProjPath : int32_t {
  // The tuning file's choice for this token count and shape (`ropejit tune --key qkvproj_...`
  // measures the crossover), else the heuristic's: fused for up to 32 tokens (the FFN: 16; e4m3
  // weights: 64), unfused beyond. Unfused needs the workspace and outputs whose heads are
  // contiguous; without them the call runs fused.
  automatic = 0,
  fused = 1,  // one kernel (templates/proj_kernel.cuh)
  // RMSNorm key -> cuBLASLt GEMM (loaded with dlopen) -> RoPE key, as torch's unfused sequence
  // computes it: the normalized activation and the projection are each rounded to the dtype
  // before the next step. Needs args.workspace and q/k/v heads contiguous within a token.
  unfused = 2,
};
const char* to_string(ProjPath v);
const char* to_string(Weights v);

// One call. Strides in elements; every pointer is device memory.
struct QkvProjArgs {
  int64_t tokens = 0;                 // rows of x (a decode step: one per sequence)
  int64_t hidden = 0;                 // K: a multiple of 8
  int64_t q_heads = 0;                // >= 1
  int64_t kv_heads = 0;               // >= 1 (k and v)
  const void* x = nullptr;            // [tokens][hidden], rows x_stride apart
  int64_t x_stride = 0;               // 0: hidden
  const void* norm_weight = nullptr;  // [hidden] (norm != none)
  double norm_eps = 1e-6;
  const void* weight = nullptr;  // [(q_heads + 2 kv_heads) * head_dim][hidden]
  int64_t weight_stride = 0;     // elements between weight rows; 0: hidden
  // Weights::e4m3: the float32 scale of every weight row, [(q_heads + 2 kv_heads) * head_dim]
  // (4-byte aligned); ignored otherwise.
  const float* weight_scale = nullptr;
  // Optional bias of every weight row, [(q_heads + 2 kv_heads) * head_dim] in the activation
  // dtype (Qwen2's q/k/v biases): added to each column's fp32 sum (after the norm and the FP8
  // scale) before RoPE, rounded once with it; null: none. The fused kernel only: a call with a
  // bias runs fused, and path unfused is refused.
  const void* bias = nullptr;
  // Outputs [tokens][heads][head_dim] (last dimension contiguous; stride_batch is ignored,
  // stride_seq is the token stride; heads must equal q_heads / kv_heads). They may be views of
  // one packed [tokens][q + 2 kv heads][head_dim] tensor; they may not overlap the inputs.
  // With a KV cache k and v may be left null (written to the cache only).
  Tensor q;
  Tensor k;
  Tensor v;
  // spec.cache: k (rotated) and v of token t go to the cache row its addressing gives
  // (KvCacheArgs: k, v, pages, page_size, the three strides, k/v_quant_scale for e4m3, skipped;
  // slots: slot_mapping [tokens]; paged: indptr [sequences + 1], indices [num_indices],
  // last_page_len [sequences]; contiguous: seq_lens [sequences], pages >= sequences; the dynamic
  // scale fields are not used). A row outside the cache (read on the device) is not written and
  // is counted in `skipped`; a negative slot is not written and not counted (padding).
  KvCacheArgs cache;
  // A paged or contiguous cache's sequences (a prefill chunk, or several tokens per sequence):
  // tokens cu_seqlens[b] .. cu_seqlens[b + 1] - 1 are sequence b's newest, in order ([batch + 1]
  // int32, device; cu_seqlens[0] = 0 and cu_seqlens[batch] = tokens expected). Paged: they take
  // the last positions of the sequence after the append (last_page_len counts them); contiguous:
  // rows seq_lens[b] onwards. A token outside every sequence is not appended and its q and k
  // are unspecified. Null (the default): token t is sequence t's one new token (a decode step),
  // and batch is ignored.
  const int32_t* cu_seqlens = nullptr;
  int64_t batch = 0;
  int64_t position_offset = 0;         // Positions::offset: position = offset + token index
  const void* position_ids = nullptr;  // Positions::ids: [tokens]
  const void* cos = nullptr;           // Freqs::table
  const void* sin = nullptr;
  int64_t table_stride = 0;  // 0: the row width
  int64_t table_rows = 0;    // device positions outside [0, table_rows) give NaN
  double base = 10000.0;     // Freqs::computed
  ProjPath path = ProjPath::automatic;
  // Scratch for the unfused path (device memory, 256-byte aligned, not read or written by the
  // fused kernel, never overlapping the inputs or outputs): qkv_projection_workspace_bytes().
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};

// Runs the projection on args.stream (compiles the key on first use, like apply()). Nothing is
// launched when an argument is invalid. Needs a GPU of compute capability 8.0 or newer. The
// unfused path's first use also compiles its RMSNorm and RoPE keys and loads cuBLASLt.
void qkv_projection(const QkvProjSpec& spec, const QkvProjArgs& args);

// Bytes of workspace the unfused path needs for args.tokens and args.hidden: the normalized
// activation (none without a norm), 256-byte aligned, with e4m3 weights a chunk of dequantized
// weight rows (the whole weight, (q_heads + 2 kv_heads) · head_dim rows, up to 64 MiB; so e4m3
// weights also need args.q_heads and args.kv_heads here), plus 32 MiB for cuBLASLt. Needs no GPU.
size_t qkv_projection_workspace_bytes(const QkvProjSpec& spec, const QkvProjArgs& args);

// The path a call with these arguments takes on its GPU: args.path when not automatic, else the
// tuning file's or the heuristic's choice for the token count where the call allows the unfused
// path (outputs' heads contiguous, cuBLASLt loadable). The workspace is not looked at: ask this
// to know whether to provide one (an automatic call without it runs fused). Checks the
// arguments as qkv_projection() does and prepares the key (compiles on first use); launches
// nothing.
ProjPath qkv_projection_path(const QkvProjSpec& spec, const QkvProjArgs& args);

// Compiles the key's default kernels for `arch` (no GPU needed); returns the cache files.
std::vector<std::string> precompile(const QkvProjSpec& spec, const std::string& arch);

// The FFN's first half, gated (SwiGLU / GeGLU), with the same prologue as the projection:
//   out = act(RMSNorm(x) · Wgᵀ) ⊙ (RMSNorm(x) · Wuᵀ)
// for the gate and up weights ([intermediate][hidden] each; vLLM's merged gate_up_proj is the
// two halves of one tensor). Fused: one kernel, both products chained in one loop over the
// hidden dimension (tensor cores, fp32 accumulation, the gate and up rows of a column in one
// thread), act and the product in fp32 on the sums, rounded once. Unfused (more tokens):
// RMSNorm key -> cuBLASLt GEMM(s) -> the GLU key (act(g) · u in fp32 on the rounded products).
enum class Activation : int32_t {
  silu = 0,       // x / (1 + e^-x): Llama, Qwen, Mistral
  gelu_tanh = 1,  // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))): Gemma
};
const char* to_string(Activation v);

struct FfnSpec {
  DType dtype = DType::bf16;  // bf16 or f16 (x, norm weight, out, and the weights unless e4m3)
  Norm norm = Norm::rms;      // none, rms, rms_one_plus (as QkvProjSpec)
  Activation act = Activation::silu;
  // e4m3: gate and up weights as FP8 codes with a float32 scale per row (FfnArgs::gate_scale,
  // up_scale), as QkvProjSpec::weights (both paths).
  Weights weights = Weights::same;

  void validate() const;
  FfnSpec canonical() const;
  std::string key() const;  // ffnglu_bf16_nrms_silu (e4m3 weights: _we4m3 appended)

  friend bool operator==(const FfnSpec& a, const FfnSpec& b) {
    return a.dtype == b.dtype && a.norm == b.norm && a.act == b.act && a.weights == b.weights;
  }
  friend bool operator!=(const FfnSpec& a, const FfnSpec& b) { return !(a == b); }
};

FfnSpec parse_ffn_key(const std::string& key);

// One call. Strides in elements; every pointer is device memory.
struct FfnArgs {
  int64_t tokens = 0;
  int64_t hidden = 0;        // K: a multiple of 8 (16 with e4m3 weights)
  int64_t intermediate = 0;  // I: output columns, >= 1
  const void* x = nullptr;   // [tokens][hidden], rows x_stride apart
  int64_t x_stride = 0;      // 0: hidden
  const void* norm_weight = nullptr;
  double norm_eps = 1e-6;
  const void* gate_weight = nullptr;  // [intermediate][hidden]
  const void* up_weight = nullptr;    // [intermediate][hidden]
  int64_t weight_stride = 0;          // elements between rows of both; 0: hidden
  // Weights::e4m3: the float32 scale of every gate row and every up row, [intermediate] each
  // (4-byte aligned; a merged gate_up tensor's scales: up_scale = gate_scale + intermediate).
  // Ignored otherwise.
  const float* gate_scale = nullptr;
  const float* up_scale = nullptr;
  void* out = nullptr;                  // [tokens][intermediate]
  int64_t out_stride = 0;               // 0: intermediate
  ProjPath path = ProjPath::automatic;  // as QkvProjArgs::path
  void* workspace = nullptr;            // the unfused path's: ffn_gate_up_workspace_bytes()
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};

void ffn_gate_up(const FfnSpec& spec, const FfnArgs& args);
// The unfused path's workspace: the normalized activation (none without a norm), the two
// products and with e4m3 weights a chunk of dequantized weight rows (the whole 2 · intermediate
// rows up to 64 MiB), each 256-byte aligned, plus 32 MiB for cuBLASLt. Needs no GPU.
size_t ffn_gate_up_workspace_bytes(const FfnSpec& spec, const FfnArgs& args);
// As qkv_projection_path(): the path a call takes, the workspace not looked at.
ProjPath ffn_gate_up_path(const FfnSpec& spec, const FfnArgs& args);
std::vector<std::string> precompile(const FfnSpec& spec, const std::string& arch);

// RMSNorm over the last dimension, alone (the decode block's norm where the projection is not
// fused, e.g. before a GEMM of a large batch):
//   out = x / sqrt(mean(x²) + eps) · w   (rms), or · (1 + w) (rms_one_plus, Gemma)
// in fp32, rounded once. With `residual`, x + residual is formed first (rounded once to the
// dtype), written back to args.residual, and normalized (vLLM's fused_add_rms_norm).
struct RmsNormSpec {
  DType dtype = DType::bf16;  // f32, f16, bf16 (x, residual, weight, out)
  Norm norm = Norm::rms;      // rms or rms_one_plus
  bool residual = false;

  void validate() const;
  RmsNormSpec canonical() const;
  std::string key() const;  // rmsnorm_bf16_nrms, rmsnorm_f16_nrms1p_res

  friend bool operator==(const RmsNormSpec& a, const RmsNormSpec& b) {
    return a.dtype == b.dtype && a.norm == b.norm && a.residual == b.residual;
  }
  friend bool operator!=(const RmsNormSpec& a, const RmsNormSpec& b) { return !(a == b); }
};

RmsNormSpec parse_rms_norm_key(const std::string& key);

// One call: `rows` rows of `hidden` elements; strides in elements (0: hidden), 16-byte aligned
// rows; out may be x itself (in place) but may not partly overlap any input.
struct RmsNormArgs {
  int64_t rows = 0;
  int64_t hidden = 0;  // a multiple of 16 bytes' elements; at most 16 vectors per thread of 256
  const void* x = nullptr;
  int64_t x_stride = 0;
  void* residual = nullptr;  // spec.residual: read, and overwritten with x + residual
  int64_t residual_stride = 0;
  const void* weight = nullptr;  // [hidden]
  double norm_eps = 1e-6;
  void* out = nullptr;
  int64_t out_stride = 0;
  void* stream = nullptr;
};

void rms_norm(const RmsNormSpec& spec, const RmsNormArgs& args);
// Compiles the key's kernels for `arch` (every row length it takes; no GPU needed).
std::vector<std::string> precompile(const RmsNormSpec& spec, const std::string& arch);

// ---------------------------------------------------------------------------------------
// MLA: multi-head latent attention's step around RoPE (DeepSeek-V2/V3, Kimi K2), one launch.
// ---------------------------------------------------------------------------------------

// Per token t, at position p = args.position_ids[t]:
//   cache[slots[t]] = [ RMSNorm(kv_c[t]) · w (kv_rank) ‖ rope(k_pe[t], p) (rope_dim) ]
//       in the dtype, or as e4m3 codes of value / *cache_scale; a slot of -1 is padding (not
//       written), one outside the cache is skipped and counted;
//   q: rope(q_pe[t, h], p) for every head h, in place (query in_place), or
//       q_out[t, h] = [ q_nope[t, h] (kv_rank) ‖ rope(q_pe[t, h], p) (rope_dim) ] (assemble: the
//       decode query of an absorbed MLA, q_nope the caller's q·W_UK), in the dtype or as e4m3
//       codes of value / *q_scale.
// The rotation reads cos/sin rows [table_rows][rope_dim / 2] (half width) by position; pairs as
// `style` (DeepSeek's reference rotates interleaved pairs: gptj). fp32 arithmetic, each output
// rounded once; a position outside the table writes NaN into that token's rotated parts.
enum class MlaQuery : int32_t { in_place = 0, assemble = 1 };
const char* to_string(MlaQuery v);

struct MlaSpec {
  DType dtype = DType::bf16;  // bf16 or f16: kv_c, k_pe, q_pe, q_nope, weight, cache, q_out
  int32_t kv_rank = 512;      // kv_lora_rank: a multiple of 8 in [8, 4096]
  int32_t rope_dim = 64;      // qk_rope_head_dim: even, in [2, 512]
  Style style = Style::gptj;
  IndexType index_type = IndexType::i64;  // position_ids
  DType table_dtype = DType::f32;         // cos/sin
  Norm norm = Norm::rms;                  // none or rms (kv_a_layernorm over kv_c)
  Store cache_store = Store::same;        // same or e4m3 (per-tensor scale)
  MlaQuery query = MlaQuery::in_place;
  Store q_store = Store::same;  // same, or e4m3 with query assemble
  // e4m3 stores hold the code of value × scale (FlashInfer's quant_scale) instead of value /
  // scale (vLLM's); needs an e4m3 cache_store or q_store. Key suffix _smul.
  bool scale_multiplies = false;

  void validate() const;
  MlaSpec canonical() const;
  // mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip,
  // mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qasm-e4m3
  std::string key() const;

  friend bool operator==(const MlaSpec& a, const MlaSpec& b) {
    return a.dtype == b.dtype && a.kv_rank == b.kv_rank && a.rope_dim == b.rope_dim &&
           a.style == b.style && a.index_type == b.index_type && a.table_dtype == b.table_dtype &&
           a.norm == b.norm && a.cache_store == b.cache_store && a.query == b.query &&
           a.q_store == b.q_store && a.scale_multiplies == b.scale_multiplies;
  }
  friend bool operator!=(const MlaSpec& a, const MlaSpec& b) { return !(a == b); }
};

MlaSpec parse_mla_key(const std::string& key);

// Strides in elements (0: the row's own width); rows 16-byte aligned (kv_c, q_nope, q_out's
// heads, cache rows: 8 bytes for e4m3). A tensor the call does not use may be null.
struct MlaArgs {
  int64_t tokens = 0;
  int64_t heads = 0;           // q heads (0: no query work)
  const void* kv_c = nullptr;  // [tokens][kv_rank]
  int64_t kv_c_stride = 0;
  const void* k_pe = nullptr;  // [tokens][rope_dim]
  int64_t k_pe_stride = 0;
  const void* norm_weight = nullptr;  // [kv_rank], norm rms
  double norm_eps = 1e-6;
  void* cache = nullptr;  // [cache_slots][kv_rank + rope_dim], rows cache_stride apart
  int64_t cache_slots = 0;
  int64_t cache_stride = 0;
  const int64_t* slots = nullptr;      // [tokens]: the cache row of each token, -1 padding
  const float* cache_scale = nullptr;  // cache_store e4m3: device scalar
  int32_t* skipped = nullptr;          // optional device counter: + tokens whose slot is outside
  void* q_pe = nullptr;  // [tokens][heads][rope_dim]: rotated in place, or read (assemble)
  int64_t q_pe_token_stride = 0, q_pe_head_stride = 0;  // 0: heads * rope_dim, rope_dim
  const void* q_nope = nullptr;                         // assemble: [tokens][heads][kv_rank]
  int64_t q_nope_token_stride = 0, q_nope_head_stride = 0;
  void* q_out = nullptr;  // assemble: [tokens][heads][kv_rank + rope_dim]
  int64_t q_out_token_stride = 0, q_out_head_stride = 0;
  const float* q_scale = nullptr;      // q_store e4m3: device scalar
  const void* position_ids = nullptr;  // [tokens], index_type
  const void* cos = nullptr;           // [table_rows][rope_dim / 2], table_dtype
  const void* sin = nullptr;
  int64_t table_rows = 0;
  int64_t table_stride = 0;  // elements between rows (0: rope_dim / 2)
  void* stream = nullptr;
  // rope(k_pe) in the dtype for every token, padding and skipped slots included; k_pe itself
  // rotates it in place (vLLM's fused op). Needs the cache: the cache rows' warps compute it.
  void* k_pe_out = nullptr;
  int64_t k_pe_out_stride = 0;  // 0: rope_dim
  // The rows' rope part in a cache of its own, [cache_slots][rope_dim] rows cache_pe_stride
  // apart, same slots and store (FlashInfer's kpe_cache); `cache` then holds kv_rank a row.
  void* cache_pe = nullptr;
  int64_t cache_pe_stride = 0;  // 0: rope_dim
  // Cache addressing, one of three: `slots`; token t's row is t (rows_by_token: outputs that
  // are one row a token, FlashInfer's mla_rope_quantize_fp8; cache_slots >= tokens); or a page
  // table (FlashInfer's append): slot = kv_indices[kv_indptr[b] + p / page_size] * page_size + p %
  // page_size for b = batch_indices[t], p = page_positions[t]. A batch index outside [0, batch) is
  // padding; a page past the request's own entries (kv_indptr[b + 1]) or a slot outside the cache
  // is skipped and counted.
  bool rows_by_token = false;
  const int32_t* kv_indices = nullptr;      // [num_indices]
  const int32_t* kv_indptr = nullptr;       // [batch + 1]
  const int32_t* batch_indices = nullptr;   // [tokens]
  const int32_t* page_positions = nullptr;  // [tokens]
  int64_t batch = 0, num_indices = 0, page_size = 0;
  // assemble: the query's rope part in a tensor of its own, [tokens][heads][rope_dim] in q_out's
  // store (FlashInfer's q_rope_out); q_out then holds kv_rank a head. 0 strides: heads *
  // rope_dim, rope_dim.
  void* q_out_pe = nullptr;
  int64_t q_out_pe_token_stride = 0, q_out_pe_head_stride = 0;
  // Blocks whose rows are not one stride apart throughout (vLLM's per-layer view of a cache
  // allocated for all layers): slot s is row s % cache_block_size of block s /
  // cache_block_size, blocks cache_block_stride elements apart (cache_pe's:
  // cache_pe_block_stride; 0: the block's rows), rows cache_stride apart within one.
  // cache_block_size 0: rows one stride apart.
  int64_t cache_block_size = 0;
  int64_t cache_block_stride = 0, cache_pe_block_stride = 0;
};

void mla_prepare(const MlaSpec& spec, const MlaArgs& args);
// Compiles the key's kernel for `arch` (no GPU needed); returns the cache files.
std::vector<std::string> precompile(const MlaSpec& spec, const std::string& arch);

// ---------------------------------------------------------------------------------------
// Frequencies and cos/sin tables on the host, in float64 (no GPU).
// ---------------------------------------------------------------------------------------

// Radians per position of each rotary pair i < rotary_dim / 2 for `freqs` (any value but table):
// base^(-2i/R), or the scaling variant's frequencies for `scaling` (dynamic_ntk and longrope
// read scaling.seq_len). Throws Error naming the first invalid parameter.
std::vector<double> inverse_frequencies(Freqs freqs, int32_t rotary_dim, double base,
                                        const RopeScaling& scaling);
// What cos and sin are multiplied by: yarn's and longrope's attention factor, else 1.
double attention_factor(Freqs freqs, int32_t rotary_dim, const RopeScaling& scaling);

// What a table holds: the angles of a frequency variant at positions 0 .. rows - 1.
struct TableSpec {
  Freqs freqs = Freqs::computed;  // any value but table
  double base = 10000.0;
  RopeScaling scaling;
  int64_t rows = 0;        // positions 0 .. rows - 1
  int64_t row_stride = 0;  // elements between rows; 0: the row width
};

// Fills host cos and sin tables for a table key (spec.freqs == Freqs::table): rows of R/2 (half)
// or R (full; neox repeats the R/2 values, gptj repeats each one) values of spec.table_dtype,
// each cos(p θ_i) or sin(p θ_i) times the attention factor, computed in float64 and rounded once.
// cos and sin each need (rows - 1) * stride + width elements; elements between rows are left
// as they were. Throws Error, writing nothing, when an argument is invalid.
void build_tables(const Spec& spec, const TableSpec& table, void* cos, void* sin);

// ---------------------------------------------------------------------------------------
// Models described by their Hugging Face config.json.
// ---------------------------------------------------------------------------------------

// A model's RoPE as its config.json describes it (the text model's part of a multimodal
// config): its fields.
struct ModelRopeFields {
  std::string model_type;  // "llama", "qwen2_vl", ... (the text config's)
  int32_t head_dim = 0;    // q/k head size
  int32_t rotary_dim = 0;  // rotated elements per head
  // First rotated element of a head: 0, or DeepSeek MLA's qk_nope_head_dim, whose rotary part is
  // the tail of each q head (and a k head of its own, shared by all heads: kv_heads is 1).
  int32_t rotary_offset = 0;
  int32_t q_heads = 0;
  int32_t kv_heads = 0;
  Style style = Style::neox;
  double base = 10000.0;                  // rope_theta
  Freqs freqs = Freqs::computed;          // from rope_type
  RopeScaling scaling;                    // its seq_len is 0: set it per call
  std::vector<double> short_factor;       // longrope (scaling points here)
  std::vector<double> long_factor;        // longrope
  bool mrope = false;                     // Positions::mrope with these sections
  int32_t mrope_section[3] = {0, 0, 0};   // rotary pairs per position row
  bool mrope_interleaved = false;         // Qwen3-VL
  int64_t max_positions = 0;              // max_position_embeddings (0: not given)
  Norm norm = Norm::none;                 // QK-norm before RoPE
  double norm_eps = 1e-6;                 // rms_norm_eps
  double local_base = 0;                  // Gemma 3's sliding-window layers: their own base,
                                          // unscaled (0: every layer uses `base` and `freqs`)
  double softmax_scale_multiplier = 1.0;  // DeepSeek yarn: mscale(mscale_all_dim)^2, applied by
                                          // the attention, not by RoPE
  int32_t kv_lora_rank = 0;               // MLA (DeepSeek, Kimi K2): the compressed kv's rank,
                                          // kv_lora_rank; 0 for other attention
  std::string style_reason;               // why `style` (for humans)
};

// The same, with copies and moves that keep scaling.short_factor / long_factor pointing at the
// object's own arrays: every field is copied as the compiler copies it, then the two pointers
// are set again.
struct ModelRope : ModelRopeFields {
  ModelRope() = default;
  ModelRope(const ModelRope& other) : ModelRopeFields(other) { own_factors(); }
  ModelRope(ModelRope&& other) noexcept : ModelRopeFields(std::move(other)) { own_factors(); }
  ModelRope& operator=(const ModelRope& other) {
    ModelRopeFields::operator=(other);
    own_factors();
    return *this;
  }
  ModelRope& operator=(ModelRope&& other) noexcept {
    ModelRopeFields::operator=(std::move(other));
    own_factors();
    return *this;
  }

 private:
  void own_factors() {
    scaling.short_factor = short_factor.empty() ? nullptr : short_factor.data();
    scaling.long_factor = long_factor.empty() ? nullptr : long_factor.data();
    scaling.factor_count = int64_t(std::min(short_factor.size(), long_factor.size()));
  }
};

// Parses config.json text / reads a config.json file (a regular file of at most 4 MiB; nesting
// deeper than 64 is refused before parsing). Throws Error naming the field and its value for a
// missing or ill-typed field or an unknown rope_type.
ModelRope model_from_hf_config(const std::string& json_text);
ModelRope model_from_hf_config_file(const std::string& path);

// The key a model's attention calls: its head_dim (the rotary part alone when rotary_offset > 0),
// rotary_dim, style, frequencies, position ids (mRoPE's three rows for mRoPE models) and QK-norm,
// in `dtype` and `layout`, in place and forward.
Spec spec_from_model(const ModelRope& model, DType dtype, Layout layout = Layout::bshd);
// Args with the model's base, scaling (pointing into `model`, which must outlive them), mRoPE
// sections and norm eps set; tensors, positions and sizes are the caller's.
Args args_from_model(const ModelRope& model);

}  // namespace ropejit
