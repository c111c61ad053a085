#pragma once
// The vector paths of attend, one per instruction set (attention_simd.h), and what they share with the portable
// one (attention.cc). attention.cc runs the one kernels/isa.h names; each gives the portable path's bits.
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>

#include "formats/dtype.h"
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

// Softmax of each head's row of n scores in place (attention_softmax.h): portable, and per instruction set.
void softmax_rows(float* scores, int64_t heads, int64_t n, bool round_bf16);
void softmax_avx512(float* scores, int64_t heads, int64_t n, bool round_bf16);
void softmax_avx2(float* scores, int64_t heads, int64_t n, bool round_bf16);

// A listed position: row j of kv[s], the p-th of the list.
struct Listed {
  size_t s;
  int64_t j, p;
};

// An int8 row's weight in the weighted sum of V: its probability times its V scale, rounded to bf16 in a bf16
// model (attention.h), one more rounding as fine as the probability's own.
inline float int8_weight(float prob, float scale, bool round_bf16) {
  return round_bf16 ? round_to_bf16(prob * scale) : prob * scale;
}

// A listed position's weight in the weighted sum of V: its probability (probs: one head's, by list index), or
// int8_weight where rows are int8.
inline float listed_weight(const KvSegment& seg, const Listed& m, const float* probs, bool round_bf16) {
  if (seg.dtype != KvDtype::Int8) return probs[m.p];
  return int8_weight(probs[m.p], scale_at(seg.v_scale, m.j, seg.stride_bytes), round_bf16);
}

// The weighted sum of V's next step (attention.h): a run of whole pairs inside one segment (`run` rows from `first`,
// an even count from an even position), or, where run is 0, one pair whose members lie in two segments or one
// position alone (its partner absent: a zero).
struct PairStep {
  int64_t run = 0;
  Listed first{};
  std::optional<Listed> odd, even;
};

// The weighted sum's steps over kv, in order.
class PairWalk {
 public:
  explicit PairWalk(std::span<const KvSegment> kv) : kv_(kv) {}

  bool next(PairStep& step) {
    for (; s_ < kv_.size(); ++s_, j_ = 0) {
      const KvSegment& seg = kv_[s_];
      if (j_ == seg.count) continue;
      const Listed here{s_, j_, p_};
      if (pending_) {  // the last segment's final row, at an even position: this row is its partner if next to it
        const Listed even = *std::exchange(pending_, std::nullopt);
        const bool partner = j_ == 0 && seg.position == kv_[even.s].position + even.j + 1;
        step = {0, {}, partner ? std::optional(here) : std::nullopt, even};
        if (partner) advance(1);
        return true;
      }
      if ((seg.position + j_) % 2 != 0) {  // an odd position whose partner is not listed before it
        step = {0, {}, here, std::nullopt};
        advance(1);
        return true;
      }
      const int64_t run = (seg.count - j_) / 2 * 2;
      if (run == 0) {
        pending_ = here, advance(1);
        continue;
      }
      step = {run, here, std::nullopt, std::nullopt};
      advance(run);
      return true;
    }
    if (!pending_) return false;
    step = {0, {}, std::nullopt, *std::exchange(pending_, std::nullopt)};
    return true;
  }

 private:
  void advance(int64_t rows) { j_ += rows, p_ += rows; }

  std::span<const KvSegment> kv_;
  size_t s_ = 0;
  int64_t j_ = 0, p_ = 0;
  std::optional<Listed> pending_;
};

// Up to kHeads heads; d a multiple of 32 up to kMaxHeadDim; scores: heads x n floats of scratch.
void heads_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                  float* out, float* scores, int64_t n);
void heads_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                float* out, float* scores, int64_t n);

// heads' steps apart, as attend_split runs them: the scores of up to kHeads heads over kv's positions into
// out[h * n + p], and the probability-weighted V of up to kHeads heads for dimensions [i0, i1) (multiples of 32)
// into out[h * d + i] (round_bf16: the probabilities are bf16).
void scores_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                   float* out, int64_t n);
void scores_avx2(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                 float* out, int64_t n);
void weighted_v_avx512(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                       bool round_bf16, const float* probs, int64_t n, float* out);
void weighted_v_avx2(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                     bool round_bf16, const float* probs, int64_t n, float* out);

}  // namespace qs::attention
