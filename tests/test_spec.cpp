// Spec validation messages, golden key strings, key parsing.
#include <doctest/doctest.h>

#include <string>

#include "jit/decode/dequant.hpp"
#include "jit/family.hpp"
#include "ropejit/ropejit.hpp"

using namespace ropejit;

namespace {

std::string error_of(const Spec& s) {
  try {
    s.validate();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("spec validation names the field and value") {
  Spec s;
  s.head_dim = 127;
  CHECK(error_of(s) == "ropejit: spec.head_dim (127) must be even and in [2, 512]");
  s.head_dim = 514;
  CHECK(error_of(s) == "ropejit: spec.head_dim (514) must be even and in [2, 512]");
  s.head_dim = 0;
  CHECK(error_of(s).find("spec.head_dim (0)") != std::string::npos);
  s = Spec{};
  s.head_dim = 64;
  s.rotary_dim = 96;
  CHECK(error_of(s) ==
        "ropejit: spec.rotary_dim (96) must be even and <= head_dim (64); 0 means head_dim");
  s.rotary_dim = 33;
  CHECK(error_of(s).find("spec.rotary_dim (33)") != std::string::npos);
  s.rotary_dim = -2;
  CHECK(error_of(s).find("spec.rotary_dim (-2)") != std::string::npos);
  s = Spec{};
  s.dtype = DType(7);
  CHECK(error_of(s) == "ropejit: spec.dtype (7) is not a known value");
  s = Spec{};
  s.layout = Layout(-1);
  CHECK(error_of(s) == "ropejit: spec.layout (-1) is not a known value");
  CHECK(error_of(Spec{}).empty());
}

TEST_CASE("golden key strings") {
  Spec s;
  CHECK(s.key() == "rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip");
  s.layout = Layout::thd;
  s.dtype = DType::f16;
  s.head_dim = 80;
  s.rotary_dim = 32;
  s.style = Style::gptj;
  s.positions = Positions::ids;
  s.index_type = IndexType::i32;
  s.freqs = Freqs::computed;
  s.direction = Direction::backward;
  s.in_place = false;
  CHECK(s.key() == "rope_thd_f16_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop");
  Spec t;
  t.layout = Layout::sbhd;
  t.dtype = DType::f32;
  t.head_dim = 96;
  t.rotary_dim = 24;
  t.positions = Positions::seq_offsets;
  t.table_dtype = DType::bf16;
  t.table_width = TableWidth::full;
  CHECK(t.key() == "rope_sbhd_f32_d96_r24_neox_pos-seqoff-i64_tab-bf16-full_qk_fwd_ip");
  t.layout = Layout::bhsd;
  CHECK(t.key() == "rope_bhsd_f32_d96_r24_neox_pos-seqoff-i64_tab-bf16-full_qk_fwd_ip");
}

TEST_CASE("canonical form: unused axes do not split keys") {
  Spec a, b;
  a.rotary_dim = 0;
  b.rotary_dim = 128;
  CHECK(a.canonical() == b.canonical());
  CHECK(a.key() == b.key());
  a.positions = b.positions = Positions::offset;
  a.index_type = IndexType::i32;  // meaningless for implicit positions
  CHECK(a.key() == b.key());
  a.freqs = b.freqs = Freqs::computed;
  a.table_dtype = DType::bf16;  // meaningless for computed frequencies
  a.table_width = TableWidth::full;
  CHECK(a.canonical() == b.canonical());
  b.in_place = false;
  CHECK(a.canonical() != b.canonical());
}

TEST_CASE("parse_key round-trips every axis and rejects others") {
  for (Layout l : {Layout::bshd, Layout::sbhd, Layout::bhsd, Layout::thd})
    for (Positions p : {Positions::offset, Positions::seq_offsets, Positions::ids})
      for (Freqs f : {Freqs::table, Freqs::computed})
        for (DType d : {DType::f32, DType::f16, DType::bf16}) {
          Spec s;
          s.layout = l;
          s.positions = p;
          s.index_type = IndexType::i32;
          s.freqs = f;
          s.dtype = d;
          s.table_dtype = d;
          s.table_width = TableWidth::full;
          s.style = Style::gptj;
          s.in_place = false;
          s.direction = Direction::backward;
          const Spec back = parse_key(s.key());
          CHECK(back == s.canonical());
          CHECK(back.key() == s.key());
        }
  CHECK_THROWS_WITH_AS(parse_key("rope_bshd"), doctest::Contains("is not a ropejit key"), Error);
  CHECK_THROWS_WITH_AS(
      parse_key("rope_xyz_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip"),
      doctest::Contains("key layout ('xyz') must be one of: bshd, sbhd, bhsd, thd"), Error);
  CHECK_THROWS_WITH_AS(parse_key("rope_bshd_bf16_d127_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip"),
                       doctest::Contains("spec.head_dim (127)"), Error);
  CHECK_THROWS_WITH_AS(
      parse_key("rope_bshd_bf16_d128_r128_neox_pos-offset-i32_tab-f32-half_qk_fwd_ip"),
      doctest::Contains("bad positions field"), Error);
  CHECK_THROWS_WITH_AS(
      parse_key("rope_bshd_bf16_d128_r128_neox_pos-offset_comp-f32-half_qk_fwd_ip"),
      doctest::Contains("bad freqs field"), Error);
  CHECK_THROWS_AS(parse_key("rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_inplace"),
                  Error);
}

TEST_CASE("contiguous strides per layout") {
  const Tensor bshd = contiguous(Layout::bshd, nullptr, 2, 5, 3, 64);
  CHECK(bshd.stride_head == 64);
  CHECK(bshd.stride_seq == 3 * 64);
  CHECK(bshd.stride_batch == 5 * 3 * 64);
  const Tensor sbhd = contiguous(Layout::sbhd, nullptr, 2, 5, 3, 64);
  CHECK(sbhd.stride_batch == 3 * 64);
  CHECK(sbhd.stride_seq == 2 * 3 * 64);
  const Tensor bhsd = contiguous(Layout::bhsd, nullptr, 2, 5, 3, 64);
  CHECK(bhsd.stride_seq == 64);
  CHECK(bhsd.stride_head == 5 * 64);
  CHECK(bhsd.stride_batch == 3 * 5 * 64);
  const Tensor thd = contiguous(Layout::thd, nullptr, 0, 11, 3, 64);
  CHECK(thd.stride_seq == 3 * 64);
  CHECK(thd.stride_head == 64);
}

TEST_CASE("a key's family is told by its first field, and each family's keys carry its tag") {
  using detail::Family;
  using detail::family_of;
  CHECK(family_of(QkvProjSpec{}.key()) == Family::qkv_projection);
  CHECK(family_of(FfnSpec{}.key()) == Family::ffn_gate_up);
  CHECK(family_of(RmsNormSpec{}.key()) == Family::rms_norm);
  CHECK(family_of(detail::dequant_key(DType::bf16)) == Family::dequant);
  CHECK(family_of(Spec{}.key()) == Family::rope);
  CHECK(family_of("") == Family::rope);               // no family's: parse_key says why
  CHECK(family_of("qkvprojx_bf16") == Family::rope);  // the whole first field, not a prefix
  CHECK(Spec{}.key().rfind(std::string(detail::family_tag(Family::rope)) + "_", 0) == 0);
  for (const Family f :
       {Family::qkv_projection, Family::ffn_gate_up, Family::rms_norm, Family::dequant})
    CHECK(std::string(detail::family_tag(f)).size() > 1);
  // Each parser refuses another family's key by its tag.
  CHECK_THROWS_AS(parse_qkv_proj_key(FfnSpec{}.key()), Error);
  CHECK_THROWS_AS(parse_ffn_key(RmsNormSpec{}.key()), Error);
  CHECK_THROWS_AS(parse_rms_norm_key(QkvProjSpec{}.key()), Error);
  CHECK_THROWS_AS(parse_key(FfnSpec{}.key()), Error);
}
