#include "kernels/vector_math_isa.h"

#include <immintrin.h>
#include <sleef.h>

namespace qs {
namespace {

// Sixteen values at a time, the tail masked; f computes one vector.
template <typename F>
inline void map16(float* x, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += 16) {
    const auto mask = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, mask, f(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

}  // namespace

void gelu_tanh_avx512(float* x, int64_t n, float k) {
  map16(x, n, [k](__m512 v) {
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), v), v), v);
    const __m512 t = Sleef_tanhf16_u10avx512f(_mm512_mul_ps(_mm512_set1_ps(k), _mm512_add_ps(v, cube)));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
  });
}

void tanh_avx512(float* x, int64_t n) {
  map16(x, n, [](__m512 v) { return Sleef_tanhf16_u10avx512f(v); });
}

}  // namespace qs
