#pragma once
// The attention softmax (attention.h), written once over a lane type L: simd_lanes.h's AVX-512, AVX2 or portable
// lanes, each operation rounded alike in all of them, so every path gets the same bits. Include with QS_SIMD
// defined as the instruction set's target attribute (attention_simd.h), or undefined (the portable path).
//
// Per head: e = exp(score - max) in place, summed in sixteen lanes (position p of the list in lane p mod 16, in
// order) and then by sum's tree; each e divided by the sum (rounded to bf16 in a bf16 model), a negligible
// probability taken as 0.
//
// exp is our own, as glibc's expf is scalar and its vector twins round differently: exp(x) = 2^n exp(r), n the
// integer nearest x log2(e), r = x - n ln(2) by two FMAs (ln(2)'s high part has few bits, so n times it is exact),
// exp(r) on |r| <= ln(2) / 2 as 1 + r + r^2 p(r), p of degree 5 with Cephes's expf coefficients: within 2 ulp of
// exp (attention_test.cc checks it against std::exp).
#include <cstdint>
#include <limits>

#include "kernels/simd_lanes.h"

#ifndef QS_SIMD
#define QS_SIMD
#endif

namespace qs::attention {

// Below this a probability is taken as 0. Beside the largest probability, at least 1/n (n <= 2^17 positions), it
// weighs under 2^-80, far under f32's 2^-24 resolution, so results do not change (short of sums that cancel to
// nothing); but products with such probabilities come out subnormal, and each subnormal operation costs the CPU a
// microcode assist (prefill of 512 tokens spent a quarter of its time there).
inline constexpr float kNegligibleProbability = 1e-30f;
// exp(x) below this is taken as 0 before it is computed: its probability would be dropped (e^-70 < 1e-30 and the
// sum is at least 1), and beside the sum's largest term, exp(0) = 1, it weighs under 2^-100. It also keeps 2^n
// normal (n >= -101).
inline constexpr float kNegligibleExponent = -70.0f;

// exp(x) for x = score - max <= 0 (a NaN stays NaN), 0 below kNegligibleExponent.
template <typename L>
QS_SIMD QS_INLINE typename L::F exp_of_shifted_score(typename L::F x) {
  using F = typename L::F;
  const F limit = L::set1(kNegligibleExponent);
  const F c = L::max(x, limit);  // n in [-101, 0] (a NaN becomes the limit here, and is added back below)
  const F n = L::nearest(L::mul(c, L::set1(1.44269504088896341f)));
  F r = L::fma(n, L::set1(-0.693359375f), c);
  r = L::fma(n, L::set1(2.12194440e-4f), r);
  F p = L::set1(1.9875691500e-4f);
  for (const float coefficient : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                                  5.0000001201e-1f})
    p = L::fma(p, r, L::set1(coefficient));
  const F y = L::add(L::fma(p, L::mul(r, r), r), L::set1(1.0f));
  const F e = L::add(L::mul(y, L::pow2(n)), L::sub(x, x));  // x - x: 0, or NaN where x is NaN or infinite
  return L::zero_below(x, limit, e);
}

// Each head's row of n scores (heads' rows n apart) into probabilities, in place.
template <typename L>
QS_SIMD void softmax(float* scores, int64_t heads, int64_t n, bool round_bf16) {
  using F = typename L::F;
  constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();  // fills tails: its exp is 0
  for (int64_t h = 0; h < heads; ++h) {
    float* s = scores + h * n;
    F top = L::set1(kMinusInfinity);
    for (int64_t p = 0; p < n; p += 16) top = L::max(top, L::load_first(s + p, n - p, kMinusInfinity));
    const F max = L::set1(L::max_of(top));
    F lanes = L::zero();
    for (int64_t p = 0; p < n; p += 16) {
      const F e = exp_of_shifted_score<L>(L::sub(L::load_first(s + p, n - p, kMinusInfinity), max));
      lanes = L::add(lanes, e);
      L::store_first(s + p, e, n - p);
    }
    const F sum = L::set1(L::sum(lanes));
    for (int64_t p = 0; p < n; p += 16) {
      F prob = L::div(L::load_first(s + p, n - p, 0.0f), sum);
      if (round_bf16) prob = L::round_bf16(prob);
      L::store_first(s + p, L::zero_below(prob, L::set1(kNegligibleProbability), prob), n - p);
    }
  }
}

}  // namespace qs::attention
