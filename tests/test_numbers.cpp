// Host rounding to fp16, bf16 and FP8 e4m3 (oracle/numbers.hpp): the float64 references build
// expected bytes with it, so it is checked against known encodings and, for fp16 where the
// compiler has _Float16, against the compiler's own conversion.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "oracle/numbers.hpp"

using namespace ropejit::oracle;

TEST_CASE("e4m3: known encodings, saturation, subnormals, ties to even, NaN") {
  CHECK(e4m3_bits(0.0) == 0x00);
  CHECK(e4m3_bits(-0.0) == 0x80);
  CHECK(e4m3_bits(1.0) == 0x38);
  CHECK(e4m3_bits(-2.0) == 0xc0);
  CHECK(e4m3_bits(448.0) == 0x7e);
  CHECK(e4m3_bits(464.0) == 0x7e);  // would round to 480, the NaN pattern: saturates
  CHECK(e4m3_bits(1e9) == 0x7e);
  CHECK(e4m3_bits(-HUGE_VAL) == 0xfe);  // satfinite: infinities become the largest finite
  CHECK(e4m3_bits(NAN) == 0x7f);
  CHECK(e4m3_bits(0x1p-9) == 0x01);    // smallest subnormal
  CHECK(e4m3_bits(0x1p-10) == 0x00);   // half of it: a tie, to even (zero)
  CHECK(e4m3_bits(0x1.8p-9) == 0x02);  // 1.5 quanta: a tie, to even (2)
  CHECK(e4m3_bits(0x1.cp-7) == 0x07);  // largest subnormal 7 * 2^-9
  CHECK(e4m3_bits(0x1p-6) == 0x08);    // smallest normal
  CHECK(e4m3_bits(1.0625) == 0x38);    // 1 + 1/16: a tie between 1 and 1.125, to even
  CHECK(e4m3_bits(1.1875) == 0x3a);    // 1 + 3/16: a tie between 1.125 and 1.25, to even
  for (int b = 0; b < 256; ++b) {
    const double v = e4m3_value(uint8_t(b));
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(e4m3_bits(v) == b);  // every finite encoding round-trips
  }
  CHECK(e4m3_value(0x7e) == 448.0);
  CHECK(e4m3_value(0x01) == 0x1p-9);
}

TEST_CASE("fp16: known encodings and the compiler's conversion") {
  CHECK(f16_bits(1.0) == 0x3c00);
  CHECK(f16_bits(65504.0) == 0x7bff);
  CHECK(f16_bits(65519.99) == 0x7bff);
  CHECK(f16_bits(65520.0) == 0x7c00);  // the tie above the largest finite rounds to infinity
  CHECK(f16_bits(-0x1p-24) == 0x8001);
  CHECK(f16_bits(0x1p-25) == 0x0000);  // tie to even: zero
  CHECK((f16_bits(NAN) & 0x7fff) == 0x7e00);
  CHECK(f16_value(0x7bff) == 65504.0);
  CHECK(std::isinf(f16_value(0xfc00)));
  for (int b = 0; b < 65536; ++b) {
    const double v = f16_value(uint16_t(b));
    if (!std::isnan(v)) CHECK(f16_bits(v) == b);
  }
#if defined(__FLT16_MAX__) && !defined(__clang__)
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> exp(-30, 17);
  for (int i = 0; i < 200000; ++i) {
    const double v = std::ldexp(mant(rng), exp(rng)) * (i % 2 ? -1 : 1);
    const _Float16 h = _Float16(v);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    REQUIRE(f16_bits(v) == want);
  }
#endif
}

TEST_CASE("bf16: rounded once from float64, not through float32") {
  CHECK(bf16_bits(1.0) == 0x3f80);
  CHECK(bf16_bits(-2.0) == 0xc000);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1). Just above it, from float64, the
  // value rounds up, although float32 would first round it to the tie.
  CHECK(bf16_bits(1.0 + 0x1p-8) == 0x3f80);
  CHECK(bf16_bits(1.0 + 0x1p-8 + 0x1p-40) == 0x3f81);
  CHECK(bf16_bits(0x1.fefp127) == 0x7f7f);
  CHECK(bf16_bits(0x1.ffp127) == 0x7f80);
  CHECK(bf16_value(0x3f81) == 1.0 + 0x1p-7);
  for (int b = 0; b < 65536; ++b) {
    const double v = bf16_value(uint16_t(b));
    if (!std::isnan(v)) CHECK(bf16_bits(v) == b);
  }
}

// The kernels' software float -> e4m3 conversion (GPUs before sm_89), compiled here for the
// host, against the exact rounding above: every float of every binade from 2^-12 to 2^10 at a
// stride, all the subnormal-range boundaries, the saturation edge, infinities and NaN.
#define ROPEJIT_FP8_FN inline
#include "templates/rope_fp8.cuh"

TEST_CASE("e4m3: the kernels' software conversion rounds exactly like the reference") {
  auto check_float = [](float f) {
    const uint8_t got = ropejit_dev::e4m3_from_float_soft(f);
    const uint8_t want = e4m3_bits(double(f));
    if (got != want) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      FAIL("float bits ", u, " (", f, "): got ", int(got), " want ", int(want));
    }
  };
  // Every float in [2^-16, 2^10) whose low 12 fraction bits are 0, 0x7ff, 0x800 or 0x801 (both
  // sides of every tie), and both signs.
  for (uint32_t exp = 127 - 16; exp < 127 + 10; ++exp)
    for (uint32_t top = 0; top < (1u << 11); ++top)
      for (uint32_t low : {0u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) {
        const uint32_t u = exp << 23 | top << 12 | low;
        float f;
        std::memcpy(&f, &u, 4);
        check_float(f);
        check_float(-f);
      }
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    check_float(f);
  }
  for (float f : {0.0f, -0.0f, 448.0f, 447.99f, 448.01f, 463.99f, 464.0f, 1e30f, -1e30f, HUGE_VALF,
                  -HUGE_VALF, NAN, 0x1p-9f, 0x1p-10f, 0x1.8p-10f, 0x1.fffffep-7f})
    check_float(f);
}

TEST_CASE("a / 448 by one correction step: the dynamic FP8 scale, rounded like a division") {
  // The kernels' e4m3_scale_of against float64 (a / 448 in double has no tie to double-round:
  // 448 = 7 * 2^6, and a float divided by 7 never lies within 2^-53 of a float midpoint).
  int64_t wrong = 0;
  auto check_float = [&](float a) {
    const float want = float(double(a) / 448.0);
    const float got = ropejit_dev::e4m3_scale_of(a);
    if (got != want && ++wrong <= 3) {
      char text[96];
      std::snprintf(text, sizeof(text), "a = %a: got %a, want %a", double(a), double(got),
                    double(want));
      FAIL_CHECK(text);
    }
  };
  // Every significand in three binades (the correction's result depends on the significand
  // alone while nothing is subnormal or overflows), then random floats over the whole range.
  for (const uint32_t exp : {127u - 9u, 127u, 127u + 127u})
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const uint32_t u = exp << 23 | m;
      float a;
      std::memcpy(&a, &u, 4);
      check_float(a);
    }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> finite(0x3b000000u, 0x7f7fffffu);  // [2^-9, FLT_MAX]
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = finite(rng);
    float a;
    std::memcpy(&a, &u, 4);
    check_float(a);
  }
  CHECK(wrong == 0);
  CHECK(ropejit_dev::e4m3_scale_of(HUGE_VALF) == HUGE_VALF);
  CHECK(ropejit_dev::e4m3_scale_of(0x1p-9f) == float(0x1p-9 / 448.0));
}

TEST_CASE("e4m3 weights dequantized as the unfused paths do: fp32 product, then the dtype") {
  // A unit scale gives every finite code's value exactly (e4m3 values are bf16 and f16 values);
  // the NaN codes read as +-480, as the kernels decode them.
  for (int b = 0; b < 256; ++b) {
    const uint8_t code = uint8_t(b);
    const double want = (b & 0x7f) == 0x7f ? (b & 0x80 ? -480.0 : 480.0) : e4m3_value(code);
    CHECK(dequantized_e4m3(ropejit::DType::bf16, code, 1.0f) == want);
    CHECK(dequantized_e4m3(ropejit::DType::f16, code, 1.0f) == want);
    CHECK(dequantized_e4m3(ropejit::DType::bf16, code, 0.25f) ==
          want * 0.25);  // powers of two: exact
  }
  // Two roundings, as the kernel's fp32 product and its conversion: 1.5 (code 0x3c) times
  // 0x1.4caaaap-1 is 0.97460934519767761 exactly, which rounds to bf16 as 0.97265625; its fp32
  // rounding lies on the tie between that and 0.9765625 and goes to the even one.
  CHECK(bf16_value(bf16_bits(1.5 * double(0x1.4caaaap-1f))) == 0.97265625);
  CHECK(dequantized_e4m3(ropejit::DType::bf16, 0x3c, 0x1.4caaaap-1f) == 0.9765625);
  // Beyond f16's range the product becomes infinite there (a scale the caller must avoid).
  CHECK(std::isinf(dequantized_e4m3(ropejit::DType::f16, 0x7e, 1000.0f)));
  CHECK(dequantized_e4m3(ropejit::DType::bf16, 0x7e, 1000.0f) == bf16_value(bf16_bits(448000.0)));
}
