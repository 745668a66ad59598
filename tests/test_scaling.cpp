// Frequency scaling variants in float64: every shipped config's frequencies and attention factor
// against the values transformers itself computes (tests/data/hf_golden.json), each variant's
// defining properties, parameter checks, mRoPE pair rows, and host tables rounded once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jit/scaling.hpp"
#include "oracle/numbers.hpp"
#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"
#include "test_util.hpp"

using namespace ropejit;

namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

std::string data(const std::string& name) { return std::string(ROPEJIT_DATA_DIR) + "/" + name; }

// Relative difference, the golden comparison's measure.
double rel(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

Freqs freqs_of(const std::string& rope_type) {
  if (rope_type == "default") return Freqs::computed;
  if (rope_type == "linear") return Freqs::linear;
  if (rope_type == "dynamic") return Freqs::dynamic_ntk;
  if (rope_type == "llama3") return Freqs::llama3;
  if (rope_type == "yarn") return Freqs::yarn;
  if (rope_type == "longrope") return Freqs::longrope;
  FAIL("unknown rope_type in the golden file: ", rope_type);
  return Freqs::table;
}

RopeScaling yarn_scaling() {
  RopeScaling s;
  s.factor = 4;
  s.original_max_positions = 32768;
  return s;
}

}  // namespace

TEST_CASE("every shipped config: frequencies and attention factor equal transformers' (1e-12)") {
  const nlohmann::json golden = nlohmann::json::parse(testing::read_file(data("hf_golden.json")));
  REQUIRE(golden["models"].size() >= 13);
  size_t compared = 0;
  double worst = 0;
  for (const nlohmann::json& model : golden["models"]) {
    const std::string file = model["file"];
    INFO(file);
    const ModelRope m = model_from_hf_config_file(data("hf/" + file));
    CHECK(m.q_heads == model["num_attention_heads"].get<int>());
    if (m.rotary_offset == 0) {  // transformers calls MLA's rotary part head_dim
      CHECK(m.kv_heads == model["num_key_value_heads"].get<int>());
      CHECK(m.head_dim == model["head_dim"].get<int>());
    } else {
      CHECK(m.rotary_dim == model["head_dim"].get<int>());
    }
    CHECK(m.max_positions == model["max_position_embeddings"].get<int64_t>());
    for (const nlohmann::json& layer : model["layers"]) {
      const bool sliding = layer["layer"] == "sliding_attention";
      const Freqs freqs = sliding ? Freqs::computed : m.freqs;
      const double base = sliding ? m.local_base : m.base;
      CHECK(freqs == freqs_of(layer["rope_type"]));
      CHECK(base == layer["rope_theta"].get<double>());
      for (const nlohmann::json& c : layer["cases"]) {
        RopeScaling s = m.scaling;
        s.seq_len = c["seq_len"].is_null() ? 0 : c["seq_len"].get<int64_t>();
        INFO("layer ", layer["layer"].get<std::string>(), ", seq_len ", s.seq_len);
        const std::vector<double> want = c["inv_freq"].get<std::vector<double>>();
        REQUIRE(int(want.size()) * 2 == m.rotary_dim);
        const std::vector<double> got = inverse_frequencies(freqs, m.rotary_dim, base, s);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("pair ", i, ": ", got[i], " vs ", want[i]);
          CHECK(rel(got[i], want[i]) < 1e-12);
          worst = std::max(worst, rel(got[i], want[i]));
        }
        CHECK(rel(attention_factor(freqs, m.rotary_dim, s), c["attention_factor"]) < 1e-12);
        ++compared;
      }
    }
  }
  MESSAGE(compared, " frequency sets compared with transformers': largest relative difference ",
          worst);
}

TEST_CASE("computed and linear: base^(-2i/R), and that divided by the factor") {
  RopeScaling s;
  const std::vector<double> plain = inverse_frequencies(Freqs::computed, 4, 10000, s);
  REQUIRE(plain.size() == 2);
  CHECK(plain[0] == 1.0);
  CHECK(plain[1] == doctest::Approx(0.01).epsilon(1e-15));
  s.factor = 8;
  const std::vector<double> lin = inverse_frequencies(Freqs::linear, 128, 500000, s);
  const std::vector<double> ref = inverse_frequencies(Freqs::computed, 128, 500000, s);
  for (size_t i = 0; i < lin.size(); ++i) CHECK(lin[i] == ref[i] / 8);
  CHECK(attention_factor(Freqs::linear, 128, s) == 1.0);
}

TEST_CASE("llama3: kept above high frequencies, divided below low ones, blended between") {
  RopeScaling s;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_positions = 8192;
  const std::vector<double> ref = inverse_frequencies(Freqs::computed, 128, 500000, s);
  const std::vector<double> got = inverse_frequencies(Freqs::llama3, 128, 500000, s);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double wavelen = kTwoPi / ref[i];
    INFO("pair ", i, " wavelength ", wavelen);
    if (wavelen < 8192.0 / 4) {
      CHECK(got[i] == ref[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      CHECK(got[i] == ref[i] / 8);
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      CHECK(got[i] == doctest::Approx((1 - smooth) * ref[i] / 8 + smooth * ref[i]).epsilon(1e-15));
      CHECK(got[i] < ref[i]);
      CHECK(got[i] > ref[i] / 8);
      ++blended;
    }
  }
  CHECK(kept > 0);
  CHECK(divided > 0);
  CHECK(blended > 0);
  CHECK(attention_factor(Freqs::llama3, 128, s) == 1.0);
}

TEST_CASE("yarn: the ramp between the beta_fast and beta_slow dimensions, and mscale") {
  const RopeScaling s = yarn_scaling();
  const double base = 1e6;
  const std::vector<double> ref = inverse_frequencies(Freqs::computed, 128, base, s);
  const std::vector<double> got = inverse_frequencies(Freqs::yarn, 128, base, s);
  // The dimension turning n times over L positions: R ln(L / (2πn)) / (2 ln base).
  auto dim_of = [&](double n) {
    return 128 * std::log(32768 / (kTwoPi * n)) / (2 * std::log(base));
  };
  const double low = std::floor(dim_of(32)), high = std::ceil(dim_of(1));
  REQUIRE(low > 0);
  REQUIRE(high < 63);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("pair ", i, " (ramp ", low, " .. ", high, ")");
    if (double(i) <= low)
      CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-15));  // fast: extrapolated
    else if (double(i) >= high)
      CHECK(got[i] == doctest::Approx(ref[i] / 4).epsilon(1e-15));  // slow: interpolated
    else
      CHECK(got[i] == doctest::Approx(ref[i] / 4 * ((i - low) / (high - low)) +
                                      ref[i] * (1 - (i - low) / (high - low)))
                          .epsilon(1e-15));
  }
  // Without truncation the ramp ends are fractional dimensions: the blended pairs move.
  RopeScaling exact = s;
  exact.truncate = false;
  const std::vector<double> untruncated = inverse_frequencies(Freqs::yarn, 128, base, exact);
  CHECK(untruncated[size_t(low) + 1] != got[size_t(low) + 1]);
  CHECK(untruncated[0] == got[0]);
  // The attention factor: 0.1 ln(factor) + 1; DeepSeek's ratio; an explicit value wins.
  CHECK(attention_factor(Freqs::yarn, 128, s) == doctest::Approx(0.1 * std::log(4.0) + 1));
  RopeScaling ds = s;
  ds.factor = 40;
  ds.mscale = 0.707;
  ds.mscale_all_dim = 0.707;
  CHECK(attention_factor(Freqs::yarn, 64, ds) == 1.0);
  ds.mscale = 1.0;
  CHECK(attention_factor(Freqs::yarn, 64, ds) ==
        doctest::Approx((0.1 * std::log(40.0) + 1) / (0.0707 * std::log(40.0) + 1)));
  ds.mscale_all_dim = 0;  // only one term given: the paper's default, as transformers does
  CHECK(attention_factor(Freqs::yarn, 64, ds) == doctest::Approx(0.1 * std::log(40.0) + 1));
  ds.attention_factor = 0.5;
  CHECK(attention_factor(Freqs::yarn, 64, ds) == 0.5);
  RopeScaling shrink = s;
  shrink.factor = 0.5;  // factors <= 1 leave magnitudes alone
  CHECK(attention_factor(Freqs::yarn, 128, shrink) == 1.0);
}

TEST_CASE("longrope: short factors up to the original length, long ones beyond") {
  std::vector<double> short_f(32), long_f(32);
  for (size_t i = 0; i < 32; ++i) {
    short_f[i] = 1.0 + 0.01 * double(i);
    long_f[i] = 1.0 + double(i);
  }
  RopeScaling s;
  s.short_factor = short_f.data();
  s.long_factor = long_f.data();
  s.factor_count = 32;
  s.original_max_positions = 4096;
  s.factor = 32;
  const std::vector<double> ref = inverse_frequencies(Freqs::computed, 64, 10000, s);
  for (const int64_t seq_len :
       {int64_t(0), int64_t(1), int64_t(4096), int64_t(4097), int64_t(1) << 20}) {
    s.seq_len = seq_len;
    const std::vector<double>& divisors = seq_len > 4096 ? long_f : short_f;
    const std::vector<double> got = inverse_frequencies(Freqs::longrope, 64, 10000, s);
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == doctest::Approx(ref[i] / divisors[i]).epsilon(1e-15));
  }
  CHECK(attention_factor(Freqs::longrope, 64, s) ==
        doctest::Approx(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));
  s.factor = 1;
  CHECK(attention_factor(Freqs::longrope, 64, s) == 1.0);
  s.attention_factor = 1.25;
  CHECK(attention_factor(Freqs::longrope, 64, s) == 1.25);
}

TEST_CASE(
    "dynamic NTK: the model's own frequencies up to the original length, a larger base after") {
  RopeScaling s;
  s.factor = 2;
  s.original_max_positions = 4096;
  const std::vector<double> ref = inverse_frequencies(Freqs::computed, 128, 10000, s);
  for (const int64_t seq_len : {int64_t(0), int64_t(1), int64_t(4095), int64_t(4096)}) {
    s.seq_len = seq_len;
    CHECK(inverse_frequencies(Freqs::dynamic_ntk, 128, 10000, s) == ref);
  }
  s.seq_len = 8192;  // base * (2 * 8192 / 4096 - 1)^(128 / 126) = 10000 * 3^(64/63)
  const double scaled_base = 10000 * std::pow(3.0, 128.0 / 126.0);
  const std::vector<double> got = inverse_frequencies(Freqs::dynamic_ntk, 128, 10000, s);
  const std::vector<double> want = inverse_frequencies(Freqs::computed, 128, scaled_base, s);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-15));
  CHECK(got[1] < ref[1]);
  s.seq_len = 16384;
  CHECK(inverse_frequencies(Freqs::dynamic_ntk, 128, 10000, s)[1] < got[1]);
}

TEST_CASE("scaling parameters are checked, naming the field and its value") {
  const std::vector<double> ones(64, 1.0);
  auto error = [](Freqs f, int32_t rotary_dim, const RopeScaling& s) {
    try {
      detail::validate_scaling(f, rotary_dim, s);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  RopeScaling s = yarn_scaling();
  s.factor = 0;
  CHECK(error(Freqs::yarn, 128, s) == "ropejit: args.scaling.factor (0) must be > 0 for yarn");
  s.factor = NAN;
  CHECK(error(Freqs::linear, 128, s) ==
        "ropejit: args.scaling.factor (nan) must be > 0 for linear");
  s = yarn_scaling();
  s.original_max_positions = 0;
  CHECK(error(Freqs::yarn, 128, s) ==
        "ropejit: args.scaling.original_max_positions (0) must be > 0 for yarn");
  s = yarn_scaling();
  s.beta_fast = 0.5;
  CHECK(error(Freqs::yarn, 128, s) ==
        "ropejit: args.scaling.beta_fast (0.5) must be >= beta_slow (1) for yarn");
  s = yarn_scaling();
  s.mscale = -1;
  CHECK(error(Freqs::yarn, 128, s) ==
        "ropejit: args.scaling.mscale (-1) must be >= 0 (0: not given) for yarn");
  s = yarn_scaling();
  s.high_freq_factor = 1;
  CHECK(error(Freqs::llama3, 128, s) ==
        "ropejit: args.scaling.high_freq_factor (1) must be > low_freq_factor (1) for llama3");
  CHECK(error(Freqs::dynamic_ntk, 2, yarn_scaling()) ==
        "ropejit: rotary_dim (2) must be > 2 for ntk: its base exponent is R / (R - 2)");
  s = yarn_scaling();
  s.seq_len = -1;
  CHECK(error(Freqs::dynamic_ntk, 128, s) ==
        "ropejit: args.scaling.seq_len (-1) must be >= 0 for ntk");
  s = yarn_scaling();
  CHECK(error(Freqs::longrope, 128, s) ==
        "ropejit: args.scaling.short_factor is null but longrope needs rotary_dim / 2 (64) values "
        "in both short_factor and long_factor");
  s.short_factor = ones.data();
  CHECK(error(Freqs::longrope, 128, s).find("args.scaling.long_factor is null") !=
        std::string::npos);
  std::vector<double> bad = ones;
  bad[7] = 0;
  s.long_factor = bad.data();
  CHECK(error(Freqs::longrope, 128, s) ==
        "ropejit: args.scaling.factor_count (0) must be rotary_dim / 2 (64) for longrope: "
        "short_factor and long_factor each hold that many values");
  s.factor_count = 63;  // one short: nothing past the 63rd value may be read
  CHECK(error(Freqs::longrope, 128, s).find("factor_count (63)") != std::string::npos);
  s.factor_count = 64;
  CHECK(error(Freqs::longrope, 128, s) ==
        "ropejit: args.scaling.long_factor[7] (0) must be > 0 for longrope");
  CHECK(error(Freqs::yarn, 7, yarn_scaling()) == "ropejit: rotary_dim (7) must be even and >= 2");
  CHECK(error(Freqs::table, 7, s) == "no error");  // tables' fields are not read
  CHECK_THROWS_WITH_AS(inverse_frequencies(Freqs::table, 64, 10000, s),
                       "ropejit: freqs (tab) has no frequencies: its cos/sin come from the "
                       "caller's tables",
                       Error);
  CHECK_THROWS_WITH_AS(inverse_frequencies(Freqs::computed, 64, 1.0, s),
                       "ropejit: base (1) must be a finite number > 1", Error);
  CHECK_THROWS_WITH_AS(inverse_frequencies(Freqs(42), 64, 1e4, s),
                       "ropejit: freqs (42) is not a known value", Error);
  // The public wrapper names its own argument.
  RopeScaling zero = yarn_scaling();
  zero.factor = 0;
  CHECK_THROWS_WITH_AS(attention_factor(Freqs::yarn, 64, zero),
                       "ropejit: scaling.factor (0) must be > 0 for yarn", Error);
}

TEST_CASE("mRoPE pair rows: contiguous (Qwen2-VL) and interleaved (Qwen3-VL) sections") {
  const int32_t qwen2[3] = {16, 24, 24};
  const std::vector<int8_t> rows = detail::mrope_pair_rows(128, qwen2, false);
  REQUIRE(rows.size() == 64);
  for (size_t i = 0; i < 64; ++i) CHECK(rows[i] == (i < 16 ? 0 : i < 40 ? 1 : 2));
  const int32_t qwen3[3] = {24, 20, 20};
  const std::vector<int8_t> il = detail::mrope_pair_rows(128, qwen3, true);
  const std::vector<int8_t> head = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  CHECK(std::vector<int8_t>(il.begin(), il.begin() + 9) == head);
  // Height and width run out at pair 60: the last pairs are temporal.
  CHECK(il[58] == 1);
  CHECK(il[59] == 2);
  CHECK(std::vector<int8_t>(il.begin() + 60, il.end()) == std::vector<int8_t>{0, 0, 0, 0});
  int count[3] = {0, 0, 0};
  for (int8_t r : il) ++count[r];
  CHECK(count[0] == 24);
  CHECK(count[1] == 20);
  CHECK(count[2] == 20);
  const int32_t bad[3] = {16, 24, 23};
  CHECK_THROWS_WITH_AS(detail::mrope_pair_rows(128, bad, false),
                       "ropejit: args.mrope_section (16, 24, 23) must be >= 0 and sum to "
                       "rotary_dim / 2 (64)",
                       Error);
  const int32_t negative[3] = {-1, 33, 32};
  CHECK_THROWS_AS(detail::mrope_pair_rows(128, negative, true), Error);
}

namespace {

// The expected bits of one table element: the float64 value rounded once to the table dtype.
uint32_t expected_bits(DType dtype, double v) {
  switch (dtype) {
    case DType::f32: {
      const float f = oracle::f32_value(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case DType::f16:
      return oracle::f16_bits(v);
    case DType::bf16:
      return oracle::bf16_bits(v);
  }
  return 0;
}

uint32_t stored_bits(DType dtype, const std::vector<unsigned char>& t, int64_t index) {
  uint32_t u = 0;
  std::memcpy(&u, t.data() + index * (dtype == DType::f32 ? 4 : 2), dtype == DType::f32 ? 4 : 2);
  return u;
}

}  // namespace

TEST_CASE("build_tables: every value is the float64 value rounded once, where the key reads it") {
  TableSpec t;
  t.freqs = Freqs::yarn;  // with its attention factor
  t.base = 1e6;
  t.scaling = yarn_scaling();
  t.rows = 3000;
  const double scale = attention_factor(t.freqs, 64, t.scaling);
  REQUIRE(scale > 1.1);
  const std::vector<double> inv = inverse_frequencies(t.freqs, 64, t.base, t.scaling);
  int64_t double_rounding_differs = 0;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const TableWidth width : {TableWidth::half, TableWidth::full})
      for (const Style style : {Style::neox, Style::gptj}) {
        Spec spec;
        spec.head_dim = 80;
        spec.rotary_dim = 64;
        spec.style = style;
        spec.table_dtype = dtype;
        spec.table_width = width;
        const int64_t cols = width == TableWidth::half ? 32 : 64;
        t.row_stride = cols + 3;  // a gap the builder must leave alone
        const size_t bytes = size_t((t.rows * t.row_stride) * (dtype == DType::f32 ? 4 : 2));
        std::vector<unsigned char> cos(bytes, 0xAB), sin(bytes, 0xAB);
        build_tables(spec, t, cos.data(), sin.data());
        INFO(to_string(dtype), " ", to_string(width), " ", to_string(style));
        int64_t wrong = 0;
        for (int64_t row = 0; row < t.rows; ++row)
          for (int64_t col = 0; col < cols; ++col) {
            const int64_t pair = width == TableWidth::half ? col
                                 : style == Style::neox    ? col % 32
                                                           : col / 2;
            const double angle = double(row) * inv[size_t(pair)];
            const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
            const int64_t at = row * t.row_stride + col;
            wrong += stored_bits(dtype, cos, at) != expected_bits(dtype, c);
            wrong += stored_bits(dtype, sin, at) != expected_bits(dtype, s);
            if (dtype == DType::bf16)  // rounding through float32 first would differ here
              double_rounding_differs += oracle::bf16_bits(c) != oracle::bf16_bits(float(c));
          }
        CHECK(wrong == 0);
        CHECK(cos[size_t(cols * (dtype == DType::f32 ? 4 : 2))] == 0xAB);  // the gap is untouched
      }
  CHECK(double_rounding_differs > 0);  // so the check above can tell the two apart
}

TEST_CASE("build_tables refuses what it cannot build, writing nothing") {
  Spec spec;
  TableSpec t;
  t.rows = 4;
  std::vector<float> cos(4 * 64, 7.0f), sin(4 * 64, 7.0f);
  spec.freqs = Freqs::computed;
  CHECK_THROWS_WITH_AS(build_tables(spec, t, cos.data(), sin.data()),
                       "ropejit: spec.freqs (comp) must be tab: tables are read by table keys (the "
                       "variant goes in table.freqs)",
                       Error);
  spec.freqs = Freqs::table;
  t.freqs = Freqs::table;
  CHECK_THROWS_WITH_AS(build_tables(spec, t, cos.data(), sin.data()),
                       "ropejit: table.freqs (tab) must name the frequencies to tabulate: comp or "
                       "a scaling variant",
                       Error);
  t.freqs = Freqs::computed;
  CHECK_THROWS_WITH_AS(build_tables(spec, t, nullptr, sin.data()), "ropejit: cos is null", Error);
  CHECK_THROWS_AS(build_tables(spec, t, cos.data(), cos.data()), Error);
  t.rows = 0;
  CHECK_THROWS_WITH_AS(build_tables(spec, t, cos.data(), sin.data()),
                       "ropejit: table.rows (0) must be >= 1", Error);
  t.rows = 4;
  t.row_stride = 63;
  CHECK_THROWS_WITH_AS(build_tables(spec, t, cos.data(), sin.data()),
                       "ropejit: table.row_stride (63) is smaller than the row width (64)", Error);
  t.row_stride = 0;
  t.freqs = Freqs::yarn;  // factor 1 is fine, original_max_positions 0 is not
  CHECK_THROWS_WITH_AS(build_tables(spec, t, cos.data(), sin.data()),
                       "ropejit: table.scaling.original_max_positions (0) must be > 0 for yarn",
                       Error);
  for (float v : cos) CHECK(v == 7.0f);
  t.freqs = Freqs::computed;
  build_tables(spec, t, cos.data(), sin.data());  // positions 0..3 of base 10000
  CHECK(cos[0] == 1.0f);
  CHECK(sin[0] == 0.0f);
  CHECK(cos[64] == oracle::f32_value(std::cos(1.0)));
  CHECK(sin[64 + 1] == oracle::f32_value(std::sin(std::pow(10000.0, -2.0 / 128))));
}

TEST_CASE("C API: tables, frequencies and attention factors") {
  ropejit_spec spec;
  ropejit_spec_init(&spec);
  spec.freqs = ROPEJIT_FREQS_TABLE;
  spec.table_dtype = ROPEJIT_BF16;
  ropejit_table_spec t;
  ropejit_table_spec_init(&t);
  CHECK(t.freqs == ROPEJIT_FREQS_COMPUTED);
  CHECK(t.base == 10000.0);
  CHECK(t.scaling.factor == 1.0);
  t.freqs = ROPEJIT_FREQS_LINEAR;
  t.scaling.factor = 2;
  t.rows = 16;
  std::vector<uint16_t> cos(16 * 64), sin(16 * 64);
  REQUIRE(ropejit_build_tables(&spec, &t, cos.data(), sin.data()) == ROPEJIT_OK);
  CHECK(cos[64] == oracle::bf16_bits(std::cos(0.5)));
  CHECK(std::string(ropejit_last_error()).empty());
  t.rows = -1;
  CHECK(ropejit_build_tables(&spec, &t, cos.data(), sin.data()) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: table.rows (-1) must be >= 1");
  CHECK(ropejit_build_tables(&spec, nullptr, cos.data(), sin.data()) ==
        ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: table is null");

  double inv[64];
  REQUIRE(ropejit_inverse_frequencies(&t, 128, inv, 64) == ROPEJIT_OK);
  CHECK(inv[0] == 0.5);
  CHECK(ropejit_inverse_frequencies(&t, 128, inv, 63) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) ==
        "ropejit: count (63) is smaller than rotary_dim / 2 (64)");
  t.freqs = ROPEJIT_FREQS_YARN;
  t.scaling.factor = 4;
  t.scaling.original_max_positions = 32768;
  double af = 0;
  REQUIRE(ropejit_attention_factor(&t, 128, &af) == ROPEJIT_OK);
  CHECK(af == doctest::Approx(0.1 * std::log(4.0) + 1));
  // longrope reads exactly factor_count values of each array, which must be rotary_dim / 2, and
  // scaling.truncate is a bool.
  const std::vector<double> ones(63, 1.0);
  t.freqs = ROPEJIT_FREQS_LONGROPE;
  t.scaling.short_factor = ones.data();
  t.scaling.long_factor = ones.data();
  t.scaling.factor_count = 63;
  CHECK(ropejit_inverse_frequencies(&t, 128, inv, 64) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) ==
        "ropejit: scaling.factor_count (63) must be rotary_dim / 2 (64) for longrope: "
        "short_factor and long_factor each hold that many values");
  t.freqs = ROPEJIT_FREQS_YARN;
  t.scaling.truncate = 7;
  CHECK(ropejit_attention_factor(&t, 128, &af) == ROPEJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ropejit_last_error()) == "ropejit: table.scaling.truncate (7) must be 0 or 1");
}
