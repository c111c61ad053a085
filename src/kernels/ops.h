#pragma once
// Element-wise and per-row operations of the Gemma 4 forward pass on f32 rows.
#include <cstdint>
#include <span>

namespace qs {

// RMSNorm over each row of length n: x * (mean(x^2) + eps)^-0.5, times weight when given (used as stored,
// not 1 + w). In place.
void rms_norm(float* x, int64_t rows, int64_t n, const float* weight, float eps);
// LayerNorm over each row of length n: (x - mean) / sqrt(var + eps) * weight (+ bias when given), the moments in
// double (torch's f32 kernel differs from it by float reordering only). In place.
void layer_norm(float* x, int64_t rows, int64_t n, const float* weight, const float* bias, float eps);

// gelu with the tanh approximation, and tanh, over whole rows, in place: with AVX-512 or AVX2 SLEEF's 1-ulp vector
// tanh (the one PyTorch's CPU kernels use; the same bits with either), portable std::tanh (kernels/isa.h picks).
void gelu_tanh(std::span<float> x);
void tanh(std::span<float> x);

// NeoX-style rotation of pairs (i, i + d/2) by angle pos * inv_freq[i]; inv_freq has d/2 entries.
void apply_rope(float* x, int64_t heads, int64_t d, const float* cos, const float* sin);
// The same as a bf16 model computes it: each product and each sum rounded to bf16, as torch does.
void apply_rope_bf16(float* x, int64_t heads, int64_t d, const float* cos, const float* sin);

void round_to_bf16(std::span<float> x);

// The dot product of two f32 vectors, summed in sixteen lanes in a fixed order, so a result never depends on what
// else runs beside it.
float dot(const float* a, const float* b, int64_t n);

// y += a x, each product and sum rounded to f32 (no fused multiply-add).
void add_scaled(float a, const float* x, float* y, int64_t n);

}  // namespace qs
