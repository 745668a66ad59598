// The bad-input table: every kind of invalid call, through the C++ and the C API. Each row is
// an input, the error code it must get, a substring of the message (which names the argument
// and its value), and the check that nothing was written: all buffers of the call are host
// memory holding a known pattern, compared byte for byte afterwards. Validation comes before
// any GPU work, so the table runs without a GPU; a valid control call shows the harness would
// see a call that gets past validation.
#include <doctest/doctest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"

using namespace ropejit;

namespace {

constexpr int64_t kBatch = 2, kSeq = 3, kQHeads = 4, kKHeads = 2, kDim = 128, kRows = 16;

// Host buffers standing in for device memory, each filled with its own byte pattern.
struct Buffers {
  std::vector<uint8_t> q, k, q_out, k_out, cos, sin, ids, seqoff, cu;
  std::vector<uint8_t> v, weights, cache_k, cache_v, pages, skipped, scales;
  Buffers() {
    const std::pair<std::vector<uint8_t>*, size_t> all[] = {
        {&q, kBatch * kSeq * kQHeads * kDim * 2},
        {&k, kBatch * kSeq * kKHeads * kDim * 2},
        {&q_out, kBatch * kSeq * kQHeads * kDim * 2},
        {&k_out, kBatch * kSeq * kKHeads * kDim * 2},
        {&cos, kRows * kDim / 2 * 4},
        {&sin, kRows * kDim / 2 * 4},
        {&ids, kBatch * kSeq * 8},
        {&seqoff, kBatch * 8},
        {&cu, (kBatch + 1) * 4},
        {&v, kBatch * kSeq * kKHeads * kDim * 2},
        {&weights, kDim * 2},
        {&cache_k, 8 * 16 * kKHeads * kDim * 2},
        {&cache_v, 8 * 16 * kKHeads * kDim * 2},
        {&pages, 64},
        {&skipped, 4},
        {&scales, 4096}};
    uint8_t fill = 0x11;
    for (const auto& [buffer, bytes] : all) {
      buffer->assign(bytes + 64, fill);  // 64 spare bytes: room for misaligned views
      fill = uint8_t(fill + 0x22);
    }
    // Valid index data, in case a row wants it read (nothing may read it on the host).
    for (int i = 0; i < kBatch * kSeq; ++i) std::memcpy(&ids[size_t(i) * 8], &i, 4);
  }
  std::vector<const std::vector<uint8_t>*> all() const {
    return {&q,  &k, &q_out,   &k_out,   &cos,     &sin,   &ids,    &seqoff,
            &cu, &v, &weights, &cache_k, &cache_v, &pages, &skipped};
  }
};

// A valid call: bshd bf16 d128, 4 q heads and 2 k heads, 2 x 3 tokens, f32 half-width table.
struct Call {
  Spec spec;
  Args args;
  explicit Call(Buffers& b) {
    args.batch = kBatch;
    args.seq_len = kSeq;
    args.q = contiguous(Layout::bshd, b.q.data(), kBatch, kSeq, kQHeads, kDim);
    args.k = contiguous(Layout::bshd, b.k.data(), kBatch, kSeq, kKHeads, kDim);
    args.cos = b.cos.data();
    args.sin = b.sin.data();
    args.table_rows = kRows;
    args.seq_offsets = b.seqoff.data();
    args.position_ids = b.ids.data();
    args.cu_seqlens = reinterpret_cast<const int32_t*>(b.cu.data());
  }
  // A valid fused call: QK-norm, RoPE, and k and v appended to a paged cache of 8 pages of 16
  // tokens (NHD).
  void fused(Buffers& b) {
    spec.norm = Norm::rms;
    spec.cache = KvCache::paged;
    args.v = contiguous(Layout::bshd, b.v.data(), kBatch, kSeq, kKHeads, kDim);
    args.q_norm_weight = b.weights.data();
    args.k_norm_weight = b.weights.data();
    KvCacheArgs& c = args.cache;
    c.k = b.cache_k.data();
    c.v = b.cache_v.data();
    c.pages = 8;
    c.page_size = 16;
    c.stride_page = 16 * kKHeads * kDim;
    c.stride_slot = kKHeads * kDim;
    c.stride_head = kDim;
    c.indptr = reinterpret_cast<const int32_t*>(b.pages.data());
    c.indices = reinterpret_cast<const int32_t*>(b.pages.data() + 16);
    c.last_page_len = reinterpret_cast<const int32_t*>(b.pages.data() + 32);
    c.num_indices = 2;
    c.slot_mapping = reinterpret_cast<const int64_t*>(b.pages.data());
    c.seq_lens = reinterpret_cast<const int32_t*>(b.pages.data() + 48);
    c.skipped = reinterpret_cast<int32_t*>(b.skipped.data());
  }
  void out_of_place(Buffers& b) {
    spec.in_place = false;
    args.q_out = contiguous(Layout::bshd, b.q_out.data(), kBatch, kSeq, kQHeads, kDim);
    args.k_out = contiguous(Layout::bshd, b.k_out.data(), kBatch, kSeq, kKHeads, kDim);
  }
  // FP8 outputs and cache with dynamic scales, every scale tensor valid (in `scales`).
  void dynamic(Buffers& b) {
    out_of_place(b);
    spec.out_store = Store::e4m3_dynamic;
    spec.cache_store = Store::e4m3_dynamic;
    uint8_t* s = b.scales.data();
    args.q_out_scale = contiguous(Layout::bshd, s, kBatch, kSeq, kQHeads, 1);
    args.k_out_scale = contiguous(Layout::bshd, s + 1024, kBatch, kSeq, kKHeads, 1);
    KvCacheArgs& c = args.cache;
    c.k_scales = reinterpret_cast<float*>(s + 2048);
    c.v_scales = reinterpret_cast<float*>(s + 3072);
    c.scale_stride_page = 16 * kKHeads;
    c.scale_stride_slot = kKHeads;
    c.scale_stride_head = 1;
  }
};

struct Row {
  std::string name;
  std::function<void(Call&, Buffers&)> edit;
  const char* message;  // must appear in the error's message
  ErrorCode code = ErrorCode::invalid_argument;
};

void* shifted(void* p, int64_t bytes) { return static_cast<uint8_t*>(p) + bytes; }

std::vector<Row> cpp_rows() {
  std::vector<Row> rows;
  auto add = [&](std::string name, std::function<void(Call&, Buffers&)> edit, const char* message) {
    rows.push_back({std::move(name), std::move(edit), message});
  };
  // --- the spec
  for (int32_t d : {0, -2, 7, 514, 1 << 30})
    add(
        "head_dim " + std::to_string(d), [d](Call& c, Buffers&) { c.spec.head_dim = d; },
        "must be even and in [2, 512]");
  for (int32_t r : {130, 3, -4, 129})
    add(
        "rotary_dim " + std::to_string(r), [r](Call& c, Buffers&) { c.spec.rotary_dim = r; },
        "must be even and <= head_dim (128)");
  add(
      "layout 9", [](Call& c, Buffers&) { c.spec.layout = Layout(9); },
      "spec.layout (9) is not a known value");
  add(
      "dtype 7", [](Call& c, Buffers&) { c.spec.dtype = DType(7); },
      "spec.dtype (7) is not a known value");
  add(
      "style -1", [](Call& c, Buffers&) { c.spec.style = Style(-1); },
      "spec.style (-1) is not a known value");
  add(
      "positions 4", [](Call& c, Buffers&) { c.spec.positions = Positions(4); },
      "spec.positions (4)");
  add(
      "index_type 3", [](Call& c, Buffers&) { c.spec.index_type = IndexType(3); },
      "spec.index_type (3)");
  add(
      "freqs 7", [](Call& c, Buffers&) { c.spec.freqs = Freqs(7); }, "spec.freqs (7)");
  add(
      "table_dtype 9", [](Call& c, Buffers&) { c.spec.table_dtype = DType(9); },
      "spec.table_dtype (9)");
  add(
      "table_width 2", [](Call& c, Buffers&) { c.spec.table_width = TableWidth(2); },
      "spec.table_width (2)");
  add(
      "direction 2", [](Call& c, Buffers&) { c.spec.direction = Direction(2); },
      "spec.direction (2)");
  add(
      "fusion 2", [](Call& c, Buffers&) { c.spec.fusion = Fusion(2); }, "spec.fusion (2)");
  add(
      "norm 4", [](Call& c, Buffers&) { c.spec.norm = Norm(4); }, "spec.norm (4)");
  add(
      "out_store 3", [](Call& c, Buffers&) { c.spec.out_store = Store(3); }, "spec.out_store (3)");
  add(
      "cache -1", [](Call& c, Buffers&) { c.spec.cache = KvCache(-1); }, "spec.cache (-1)");
  add(
      "cache_store 5", [](Call& c, Buffers&) { c.spec.cache_store = Store(5); },
      "spec.cache_store (5)");
  add(
      "k only to a cache that is not there", [](Call& c, Buffers&) { c.spec.fusion = Fusion::q; },
      "spec.fusion (q) writes k only into the KV cache, but spec.cache is none");
  add(
      "e4m3 outputs in place", [](Call& c, Buffers&) { c.spec.out_store = Store::e4m3; },
      "spec.out_store (e4m3) needs spec.in_place = false");
  add(
      "e4m3 cache without a cache", [](Call& c, Buffers&) { c.spec.cache_store = Store::e4m3; },
      "spec.cache_store (e4m3) needs a KV cache");
  add(
      "fused backward",
      [](Call& c, Buffers&) {
        c.spec.norm = Norm::rms;
        c.spec.direction = Direction::backward;
      },
      "spec.direction (bwd) is for plain RoPE gradients");
  // --- sizes
  add(
      "batch 0", [](Call& c, Buffers&) { c.args.batch = 0; }, "args.batch (0) must be >= 1");
  add(
      "batch -1", [](Call& c, Buffers&) { c.args.batch = -1; }, "args.batch (-1) must be >= 1");
  add(
      "seq_len -1", [](Call& c, Buffers&) { c.args.seq_len = -1; },
      "args.seq_len (-1) must be >= 0");
  add(
      "batch x seq overflows",
      [](Call& c, Buffers&) { c.args.batch = c.args.seq_len = int64_t(1) << 40; }, "overflows");
  add(
      "2^31 tokens",
      [](Call& c, Buffers&) {
        c.args.batch = 1;
        c.args.seq_len = int64_t(1) << 31;
      },
      "token count (2147483648) exceeds 2147483647");
  add(
      "thd batch -1",
      [](Call& c, Buffers&) {
        c.spec.layout = Layout::thd;
        c.args.batch = -1;
      },
      "args.batch (-1) must be >= 0");
  for (int64_t h : {int64_t(0), int64_t(-1), int64_t(1) << 31, int64_t(1) << 40})
    add(
        "q.heads " + std::to_string(h), [h](Call& c, Buffers&) { c.args.q.heads = h; },
        "must be in [1, 2^29]");
  add(
      "k.heads 2^31", [](Call& c, Buffers&) { c.args.k.heads = int64_t(1) << 31; },
      "args.k.heads (2147483648) must be in [1, 2^29]");
  add(
      "k.heads 0 with k.data", [](Call& c, Buffers&) { c.args.k.heads = 0; },
      "args.k.heads (0) must be in [1, 2^29]");
  add(
      "k.heads without k.data", [](Call& c, Buffers&) { c.args.k.data = nullptr; },
      "args.k.heads (2) is set but args.k.data is null");
  // --- each operand's pointer, heads and strides (out of place, so all four exist)
  struct Member {
    const char* name;
    Tensor Args::*tensor;
  };
  for (const Member m : {Member{"args.q", &Args::q}, Member{"args.k", &Args::k},
                         Member{"args.q_out", &Args::q_out}, Member{"args.k_out", &Args::k_out}}) {
    const std::string n = m.name;
    const auto ptr = m.tensor;
    if (n != "args.k")  // a null k is a call without k (tested above)
      add(
          n + ".data null",
          [ptr](Call& c, Buffers& b) {
            c.out_of_place(b);
            (c.args.*ptr).data = nullptr;
          },
          ".data is null");
    add(
        n + ".data misaligned",
        [ptr](Call& c, Buffers& b) {
          c.out_of_place(b);
          (c.args.*ptr).data = shifted((c.args.*ptr).data, 1);
        },
        "is not aligned to its 2-byte elements");
    add(
        n + ".heads off by one",
        [ptr](Call& c, Buffers& b) {
          c.out_of_place(b);
          if (&(c.args.*ptr) == &c.args.k)
            c.args.k_out.heads += 1;
          else
            (c.args.*ptr).heads += 1;
        },
        ".heads (");
    for (const auto& [field, label] : {std::pair{&Tensor::stride_seq, "stride_seq"},
                                       std::pair{&Tensor::stride_head, "stride_head"},
                                       std::pair{&Tensor::stride_batch, "stride_batch"}}) {
      const auto f = field;
      add(
          n + "." + label + " -8",
          [ptr, f](Call& c, Buffers& b) {
            c.out_of_place(b);
            (c.args.*ptr).*f = -8;
          },
          "(-8) must be >= 0");
      add(
          n + "." + label + " huge",
          [ptr, f](Call& c, Buffers& b) {
            c.out_of_place(b);
            (c.args.*ptr).*f = INT64_MAX / 2;
          },
          "overflows 64-bit");
    }
  }
  // Rows of written operands must not overlap: in place q and k, out of place the outputs.
  for (const Member m : {Member{"args.q", &Args::q}, Member{"args.k", &Args::k}})
    add(
        std::string(m.name) + " rows overlap in place",
        [ptr = m.tensor](Call& c, Buffers&) { (c.args.*ptr).stride_head = 64; },
        "stride_head (64) makes rows overlap (needs >= 128)");
  for (const Member m : {Member{"args.q_out", &Args::q_out}, Member{"args.k_out", &Args::k_out}})
    add(
        std::string(m.name) + " rows overlap",
        [ptr = m.tensor](Call& c, Buffers& b) {
          c.out_of_place(b);
          (c.args.*ptr).stride_seq = 100;
        },
        "makes rows overlap");
  // --- operands sharing memory
  add(
      "in place: k is q",
      [](Call& c, Buffers&) {
        c.args.k = c.args.q;
        c.args.k.heads = kKHeads;
      },
      "args.q and args.k overlap in memory");
  add(
      "in place: k two elements into q",
      [](Call& c, Buffers&) {
        c.args.k = c.args.q;
        c.args.k.heads = kKHeads;
        c.args.k.data = shifted(c.args.q.data, 4);
      },
      "args.q and args.k overlap in memory");
  add(
      "in place: k is q's last heads",
      [](Call& c, Buffers&) {
        c.args.k = c.args.q;
        c.args.k.heads = kKHeads;
        c.args.k.data = shifted(c.args.q.data, 2 * kDim * 2);  // heads 2, 3 of q
      },
      "args.q and args.k overlap in memory");
  add(
      "out of place: q_out is q",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.args.q_out = c.args.q;
      },
      "args.q and args.q_out overlap in memory");
  add(
      "out of place: k_out is k",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.args.k_out = c.args.k;
      },
      "args.k and args.k_out overlap in memory");
  add(
      "out of place: q_out is k's memory",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.args.q_out.data = c.args.k.data;
      },
      "args.k and args.q_out overlap in memory");
  add(
      "out of place: k_out inside q_out",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.args.k_out.data = shifted(c.args.q_out.data, 2 * kDim * 2 + 2);
      },
      "args.q_out and args.k_out overlap in memory");
  add(
      "in place: q over the cos table",
      [](Call& c, Buffers&) { c.args.cos = static_cast<const uint8_t*>(c.args.q.data) + 64; },
      "args.q and args.cos overlap in memory");
  add(
      "out of place: k_out over the position ids",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.spec.positions = Positions::ids;
        c.args.position_ids = c.args.k_out.data;
      },
      "args.k_out and args.position_ids overlap in memory");
  add(
      "thd: q over cu_seqlens",
      [](Call& c, Buffers&) {
        c.spec.layout = Layout::thd;
        c.args.q = contiguous(Layout::thd, c.args.q.data, 0, kBatch * kSeq, kQHeads, kDim);
        c.args.k = contiguous(Layout::thd, c.args.k.data, 0, kBatch * kSeq, kKHeads, kDim);
        c.args.seq_len = kBatch * kSeq;
        c.args.cu_seqlens = static_cast<const int32_t*>(c.args.k.data) + 100;
      },
      "args.k and args.cu_seqlens overlap in memory");
  add(
      "in place with q_out set", [](Call& c, Buffers& b) { c.args.q_out.data = b.q_out.data(); },
      "args.q_out.data is set but spec.in_place is true");
  add(
      "in place with k_out set", [](Call& c, Buffers& b) { c.args.k_out.data = b.k_out.data(); },
      "args.k_out.data is set but spec.in_place is true");
  add(
      "k_out without k",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.args.k = Tensor{};
      },
      "args.k_out.data is set but args.k.data is null");
  add(
      "gptj with odd element pointers",
      [](Call& c, Buffers&) {
        c.spec.style = Style::gptj;
        c.args.q.data = shifted(c.args.q.data, 2);
      },
      "gptj needs q/k pointers and strides aligned to a pair of elements (4 bytes)");
  // --- positions
  add(
      "thd without cu_seqlens",
      [](Call& c, Buffers&) {
        c.spec.layout = Layout::thd;
        c.args.cu_seqlens = nullptr;
      },
      "args.cu_seqlens is null but layout thd needs it");
  add(
      "thd cu_seqlens misaligned",
      [](Call& c, Buffers& b) {
        c.spec.layout = Layout::thd;
        c.args.cu_seqlens = reinterpret_cast<const int32_t*>(b.cu.data() + 2);
      },
      "is not 4-byte aligned");
  add(
      "thd without sequences",
      [](Call& c, Buffers&) {
        c.spec.layout = Layout::thd;
        c.args.batch = 0;
      },
      "args.batch (0) must be >= 1 with cu_seqlens");
  add(
      "seqoff null",
      [](Call& c, Buffers&) {
        c.spec.positions = Positions::seq_offsets;
        c.args.seq_offsets = nullptr;
      },
      "args.seq_offsets is null but positions is seqoff");
  add(
      "seqoff i64 misaligned",
      [](Call& c, Buffers& b) {
        c.spec.positions = Positions::seq_offsets;
        c.args.seq_offsets = b.seqoff.data() + 4;
      },
      "is not aligned to its 8-byte elements");
  add(
      "ids null",
      [](Call& c, Buffers&) {
        c.spec.positions = Positions::ids;
        c.args.position_ids = nullptr;
      },
      "args.position_ids is null but positions is ids");
  add(
      "ids i64 misaligned",
      [](Call& c, Buffers& b) {
        c.spec.positions = Positions::ids;
        c.args.position_ids = b.ids.data() + 4;
      },
      "is not aligned to its 8-byte elements");
  add(
      "ids i32 misaligned",
      [](Call& c, Buffers& b) {
        c.spec.positions = Positions::ids;
        c.spec.index_type = IndexType::i32;
        c.args.position_ids = b.ids.data() + 2;
      },
      "is not aligned to its 4-byte elements");
  add(
      "position_offset -1", [](Call& c, Buffers&) { c.args.position_offset = -1; },
      "args.position_offset (-1) must be >= 0");
  add(
      "position_offset INT64_MAX, computed",
      [](Call& c, Buffers&) {
        c.spec.freqs = Freqs::computed;
        c.args.position_offset = INT64_MAX;
      },
      "args.position_offset (9223372036854775807) + 6 tokens exceeds the largest position (2^62)");
  add(
      "position_offset INT64_MAX, table",
      [](Call& c, Buffers&) { c.args.position_offset = INT64_MAX; },
      "args.position_offset (9223372036854775807) + 6 tokens exceeds");
  add(
      "positions beyond the table", [](Call& c, Buffers&) { c.args.position_offset = 14; },
      "positions up to 16 (position_offset 14 + seq_len 3 - 1) are beyond the table (table_rows "
      "16)");
  // --- tables
  add(
      "cos null", [](Call& c, Buffers&) { c.args.cos = nullptr; },
      "args.cos is null but freqs is tab");
  add(
      "sin null", [](Call& c, Buffers&) { c.args.sin = nullptr; },
      "args.sin is null but freqs is tab");
  add(
      "cos misaligned", [](Call& c, Buffers& b) { c.args.cos = b.cos.data() + 2; },
      "is not aligned to its 4-byte elements");
  add(
      "sin misaligned", [](Call& c, Buffers& b) { c.args.sin = b.sin.data() + 1; },
      "is not aligned to its 4-byte elements");
  add(
      "f16 table misaligned",
      [](Call& c, Buffers& b) {
        c.spec.table_dtype = DType::f16;
        c.args.cos = b.cos.data() + 1;
      },
      "is not aligned to its 2-byte elements");
  for (int64_t n : {int64_t(0), int64_t(-1)})
    add(
        "table_rows " + std::to_string(n), [n](Call& c, Buffers&) { c.args.table_rows = n; },
        "must be >= 1");
  add(
      "table_stride below the row", [](Call& c, Buffers&) { c.args.table_stride = 32; },
      "args.table_stride (32) is smaller than the row width (64)");
  add(
      "full table_stride below the row",
      [](Call& c, Buffers&) {
        c.spec.table_width = TableWidth::full;
        c.args.table_stride = 64;
      },
      "args.table_stride (64) is smaller than the row width (128)");
  add(
      "table_stride negative", [](Call& c, Buffers&) { c.args.table_stride = -64; },
      "args.table_stride (-64) is smaller");
  add(
      "table rows x stride overflows",
      [](Call& c, Buffers&) {
        c.args.table_rows = int64_t(1) << 40;
        c.args.table_stride = int64_t(1) << 40;
      },
      "* table_stride overflows");
  // --- computed frequencies
  for (double base : {1.0, 0.5, -2.0, 0.0, double(NAN), double(INFINITY)})
    add(
        "base " + std::to_string(base),
        [base](Call& c, Buffers&) {
          c.spec.freqs = Freqs::computed;
          c.args.base = base;
        },
        "must be a finite number > 1");
  // --- scaled frequencies and mRoPE
  add(
      "yarn factor 0",
      [](Call& c, Buffers&) {
        c.spec.freqs = Freqs::yarn;
        c.args.scaling.factor = 0;
        c.args.scaling.original_max_positions = 4096;
      },
      "args.scaling.factor (0) must be > 0");
  add(
      "llama3 without original positions",
      [](Call& c, Buffers&) {
        c.spec.freqs = Freqs::llama3;
        c.args.scaling.factor = 8;
      },
      "args.scaling.original_max_positions (0)");
  add(
      "longrope without factors",
      [](Call& c, Buffers&) {
        c.spec.freqs = Freqs::longrope;
        c.args.scaling.original_max_positions = 4096;
      },
      "short_factor");
  add(
      "mrope sections that do not add up",
      [](Call& c, Buffers&) {
        c.spec.positions = Positions::mrope;
        c.args.mrope_section[0] = 16;
        c.args.mrope_section[1] = 16;
        c.args.mrope_section[2] = 16;
      },
      "sum to rotary_dim / 2");
  add(
      "mrope without ids",
      [](Call& c, Buffers&) {
        c.spec.positions = Positions::mrope;
        c.args.position_ids = nullptr;
      },
      "args.position_ids is null but positions is mrope");
  // --- fused calls (Call::fused is valid; each row breaks one thing)
  auto fused = [&](std::string name, std::function<void(Call&, Buffers&)> edit,
                   const char* message) {
    add(
        "fused: " + name,
        [edit](Call& c, Buffers& b) {
          c.fused(b);
          edit(c, b);
        },
        message);
  };
  fused(
      "cache without k",
      [](Call& c, Buffers&) {
        c.args.k = Tensor{};
        c.args.v = Tensor{};
        c.args.cache.v = nullptr;
      },
      "args.k.data is null but spec.cache is paged");
  fused(
      "v without a cache", [](Call& c, Buffers&) { c.spec.cache = KvCache::none; },
      "args.v.data is set but spec.cache is none");
  fused(
      "v heads without v", [](Call& c, Buffers&) { c.args.v.data = nullptr; },
      "args.v.heads (2) is set but args.v.data is null");
  fused(
      "v heads unlike k", [](Call& c, Buffers&) { c.args.v.heads = 1; },
      "args.v.heads (1) must be 2");
  fused(
      "cache.k null", [](Call& c, Buffers&) { c.args.cache.k = nullptr; },
      "args.cache.k.data is null");
  fused(
      "cache.v null with v", [](Call& c, Buffers&) { c.args.cache.v = nullptr; },
      "args.cache.v is null but args.v is given");
  fused(
      "cache.v without v", [](Call& c, Buffers&) { c.args.v = Tensor{}; },
      "args.cache.v is set but args.v.data is null");
  fused(
      "no pages", [](Call& c, Buffers&) { c.args.cache.pages = 0; },
      "args.cache.pages (0) must be >= 1");
  fused(
      "page_size 0", [](Call& c, Buffers&) { c.args.cache.page_size = 0; },
      "args.cache.page_size (0) must be >= 1");
  fused(
      "cache rows overlap", [](Call& c, Buffers&) { c.args.cache.stride_slot = 64; },
      "args.cache.k.stride_slot (64) makes rows overlap");
  fused(
      "cache stride negative", [](Call& c, Buffers&) { c.args.cache.stride_page = -1; },
      "args.cache.k.stride_page (-1) must be >= 0");
  fused(
      "cache is q", [](Call& c, Buffers& b) { c.args.cache.k = b.q.data(); }, "overlap in memory");
  fused(
      "v cache is the k cache", [](Call& c, Buffers&) { c.args.cache.v = c.args.cache.k; },
      "args.cache.k and args.cache.v overlap in memory");
  fused(
      "indptr null", [](Call& c, Buffers&) { c.args.cache.indptr = nullptr; },
      "args.cache.indptr is null but spec.cache is paged");
  fused(
      "indices misaligned",
      [](Call& c, Buffers& b) {
        c.args.cache.indices = reinterpret_cast<const int32_t*>(b.pages.data() + 2);
      },
      "args.cache.indices (");
  fused(
      "last_page_len null", [](Call& c, Buffers&) { c.args.cache.last_page_len = nullptr; },
      "args.cache.last_page_len is null");
  fused(
      "num_indices -1", [](Call& c, Buffers&) { c.args.cache.num_indices = -1; },
      "args.cache.num_indices (-1) must be >= 0");
  fused(
      "paged page_size 2^31",
      [](Call& c, Buffers&) {
        c.args.cache.page_size = int64_t(1) << 31;
        c.args.cache.stride_page = 0;  // one page: the strides' spans still fit
        c.args.cache.pages = 1;
      },
      "args.cache.page_size (2147483648) must be below 2^31 for a paged cache");
  fused(
      "slot_mapping null",
      [](Call& c, Buffers&) {
        c.spec.cache = KvCache::slots;
        c.args.cache.slot_mapping = nullptr;
      },
      "args.cache.slot_mapping is null but spec.cache is slots");
  fused(
      "seq_lens null",
      [](Call& c, Buffers&) {
        c.spec.cache = KvCache::contiguous;
        c.args.cache.seq_lens = nullptr;
      },
      "args.cache.seq_lens is null but spec.cache is cont");
  fused(
      "more sequences than the cache holds",
      [](Call& c, Buffers&) {
        c.spec.cache = KvCache::contiguous;
        c.args.cache.pages = 1;
      },
      "args.cache.pages (1) holds fewer sequences than args.batch (2)");
  fused(
      "skipped misaligned",
      [](Call& c, Buffers& b) {
        c.args.cache.skipped = reinterpret_cast<int32_t*>(b.skipped.data() + 1);
      },
      "args.cache.skipped (");
  fused(
      "e4m3 cache scale 0",
      [](Call& c, Buffers&) {
        c.spec.cache_store = Store::e4m3;
        c.args.cache.k_quant_scale = 0.0f;
      },
      "args.cache.k_quant_scale (0) must be a finite number > 0");
  fused(
      "e4m3 cache scale NaN",
      [](Call& c, Buffers&) {
        c.spec.cache_store = Store::e4m3;
        c.args.cache.v_quant_scale = NAN;
      },
      "args.cache.v_quant_scale (nan) must be a finite number > 0");
  fused(
      "e4m3 output scale -1",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.spec.out_store = Store::e4m3;
        c.args.out_quant_scale = -1.0f;
      },
      "args.out_quant_scale (-1) must be a finite number > 0");
  auto dynamic = [&](std::string name, std::function<void(Call&, Buffers&)> edit,
                     const char* message) {
    fused(
        "dynamic FP8: " + name,
        [edit](Call& c, Buffers& b) {
          c.dynamic(b);
          edit(c, b);
        },
        message);
  };
  dynamic(
      "q scales missing", [](Call& c, Buffers&) { c.args.q_out_scale = Tensor{}; },
      "args.q_out_scale.data is null but spec.out_store is e4m3dyn");
  dynamic(
      "k scales heads", [](Call& c, Buffers&) { c.args.k_out_scale.heads = 3; },
      "args.k_out_scale.heads (3) must be ");
  dynamic(
      "q and k scales overlap",
      [](Call& c, Buffers&) { c.args.k_out_scale.data = c.args.q_out_scale.data; },
      "args.q_out_scale and args.k_out_scale overlap in memory");
  dynamic(
      "q scales misaligned",
      [](Call& c, Buffers&) { c.args.q_out_scale.data = shifted(c.args.q_out_scale.data, 2); },
      "args.q_out_scale.data (");
  dynamic(
      "scales with a static store", [](Call& c, Buffers&) { c.spec.out_store = Store::e4m3; },
      "args.q_out_scale.data is set but spec.out_store is not e4m3dyn");
  dynamic(
      "k scales without k written",
      [](Call& c, Buffers&) {
        c.spec.fusion = Fusion::q;
        c.args.k_out = Tensor{};
      },
      "args.k_out_scale.data is set but no k is written out");
  dynamic(
      "cache scales missing", [](Call& c, Buffers&) { c.args.cache.k_scales = nullptr; },
      "args.cache.k_scales is null but spec.cache_store is e4m3dyn");
  dynamic(
      "v cache scales missing", [](Call& c, Buffers&) { c.args.cache.v_scales = nullptr; },
      "args.cache.v_scales is null but spec.cache_store is e4m3dyn and v is cached");
  dynamic(
      "cache scale rows overlap", [](Call& c, Buffers&) { c.args.cache.scale_stride_slot = 0; },
      "args.cache.k_scales.scale_stride_slot (0) makes rows overlap");
  dynamic(
      "cache scales are the cache",
      [](Call& c, Buffers& b) {
        c.args.cache.v_scales = reinterpret_cast<float*>(b.cache_k.data());
      },
      "overlap in memory");
  dynamic(
      "cache scales with a static cache",
      [](Call& c, Buffers&) { c.spec.cache_store = Store::e4m3; },
      "args.cache.k_scales is set but spec.cache_store is not e4m3dyn");
  fused(
      "norm weight null", [](Call& c, Buffers&) { c.args.q_norm_weight = nullptr; },
      "args.q_norm_weight is null but spec.norm needs the weights");
  fused(
      "norm weight misaligned",
      [](Call& c, Buffers& b) { c.args.k_norm_weight = b.weights.data() + 1; },
      "args.k_norm_weight (");
  fused(
      "norm eps NaN", [](Call& c, Buffers&) { c.args.norm_eps = NAN; },
      "args.norm_eps (nan) must be a finite number in [0, FLT_MAX] (a float)");
  fused(
      "norm eps negative", [](Call& c, Buffers&) { c.args.norm_eps = -1e-6; },
      "args.norm_eps (-1e-06) must be a finite number in [0, FLT_MAX] (a float)");
  fused(
      "norm eps beyond a float", [](Call& c, Buffers&) { c.args.norm_eps = 1e300; },
      "args.norm_eps (1e+300) must be a finite number in [0, FLT_MAX] (a float)");
  // Written memory may not meet what the kernel reads: the cache's addressing, and the tables.
  fused(
      "cache pages over the page table",
      [](Call& c, Buffers&) { c.args.cache.indptr = static_cast<const int32_t*>(c.args.cache.k); },
      "args.cache.k and args.cache.indptr overlap in memory");
  fused(
      "skipped counter inside the page indices",
      [](Call& c, Buffers&) {
        c.args.cache.skipped = const_cast<int32_t*>(c.args.cache.indices) + 1;
      },
      "args.cache.skipped and args.cache.indices overlap in memory");
  fused(
      "slots over the slot mapping",
      [](Call& c, Buffers&) {
        c.spec.cache = KvCache::slots;
        c.args.cache.slot_mapping = static_cast<const int64_t*>(c.args.cache.v) + 8;
      },
      "args.cache.v and args.cache.slot_mapping overlap in memory");
  fused(
      "cache page and slot strides equal",
      [](Call& c, Buffers&) { c.args.cache.stride_page = c.args.cache.stride_slot; },
      "args.cache.k.stride_page and stride_slot are both 256, which makes rows overlap: one of "
      "them must be >= 2048");
  fused(
      "k_out with k only to the cache",
      [](Call& c, Buffers& b) {
        c.out_of_place(b);
        c.spec.fusion = Fusion::q;
      },
      "args.k_out.data is set but spec.fusion is q: k is written only to the cache");
  fused(
      "thd ids without cu_seqlens",
      [](Call& c, Buffers&) {
        c.spec.layout = Layout::thd;
        c.spec.positions = Positions::ids;
        c.args.cu_seqlens = nullptr;
      },
      "args.cu_seqlens is null but layout thd needs it (the KV cache is addressed by sequence)");
  return rows;
}

bool unchanged(const Buffers& now, const Buffers& before) {
  const auto a = now.all(), b = before.all();
  for (size_t i = 0; i < a.size(); ++i)
    if (*a[i] != *b[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("bad-input table, C++ API: the error code, the argument named, nothing written") {
  const std::vector<Row> rows = cpp_rows();
  CHECK(rows.size() >= 100);
  const Buffers pristine;
  for (const Row& row : rows) {
    Buffers b;
    Call call(b);
    row.edit(call, b);
    INFO(row.name);
    std::string message = "accepted";
    ErrorCode code{};
    try {
      apply(call.spec, call.args);
    } catch (const Error& e) {
      message = e.what();
      code = e.code();
    }
    INFO(message);
    CHECK(code == row.code);
    CHECK(message.find(row.message) != std::string::npos);
    CHECK(message.rfind("ropejit: ", 0) == 0);
    CHECK(message.size() < 600);
    CHECK(unchanged(b, pristine));
  }
  MESSAGE(rows.size(), " bad inputs rejected");
}

TEST_CASE("the table's harness sees a valid call get past validation") {
  // Valid calls reach the GPU stage: no driver here (no_driver), or host memory on a GPU host
  // (invalid_argument naming it as not device memory). Packed QKV views share a buffer without
  // overlapping, and must not be taken for overlap.
  for (int variant = 0; variant < 4; ++variant) {
    Buffers b;
    Call call(b);
    if (variant == 1) call.out_of_place(b);
    if (variant == 3) call.fused(b);
    if (variant == 2) {
      call.args.q = contiguous(Layout::bshd, b.q.data(), kBatch, kSeq, 2 + 1 + 1, kDim);
      call.args.q.heads = 2;
      call.args.k = call.args.q;
      call.args.k.heads = 1;
      call.args.k.data = shifted(b.q.data(), 2 * kDim * 2);
    }
    std::string message;
    try {
      apply(call.spec, call.args);
    } catch (const Error& e) {
      message = e.what();
      INFO(message);
      CHECK((e.code() == ErrorCode::no_driver ||
             message.find("is not device memory") != std::string::npos));
    }
    CHECK_FALSE(message.empty());
  }
}

TEST_CASE("bad-input table, C API: status, message, nothing written") {
  Buffers b;
  const Buffers pristine;
  ropejit_spec spec;
  ropejit_spec_init(&spec);
  ropejit_args args;
  ropejit_args_init(&args);
  args.batch = kBatch;
  args.seq_len = kSeq;
  REQUIRE(ropejit_make_contiguous(ROPEJIT_LAYOUT_BSHD, b.q.data(), kBatch, kSeq, kQHeads, kDim,
                                  &args.q) == ROPEJIT_OK);
  REQUIRE(ropejit_make_contiguous(ROPEJIT_LAYOUT_BSHD, b.k.data(), kBatch, kSeq, kKHeads, kDim,
                                  &args.k) == ROPEJIT_OK);
  args.cos = b.cos.data();
  args.sin = b.sin.data();
  args.table_rows = kRows;
  struct CRow {
    const char* name;
    std::function<ropejit_status(ropejit_spec, ropejit_args)> call;
    ropejit_status status;
    const char* message;
  };
  const CRow rows[] = {
      {"null spec", [](ropejit_spec, ropejit_args a) { return ropejit_apply(nullptr, &a); },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "spec is null"},
      {"null args", [](ropejit_spec s, ropejit_args) { return ropejit_apply(&s, nullptr); },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "args is null"},
      {"in_place 7",
       [](ropejit_spec s, ropejit_args a) {
         s.in_place = 7;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "spec.in_place (7) must be 0 or 1"},
      {"in_place -1",
       [](ropejit_spec s, ropejit_args a) {
         s.in_place = -1;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "spec.in_place (-1) must be 0 or 1"},
      {"layout 99",
       [](ropejit_spec s, ropejit_args a) {
         s.layout = 99;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "spec.layout (99) is not a known value"},
      {"dtype -3",
       [](ropejit_spec s, ropejit_args a) {
         s.dtype = -3;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "spec.dtype (-3) is not a known value"},
      {"q.heads 2^31",
       [](ropejit_spec s, ropejit_args a) {
         a.q.heads = int64_t(1) << 31;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "args.q.heads (2147483648) must be in [1, 2^29]"},
      {"overlapping q and k",
       [](ropejit_spec s, ropejit_args a) {
         a.k.data = a.q.data;
         return ropejit_apply(&s, &a);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "args.q and args.k overlap in memory"},
      {"key into a short buffer",
       [](ropejit_spec s, ropejit_args) {
         char buf[8];
         return ropejit_key(&s, buf, sizeof buf);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "size (8) is too small for key"},
      {"key into null", [](ropejit_spec s, ropejit_args) { return ropejit_key(&s, nullptr, 100); },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "buf is null"},
      {"precompile sm_0090",
       [](ropejit_spec s, ropejit_args) { return ropejit_precompile(&s, "sm_0090"); },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "arch ('sm_0090') must look like sm_90"},
      {"precompile a 10,000-character arch",
       [](ropejit_spec s, ropejit_args) {
         const std::string arch = "sm_" + std::string(9997, '9');
         return ropejit_precompile(&s, arch.c_str());
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "(10000 characters)') must look like sm_90"},
      {"precompile null arch",
       [](ropejit_spec s, ropejit_args) { return ropejit_precompile(&s, nullptr); },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "arch is null"},
      {"contiguous overflow",
       [](ropejit_spec, ropejit_args) {
         ropejit_tensor t;
         return ropejit_make_contiguous(ROPEJIT_LAYOUT_BSHD, nullptr, int64_t(1) << 40,
                                        int64_t(1) << 40, 8, 128, &t);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "x head_dim (128) overflows int64"},
      {"contiguous negative heads",
       [](ropejit_spec, ropejit_args) {
         ropejit_tensor t;
         return ropejit_make_contiguous(ROPEJIT_LAYOUT_THD, nullptr, 1, 4, -8, 128, &t);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "contiguous: heads (-8) must be >= 0"},
      {"contiguous bad layout",
       [](ropejit_spec, ropejit_args) {
         ropejit_tensor t;
         return ropejit_make_contiguous(7, nullptr, 1, 4, 8, 128, &t);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "contiguous: layout (7) is not a known value"},
      {"contiguous null out",
       [](ropejit_spec, ropejit_args) {
         return ropejit_make_contiguous(0, nullptr, 1, 4, 8, 128, nullptr);
       },
       ROPEJIT_ERROR_INVALID_ARGUMENT, "out is null"},
  };
  for (const CRow& row : rows) {
    INFO(std::string(row.name));
    const ropejit_status st = row.call(spec, args);
    INFO(std::string(ropejit_last_error()));
    CHECK(st == row.status);
    CHECK(std::string(ropejit_last_error()).find(row.message) != std::string::npos);
    CHECK(unchanged(b, pristine));
  }
  // The value form reports through ropejit_last_error() and returns a tensor apply refuses.
  const ropejit_tensor t = ropejit_contiguous(ROPEJIT_LAYOUT_BSHD, b.q.data(), INT64_MAX, 2, 2, 2);
  CHECK(t.data == nullptr);
  CHECK(std::string(ropejit_last_error()).find("overflows int64") != std::string::npos);
}
