#pragma once
// Element-wise and per-row operations of the Gemma 4 forward pass on f32 rows.
#include <cstdint>
#include <span>

namespace qs {

// RMSNorm over each row of length n: x * (mean(x^2) + eps)^-0.5, times weight when given (used as stored,
// not 1 + w). In place.
void rms_norm(float* x, int64_t rows, int64_t n, const float* weight, float eps);

float gelu_tanh(float x);

// NeoX-style rotation of pairs (i, i + d/2) by angle pos * inv_freq[i]; inv_freq has d/2 entries.
void apply_rope(float* x, int64_t heads, int64_t d, const float* cos, const float* sin);

void round_to_bf16(std::span<float> x);

}  // namespace qs
