#include <immintrin.h>
#include <sleef.h>

#include "kernels/vector_math_isa.h"

namespace qs {
namespace {

// Eight values at a time, the tail masked; f computes one vector.
template <typename F>
inline void map8(float* x, int64_t n, F f) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i < 8 ? n - i : 8)), lane);
    _mm256_maskstore_ps(x + i, mask, f(_mm256_maskload_ps(x + i, mask)));
  }
}

}  // namespace

// vector_math_avx512.cc's operations, eight lanes at a time.
void gelu_tanh_avx2(float* x, int64_t n, float k) {
  map8(x, n, [k](__m256 v) {
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), v), v);
    const __m256 t = Sleef_tanhf8_u10avx2(_mm256_mul_ps(_mm256_set1_ps(k), _mm256_add_ps(v, cube)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
  });
}

void tanh_avx2(float* x, int64_t n) {
  map8(x, n, [](__m256 v) { return Sleef_tanhf8_u10avx2(v); });
}

}  // namespace qs
