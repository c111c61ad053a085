#include "kernels/ops.h"

#include <cmath>

#include "formats/dtype.h"

namespace qs {

void rms_norm(float* x, int64_t rows, int64_t n, const float* weight, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
    float scale = std::pow(ss / n + eps, -0.5f);
    for (int64_t i = 0; i < n; ++i) v[i] = weight ? (v[i] * scale) * weight[i] : v[i] * scale;
  }
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
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

void round_to_bf16(std::span<float> x) {
  for (float& v : x) v = qs::round_to_bf16(v);
}

}  // namespace qs
