// Exact host rounding to the kernels' number formats (round to nearest even, once).
#include "oracle/numbers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ropejit::oracle {
namespace {

// Magnitude bits (exponent field, then fraction) of an exactly representable finite value `r`
// in a format with `mantissa` fraction bits and exponent bias `bias` (normal exponents from
// 1 - bias, subnormals below).
uint32_t magnitude_bits(double r, int mantissa, int bias) {
  const double a = std::fabs(r);
  if (a == 0) return 0;
  const int e = std::ilogb(a);
  if (e < 1 - bias) return uint32_t(std::ldexp(a, bias - 1 + mantissa));  // subnormal
  return uint32_t(e + bias) << mantissa |
         (uint32_t(std::ldexp(a, mantissa - e)) - (1u << mantissa));
}

double decode(uint32_t exp_field, uint32_t frac, bool negative, int mantissa, int bias) {
  const double a =
      exp_field == 0 ? std::ldexp(double(frac), 1 - bias - mantissa)
                     : std::ldexp(double(frac | 1u << mantissa), int(exp_field) - bias - mantissa);
  return negative ? -a : a;
}

}  // namespace

double round_to_format(double v, int mantissa, int min_exponent) {
  if (std::isnan(v) || v == 0 || std::isinf(v)) return v;
  const int e = std::max(std::ilogb(v), min_exponent);
  // v / quantum is exact (a power-of-two scaling); nearbyint rounds ties to even in the
  // default rounding mode.
  return std::ldexp(std::nearbyint(std::ldexp(v, mantissa - e)), e - mantissa);
}

uint16_t f16_bits(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return sign | 0x7e00;
  const double r = round_to_format(v, 10, -14);
  if (std::fabs(r) > 65504.0) return sign | 0x7c00;
  return uint16_t(sign | magnitude_bits(r, 10, 15));
}

double f16_value(uint16_t bits) {
  const uint32_t exp_field = bits >> 10 & 0x1f, frac = bits & 0x3ff;
  const bool negative = bits & 0x8000;
  if (exp_field == 0x1f) {
    if (frac) return std::numeric_limits<double>::quiet_NaN();
    return negative ? -HUGE_VAL : HUGE_VAL;
  }
  return decode(exp_field, frac, negative, 10, 15);
}

uint16_t bf16_bits(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return sign | 0x7fc0;
  const double r = round_to_format(v, 7, -126);
  if (std::fabs(r) > 0x1.fep127) return sign | 0x7f80;
  return uint16_t(sign | magnitude_bits(r, 7, 127));
}

double bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f32_value(double v) { return float(v); }  // the conversion rounds once, to nearest even

uint8_t e4m3_bits(double v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  if (std::isnan(v)) return sign | 0x7f;
  const double r = round_to_format(v, 3, -6);
  if (std::isinf(r) || std::fabs(r) > kE4m3Max) return sign | 0x7e;  // saturate to 448
  return uint8_t(sign | magnitude_bits(r, 3, 7));
}

double e4m3_value(uint8_t bits) {
  const uint32_t exp_field = bits >> 3 & 0xf, frac = bits & 0x7;
  if (exp_field == 0xf && frac == 0x7) return std::numeric_limits<double>::quiet_NaN();
  return decode(exp_field, frac, bits & 0x80, 3, 7);
}

double dequantized_e4m3(DType dtype, uint8_t code, float scale) {
  const double value = (code & 0x7f) == 0x7f ? ((code & 0x80) ? -480.0 : 480.0) : e4m3_value(code);
  const double product = f32_value(value * double(scale));  // exact in float64, then rounded
  return dtype == DType::bf16 ? bf16_value(bf16_bits(product)) : f16_value(f16_bits(product));
}

std::vector<double> dequantized_rows(DType dtype, const uint8_t* scales, int64_t rows) {
  std::vector<double> out(size_t(rows) * 256);
  for (int64_t n = 0; n < rows; ++n) {
    float scale;
    std::memcpy(&scale, scales + n * 4, 4);
    for (int b = 0; b < 256; ++b)
      out[size_t(n * 256 + b)] = dequantized_e4m3(dtype, uint8_t(b), scale);
  }
  return out;
}

double load_value(DType t, const uint8_t* p) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_value(h);
    }
    case DType::bf16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_value(b);
    }
  }
  return 0;
}

void store_value(DType t, uint8_t* p, double v) {
  switch (t) {
    case DType::f32: {
      const float f = f32_value(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::f16: {
      const uint16_t h = f16_bits(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::bf16: {
      const uint16_t b = bf16_bits(v);
      std::memcpy(p, &b, 2);
      break;
    }
  }
}

double half_ulp(DType t, double x) {
  const int mant = t == DType::f32 ? 23 : t == DType::f16 ? 10 : 7;
  const double tiny = t == DType::f32 ? 0x1p-150 : t == DType::f16 ? 0x1p-25 : 0x1p-134;
  if (x == 0) return tiny;
  return std::max(tiny, std::ldexp(1.0, std::ilogb(x) - mant - 1));
}

}  // namespace ropejit::oracle
