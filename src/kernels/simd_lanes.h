#pragma once
// Sixteen f32 lanes, as one AVX-512 register or as two AVX2 ones (lanes 0-7 and 8-15), with the operations the
// vector kernels (linear_simd.h, attention_simd.h) are written over. Every lane sees the same operations, each
// rounded to f32, and sum is one fixed tree (lanes k + 8, then k + 4, k + 2, k + 1: _mm512_reduce_add_ps's), so a
// kernel gives the same bits with either. Each struct carries its own target attribute: include anywhere, call
// only where the CPU has the instruction set (kernels/isa.h).
#include <immintrin.h>

#include <cstdint>

#define QS_INLINE __attribute__((always_inline)) inline
#define QS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define QS_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace qs::simd {

struct Avx512Lanes {
  using F = __m512;
  static QS_TARGET_AVX512 QS_INLINE F zero() { return _mm512_setzero_ps(); }
  static QS_TARGET_AVX512 QS_INLINE F set1(float a) { return _mm512_set1_ps(a); }
  static QS_TARGET_AVX512 QS_INLINE F load(const float* p) { return _mm512_loadu_ps(p); }
  static QS_TARGET_AVX512 QS_INLINE F load_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static QS_TARGET_AVX512 QS_INLINE F load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static QS_TARGET_AVX512 QS_INLINE void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static QS_TARGET_AVX512 QS_INLINE F add(F a, F b) { return _mm512_add_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static QS_TARGET_AVX512 QS_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static QS_TARGET_AVX512 QS_INLINE float sum(F v) { return _mm512_reduce_add_ps(v); }
};

struct Avx2Lanes {
  struct F {
    __m256 lo, hi;
  };
  static QS_TARGET_AVX2 QS_INLINE F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static QS_TARGET_AVX2 QS_INLINE F set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static QS_TARGET_AVX2 QS_INLINE F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static QS_TARGET_AVX2 QS_INLINE F load_bf16(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {widen_bf16(_mm256_castsi256_si128(v)), widen_bf16(_mm256_extracti128_si256(v, 1))};
  }
  static QS_TARGET_AVX2 QS_INLINE __m256 widen_bf16(__m128i eight) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(eight), 16));
  }
  static QS_TARGET_AVX2 QS_INLINE F load_i8(const int8_t* p) {
    return {widen_i8(p), widen_i8(p + 8)};
  }
  static QS_TARGET_AVX2 QS_INLINE __m256 widen_i8(const int8_t* eight) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(eight))));
  }
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
};

}  // namespace qs::simd
