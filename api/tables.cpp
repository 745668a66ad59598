// Host frequencies and cos/sin tables for the public API: float64 angles from jit/scaling, each
// table value rounded once to the table dtype with autotune/numbers' exact rounding.
#include <cmath>
#include <cstring>

#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "jit/names.hpp"
#include "jit/scaling.hpp"
#include "oracle/numbers.hpp"

namespace ropejit {

std::vector<double> inverse_frequencies(Freqs freqs, int32_t rotary_dim, double base,
                                        const RopeScaling& scaling) {
  return detail::inverse_frequencies(freqs, rotary_dim, base, scaling, "scaling");
}

double attention_factor(Freqs freqs, int32_t rotary_dim, const RopeScaling& scaling) {
  return detail::attention_factor(freqs, rotary_dim, scaling, "scaling");
}

namespace {

// One value in the table dtype's bits, rounded once from float64.
void store(DType dtype, double v, unsigned char* out) {
  switch (dtype) {
    case DType::f32: {
      const float f = oracle::f32_value(v);
      std::memcpy(out, &f, sizeof f);
      return;
    }
    case DType::f16: {
      const uint16_t b = oracle::f16_bits(v);
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case DType::bf16: {
      const uint16_t b = oracle::bf16_bits(v);
      std::memcpy(out, &b, sizeof b);
      return;
    }
  }
}

// Row stride (elements) after checking every size, pointer and the bytes the tables span.
int64_t checked_stride(const Spec& spec, const TableSpec& t, int64_t width, const void* cos,
                       const void* sin) {
  if (spec.freqs != Freqs::table)
    detail::invalid("spec.freqs (", to_string(spec.freqs),
                    ") must be tab: tables are read by table keys (the variant goes in "
                    "table.freqs)");
  if (t.freqs == Freqs::table)
    detail::invalid(
        "table.freqs (tab) must name the frequencies to tabulate: comp or a scaling "
        "variant");
  if (!cos || !sin) detail::invalid(cos ? "sin" : "cos", " is null");
  if (cos == sin) detail::invalid("cos and sin (", cos, ") are the same memory");
  if (t.rows < 1) detail::invalid("table.rows (", t.rows, ") must be >= 1");
  const int64_t stride = t.row_stride == 0 ? width : t.row_stride;
  if (stride < width)
    detail::invalid("table.row_stride (", t.row_stride, ") is smaller than the row width (", width,
                    ")");
  int64_t span = 0;
  if (__builtin_mul_overflow(t.rows - 1, stride, &span) ||
      __builtin_add_overflow(span, width, &span) ||
      __builtin_mul_overflow(span, int64_t(detail::element_bytes(spec.table_dtype)), &span))
    detail::invalid("table.rows (", t.rows, ") * row stride (", stride, ") overflows");
  return stride;
}

}  // namespace

void build_tables(const Spec& spec, const TableSpec& table, void* cos, void* sin) {
  spec.validate();
  const int32_t rotary_dim = spec.rotary_dim == 0 ? spec.head_dim : spec.rotary_dim;
  const int64_t half = rotary_dim / 2;
  const int64_t width = spec.table_width == TableWidth::half ? half : rotary_dim;
  const int64_t stride = checked_stride(spec, table, width, cos, sin);
  const std::vector<double> inv = detail::inverse_frequencies(table.freqs, rotary_dim, table.base,
                                                              table.scaling, "table.scaling");
  const double scale =
      detail::attention_factor(table.freqs, rotary_dim, table.scaling, "table.scaling");
  const int64_t elem = detail::element_bytes(spec.table_dtype);
  auto* cos_bytes = static_cast<unsigned char*>(cos);
  auto* sin_bytes = static_cast<unsigned char*>(sin);
  std::vector<double> c(inv.size()), s(inv.size());
  for (int64_t row = 0; row < table.rows; ++row) {
    for (size_t i = 0; i < inv.size(); ++i) {
      const double angle = double(row) * inv[i];
      c[i] = std::cos(angle) * scale;
      s[i] = std::sin(angle) * scale;
    }
    for (int64_t col = 0; col < width; ++col) {
      // Full rows repeat each pair's value where the key reads it: neox halves, gptj neighbours.
      const int64_t pair = spec.table_width == TableWidth::half ? col
                           : spec.style == Style::neox          ? col % half
                                                                : col / 2;
      const int64_t at = (row * stride + col) * elem;
      store(spec.table_dtype, c[size_t(pair)], cos_bytes + at);
      store(spec.table_dtype, s[size_t(pair)], sin_bytes + at);
    }
  }
}

}  // namespace ropejit
