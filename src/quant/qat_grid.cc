#include "quant/qat_grid.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include <fmt/format.h>

#include "formats/dtype.h"
#include "util/error.h"
#include "quant/qat_grid_avx512.h"
#include "quant/w4a16.h"

namespace qs {
namespace {

// The loops below have no early exits and fixed trip counts for the 32-wide group, so the compiler turns each
// into a few vector instructions; fit_group32 is cloned for AVX-512 and AVX2 and picked at run time.
#define QS_INLINE inline __attribute__((always_inline))

QS_INLINE float level_f(float w, float s) {
  return std::clamp(std::rint(w / s), float(kMinLevel), float(kMaxLevel));
}

// Largest |v|: on non-negative floats the bit patterns order like the values, so an integer max vectorises.
template <int N>
QS_INLINE float abs_max(const float* v, int n) {
  if constexpr (N > 0) n = N;
  uint32_t m = 0;
  for (int i = 0; i < n; ++i) {
    uint32_t u = std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu;
    m = u > m ? u : m;
  }
  return std::bit_cast<float>(m);
}

// Whether every value sits within tol of its level on step s.
template <int N>
QS_INLINE bool fits_step(const float* w, int n, float s, float tol) {
  if constexpr (N > 0) n = N;
  int bad = 0;
  for (int i = 0; i < n; ++i) bad |= std::fabs(w[i] - level_f(w[i], s) * s) > tol;
  return !bad;
}

template <int N>
QS_INLINE int bit_exact_count(const float* w, int n, float s) {
  if constexpr (N > 0) n = N;
  int exact = 0;
  for (int i = 0; i < n; ++i) exact += round_to_bf16(level_f(w[i], s) * s) == w[i];
  return exact;
}

template <int N>
QS_INLINE float levels_on_step(const float* w, int n, float s, int8_t* levels) {
  if constexpr (N > 0) n = N;
  uint32_t worst = 0;
  for (int i = 0; i < n; ++i) {
    float q = s == 0 ? 0.0f : level_f(w[i], s);
    levels[i] = static_cast<int8_t>(q);
    uint32_t e = std::bit_cast<uint32_t>(std::fabs(w[i] - q * s));
    worst = e > worst ? e : worst;
  }
  return std::bit_cast<float>(worst);
}

template <int N>
QS_INLINE GroupFit finish_fit(const float* w, int n, float step, float amax, int8_t* levels) {
  GroupFit fit;
  fit.scale_bf16 = f32_to_bf16(step);
  fit.max_error = levels_on_step<N>(w, n, bf16_to_f32(fit.scale_bf16), levels);
  fit.on_grid = fit.max_error <= grid_tolerance(amax);
  return fit;
}

// The least-squares step sits within an ulp of the true one; of bf16(step) and its two neighbours keep the one
// that reproduces the most values bit for bit (exact when the export's step was itself a bf16 number).
template <int N>
QS_INLINE float best_bf16_step(const float* w, int n, float step) {
  uint16_t center = f32_to_bf16(step);
  float best = bf16_to_f32(center);
  int best_exact = bit_exact_count<N>(w, n, best);
  if (best_exact == (N > 0 ? N : n)) return best;
  for (uint16_t candidate : {uint16_t(center - 1), uint16_t(center + 1)}) {
    float s = bf16_to_f32(candidate);
    if (s <= 0 || !std::isfinite(s)) continue;
    if (int exact = bit_exact_count<N>(w, n, s); exact > best_exact) best = s, best_exact = exact;
  }
  return best;
}

// Least squares over the group: the step that best explains every value at the levels of `candidate`.
template <int N>
QS_INLINE float least_squares_step(const float* w, int n, float candidate) {
  if constexpr (N > 0) n = N;
  double qw = 0;
  int32_t qq = 0;  // exact: at most 32 x 64
  for (int i = 0; i < n; ++i) {
    float q = level_f(w[i], candidate);
    qw += double(q) * w[i];
    qq += static_cast<int32_t>(q * q);
  }
  return static_cast<float>(qw / qq);
}

template <int N>
QS_INLINE GroupFit fit_group(const float* w, int n, int8_t* levels) {
  float amax = abs_max<N>(w, n);
  if (amax == 0) return finish_fit<N>(w, n, 0, 0, levels);
  float tol = grid_tolerance(amax);
  const int count = N > 0 ? N : n;
  for (int m = 1; m <= 8; ++m) {
    float candidate = amax / m;
    // Wrong m usually show in the first half: test it alone before the rest.
    constexpr int H = N > 0 ? N / 2 : 0;
    if constexpr (N > 0) {
      if (!fits_step<H>(w, H, candidate, tol) || !fits_step<H>(w + H, H, candidate, tol)) continue;
    } else if (!fits_step<0>(w, n, candidate, tol)) {
      continue;
    }
    // The common case: the candidate itself, rounded to bf16, reproduces every value bit for bit.
    float rounded = round_to_bf16(candidate);
    if (bit_exact_count<N>(w, n, rounded) == count) return finish_fit<N>(w, n, rounded, amax, levels);
    return finish_fit<N>(w, n, best_bf16_step<N>(w, n, least_squares_step<N>(w, n, candidate)), amax, levels);
  }
  GroupFit off = finish_fit<N>(w, n, amax / 8, amax, levels);
  off.on_grid = false;
  return off;
}

__attribute__((target_clones("avx512f", "avx2", "default")))
GroupFit fit_group32(const float* w, int8_t* levels) { return fit_group<kQatGroupSize>(w, kQatGroupSize, levels); }

}  // namespace

int8_t level_on_grid(float w, float s) { return s == 0 ? 0 : static_cast<int8_t>(level_f(w, s)); }

GroupFit fit_qat_group(std::span<const float> values, std::span<int8_t> levels) {
  if (values.size() == kQatGroupSize && cpu_runs_qat_grid_avx512())
    if (std::optional<GroupFit> fit = fit_group32_avx512(values.data(), levels.data())) return *fit;
  return fit_qat_group_search(values, levels);
}

GroupFit fit_qat_group_search(std::span<const float> values, std::span<int8_t> levels) {
  if (values.size() == kQatGroupSize) return fit_group32(values.data(), levels.data());
  return fit_group<0>(values.data(), static_cast<int>(values.size()), levels.data());
}

GroupFit fit_fixed_divisor(std::span<const float> values, float divisor, std::span<int8_t> levels) {
  int n = static_cast<int>(values.size());
  float amax = abs_max<0>(values.data(), n);
  return finish_fit<0>(values.data(), n, amax / divisor, amax, levels.data());
}

namespace {

// compressed-tensors' quantizer on bf16 weights (qat_grid.h: Ct75).
GroupFit fit_ct75(std::span<const float> values, std::span<int8_t> levels) {
  int n = static_cast<int>(values.size());
  float amax = abs_max<0>(values.data(), n);
  GroupFit fit;
  fit.scale_bf16 = amax == 0 ? f32_to_bf16(0x1p-7f) : f32_to_bf16(amax / 7.5f);
  float s = bf16_to_f32(fit.scale_bf16);
  uint32_t worst = 0;
  for (int i = 0; i < n; ++i) {
    float q = std::clamp(std::rint(round_to_bf16(values[i] / s)), float(kMinLevel), float(kMaxLevel));
    levels[i] = static_cast<int8_t>(q);
    worst = std::max(worst, std::bit_cast<uint32_t>(std::fabs(values[i] - q * s)));
  }
  fit.max_error = std::bit_cast<float>(worst);
  fit.on_grid = fit.max_error <= grid_tolerance(amax);
  return fit;
}

}  // namespace

RepackGrid parse_repack_grid(const std::string& name) {
  if (name == "lossless") return RepackGrid::Lossless;
  if (name == "textbook") return RepackGrid::Textbook;
  if (name == "ct-7.5") return RepackGrid::Ct75;
  throw Error(fmt::format("--grid '{}': expected lossless, textbook or ct-7.5", name));
}

std::string_view repack_grid_name(RepackGrid grid) {
  switch (grid) {
    case RepackGrid::Textbook: return "textbook";
    case RepackGrid::Ct75: return "ct-7.5";
    default: return "lossless";
  }
}

GroupFit fit_group_on(RepackGrid grid, std::span<const float> values, std::span<int8_t> levels) {
  switch (grid) {
    case RepackGrid::Textbook: return fit_fixed_divisor(values, 8.0f, levels);
    case RepackGrid::Ct75: return fit_ct75(values, levels);
    default: return fit_qat_group(values, levels);
  }
}

bool group_nearest_on_scale(std::span<const float> values, std::span<const int8_t> levels, float scale) {
  // Half a level, widened by a bf16 ulp of the quotient (at most 2^-8 relative: 0.034 at |quotient| <= 8.5).
  constexpr float kHalf = 0.5f + 9.0f / 256.0f;
  if (!(scale > 0)) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    float x = values[i] / scale;
    bool clamped = (levels[i] == kMaxLevel && x > kMaxLevel) || (levels[i] == kMinLevel && x < kMinLevel);
    if (!clamped && std::fabs(x - levels[i]) > kHalf) return false;
  }
  return true;
}

bool group_matches(std::span<const float> values, std::span<const int8_t> levels, float scale) {
  float tol = grid_tolerance(abs_max<0>(values.data(), static_cast<int>(values.size())));
  for (size_t i = 0; i < values.size(); ++i) {
    if (levels[i] != level_on_grid(values[i], scale)) return false;
    if (std::fabs(levels[i] * scale - values[i]) > tol) return false;
  }
  return true;
}

}  // namespace qs
