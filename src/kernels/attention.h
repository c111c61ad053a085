#pragma once
// Attention of one query position over its cached positions, for the query heads that share one KV head: scores
// (q . k), softmax, and the probability-weighted sum of V. Each K and V row is read once for all those heads (the
// 8 query heads of a Gemma 4 E2B layer share its one KV head). One order of operations, whatever the path or the
// grouping of heads, denormals flushed throughout (simd::FlushDenormals):
// - a score is the linears' canonical dot (linear_simd.h: pairs of dimensions by FMA, the odd one first; q rounded
//   to bf16 first in a bf16 model);
// - the probabilities are attention_softmax.h's: our own exp, its sum in sixteen lanes by position;
// - the weighted sum of V takes positions in pairs (2m, 2m + 1): per dimension, the odd position's product added
//   first, then the even one's, each by an FMA, pair after pair in the list's order; a position listed without its
//   partner next to it is paired with a zero (0 x 0 added in the partner's turn). That is vdpbf16ps's definition
//   with the pair as one instruction's two halves, so bf16 rows weighed by bf16 probabilities take it; an int8
//   row's weight, its probability times its V scale, is rounded to bf16 in a bf16 model so that it may too.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace qs {

class ThreadPool;

// How K and V rows are stored: f32, bf16, or int8 codes with one f32 scale per position (and KV head), the value
// being scale x code. Int8 rows are dequantized inside the kernels: the products are taken on the codes and the
// scale applied once per position (to the score, and to the probability that weighs V).
enum class KvDtype { F32, BF16, Int8 };

// Consecutive positions whose K and V rows lie at a fixed stride (one block of the paged cache, or this call's
// own rows).
struct KvSegment {
  const std::byte* k;
  const std::byte* v;
  int64_t stride_bytes;
  int64_t count;
  KvDtype dtype;
  // Int8 only: where each position's f32 scale of K and of V lies (unaligned), at the same stride as the rows.
  const std::byte* k_scale = nullptr;
  const std::byte* v_scale = nullptr;
  int64_t position = 0;  // of the first row: it sets which positions the weighted sum of V pairs
};

// q: heads x d queries (already scaled); out: heads x d, overwritten. round_bf16: scores and probabilities are
// rounded to bf16 as a bf16 model rounds them. scratch: reused between calls (heads x positions floats; grows
// only past its capacity).
void attend(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
            std::vector<float>& scratch);

// attend on every thread of the pool, for a query whose heads alone would not keep the threads busy over a long
// context: the scores split by positions, the softmax by heads, the weighted sum of V by dimensions, so each K and
// V row is read once whatever the threads; the bits are attend's. Call from outside the pool's jobs.
void attend_split(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                  float* out, ThreadPool& pool, std::vector<float>& scratch);

// Many queries over the same keys and values (a tower's patches, every one attending over the whole image): query
// i's heads x d at q + i * q_stride, its result at out + i * out_stride. The bits are attend's on each query alone;
// the query heads of several queries share one pass over the keys and values (as a layer's heads do in attend),
// so each K and V row is read once for all of them rather than once a query.
void attend_queries(const float* q, int64_t queries, int64_t q_stride, int64_t heads, int64_t d,
                    std::span<const KvSegment> kv, bool round_bf16, float* out, int64_t out_stride,
                    std::vector<float>& scratch);

}  // namespace qs
