// The number formats kernels read and write, on the host: exact rounding of float64 values to
// fp16, bf16 and FP8 e4m3 bits (round to nearest even, once), and back. The float64 references
// (workload.cpp) build tables and expected bytes with these, so they must be right to the bit.
#pragma once

#include <cstdint>
#include <vector>

#include "ropejit/ropejit.hpp"

namespace ropejit::oracle {

// IEEE binary16: overflow rounds to infinity, NaN to the quiet NaN 0x7e00 (sign kept).
uint16_t f16_bits(double v);
double f16_value(uint16_t bits);

// bfloat16 (float32's top half): overflow rounds to infinity, NaN to 0x7fc0 (sign kept).
uint16_t bf16_bits(double v);
double bf16_value(uint16_t bits);

// float32, rounded once from float64.
float f32_value(double v);

// FP8 e4m3 (OCP "E4M3FN": bias 7, no infinities, S.1111.111 is NaN, largest finite 448),
// saturating as the kernels' conversions do: values beyond ±448 (infinities too) become ±448,
// NaN becomes 0x7f (sign kept).
uint8_t e4m3_bits(double v);
double e4m3_value(uint8_t bits);
constexpr double kE4m3Max = 448.0;

// An e4m3 weight code as the unfused paths dequantize it (templates/dequant_kernel.cuh): its
// value (the NaN codes read as +-480, as the kernels decode them) times `scale`, rounded to
// fp32, then to `dtype` (bf16 or f16).
double dequantized_e4m3(DType dtype, uint8_t code, float scale);
// dequantized_e4m3 of every code for `rows` rows with the float32 scales at `scales` (bytes, as
// uploaded): rows x 256 values, row n's code b at n * 256 + b.
std::vector<double> dequantized_rows(DType dtype, const uint8_t* scales, int64_t rows);

// Rounds v to the nearest value with `mantissa` fraction bits whose normal exponents start at
// `min_exponent` (subnormals below, with the same quantum), ties to even. No overflow handling:
// the caller decides what happens above its largest finite value. NaN and zero pass through.
double round_to_format(double v, int mantissa, int min_exponent);

// One element of `dtype` at `p`, read as a double, or written from one (rounded once).
double load_value(DType dtype, const uint8_t* p);
void store_value(DType dtype, uint8_t* p, double v);

// Half an ulp of `dtype` at magnitude x: the error of one correct rounding.
double half_ulp(DType dtype, double x);

}  // namespace ropejit::oracle
