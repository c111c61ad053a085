#pragma once
// Sixteen f32 lanes, as one AVX-512 register or as two AVX2 ones (lanes 0-7 and 8-15), with the operations the
// vector kernels (linear_simd.h, attention_simd.h) are written over. Every lane sees the same operations, each
// rounded to f32, and sum is one fixed tree (lanes k + 8, then k + 4, k + 2, k + 1: _mm512_reduce_add_ps's), so a
// kernel gives the same bits with either. Each struct carries its own target attribute: include anywhere, call
// only where the CPU has the instruction set (kernels/isa.h).
//
// Pairs: 32 consecutive values as two F, the even-indexed ones and the odd ones (lane k holding values 2k and
// 2k + 1), the order in which bf16 rows widen to f32 without moving a value across lanes (a shift and a mask);
// interleave stores such a pair back in order.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "formats/dtype.h"

#define QS_INLINE __attribute__((always_inline)) inline
#define QS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define QS_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace qs::simd {

struct Avx512Lanes {
  using F = __m512;
  static QS_TARGET_AVX512 QS_INLINE F zero() { return _mm512_setzero_ps(); }
  static QS_TARGET_AVX512 QS_INLINE F set1(float a) { return _mm512_set1_ps(a); }
  static QS_TARGET_AVX512 QS_INLINE F load(const float* p) { return _mm512_loadu_ps(p); }
  static QS_TARGET_AVX512 QS_INLINE void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static QS_TARGET_AVX512 QS_INLINE F add(F a, F b) { return _mm512_add_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static QS_TARGET_AVX512 QS_INLINE float sum(F v) { return _mm512_reduce_add_ps(v); }
  // Keeps v in a register: the compiler would otherwise fold its load into every instruction that uses it.
  static QS_TARGET_AVX512 QS_INLINE void pin(F& v) { asm("" : "+v"(v)); }

  // sum of 16 vectors at once, lane m of the result being sum(v[slot_of(m)]): each level of sum's tree adds the
  // halves of two vectors in one instruction, instead of one vector's halves.
  static constexpr bool kManySums = true;
  static constexpr int slot_of(int m) { return 4 * (m % 4) + m / 4; }
  static QS_TARGET_AVX512 QS_INLINE F sums(const F (&v)[16]) {
    F eights[8], fours[4], twos[2];
    for (int j = 0; j < 8; ++j)  // lanes k + 8: the low halves of two vectors against their high halves
      eights[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                                _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xee));
    for (int j = 0; j < 4; ++j)  // k + 4
      fours[j] = _mm512_add_ps(_mm512_shuffle_f32x4(eights[2 * j], eights[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(eights[2 * j], eights[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int j = 0; j < 2; ++j)  // k + 2
      twos[j] = _mm512_add_ps(_mm512_shuffle_ps(fours[2 * j], fours[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(fours[2 * j], fours[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(2, 0, 2, 0)),  // k + 1
                         _mm512_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // The softmax's (attention_exp.h): max as maxps (b where either is NaN), the nearest integer (ties to even),
  // 2^n for an integral n in [-126, 127], 0 where x < limit (else y), and the first `count` lanes of p (the rest
  // `fill`) for tails.
  static QS_TARGET_AVX512 QS_INLINE F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F div(F a, F b) { return _mm512_div_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F max(F a, F b) { return _mm512_max_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE float max_of(F v) { return _mm512_reduce_max_ps(v); }
  static QS_TARGET_AVX512 QS_INLINE F nearest(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static QS_TARGET_AVX512 QS_INLINE F pow2(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static QS_TARGET_AVX512 QS_INLINE F zero_below(F x, F limit, F y) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x, limit, _CMP_LT_OQ)), y);
  }
  static QS_TARGET_AVX512 QS_INLINE F load_first(const float* p, int64_t count, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), first_lanes(count), p);
  }
  static QS_TARGET_AVX512 QS_INLINE void store_first(float* p, F v, int64_t count) {
    _mm512_mask_storeu_ps(p, first_lanes(count), v);
  }
  static QS_INLINE __mmask16 first_lanes(int64_t count) {
    return static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  }

  // Each lane rounded to bf16 as round_to_bf16 does (nearest, ties to even; a NaN stays a quiet NaN).
  static QS_TARGET_AVX512 QS_INLINE F round_bf16(F x) {
    const __m512i u = _mm512_castps_si512(x), high = _mm512_set1_epi32(int(0xffff0000u));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(u, bias), high);
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, high), _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, quiet));
  }

  struct Pair {
    F even, odd;
  };
  static QS_TARGET_AVX512 QS_INLINE Pair load_pairs_bf16(const uint16_t* p) {
    const __m512i x = _mm512_loadu_si512(p);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int(0xffff0000u))))};
  }
  static QS_TARGET_AVX512 QS_INLINE Pair load_pairs_i8(const int8_t* p) {
    const __m512i x = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 24), 24)),
            _mm512_cvtepi32_ps(_mm512_srai_epi32(x, 8))};
  }
  static QS_TARGET_AVX512 QS_INLINE Pair load_pairs(const float* p) {
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    return {_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b)};
  }
  static QS_TARGET_AVX512 QS_INLINE void interleave(F even, F odd, float* p) {
    const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
    _mm512_storeu_ps(p, _mm512_permutex2var_ps(even, low, odd));
    _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(even, high, odd));
  }
};

struct Avx2Lanes {
  struct F {
    __m256 lo, hi;
  };
  static QS_TARGET_AVX2 QS_INLINE F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static QS_TARGET_AVX2 QS_INLINE F set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static QS_TARGET_AVX2 QS_INLINE F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static QS_TARGET_AVX2 QS_INLINE void store(float* p, F v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
  static QS_TARGET_AVX2 QS_INLINE F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE float sum(F v) {
    const __m256 s8 = _mm256_add_ps(v.hi, v.lo);
    const __m128 s4 = _mm_add_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
    const __m128 s2 = _mm_add_ps(s4, _mm_shuffle_ps(s4, s4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, _MM_SHUFFLE(1, 1, 1, 1)));
  }
  static QS_TARGET_AVX2 QS_INLINE void pin(F& v) { asm("" : "+x"(v.lo), "+x"(v.hi)); }
  static constexpr bool kManySums = false;  // sixteen vectors take 32 of AVX2's 16 registers

  // As Avx512Lanes's, half by half.
  static QS_TARGET_AVX2 QS_INLINE F sub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE F div(F a, F b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE float max_of(F v) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_max_ps(v.lo, v.hi));
    float m = lanes[0];
    for (float x : lanes) m = x > m ? x : m;
    return m;
  }
  static QS_TARGET_AVX2 QS_INLINE F nearest(F x) {
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(x.lo, kNearest), _mm256_round_ps(x.hi, kNearest)};
  }
  static QS_TARGET_AVX2 QS_INLINE F pow2(F n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE __m256 pow2_8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static QS_TARGET_AVX2 QS_INLINE F zero_below(F x, F limit, F y) {
    return {_mm256_andnot_ps(_mm256_cmp_ps(x.lo, limit.lo, _CMP_LT_OQ), y.lo),
            _mm256_andnot_ps(_mm256_cmp_ps(x.hi, limit.hi, _CMP_LT_OQ), y.hi)};
  }
  static QS_TARGET_AVX2 QS_INLINE F load_first(const float* p, int64_t count, float fill) {
    if (count >= 16) return load(p);
    alignas(32) float lanes[16];
    for (int64_t i = 0; i < 16; ++i) lanes[i] = i < count ? p[i] : fill;
    return load(lanes);
  }
  static QS_TARGET_AVX2 QS_INLINE void store_first(float* p, F v, int64_t count) {
    if (count >= 16) return store(p, v);
    alignas(32) float lanes[16];
    store(lanes, v);
    for (int64_t i = 0; i < count; ++i) p[i] = lanes[i];
  }
  static QS_TARGET_AVX2 QS_INLINE F round_bf16(F x) { return {round_bf16_8(x.lo), round_bf16_8(x.hi)}; }
  static QS_TARGET_AVX2 QS_INLINE __m256 round_bf16_8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x), high = _mm256_set1_epi32(int(0xffff0000u));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, bias), high);
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, high), _mm256_set1_epi32(0x400000));
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan);
  }

  struct Pair {
    F even, odd;
  };
  static QS_TARGET_AVX2 QS_INLINE Pair load_pairs_bf16(const uint16_t* p) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
    return {{_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))},
            {_mm256_castsi256_ps(_mm256_and_si256(a, high)), _mm256_castsi256_ps(_mm256_and_si256(b, high))}};
  }
  static QS_TARGET_AVX2 QS_INLINE Pair load_pairs_i8(const int8_t* p) {
    const __m256i a = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i b = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    return {{low_bytes(a), low_bytes(b)}, {high_bytes(a), high_bytes(b)}};
  }
  // A sign-extended 16-bit word's low byte and high byte, each as a signed value.
  static QS_TARGET_AVX2 QS_INLINE __m256 low_bytes(__m256i words) {
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(words, 24), 24));
  }
  static QS_TARGET_AVX2 QS_INLINE __m256 high_bytes(__m256i words) {
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(words, 8));
  }
  static QS_TARGET_AVX2 QS_INLINE Pair load_pairs(const float* p) {
    return {{evens(p), evens(p + 16)}, {odds(p), odds(p + 16)}};
  }
  // Values 0, 2, ..., 14 (or 1, 3, ..., 15) of p[0..15].
  static QS_TARGET_AVX2 QS_INLINE __m256 evens(const float* p) {
    const __m256 mixed = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(mixed), _MM_SHUFFLE(3, 1, 2, 0)));
  }
  static QS_TARGET_AVX2 QS_INLINE __m256 odds(const float* p) {
    const __m256 mixed = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(mixed), _MM_SHUFFLE(3, 1, 2, 0)));
  }
  static QS_TARGET_AVX2 QS_INLINE void interleave(F even, F odd, float* p) {
    interleave8(even.lo, odd.lo, p), interleave8(even.hi, odd.hi, p + 16);
  }
  static QS_TARGET_AVX2 QS_INLINE void interleave8(__m256 even, __m256 odd, float* p) {
    const __m256 low = _mm256_unpacklo_ps(even, odd), high = _mm256_unpackhi_ps(even, odd);  // 0-3 8-11, 4-7 12-15
    _mm256_storeu_ps(p, _mm256_permute2f128_ps(low, high, 0x20));
    _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(low, high, 0x31));
  }
};

// The same sixteen lanes one value at a time, for the portable paths that must give the vector paths' bits (the
// attention softmax, attention_softmax.h): the operations above, in scalar f32.
struct PortableLanes {
  struct F {
    float lane[16];
  };
  template <typename Op>
  static F each(Op op) {
    F r;
    for (int k = 0; k < 16; ++k) r.lane[k] = op(k);
    return r;
  }
  static F zero() { return set1(0.0f); }
  static F set1(float a) { return each([&](int) { return a; }); }
  static F add(F a, F b) { return each([&](int k) { return a.lane[k] + b.lane[k]; }); }
  static F sub(F a, F b) { return each([&](int k) { return a.lane[k] - b.lane[k]; }); }
  static F mul(F a, F b) { return each([&](int k) { return a.lane[k] * b.lane[k]; }); }
  static F div(F a, F b) { return each([&](int k) { return a.lane[k] / b.lane[k]; }); }
  static F fma(F a, F b, F c) { return each([&](int k) { return std::fma(a.lane[k], b.lane[k], c.lane[k]); }); }
  static F max(F a, F b) { return each([&](int k) { return a.lane[k] > b.lane[k] ? a.lane[k] : b.lane[k]; }); }
  static float max_of(F v) {
    float m = v.lane[0];
    for (float x : v.lane) m = x > m ? x : m;
    return m;
  }
  static float sum(F v) {
    for (int width = 8; width >= 1; width /= 2)
      for (int k = 0; k < width; ++k) v.lane[k] += v.lane[k + width];
    return v.lane[0];
  }
  static F nearest(F x) { return each([&](int k) { return std::nearbyint(x.lane[k]); }); }
  static F pow2(F n) {
    return each([&](int k) { return std::bit_cast<float>(uint32_t(int32_t(n.lane[k]) + 127) << 23); });
  }
  static F zero_below(F x, F limit, F y) {
    return each([&](int k) { return x.lane[k] < limit.lane[k] ? 0.0f : y.lane[k]; });
  }
  static F load_first(const float* p, int64_t count, float fill) {
    return each([&](int k) { return k < count ? p[k] : fill; });
  }
  static void store_first(float* p, F v, int64_t count) {
    for (int k = 0; k < 16 && k < count; ++k) p[k] = v.lane[k];
  }
  static F round_bf16(F x) { return each([&](int k) { return round_to_bf16(x.lane[k]); }); }
};

// Denormal inputs read as zero and denormal results flushed to zero (MXCSR's DAZ and FTZ) on this thread while
// the kernels run: the rounding of the linears' and the attention scores' canonical order, which vdpbf16ps applies
// by definition.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDenormalsAreZero | kFlushToZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kDenormalsAreZero = 0x0040, kFlushToZero = 0x8000;
  unsigned saved_;
};

}  // namespace qs::simd
