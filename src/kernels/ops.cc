#include "kernels/ops.h"

#include <cmath>

#include "formats/dtype.h"
#include "kernels/isa.h"
#include "kernels/vector_math_isa.h"

namespace qs {
namespace {

#define QS_ALWAYS_INLINE __attribute__((always_inline)) inline

QS_ALWAYS_INLINE float dot_lanes(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[i % 16] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

QS_ALWAYS_INLINE void add_scaled_row(float a, const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// f32_to_bf16's rounding without its branch, so that the loop vectorises: round to nearest even, NaN kept quiet.
QS_ALWAYS_INLINE void round_row_to_bf16(float* x, size_t n) {
  uint32_t* u = reinterpret_cast<uint32_t*>(x);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = u[i];
    const uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
    const uint32_t quiet = (v & 0xffff0000u) | 0x00400000u;
    u[i] = (v & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  }
}

// The row operations, compiled (auto-vectorised) once per instruction set. Their order of operations is fixed and
// nothing is contracted into FMA (-ffp-contract=off), so every set gives the same bits.
struct RowOps {
  float (*dot)(const float*, const float*, int64_t);
  void (*add_scaled)(float, const float*, float*, int64_t);
  void (*round_bf16)(float*, size_t);
};

#define QS_ROW_OPS(name, target)                                                                            \
  target float name##_dot(const float* a, const float* b, int64_t n) { return dot_lanes(a, b, n); }        \
  target void name##_add(float a, const float* x, float* y, int64_t n) { add_scaled_row(a, x, y, n); }     \
  target void name##_round(float* x, size_t n) { round_row_to_bf16(x, n); }                                 \
  constexpr RowOps name = {name##_dot, name##_add, name##_round};

QS_ROW_OPS(kAvx512Rows, __attribute__((target("avx512f"))))
QS_ROW_OPS(kAvx2Rows, __attribute__((target("avx2"))))
QS_ROW_OPS(kPortableRows, )

const RowOps& row_ops() {
  switch (kernel_isa()) {
    case Isa::Avx512: return kAvx512Rows;
    case Isa::Avx2: return kAvx2Rows;
    case Isa::Portable: break;
  }
  return kPortableRows;
}

}  // namespace

float dot(const float* a, const float* b, int64_t n) { return row_ops().dot(a, b, n); }
void add_scaled(float a, const float* x, float* y, int64_t n) { row_ops().add_scaled(a, x, y, n); }

void round_to_bf16(std::span<float> x) { row_ops().round_bf16(x.data(), x.size()); }

void rms_norm(float* x, int64_t rows, int64_t n, const float* weight, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    float ss = dot(v, v, n);
    float scale = std::pow(ss / n + eps, -0.5f);
    for (int64_t i = 0; i < n; ++i) v[i] = weight ? (v[i] * scale) * weight[i] : v[i] * scale;
  }
}

void layer_norm(float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) sum += v[i];
    const float mean = static_cast<float>(sum / n);
    for (int64_t i = 0; i < n; ++i) sq += double(v[i] - mean) * (v[i] - mean);
    const float inv = 1.0f / std::sqrt(static_cast<float>(sq / n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = (v[i] - mean) * inv * weight[i];
      if (bias) v[i] += bias[i];
    }
  }
}

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
}  // namespace

void gelu_tanh(std::span<float> x) {
  const auto n = static_cast<int64_t>(x.size());
  switch (kernel_isa()) {
    case Isa::Avx512: return gelu_tanh_avx512(x.data(), n, kGeluK);
    case Isa::Avx2: return gelu_tanh_avx2(x.data(), n, kGeluK);
    case Isa::Portable: break;
  }
  for (float& v : x) v = 0.5f * v * (1.0f + std::tanh(kGeluK * (v + 0.044715f * v * v * v)));
}

void tanh(std::span<float> x) {
  const auto n = static_cast<int64_t>(x.size());
  switch (kernel_isa()) {
    case Isa::Avx512: return tanh_avx512(x.data(), n);
    case Isa::Avx2: return tanh_avx2(x.data(), n);
    case Isa::Portable: break;
  }
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

void apply_rope_bf16(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = round_to_bf16(round_to_bf16(a * cos[i]) + round_to_bf16(-b * sin[i]));
      v[i + half] = round_to_bf16(round_to_bf16(b * cos[i]) + round_to_bf16(a * sin[i]));
    }
  }
}

}  // namespace qs
