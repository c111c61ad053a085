#pragma once
// The bf16-activation path of linear_forward (AVX512-BF16); see linear_bf16.cc for its order of operations.
#include <cstdint>

namespace qs {

class ThreadPool;
struct LinearWeight;

bool bf16_linear_supported(const LinearWeight& w);  // this CPU, and this weight's format
void linear_forward_bf16(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool);

}  // namespace qs
