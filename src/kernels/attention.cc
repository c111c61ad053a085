#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "formats/dtype.h"
#include "kernels/attention_isa.h"
#include "kernels/attention_softmax.h"
#include "kernels/isa.h"
#include "kernels/simd_lanes.h"
#include "util/parallel.h"

namespace qs {
namespace attention {

void softmax_rows(float* scores, int64_t heads, int64_t n, bool round_bf16) {
  softmax<simd::PortableLanes>(scores, heads, n, round_bf16);
}

}  // namespace attention

namespace {

using attention::kHeads;

float value_of(float x) { return x; }
float value_of(uint16_t bf16) { return bf16_to_f32(bf16); }
float value_of(int8_t code) { return code; }

int64_t positions_of(std::span<const KvSegment> kv) {
  int64_t n = 0;
  for (const KvSegment& s : kv) n += s.count;
  return n;
}

// The scores' canonical order (attention_simd.h), one value at a time: q rounded to bf16 first in a bf16 model;
// sixteen lanes, lane k taking the pair (32c + 2k, 32c + 2k + 1) of each chunk c by FMA, the odd one first; then
// sum's tree (lanes k + 8, k + 4, k + 2, k + 1).
template <typename Value>
float pair_dot(const float* q, bool round_bf16, const Value* k, int64_t d) {
  float lanes[16] = {};
  for (int64_t c = 0; c < d; c += 32)
    for (int64_t lane = 0; lane < 16; ++lane)
      for (const int64_t i : {c + 2 * lane + 1, c + 2 * lane})
        if (i < d) lanes[lane] = std::fma(round_bf16 ? round_to_bf16(q[i]) : q[i], value_of(k[i]), lanes[lane]);
  for (int width = 8; width >= 1; width /= 2)
    for (int lane = 0; lane < width; ++lane) lanes[lane] += lanes[lane + width];
  return lanes[0];
}

// The portable path: pair_dot, then weigh_values, one head and one position at a time.
float score_of(const float* q, bool round_bf16, const KvSegment& s, int64_t j, int64_t d) {
  const std::byte* row = s.k + j * s.stride_bytes;
  switch (s.dtype) {
    case KvDtype::F32: return pair_dot(q, round_bf16, reinterpret_cast<const float*>(row), d);
    case KvDtype::BF16: return pair_dot(q, round_bf16, reinterpret_cast<const uint16_t*>(row), d);
    case KvDtype::Int8:
      return pair_dot(q, round_bf16, reinterpret_cast<const int8_t*>(row), d) *
             attention::scale_at(s.k_scale, j, s.stride_bytes);
  }
  return 0;
}

// A listed position's value of dimension i (int8: its code).
float listed_value(const KvSegment& s, int64_t j, int64_t i) {
  const std::byte* row = s.v + j * s.stride_bytes;
  switch (s.dtype) {
    case KvDtype::F32: return reinterpret_cast<const float*>(row)[i];
    case KvDtype::BF16: return value_of(reinterpret_cast<const uint16_t*>(row)[i]);
    case KvDtype::Int8: return reinterpret_cast<const int8_t*>(row)[i];
  }
  return 0;
}

// One head's weighted sum of V in attention.h's order: each pair's odd member, then its even one, by an FMA (an
// absent member: fma(0, 0, sum)).
void weigh_values(std::span<const KvSegment> kv, const float* probs, bool round_bf16, float* out, int64_t d) {
  using attention::Listed;
  auto add = [&](const std::optional<Listed>& m) {
    if (!m) {
      for (int64_t i = 0; i < d; ++i) out[i] = std::fma(0.0f, 0.0f, out[i]);
      return;
    }
    const KvSegment& s = kv[m->s];
    const float w = attention::listed_weight(s, *m, probs, round_bf16);
    for (int64_t i = 0; i < d; ++i) out[i] = std::fma(w, listed_value(s, m->j, i), out[i]);
  };
  std::fill(out, out + d, 0.0f);
  attention::PairWalk walk(kv);
  for (attention::PairStep step; walk.next(step);) {
    if (!step.run) {
      add(step.odd), add(step.even);
      continue;
    }
    for (int64_t j = 0; j < step.run; j += 2) {
      const Listed& f = step.first;
      add(Listed{f.s, f.j + j + 1, f.p + j + 1}), add(Listed{f.s, f.j + j, f.p + j});
    }
  }
}

void attend_portable(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                     float* out, float* scores, int64_t n) {
  for (int64_t h = 0; h < heads; ++h) {
    int64_t p = 0;
    for (const KvSegment& s : kv)
      for (int64_t j = 0; j < s.count; ++j, ++p) {
        const float score = score_of(q + h * d, round_bf16, s, j, d);
        scores[h * n + p] = round_bf16 ? round_to_bf16(score) : score;
      }
  }
  attention::softmax_rows(scores, heads, n, round_bf16);
  for (int64_t h = 0; h < heads; ++h) weigh_values(kv, scores + h * n, round_bf16, out + h * d, d);
}

// Grown, never shrunk, and by doubling: the positions grow by one a decode step, and sliding layers between full
// ones ask for less, so sizing to each call would reallocate on every step. Room the caller reserved is used before
// any is added.
float* scores_room(std::vector<float>& scratch, size_t need) {
  if (scratch.size() < need) {
    if (scratch.capacity() < need) scratch.reserve(std::max(need, 2 * scratch.capacity()));
    scratch.resize(need);
  }
  return scratch.data();
}

bool portable_for(Isa isa, int64_t d) { return isa == Isa::Portable || d % 32 != 0 || d > attention::kMaxHeadDim; }

}  // namespace

void attend(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
            std::vector<float>& scratch) {
  const simd::FlushDenormals canonical_rounding;
  const int64_t n = positions_of(kv);
  const Isa isa = kernel_isa();
  const bool portable = portable_for(isa, d);
  scores_room(scratch, (portable ? heads : std::min<int64_t>(heads, kHeads)) * n);
  if (portable) return attend_portable(q, heads, d, kv, round_bf16, out, scratch.data(), n);
  for (int64_t h = 0; h < heads; h += kHeads) {
    const int64_t H = std::min<int64_t>(kHeads, heads - h);
    (isa == Isa::Avx512 ? attention::heads_avx512 : attention::heads_avx2)(q + h * d, H, d, kv, round_bf16, out + h * d,
                                                                            scratch.data(), n);
  }
}

void attend_split(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                  float* out, ThreadPool& pool, std::vector<float>& scratch) {
  const Isa isa = kernel_isa();
  if (portable_for(isa, d) || pool.size() == 1) return attend(q, heads, d, kv, round_bf16, out, scratch);
  const bool avx512 = isa == Isa::Avx512;
  const int64_t n = positions_of(kv);
  float* probs = scores_room(scratch, heads * n);
  // Scores: segments split between threads (at least some 256 positions a chunk), every head of a K row at once.
  const int64_t segment_positions = std::max<int64_t>(1, n / std::max<int64_t>(1, kv.size()));
  pool.parallel_for(kv.size(), std::max<int64_t>(1, 256 / segment_positions), [&](size_t a, size_t b) {
    const simd::FlushDenormals canonical_rounding;
    const std::span<const KvSegment> part = kv.subspan(a, b - a);
    const int64_t first = positions_of(kv.first(a));
    for (int64_t h = 0; h < heads; h += kHeads) {
      const int64_t H = std::min<int64_t>(kHeads, heads - h);
      (avx512 ? attention::scores_avx512 : attention::scores_avx2)(q + h * d, H, d, part, round_bf16,
                                                                    probs + h * n + first, n);
    }
  });
  pool.parallel_for(heads, 1, [&](size_t a, size_t b) {
    const simd::FlushDenormals canonical_rounding;
    (avx512 ? attention::softmax_avx512 : attention::softmax_avx2)(probs + a * n, b - a, n, round_bf16);
  });
  // Weighted values: the dimensions in one part a thread (whole runs of 32), every position of each in order. Not
  // over-split as other jobs are: each call walks every position, weighing the probabilities and finding the rows
  // ahead once a tile for all its dimensions (32K positions, 2 threads: 2.2-2.4 ms for parts of 256, 3.3-3.7 for
  // eight of 64).
  const int64_t runs = d / 32, parts = std::min<int64_t>(runs, pool.size());
  pool.parallel_for(parts, 1, [&](size_t a, size_t b) {
    const simd::FlushDenormals canonical_rounding;
    const int64_t i0 = runs * a / parts * 32, i1 = runs * b / parts * 32;
    for (int64_t h = 0; h < heads; h += kHeads) {
      const int64_t H = std::min<int64_t>(kHeads, heads - h);
      (avx512 ? attention::weighted_v_avx512 : attention::weighted_v_avx2)(H, d, i0, i1, kv, round_bf16,
                                                                            probs + h * n, n, out + h * d);
    }
  });
}

void attend_queries(const float* q, int64_t queries, int64_t q_stride, int64_t heads, int64_t d,
                    std::span<const KvSegment> kv, bool round_bf16, float* out, int64_t out_stride,
                    std::vector<float>& scratch) {
  // Whole queries, up to kHeads query heads a pass (at least one query), gathered into rows and scattered back.
  const int64_t per_pass = std::max<int64_t>(1, kHeads / heads);
  std::vector<float> rows(per_pass * heads * d), results(per_pass * heads * d);
  for (int64_t first = 0; first < queries; first += per_pass) {
    const int64_t count = std::min(per_pass, queries - first);
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(q + (first + i) * q_stride, heads * d, rows.data() + i * heads * d);
    attend(rows.data(), count * heads, d, kv, round_bf16, results.data(), scratch);
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(results.data() + i * heads * d, heads * d, out + (first + i) * out_stride);
  }
}

}  // namespace qs
