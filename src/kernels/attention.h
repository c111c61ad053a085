#pragma once
// Attention of one query position over its cached positions, for the query heads that share one KV head: scores
// (q . k), softmax, and the probability-weighted sum of V. Each K and V row is read once for all those heads (the
// 8 query heads of a Gemma 4 E2B layer share its one KV head), and the arithmetic is that of ops.h's dot and
// add_scaled taken one head at a time, so the bits do not depend on how heads are grouped.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace qs {

// Consecutive positions whose K and V rows lie at a fixed stride (one block of the paged cache, or this call's
// own rows), f32 or bf16.
struct KvSegment {
  const std::byte* k;
  const std::byte* v;
  int64_t stride_bytes;
  int64_t count;
  bool bf16;
};

// q: heads x d queries (already scaled); out: heads x d, overwritten. round_bf16: scores and probabilities are
// rounded to bf16 as a bf16 model rounds them. scratch: reused between calls (heads x positions floats; grows
// only past its capacity).
void attend(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
            std::vector<float>& scratch);

}  // namespace qs
