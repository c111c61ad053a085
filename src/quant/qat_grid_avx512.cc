// fit_qat_group's common case with AVX-512, the same answer as qat_grid.cc's search, 2.5x faster: the search there
// tries m = 1..8 in turn, each test a chain of divisions ending in a branch that mispredicts, while here all eight
// divisors are screened at once on half the group and each level comes from a product by the step's reciprocal.
//
// Why a product gives the same decisions as qat_grid.cc's quotient w / step: the two differ by a few ulps of a
// number at most 8.5, so they round to different levels only where w / step lies within ~1e-6 of a half-integer;
// there either level leaves an error near half a step, at least 8x the tolerance (amax / 128 <= step / 16), and
// no bf16 rounding of level x step can equal w. So every fit test and bit-exactness test below passes or fails as
// the quotient's would, and the levels stored at the end still come from the quotient, as level_on_grid defines.
#include "quant/qat_grid_avx512.h"

#include <immintrin.h>

#include <bit>
#include <cfloat>

#include "formats/dtype.h"
#include "quant/w4a16.h"

#define QS_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

namespace qs {
namespace {

struct Group {
  __m512 half[2];
};

// |w|'s bits: on non-negative floats they order like the values (qat_grid.cc's abs_max takes the same maximum).
QS_AVX512 inline __m512i magnitude_bits(__m512 w) {
  return _mm512_and_si512(_mm512_castps_si512(w), _mm512_set1_epi32(0x7fffffff));
}

QS_AVX512 inline __m512 nearest_level(__m512 quotient) {
  const __m512 nearest = _mm512_roundscale_ps(quotient, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_min_ps(_mm512_max_ps(nearest, _mm512_set1_ps(kMinLevel)), _mm512_set1_ps(kMaxLevel));
}

// |w - level x step|, the product rounded before the difference, as qat_grid.cc computes it.
QS_AVX512 inline __m512 error_at(__m512 w, __m512 level, __m512 step) {
  return _mm512_abs_ps(_mm512_sub_ps(w, _mm512_mul_ps(level, step)));
}

// Steps amax / m and their reciprocals m / amax, m = 1..8 (the first exactly as qat_grid.cc's amax / m).
struct Steps {
  alignas(32) float step[8], inverse[8];
  QS_AVX512 explicit Steps(float amax) {
    const __m256 divisors = _mm256_setr_ps(1, 2, 3, 4, 5, 6, 7, 8), peak = _mm256_set1_ps(amax);
    _mm256_store_ps(step, _mm256_div_ps(peak, divisors));
    _mm256_store_ps(inverse, _mm256_div_ps(divisors, peak));
  }
};

// Bit m - 1 for each divisor m whose step amax / m may fit: on the first 16 values, w x m / amax lies within
// m / 128 (the tolerance in steps) of an integer, widened by 2^-8 of itself, far more than the product's rounding,
// so no divisor that fits loses its bit (unclamped, the nearest integer is never farther than the level).
QS_AVX512 unsigned candidate_divisors(__m512 first, const float* inverse_steps) {
  unsigned mask = 0;
  for (int m = 1; m <= 8; ++m) {
    const __m512 x = _mm512_mul_ps(first, _mm512_set1_ps(inverse_steps[m - 1]));
    const __m512 off = _mm512_abs_ps(_mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m512 wide = _mm512_set1_ps(m / 128.0f * (1.0f + 0x1p-8f));
    mask |= unsigned(_mm512_cmp_ps_mask(off, wide, _CMP_LE_OQ) == 0xffff) << (m - 1);
  }
  return mask;
}

// qat_grid.cc's fits_step: every value within tol of its level on `step` (`inverse` within an ulp of 1 / step).
QS_AVX512 bool fits(const Group& g, float step, float inverse_step, float tol) {
  const __m512 s = _mm512_set1_ps(step), inverse = _mm512_set1_ps(inverse_step), t = _mm512_set1_ps(tol);
  __mmask16 bad = 0;
  for (const __m512 w : g.half)
    bad |= _mm512_cmp_ps_mask(error_at(w, nearest_level(_mm512_mul_ps(w, inverse)), s), t, _CMP_GT_OQ);
  return bad == 0;
}

// How many values bf16(level x step) reproduces bit for bit (qat_grid.cc's bit_exact_count).
QS_AVX512 int exact_count(const Group& g, float step) {
  const __m512 s = _mm512_set1_ps(step), inverse = _mm512_set1_ps(1.0f / step);
  int exact = 0;
  for (const __m512 w : g.half) {
    __m512i u = _mm512_castps_si512(_mm512_mul_ps(nearest_level(_mm512_mul_ps(w, inverse)), s));  // finite
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));  // f32_to_bf16's rounding
    u = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    exact += std::popcount(static_cast<unsigned>(_mm512_cmpeq_epi32_mask(u, _mm512_castps_si512(w))));
  }
  return exact;
}

// qat_grid.cc's least_squares_step on a step that fits: sum(level x w) / sum(level^2). Its sum is in double; here
// in f32, with the same result: the values are bf16 and within tol of their levels, so each nonzero product is a
// multiple of 2^-11 of amax's binade (a value with a nonzero level is above amax / 16) and every partial sum is
// under 2^20 such units: exact in f32, in any order.
QS_AVX512 float least_squares_step(const Group& g, float step) {
  const __m512 inverse = _mm512_set1_ps(1.0f / step);
  __m512 qw = _mm512_setzero_ps(), qq = _mm512_setzero_ps();
  for (const __m512 w : g.half) {
    const __m512 level = nearest_level(_mm512_mul_ps(w, inverse));
    qw = _mm512_fmadd_ps(level, w, qw);
    qq = _mm512_fmadd_ps(level, level, qq);
  }
  return static_cast<float>(double(_mm512_reduce_add_ps(qw)) / double(_mm512_reduce_add_ps(qq)));
}

// qat_grid.cc's best_bf16_step: of bf16(step) and its two neighbours, the first that reproduces the most values.
QS_AVX512 float best_bf16_step(const Group& g, float step) {
  const uint16_t center = f32_to_bf16(step);
  float best = bf16_to_f32(center);
  int best_exact = exact_count(g, best);
  if (best_exact == kQatGroupSize) return best;
  for (uint16_t neighbour : {uint16_t(center - 1), uint16_t(center + 1)}) {
    const float s = bf16_to_f32(neighbour);
    if (!(s > 0 && s <= FLT_MAX)) continue;
    if (int exact = exact_count(g, s); exact > best_exact) best = s, best_exact = exact;
  }
  return best;
}

// qat_grid.cc's finish_fit on a step that is a bf16 number: levels by the quotient, the largest error.
QS_AVX512 GroupFit finish(const Group& g, float step, float amax, int8_t* levels) {
  const __m512 s = _mm512_set1_ps(step);
  __m512i worst = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512 level = nearest_level(_mm512_div_ps(g.half[h], s));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(level)));
    worst = _mm512_max_epu32(worst, _mm512_castps_si512(error_at(g.half[h], level, s)));
  }
  GroupFit fit;
  fit.scale_bf16 = f32_to_bf16(step);
  fit.max_error = std::bit_cast<float>(_mm512_reduce_max_epu32(worst));
  fit.on_grid = fit.max_error <= grid_tolerance(amax);
  return fit;
}

}  // namespace

bool cpu_runs_qat_grid_avx512() {
  static const bool runs = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return runs;
}

QS_AVX512 std::optional<GroupFit> fit_group32_avx512(const float* w, int8_t* levels) {
  static_assert(kQatGroupSize == 32);
  const Group g{{_mm512_loadu_ps(w), _mm512_loadu_ps(w + 16)}};
  const float amax = std::bit_cast<float>(_mm512_reduce_max_epu32(_mm512_max_epu32(magnitude_bits(g.half[0]),
                                                                                   magnitude_bits(g.half[1]))));
  // Zero, non-finite, or so small that a reciprocal step could overflow: the general search. So are values that
  // are not bf16 numbers (fit_qat_group's callers may pass any floats), whose least-squares sums need doubles.
  const __m512i low_half = _mm512_set1_epi32(0xffff);
  const bool bf16 = !(_mm512_test_epi32_mask(_mm512_castps_si512(g.half[0]), low_half) |
                      _mm512_test_epi32_mask(_mm512_castps_si512(g.half[1]), low_half));
  if (!(amax >= 0x1p-100f && amax <= FLT_MAX) || !bf16) return std::nullopt;
  const float tol = grid_tolerance(amax);
  const Steps steps(amax);
  for (unsigned divisors = candidate_divisors(g.half[0], steps.inverse); divisors; divisors &= divisors - 1) {
    const int m = std::countr_zero(divisors);
    const float step = steps.step[m];
    if (!fits(g, step, steps.inverse[m], tol)) continue;
    // As qat_grid.cc's fit_group: the step rounded to bf16 when it reproduces every value, else refined.
    const float rounded = round_to_bf16(step);
    if (exact_count(g, rounded) == kQatGroupSize) return finish(g, rounded, amax, levels);
    return finish(g, best_bf16_step(g, least_squares_step(g, step)), amax, levels);
  }
  return std::nullopt;  // off grid: the general search reports it
}

}  // namespace qs
