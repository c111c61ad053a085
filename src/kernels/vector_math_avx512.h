#pragma once
// AVX-512 element-wise math (SLEEF's vector tanh), compiled with -mavx512f on its own: call only where the CPU has
// AVX-512F (ops.cc checks). Each applies the scalar formula's operations in its order, each rounded.
#include <cstdint>

namespace qs {

void gelu_tanh_avx512(float* x, int64_t n, float k);  // 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
void tanh_avx512(float* x, int64_t n);

}  // namespace qs
