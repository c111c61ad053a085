#pragma once
// The vector paths of linear_forward, one per instruction set (linear_simd.h): linear.cc picks the widest the CPU
// has. Each computes the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/linear.h"

namespace qs {

// How far ahead a row's weights are requested (into L2), by every int4 kernel: the same place in the rows of the
// tile after next, at least 6 KB ahead (measured with weights far larger than the caches; a tile reads its rows
// side by side, so less than a tile ahead only requests what is being read). The hardware prefetchers alone serve
// several slow streams per core poorly.
inline constexpr int64_t kPrefetchTiles = 2, kMinPrefetchBytes = 6144;
inline int64_t prefetch_distance(int64_t row_bytes) {
  return std::max(kMinPrefetchBytes, kPrefetchTiles * kTileRows * row_bytes);
}
// Always inlined: GCC may judge an out-of-line prefetch free of side effects and drop calls to it.
__attribute__((always_inline)) inline void prefetch(const std::byte* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

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
