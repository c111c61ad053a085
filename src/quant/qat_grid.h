#pragma once
// Recovering the 4-bit grid of QAT weights. A bf16 QAT export stores, in every group of 32 consecutive input
// columns, values step x level (level in -8..7) rounded to bf16. The step is not amax/8 (the group's peak is
// often at a level below 8) nor amax/7.5 (compressed-tensors' observer): both re-grid the weights. Instead
// try step = amax/m for m = 1..8, take the first m that reproduces every value, refine the step by least
// squares, round it to bf16 (the stored scale dtype) and recompute the levels against that stored scale.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace qs {

inline constexpr int kQatGroupSize = 32;

// Largest allowed |level x scale - value| for a group whose largest magnitude is amax: two bf16 ulps of the
// peak, far below one step (amax/8), so a wrong level can never pass.
inline float grid_tolerance(float amax) { return amax * (1.0f / 128.0f); }

// The level of value w on a grid of step s, as the repack and the verifier both define it.
int8_t level_on_grid(float w, float s);

struct GroupFit {
  bool on_grid = false;
  uint16_t scale_bf16 = 0;  // positive, or 0 for an all-zero group
  float max_error = 0;      // largest |level x scale - value|
};

// values and levels have the same length (a group). Levels are written even when the group is off grid.
GroupFit fit_qat_group(std::span<const float> values, std::span<int8_t> levels);

// The step search itself, without the vector fast path for groups of 32 (qat_grid_avx512.h): what that path is
// tested against.
GroupFit fit_qat_group_search(std::span<const float> values, std::span<int8_t> levels);

// Fits with a fixed rule scale = amax / divisor (8 = textbook Q4_0, 7.5 = compressed-tensors minmax), for
// showing that such rules are not lossless on QAT data.
GroupFit fit_fixed_divisor(std::span<const float> values, float divisor, std::span<int8_t> levels);

// The grids `repack --grid` offers. Lossless (default): fit_qat_group's step search. The other two quantize every
// group by a fixed rule whatever grid its values sit on, so on QAT weights they are LOSSY:
//   Textbook: step = bf16(amax/8), level = clamp(rint(w/step), -8, 7) (a positive peak clamps to 7).
//   Ct75: compressed-tensors 0.20's symmetric minmax rule on bf16 weights (calculate_qparams, then _quantize):
//     step = bf16(amax/7.5), or bf16's eps 2^-7 for an all-zero group; level = clamp(round_half_even(
//     bf16(w/step)), -8, 7) -- torch divides bf16 tensors in bf16, so the quotient is rounded before rounding.
enum class RepackGrid { Lossless, Textbook, Ct75 };
RepackGrid parse_repack_grid(const std::string& name);  // "lossless" | "textbook" | "ct-7.5"
std::string_view repack_grid_name(RepackGrid grid);
GroupFit fit_group_on(RepackGrid grid, std::span<const float> values, std::span<int8_t> levels);

// Whether each level is the value's nearest level on `scale` (up to a bf16 rounding of value/scale, as Ct75
// rounds it), or -8/7 where the value lies beyond: a correct quantization on that scale, lossy or not.
bool group_nearest_on_scale(std::span<const float> values, std::span<const int8_t> levels, float scale);

// Whether stored levels and scale reproduce values: each level equals level_on_grid(value, scale) and
// |level x scale - value| <= grid_tolerance(amax).
bool group_matches(std::span<const float> values, std::span<const int8_t> levels, float scale);

}  // namespace qs
