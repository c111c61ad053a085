#pragma once
// The vector paths of linear_forward, one per instruction set (linear_simd.h): linear.cc picks the widest the CPU
// has. Each computes the same bits.
#include <span>

namespace qs {

class ThreadPool;
struct LinearJob;

// round_to_bf16: activations are rounded to bf16 first (W4A16's 16-bit activations); else used as f32.
void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16);
void linear_forward_avx2(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16);

}  // namespace qs
