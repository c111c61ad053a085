#pragma once
// The vector paths of linear_forward, one per instruction set (linear_simd.h): linear.cc picks the widest the CPU
// has. Each computes the same bits.
#include <algorithm>
#include <span>
#include <vector>

namespace qs {

// The kernels' per-call lists (which jobs share an input, where each one's packed input lies) get room for at
// least this many jobs, so that after their first use they never grow in a decode step: an MoE layer's gate and up
// jobs for 128 experts (Gemma 4 26B-A4B's count).
inline constexpr size_t kJobListRoom = 256;
template <typename T>
void reserve_job_list(std::vector<T>& list, size_t jobs) {
  list.reserve(std::max(jobs, kJobListRoom));
}

class ThreadPool;
struct LinearJob;

// round_to_bf16: activations are rounded to bf16 first (W4A16's 16-bit activations); else used as f32.
void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16);
void linear_forward_avx2(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16);

}  // namespace qs
