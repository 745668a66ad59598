// Argument checking: each bad input gets an error naming the argument and its value, and is
// rejected before any GPU work (these run without a driver, so reaching the GPU would throw
// no_driver instead of invalid_argument).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "autotune/policy.hpp"
#include "jit/call.hpp"
#include "jit/launch_config.hpp"
#include "ropejit/ropejit.hpp"

using namespace ropejit;

namespace {

void* fake(uintptr_t at) { return reinterpret_cast<void*>(at); }

Args valid_args(const Spec& s) {
  Args a;
  a.batch = 2;
  a.seq_len = 7;
  a.q = contiguous(s.layout, fake(0x100000), 2, 7, 4, s.head_dim);
  a.k = contiguous(s.layout, fake(0x200000), 2, 7, 1, s.head_dim);
  if (!s.in_place) {
    a.q_out = contiguous(s.layout, fake(0x300000), 2, 7, 4, s.head_dim);
    a.k_out = contiguous(s.layout, fake(0x400000), 2, 7, 1, s.head_dim);
  }
  a.cos = fake(0x500000);
  a.sin = fake(0x600000);
  a.table_rows = 4096;
  return a;
}

std::string rejection(const Spec& s, const Args& a) {
  try {
    apply(s, a);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::invalid_argument) return std::string("WRONG CODE: ") + e.what();
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("valid calls pass checking and report their shape") {
  Spec s;
  const detail::CallShape shape = detail::check_call(s.canonical(), valid_args(s));
  CHECK(shape.tokens == 14);
  CHECK(shape.q_heads == 4);
  CHECK(shape.k_heads == 1);
  CHECK(shape.align_bytes == 16);
  Args a = valid_args(s);
  a.q.data = fake(0x100002);  // one bf16 element off 16-byte alignment
  CHECK(detail::check_call(s.canonical(), a).align_bytes == 2);
  CHECK(shape.table_align == 16);
  a = valid_args(s);
  a.sin = fake(0x600004);  // one f32 element off: the table allows 4-byte loads only
  CHECK(detail::check_call(s.canonical(), a).table_align == 4);
  a.sin = fake(0x600000);
  a.table_stride = 66;  // rows of 66 floats: 264 bytes, 8-byte aligned
  CHECK(detail::check_call(s.canonical(), a).table_align == 8);
  a = valid_args(s);
  a.seq_len = 0;  // empty calls are valid no-ops
  a.q = contiguous(s.layout, fake(0x100000), 2, 0, 4, 128);
  a.k = contiguous(s.layout, fake(0x200000), 2, 0, 1, 128);
  CHECK(detail::check_call(s.canonical(), a).tokens == 0);
  CHECK_NOTHROW(apply(s, a));  // nothing to do, so no GPU needed
}

TEST_CASE("bad pointers, sizes and strides are named") {
  Spec s;
  Args a = valid_args(s);
  a.q.data = nullptr;
  CHECK(rejection(s, a) == "ropejit: args.q.data is null");
  a = valid_args(s);
  a.q.data = fake(0x100001);
  CHECK(rejection(s, a).find("args.q.data (0x100001) is not aligned to its 2-byte elements") !=
        std::string::npos);
  a = valid_args(s);
  a.q.stride_head = 64;  // heads of 128 elements 64 apart overlap
  CHECK(rejection(s, a) == "ropejit: args.q.stride_head (64) makes rows overlap (needs >= 128)");
  a = valid_args(s);
  a.q.stride_seq = -512;
  CHECK(rejection(s, a) == "ropejit: args.q.stride_seq (-512) must be >= 0");
  a = valid_args(s);
  a.q.heads = 0;
  CHECK(rejection(s, a) == "ropejit: args.q.heads (0) must be in [1, 2^29]");
  a = valid_args(s);
  a.k.data = nullptr;
  CHECK(rejection(s, a) == "ropejit: args.k.heads (1) is set but args.k.data is null");
  a = valid_args(s);
  a.batch = 0;
  CHECK(rejection(s, a) == "ropejit: args.batch (0) must be >= 1");
  a = valid_args(s);
  a.seq_len = -1;
  CHECK(rejection(s, a) == "ropejit: args.seq_len (-1) must be >= 0");
  a = valid_args(s);
  a.batch = int64_t(1) << 20;
  a.seq_len = int64_t(1) << 20;
  CHECK(rejection(s, a) ==
        "ropejit: token count (1099511627776) exceeds 2147483647; split the call");
  a.batch = int64_t(1) << 40;
  a.seq_len = int64_t(1) << 30;
  CHECK(rejection(s, a).find("overflows") != std::string::npos);
  a = valid_args(s);
  a.q.stride_batch = int64_t(1) << 62;
  a.batch = 2;
  CHECK(rejection(s, a).find("overflows") != std::string::npos);
}

TEST_CASE("out-of-place outputs are required and checked") {
  Spec s;
  s.in_place = false;
  Args a = valid_args(s);
  a.q_out.data = nullptr;
  CHECK(rejection(s, a) == "ropejit: args.q_out.data is null");
  a = valid_args(s);
  a.k_out.heads = 2;
  CHECK(rejection(s, a) == "ropejit: args.k_out.heads (2) must be 1");
}

TEST_CASE("positions and tables") {
  Spec s;
  Args a = valid_args(s);
  a.position_offset = 4090;  // positions 4090..4096 but the table has 4096 rows
  CHECK(rejection(s, a) ==
        "ropejit: positions up to 4096 (position_offset 4090 + seq_len 7 - 1) are beyond the table "
        "(table_rows 4096)");
  a.position_offset = -1;
  CHECK(rejection(s, a) == "ropejit: args.position_offset (-1) must be >= 0");
  a = valid_args(s);
  a.cos = nullptr;
  CHECK(rejection(s, a) == "ropejit: args.cos is null but freqs is tab");
  a = valid_args(s);
  a.sin = fake(0x600002);
  CHECK(rejection(s, a).find("args.sin (0x600002) is not aligned to its 4-byte elements") !=
        std::string::npos);
  a = valid_args(s);
  a.table_rows = 0;
  CHECK(rejection(s, a) == "ropejit: args.table_rows (0) must be >= 1");
  a = valid_args(s);
  a.table_stride = 32;
  CHECK(rejection(s, a) == "ropejit: args.table_stride (32) is smaller than the row width (64)");

  Spec ids = s;
  ids.positions = Positions::ids;
  a = valid_args(ids);
  CHECK(rejection(ids, a) == "ropejit: args.position_ids is null but positions is ids");
  a.position_ids = fake(0x700004);  // int64 ids need 8-byte alignment
  CHECK(rejection(ids, a).find(
            "args.position_ids (0x700004) is not aligned to its 8-byte elements") !=
        std::string::npos);

  Spec seqoff = s;
  seqoff.positions = Positions::seq_offsets;
  a = valid_args(seqoff);
  CHECK(rejection(seqoff, a) == "ropejit: args.seq_offsets is null but positions is seqoff");

  Spec thd = s;
  thd.layout = Layout::thd;
  a = valid_args(thd);
  a.batch = 3;
  a.seq_len = 14;
  a.q = contiguous(Layout::thd, fake(0x100000), 0, 14, 4, 128);
  a.k = contiguous(Layout::thd, fake(0x200000), 0, 14, 1, 128);
  CHECK(rejection(thd, a) == "ropejit: args.cu_seqlens is null but layout thd needs it");

  Spec comp = s;
  comp.freqs = Freqs::computed;
  a = valid_args(comp);
  a.base = 1.0;
  CHECK(rejection(comp, a) == "ropejit: args.base (1) must be a finite number > 1");
}

TEST_CASE("gptj needs pair-aligned operands") {
  Spec s;
  s.style = Style::gptj;
  Args a = valid_args(s);
  a.q.data = fake(0x100002);
  CHECK(rejection(s, a).find(
            "gptj needs q/k pointers and strides aligned to a pair of elements (4 bytes)") !=
        std::string::npos);
}

TEST_CASE("page_divisor gives the kernels' division by the page size for every 32-bit count") {
  // The kernels' formula (templates/rope_fused.cuh, page_div), here on the host.
  auto divide = [](uint32_t n, const detail::Divisor& d) {
    const uint32_t h = uint32_t((uint64_t(n) * d.magic) >> 32);
    return (h + ((n - h) >> d.shift_a)) >> d.shift_b;
  };
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int64_t d : {int64_t(65535), int64_t(65536), int64_t(65537), int64_t(1000003),
                    int64_t(1) << 31, (int64_t(1) << 31) - 1, (int64_t(1) << 31) + 1,
                    int64_t(3000000019), int64_t(UINT32_MAX) - 1, int64_t(UINT32_MAX)})
    divisors.push_back(d);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int64_t wrong = 0;
  for (int64_t dd : divisors) {
    const detail::Divisor div = detail::page_divisor(dd);
    const uint32_t d = uint32_t(dd);
    std::vector<uint32_t> counts = {0u,
                                    1u,
                                    d - 1,
                                    d,
                                    d + 1,
                                    UINT32_MAX,
                                    UINT32_MAX - 1,
                                    UINT32_MAX - d,
                                    (UINT32_MAX / d) * d,
                                    (UINT32_MAX / d) * d - 1};
    for (int i = 0; i < 200; ++i) counts.push_back(uint32_t(next()));
    for (int i = 0; i < 50; ++i) {
      const uint64_t q = next() % (uint64_t(UINT32_MAX) / d + 1);
      for (int64_t off : {-1, 0, 1})
        if (int64_t(q * d) + off >= 0 && int64_t(q * d) + off <= int64_t(UINT32_MAX))
          counts.push_back(uint32_t(int64_t(q * d) + off));
    }
    for (uint32_t n : counts)
      if (divide(n, div) != n / d) {
        if (++wrong <= 5) FAIL_CHECK("n = " << n << ", d = " << d << ": " << divide(n, div));
      }
  }
  CHECK(wrong == 0);
  // Outside [1, 2^32): no multiplier; the kernels divide.
  for (int64_t d : {int64_t(0), int64_t(-3), int64_t(1) << 32, int64_t(1) << 40}) {
    const detail::Divisor none = detail::page_divisor(d);
    CHECK(none.magic == 0);
  }
}

TEST_CASE("fused calls take 32-bit offsets (narrow variants) exactly when every offset fits") {
  // Packed QKV-style tensors of `tokens` tokens and a paged bf16 cache; addresses far apart
  // (nothing is dereferenced).
  const Spec s = parse_key("rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-cpaged_fwd_ip")
                     .canonical();
  auto call = [](int64_t tokens, int64_t pages, int64_t stride_page) {
    Args a;
    a.batch = 1;
    a.seq_len = tokens;
    a.q = contiguous(Layout::thd, fake(uintptr_t(1) << 40), 1, tokens, 4, 128);
    a.k = contiguous(Layout::thd, fake(uintptr_t(2) << 40), 1, tokens, 1, 128);
    a.v = contiguous(Layout::thd, fake(uintptr_t(3) << 40), 1, tokens, 1, 128);
    a.cos = fake(uintptr_t(4) << 40);
    a.sin = fake(uintptr_t(5) << 40);
    a.table_rows = 4096;
    a.position_ids = fake(uintptr_t(6) << 40);
    a.cu_seqlens = static_cast<const int32_t*>(fake(uintptr_t(7) << 40));
    KvCacheArgs& c = a.cache;
    c.k = fake(uintptr_t(8) << 40);
    c.v = fake(uintptr_t(9) << 40);
    c.pages = pages;
    c.page_size = 16;
    c.stride_head = 128;
    c.stride_slot = 128;
    c.stride_page = stride_page;
    c.indptr = static_cast<const int32_t*>(fake(uintptr_t(10) << 40));
    c.indices = static_cast<const int32_t*>(fake(uintptr_t(11) << 40));
    c.num_indices = pages;
    c.last_page_len = static_cast<const int32_t*>(fake(uintptr_t(12) << 40));
    return a;
  };
  CHECK(detail::check_call(s, call(16, 64, 16 * 128)).narrow);
  // A cache of 2^26 pages (32 GiB) still fits: offsets inside a page are narrow, a page's own
  // offset is 64-bit.
  CHECK(detail::check_call(s, call(16, int64_t(1) << 26, 16 * 128)).narrow);
  // Not when a page stride reaches 2^31 bytes, or q spans 2^31 bytes (2^21 tokens of 4 heads).
  CHECK_FALSE(detail::check_call(s, call(16, 4, int64_t(1) << 30)).narrow);
  CHECK_FALSE(detail::check_call(s, call(int64_t(1) << 21, 64, 16 * 128)).narrow);
  CHECK(detail::check_call(s, call((int64_t(1) << 21) - 1, 64, 16 * 128)).narrow);
  // Plain keys have no narrow variant.
  CHECK_FALSE(detail::check_call(Spec{}.canonical(), valid_args(Spec{})).narrow);
  // A contiguous cache: one page per sequence of page_size = the longest sequence, each page
  // its own span (2^20 slots of one 128-element head fit, 2^23 do not).
  const Spec cont =
      parse_key("rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-ccont_fwd_ip").canonical();
  auto contiguous_call = [&](int64_t page_size) {
    Args a = call(16, 64, 16 * 128);
    a.cache.pages = 2;
    a.cache.page_size = page_size;
    a.cache.stride_page = page_size * 128;
    a.cache.indptr = nullptr;
    a.cache.indices = nullptr;
    a.cache.num_indices = 0;
    a.cache.last_page_len = nullptr;
    a.cache.seq_lens = static_cast<const int32_t*>(fake(uintptr_t(13) << 40));
    return a;
  };
  CHECK(detail::check_call(cont, contiguous_call(int64_t(1) << 20)).narrow);
  CHECK_FALSE(detail::check_call(cont, contiguous_call(int64_t(1) << 23)).narrow);
  // An e4m3 q_out is counted in its own 1-byte elements (2^20 tokens of 4 heads: 2^29 bytes),
  // and its strides count like the others'.
  const Spec fp8 =
      parse_key("rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-oe4m3-cpaged-e4m3_fwd_oop")
          .canonical();
  Args big = call((int64_t(1) << 20) - 1, 64, 16 * 128);
  big.q_out = contiguous(Layout::thd, fake(uintptr_t(14) << 40), 1, big.seq_len, 4, 128);
  CHECK(detail::check_call(fp8, big).narrow);
  big.q_out.stride_head = int64_t(1) << 31;  // strides past 2^31 bytes
  big.q_out.stride_seq = (int64_t(1) << 31) * 4;
  CHECK_FALSE(detail::check_call(fp8, big).narrow);

  // Both offset widths of the heuristic's two kernels are prepared on a fused key's first use
  // (a later call of the other width, or a graph capture, then loads nothing); plain keys keep
  // their two.
  const std::vector<detail::KernelVariant> forms = detail::default_variants(s, 16);
  REQUIRE(forms.size() == 4);
  CHECK(std::count_if(forms.begin(), forms.end(),
                      [](const detail::KernelVariant& v) { return v.narrow; }) == 2);
  CHECK(detail::default_variants(Spec{}.canonical(), 16).size() == 2);

  // The variant follows the call: the heuristic's choice, and a launch asking for a narrow
  // variant the call does not fit is refused.
  detail::DeviceInfo dev;
  dev.cc = 90;
  dev.sm_count = 132;
  const detail::CallShape fits = detail::check_call(s, call(16, 64, 16 * 128));
  const detail::CallShape wide = detail::check_call(s, call(16, 4, int64_t(1) << 30));
  CHECK(autotune::heuristic_config(s, fits, dev).kernel.narrow);
  CHECK(autotune::heuristic_config(s, fits, dev).kernel.name().back() == 'n');
  CHECK_FALSE(autotune::heuristic_config(s, wide, dev).kernel.narrow);
  detail::LaunchConfig forced = autotune::heuristic_config(s, fits, dev);
  CHECK(detail::illegal_reason(s, fits, forced, dev).empty());
  CHECK(detail::illegal_reason(s, wide, forced, dev).find("32-bit offsets") != std::string::npos);
}
