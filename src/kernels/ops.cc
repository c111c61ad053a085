#include "kernels/ops.h"

#include <cmath>

#include "formats/dtype.h"
#include "kernels/vector_math_avx512.h"

namespace qs {
namespace {

#define QS_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

template <typename B>
inline float widen(B b) {
  if constexpr (sizeof(B) == 2) return bf16_to_f32(b);
  else return b;
}

template <typename B>
inline float dot_lanes(const float* a, const B* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * widen(b[i + k]);
  for (; i < n; ++i) acc[i % 16] += a[i] * widen(b[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

template <typename X>
inline void add_scaled_row(float a, const X* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * widen(x[i]);
}

}  // namespace

QS_VECTOR_CLONES float dot(const float* a, const float* b, int64_t n) { return dot_lanes(a, b, n); }
QS_VECTOR_CLONES float dot(const float* a, const uint16_t* b, int64_t n) { return dot_lanes(a, b, n); }

QS_VECTOR_CLONES void add_scaled(float a, const float* x, float* y, int64_t n) { add_scaled_row(a, x, y, n); }
QS_VECTOR_CLONES void add_scaled(float a, const uint16_t* x, float* y, int64_t n) { add_scaled_row(a, x, y, n); }

void rms_norm(float* x, int64_t rows, int64_t n, const float* weight, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    float ss = dot(v, v, n);
    float scale = std::pow(ss / n + eps, -0.5f);
    for (int64_t i = 0; i < n; ++i) v[i] = weight ? (v[i] * scale) * weight[i] : v[i] * scale;
  }
}

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
const bool kHasAvx512 = __builtin_cpu_supports("avx512f");
}  // namespace

void gelu_tanh(std::span<float> x) {
  if (kHasAvx512) return gelu_tanh_avx512(x.data(), static_cast<int64_t>(x.size()), kGeluK);
  for (float& v : x) v = 0.5f * v * (1.0f + std::tanh(kGeluK * (v + 0.044715f * v * v * v)));
}

void tanh(std::span<float> x) {
  if (kHasAvx512) return tanh_avx512(x.data(), static_cast<int64_t>(x.size()));
  for (float& v : x) v = std::tanh(v);
}

void apply_rope(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

// f32_to_bf16's rounding without its branch, so that the loop vectorises: round to nearest even, NaN kept quiet.
QS_VECTOR_CLONES void round_to_bf16(std::span<float> x) {
  uint32_t* u = reinterpret_cast<uint32_t*>(x.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t v = u[i];
    const uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
    const uint32_t quiet = (v & 0xffff0000u) | 0x00400000u;
    u[i] = (v & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  }
}

}  // namespace qs
