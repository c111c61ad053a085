#pragma once
// The vector paths of attend, one per instruction set (attention_simd.h), and what they share with the portable
// one (attention.cc). attention.cc runs the one kernels/isa.h names; each gives the portable path's bits.
#include <cstdint>
#include <cstring>
#include <span>

#include "kernels/attention.h"

namespace qs::attention {

inline constexpr int kHeads = 8;  // query heads per pass over the keys and values
inline constexpr int64_t kMaxHeadDim = 512;  // the vector paths' (Gemma 4's largest); past it, the portable one

// The f32 scale of a segment's j-th position (int8 rows).
inline float scale_at(const std::byte* scales, int64_t j, int64_t stride_bytes) {
  float scale;
  std::memcpy(&scale, scales + j * stride_bytes, sizeof scale);
  return scale;
}

// Softmax of each head's row of n scores in place, as the reference computes it (attention.cc).
void softmax_rows(float* scores, int64_t heads, int64_t n, bool round_bf16);

// Up to kHeads heads; d a multiple of 32 up to kMaxHeadDim; scores: heads x n floats of scratch.
void heads_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                  float* out, float* scores, int64_t n);
void heads_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                float* out, float* scores, int64_t n);

// heads' steps apart, as attend_split runs them: the scores of up to kHeads heads over kv's positions into
// out[h * n + p], and the probability-weighted V of up to kHeads heads for dimensions [i0, i1) (multiples of 32)
// into out[h * d + i].
void scores_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                   float* out, int64_t n);
void scores_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                 float* out, int64_t n);
void weighted_v_avx512(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                       const float* probs, int64_t n, float* out);
void weighted_v_avx2(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                     const float* probs, int64_t n, float* out);

}  // namespace qs::attention
