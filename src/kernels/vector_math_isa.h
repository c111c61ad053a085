#pragma once
// Vector element-wise math (SLEEF's 1-ulp vector tanh, the one PyTorch's CPU kernels use), one file per
// instruction set compiled with its -m flags (SLEEF declares its functions only there): vector_math_avx512.cc
// (-mavx512f) and vector_math_avx2.cc (-mavx2 -mfma). Call each only where the CPU has it (ops.cc runs the one
// kernels/isa.h names). Each applies the scalar formula's operations in its order, each rounded; SLEEF's AVX2 and
// AVX-512 tanh agree bit for bit, so both files give the same bits.
#include <cstdint>

namespace qs {

void gelu_tanh_avx512(float* x, int64_t n, float k);  // 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
void tanh_avx512(float* x, int64_t n);
void gelu_tanh_avx2(float* x, int64_t n, float k);
void tanh_avx2(float* x, int64_t n);

}  // namespace qs
