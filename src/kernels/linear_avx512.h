#pragma once
// The AVX-512 path of linear_forward; see linear_avx512.cc for its order of operations.
#include <cstdint>
#include <span>

namespace qs {

class ThreadPool;
struct LinearWeight;

bool avx512_linear_supported(const LinearWeight& w);  // this CPU, and this weight's format
// round_to_bf16: activations are rounded to bf16 first (W4A16's 16-bit activations); else used as f32.
struct LinearJob;

// See linear_forward.
void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16);

}  // namespace qs
