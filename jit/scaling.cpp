// Frequency scaling variants in float64, each written from its published definition:
//   linear (position interpolation, Chen et al. 2023): every frequency divided by the factor;
//   dynamic NTK (the "NTK-aware" rescaled base, bloc97/emozilla; the form Hugging Face ships):
//     base * (factor * L' / L - (factor - 1))^(R / (R - 2)) with L' = max(seq_len, L);
//   Llama 3.1 (Meta's reference model code): wavelengths above L / low_freq_factor interpolated
//     by the factor, below L / high_freq_factor kept, a linear blend in between;
//   YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension"): a ramp over the pair
//     index between the dimensions that turn beta_fast and beta_slow times in L positions, and the
//     attention factor 0.1 ln(factor) + 1 ("mscale"), as a ratio of two such terms for
//     DeepSeek-V2/V3 (mscale, mscale_all_dim);
//   LongRoPE (Ding et al. 2024) as Phi-3 ships it ("su"): per-pair divisors, the short set up to
//     L positions and the long set beyond, attention factor sqrt(1 + ln(factor) / ln(L)).
// L is RopeScaling::original_max_positions throughout.
#include "jit/scaling.hpp"

#include <algorithm>
#include <cmath>

#include "jit/errors.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

bool positive(double v) { return std::isfinite(v) && v > 0; }

void check_rotary_dim(int32_t rotary_dim) {
  if (rotary_dim < 2 || rotary_dim % 2 != 0)
    invalid("rotary_dim (", rotary_dim, ") must be even and >= 2");
}

// base^(-2i/R) for i < R/2: the unscaled RoPE frequencies (Su et al., RoFormer).
std::vector<double> unscaled(int32_t rotary_dim, double base) {
  std::vector<double> inv(size_t(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(base, 2.0 * double(i) / double(rotary_dim));
  return inv;
}

// YaRN's magnitude term: 1 for factors <= 1, else 0.1 * m * ln(factor) + 1.
double yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// The pair index (fractional) whose frequency turns `rotations` times over L positions:
// L * base^(-2d/R) = 2π * rotations, solved for d.
double correction_dim(double rotations, int32_t rotary_dim, double base, double L) {
  return double(rotary_dim) * std::log(L / (rotations * kTwoPi)) / (2.0 * std::log(base));
}

std::vector<double> yarn(int32_t rotary_dim, double base, const RopeScaling& s) {
  const double L = double(s.original_max_positions);
  double low = correction_dim(s.beta_fast, rotary_dim, base, L);
  double high = correction_dim(s.beta_slow, rotary_dim, base, L);
  if (s.truncate) {  // whole dimensions, the original YaRN code's choice
    low = std::floor(low);
    high = std::ceil(high);
  }
  // The reference clamps to [0, R - 1], R the rotary width, though the ramp runs over R/2 pairs.
  low = std::max(low, 0.0);
  high = std::min(high, double(rotary_dim - 1));
  if (low == high) high += 0.001;  // the reference's guard against a zero-width ramp
  std::vector<double> inv = unscaled(rotary_dim, base);
  for (size_t i = 0; i < inv.size(); ++i) {
    // ramp: 0 up to `low` (fast dimensions keep their frequency), 1 from `high` on (slow ones
    // are interpolated by the factor), linear between.
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;
    inv[i] = inv[i] / s.factor * (1.0 - keep) + inv[i] * keep;
  }
  return inv;
}

std::vector<double> llama3(int32_t rotary_dim, double base, const RopeScaling& s) {
  const double L = double(s.original_max_positions);
  const double low_wavelen = L / s.low_freq_factor;    // longer: interpolated
  const double high_wavelen = L / s.high_freq_factor;  // shorter: kept
  std::vector<double> inv = unscaled(rotary_dim, base);
  for (double& f : inv) {
    const double wavelen = kTwoPi / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f /= s.factor;
      continue;
    }
    const double smooth =
        (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = (1.0 - smooth) * f / s.factor + smooth * f;
  }
  return inv;
}

std::vector<double> dynamic_ntk(int32_t rotary_dim, double base, const RopeScaling& s) {
  const int64_t L = s.original_max_positions;
  // Up to the trained length the frequencies are the model's own, exactly.
  if (s.seq_len <= L) return unscaled(rotary_dim, base);
  const double ratio = s.factor * double(s.seq_len) / double(L) - (s.factor - 1.0);
  const double scaled_base = base * std::pow(ratio, double(rotary_dim) / double(rotary_dim - 2));
  return unscaled(rotary_dim, scaled_base);
}

std::vector<double> longrope(int32_t rotary_dim, double base, const RopeScaling& s) {
  const double* divisors = s.seq_len > s.original_max_positions ? s.long_factor : s.short_factor;
  std::vector<double> inv(size_t(rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / (divisors[i] * std::pow(base, 2.0 * double(i) / double(rotary_dim)));
  return inv;
}

}  // namespace

void validate_scaling(Freqs freqs, int32_t rotary_dim, const RopeScaling& s, const char* where) {
  if (!is_valid(freqs)) invalid("freqs (", int32_t(freqs), ") is not a known value");
  if (freqs == Freqs::table || freqs == Freqs::computed) return;
  check_rotary_dim(rotary_dim);
  const char* variant = name_of(freqs);
  auto require = [&](bool ok, const char* field, auto value, const char* rule) {
    if (!ok) invalid(where, ".", field, " (", value, ") must be ", rule, " for ", variant);
  };
  if (freqs != Freqs::longrope) require(positive(s.factor), "factor", s.factor, "> 0");
  // longrope reads the factor only for its default attention factor, where <= 1 means none.
  if (freqs == Freqs::longrope)
    require(std::isfinite(s.factor) && s.factor >= 0, "factor", s.factor, ">= 0");
  if (freqs != Freqs::linear) {
    require(s.original_max_positions > 0, "original_max_positions", s.original_max_positions,
            "> 0");
  }
  if (freqs == Freqs::dynamic_ntk || freqs == Freqs::longrope)
    require(s.seq_len >= 0, "seq_len", s.seq_len, ">= 0");
  switch (freqs) {
    case Freqs::dynamic_ntk:
      if (rotary_dim <= 2)
        invalid("rotary_dim (", rotary_dim, ") must be > 2 for ntk: its base exponent is ",
                "R / (R - 2)");
      break;
    case Freqs::llama3:
      require(positive(s.low_freq_factor), "low_freq_factor", s.low_freq_factor, "> 0");
      require(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor,
              "high_freq_factor", s.high_freq_factor,
              concat("> low_freq_factor (", s.low_freq_factor, ")").c_str());
      break;
    case Freqs::yarn:
      require(positive(s.beta_slow), "beta_slow", s.beta_slow, "> 0");
      require(std::isfinite(s.beta_fast) && s.beta_fast >= s.beta_slow, "beta_fast", s.beta_fast,
              concat(">= beta_slow (", s.beta_slow, ")").c_str());
      require(std::isfinite(s.mscale) && s.mscale >= 0, "mscale", s.mscale, ">= 0 (0: not given)");
      require(std::isfinite(s.mscale_all_dim) && s.mscale_all_dim >= 0, "mscale_all_dim",
              s.mscale_all_dim, ">= 0 (0: not given)");
      require(std::isfinite(s.attention_factor) && s.attention_factor >= 0, "attention_factor",
              s.attention_factor, ">= 0 (0: from the definition)");
      break;
    case Freqs::longrope: {
      require(s.original_max_positions > 1, "original_max_positions", s.original_max_positions,
              "> 1 (its logarithm divides)");
      require(std::isfinite(s.attention_factor) && s.attention_factor >= 0, "attention_factor",
              s.attention_factor, ">= 0 (0: from the definition)");
      const std::pair<const double*, const char*> arrays[] = {{s.short_factor, "short_factor"},
                                                              {s.long_factor, "long_factor"}};
      for (const auto& [array, name] : arrays)
        if (!array)
          invalid(where, ".", name, " is null but longrope needs rotary_dim / 2 (", rotary_dim / 2,
                  ") values in both short_factor and long_factor");
      if (s.factor_count != rotary_dim / 2)
        invalid(where, ".factor_count (", s.factor_count, ") must be rotary_dim / 2 (",
                rotary_dim / 2,
                ") for longrope: short_factor and long_factor each hold that many values");
      for (const auto& [array, name] : arrays)
        for (int32_t i = 0; i < rotary_dim / 2; ++i)
          if (!positive(array[i]))
            invalid(where, ".", name, "[", i, "] (", array[i], ") must be > 0 for longrope");
      break;
    }
    default:
      break;
  }
}

std::vector<double> inverse_frequencies(Freqs freqs, int32_t rotary_dim, double base,
                                        const RopeScaling& s, const char* where) {
  if (freqs == Freqs::table)
    invalid("freqs (tab) has no frequencies: its cos/sin come from the caller's tables");
  validate_scaling(freqs, rotary_dim, s, where);
  check_rotary_dim(rotary_dim);
  if (!(std::isfinite(base) && base > 1.0))
    invalid("base (", base, ") must be a finite number > 1");
  switch (freqs) {
    case Freqs::linear: {
      std::vector<double> inv = unscaled(rotary_dim, base);
      for (double& f : inv) f /= s.factor;
      return inv;
    }
    case Freqs::dynamic_ntk:
      return dynamic_ntk(rotary_dim, base, s);
    case Freqs::llama3:
      return llama3(rotary_dim, base, s);
    case Freqs::yarn:
      return yarn(rotary_dim, base, s);
    case Freqs::longrope:
      return longrope(rotary_dim, base, s);
    default:
      return unscaled(rotary_dim, base);
  }
}

double attention_factor(Freqs freqs, int32_t rotary_dim, const RopeScaling& s, const char* where) {
  validate_scaling(freqs, rotary_dim, s, where);
  if (freqs == Freqs::yarn) {
    if (s.attention_factor > 0) return s.attention_factor;
    // DeepSeek-V2/V3 give both terms; their ratio (1 when equal) scales cos/sin, and the model
    // puts mscale_all_dim's term into the softmax scale instead. With either term missing the
    // YaRN paper's 0.1 ln(factor) + 1 applies (what Hugging Face does; DeepSeek's own code and
    // vLLM would still use a lone mscale).
    if (s.mscale > 0 && s.mscale_all_dim > 0)
      return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
    return yarn_mscale(s.factor, 1.0);
  }
  if (freqs == Freqs::longrope) {
    if (s.attention_factor > 0) return s.attention_factor;
    if (s.factor <= 1) return 1.0;
    return std::sqrt(1.0 + std::log(s.factor) / std::log(double(s.original_max_positions)));
  }
  return 1.0;
}

std::vector<int8_t> mrope_pair_rows(int32_t rotary_dim, const int32_t section[3],
                                    bool interleaved) {
  check_rotary_dim(rotary_dim);
  const int64_t pairs = rotary_dim / 2;
  const int64_t sum = int64_t(section[0]) + section[1] + section[2];
  if (section[0] < 0 || section[1] < 0 || section[2] < 0 || sum != pairs)
    invalid("args.mrope_section (", section[0], ", ", section[1], ", ", section[2],
            ") must be >= 0 and sum to rotary_dim / 2 (", pairs, ")");
  std::vector<int8_t> rows(size_t(pairs), 0);
  for (int64_t i = 0; i < pairs; ++i) {
    if (interleaved) {
      // Pair i takes row i % 3 while that row's section lasts (its pairs 1, 4, 7, ... or
      // 2, 5, 8, ... below 3 * section), and the temporal row otherwise.
      const int64_t r = i % 3;
      if (r != 0 && i < 3 * int64_t(section[r])) rows[size_t(i)] = int8_t(r);
    } else {
      rows[size_t(i)] = int8_t(i < section[0] ? 0 : i < section[0] + section[1] ? 1 : 2);
    }
  }
  return rows;
}

}  // namespace ropejit::detail
