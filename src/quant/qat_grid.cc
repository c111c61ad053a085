#include "quant/qat_grid.h"

#include <algorithm>
#include <cmath>

#include "formats/dtype.h"
#include "quant/w4a16.h"

namespace qs {
namespace {

float abs_max(std::span<const float> v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Levels of values on step s; returns the largest reconstruction error.
float quantize_on_step(std::span<const float> values, float s, std::span<int8_t> levels) {
  float err = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    levels[i] = level_on_grid(values[i], s);
    err = std::max(err, std::fabs(values[i] - levels[i] * s));
  }
  return err;
}

int bit_exact_count(std::span<const float> values, float s) {
  int n = 0;
  for (float w : values) n += round_to_bf16(level_on_grid(w, s) * s) == w;
  return n;
}

GroupFit finish_fit(std::span<const float> values, float step, float amax, std::span<int8_t> levels) {
  GroupFit fit;
  fit.scale_bf16 = f32_to_bf16(step);
  fit.max_error = quantize_on_step(values, bf16_to_f32(fit.scale_bf16), levels);
  fit.on_grid = fit.max_error <= grid_tolerance(amax);
  return fit;
}

// The least-squares step sits within an ulp of the true one; of bf16(step) and its two neighbours keep the one
// that reproduces the most values bit for bit (exact when the export's step was itself a bf16 number).
float best_bf16_step(std::span<const float> values, float step) {
  uint16_t center = f32_to_bf16(step);
  float best = bf16_to_f32(center);
  int best_exact = bit_exact_count(values, best);
  for (uint16_t candidate : {uint16_t(center - 1), uint16_t(center + 1)}) {
    float s = bf16_to_f32(candidate);
    if (s <= 0 || !std::isfinite(s)) continue;
    if (int exact = bit_exact_count(values, s); exact > best_exact) best = s, best_exact = exact;
  }
  return best;
}

}  // namespace

int8_t level_on_grid(float w, float s) {
  if (s == 0) return 0;
  float q = std::rint(w / s);
  return static_cast<int8_t>(std::clamp(q, float(kMinLevel), float(kMaxLevel)));
}

GroupFit fit_qat_group(std::span<const float> values, std::span<int8_t> levels) {
  float amax = abs_max(values);
  if (amax == 0) return finish_fit(values, 0, 0, levels);
  float tol = grid_tolerance(amax);
  for (int m = 1; m <= 8; ++m) {
    float candidate = amax / m;
    bool fits = true;
    for (float w : values) {
      if (std::fabs(w - level_on_grid(w, candidate) * candidate) > tol) {
        fits = false;
        break;
      }
    }
    if (!fits) continue;
    // Least squares over the group: the step that best explains every value at these levels.
    double qw = 0, qq = 0;
    for (float w : values) {
      int q = level_on_grid(w, candidate);
      qw += double(q) * w;
      qq += double(q) * q;
    }
    return finish_fit(values, best_bf16_step(values, static_cast<float>(qw / qq)), amax, levels);
  }
  GroupFit off = finish_fit(values, amax / 8, amax, levels);
  off.on_grid = false;
  return off;
}

GroupFit fit_fixed_divisor(std::span<const float> values, float divisor, std::span<int8_t> levels) {
  float amax = abs_max(values);
  return finish_fit(values, amax / divisor, amax, levels);
}

bool group_matches(std::span<const float> values, std::span<const int8_t> levels, float scale) {
  float tol = grid_tolerance(abs_max(values));
  for (size_t i = 0; i < values.size(); ++i) {
    if (levels[i] != level_on_grid(values[i], scale)) return false;
    if (std::fabs(levels[i] * scale - values[i]) > tol) return false;
  }
  return true;
}

}  // namespace qs
