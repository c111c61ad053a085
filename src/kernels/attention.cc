#include "kernels/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "formats/dtype.h"
#include "kernels/ops.h"

namespace qs {
namespace {

int64_t positions_of(std::span<const KvSegment> kv) {
  int64_t n = 0;
  for (const KvSegment& s : kv) n += s.count;
  return n;
}

// Below this a probability is taken as 0. Beside the largest probability, at least 1/n (n <= 2^17 positions), it
// weighs under 2^-80, far under f32's 2^-24 resolution, so results do not change (short of sums that cancel to
// nothing); but products with such probabilities come out subnormal, and each subnormal operation costs the CPU a
// microcode assist (prefill of 512 tokens spent a quarter of its time there).
constexpr float kNegligibleProbability = 1e-30f;

// Softmax of each head's row of scores in place, as the reference computes it: max, exp(s - max) summed in position
// order, then each divided by the sum (and rounded in a bf16 model).
void softmax_rows(float* scores, int64_t heads, int64_t n, bool round_bf16) {
  for (int64_t h = 0; h < heads; ++h) {
    float* s = scores + h * n;
    const float max_score = *std::max_element(s, s + n);
    float sum = 0;
    for (int64_t p = 0; p < n; ++p) sum += (s[p] = std::exp(s[p] - max_score));
    for (int64_t p = 0; p < n; ++p) {
      const float prob = round_bf16 ? round_to_bf16(s[p] / sum) : s[p] / sum;
      s[p] = prob < kNegligibleProbability ? 0.0f : prob;
    }
  }
}

// --- portable: ops.h's dot and add_scaled, one head and one position at a time ---------------------------------

float dot_row(const float* q, const std::byte* row, int64_t d, bool bf16) {
  return bf16 ? dot(q, reinterpret_cast<const uint16_t*>(row), d) : dot(q, reinterpret_cast<const float*>(row), d);
}

void attend_portable(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                     float* out, float* scores, int64_t n) {
  for (int64_t h = 0; h < heads; ++h) {
    int64_t p = 0;
    for (const KvSegment& s : kv)
      for (int64_t j = 0; j < s.count; ++j, ++p) {
        const float score = dot_row(q + h * d, s.k + j * s.stride_bytes, d, s.bf16);
        scores[h * n + p] = round_bf16 ? round_to_bf16(score) : score;
      }
  }
  softmax_rows(scores, heads, n, round_bf16);
  std::fill(out, out + heads * d, 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    int64_t p = 0;
    for (const KvSegment& s : kv)
      for (int64_t j = 0; j < s.count; ++j, ++p) {
        const std::byte* row = s.v + j * s.stride_bytes;
        if (s.bf16) add_scaled(scores[h * n + p], reinterpret_cast<const uint16_t*>(row), out + h * d, d);
        else add_scaled(scores[h * n + p], reinterpret_cast<const float*>(row), out + h * d, d);
      }
  }
}

// --- AVX-512: the same operations, sixteen dimensions at a time for up to kHeads heads ----------------------------

#define QS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define QS_INLINE __attribute__((always_inline)) inline

constexpr int kHeads = 8;  // query heads per pass over the keys
constexpr int kValueHeads = 4;  // per pass over the values (four 16-dim blocks each)

QS_AVX512 QS_INLINE __m512 load16(const std::byte* row, int64_t i, bool bf16) {
  if (!bf16) return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i * 2));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Scores of H heads: per head sixteen lanes summing q x k over the blocks of sixteen dimensions in order, then one
// fixed tree (dot's order, with products and sums rounded separately).
template <int H>
QS_AVX512 void scores_avx512(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                             float* scores, int64_t n) {
  int64_t p = 0;
  for (const KvSegment& s : kv)
    for (int64_t j = 0; j < s.count; ++j, ++p) {
      const std::byte* row = s.k + j * s.stride_bytes;
      __m512 acc[H];
      for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        const __m512 k = load16(row, i, s.bf16);
        for (int h = 0; h < H; ++h) acc[h] = _mm512_add_ps(acc[h], _mm512_mul_ps(_mm512_loadu_ps(q + h * d + i), k));
      }
      for (int h = 0; h < H; ++h) {
        const float score = _mm512_reduce_add_ps(acc[h]);
        scores[h * n + p] = round_bf16 ? round_to_bf16(score) : score;
      }
    }
}

// out[h] = sum over positions, in order, of prob[h][p] x V[p] (each product and sum rounded: add_scaled's order).
// Sixty-four dimensions of up to four heads at a time (16 accumulators): each pass over the positions reads one
// contiguous run of every V row, which the prefetchers follow, rather than one line of it.
template <int H>
QS_AVX512 void weighted_v_avx512(int64_t d, std::span<const KvSegment> kv, const float* probs, int64_t n,
                                 float* out) {
  for (int64_t i = 0; i < d; i += 64) {
    const int B = static_cast<int>(std::min<int64_t>(4, (d - i) / 16));  // 16-dim blocks in this run
    __m512 acc[H][4];
    for (int h = 0; h < H; ++h)
      for (int b = 0; b < 4; ++b) acc[h][b] = _mm512_setzero_ps();
    int64_t p = 0;
    for (const KvSegment& s : kv)
      for (int64_t j = 0; j < s.count; ++j, ++p) {
        const std::byte* row = s.v + j * s.stride_bytes;
        for (int b = 0; b < B; ++b) {
          const __m512 v = load16(row, i + 16 * b, s.bf16);
          for (int h = 0; h < H; ++h)
            acc[h][b] = _mm512_add_ps(acc[h][b], _mm512_mul_ps(_mm512_set1_ps(probs[h * n + p]), v));
        }
      }
    for (int h = 0; h < H; ++h)
      for (int b = 0; b < B; ++b) _mm512_storeu_ps(out + h * d + i + 16 * b, acc[h][b]);
  }
}

template <int H>
QS_AVX512 void heads_avx512(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
                            float* scores, int64_t n) {
  scores_avx512<H>(q, d, kv, round_bf16, scores, n);
  softmax_rows(scores, H, n, round_bf16);
  constexpr int first = std::min(H, kValueHeads);
  weighted_v_avx512<first>(d, kv, scores, n, out);
  if constexpr (H > kValueHeads) weighted_v_avx512<H - kValueHeads>(d, kv, scores + kValueHeads * n, n, out + kValueHeads * d);
}

using HeadsFn = void (*)(const float*, int64_t, std::span<const KvSegment>, bool, float*, float*, int64_t);
constexpr HeadsFn kHeadsFns[kHeads] = {heads_avx512<1>, heads_avx512<2>, heads_avx512<3>, heads_avx512<4>,
                                       heads_avx512<5>, heads_avx512<6>, heads_avx512<7>, heads_avx512<8>};

const bool kHasAvx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");

}  // namespace

void attend(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
            std::vector<float>& scratch) {
  const int64_t n = positions_of(kv);
  const bool portable = !kHasAvx512 || d % 16 != 0;
  // Grown, never shrunk, and by doubling: the positions grow by one a decode step, and sliding layers between full
  // ones ask for less, so sizing to each call would reallocate on every step.
  const size_t need = (portable ? heads : std::min<int64_t>(heads, kHeads)) * n;
  if (scratch.size() < need) scratch.resize(std::max(need, 2 * scratch.size()));
  if (portable) return attend_portable(q, heads, d, kv, round_bf16, out, scratch.data(), n);
  for (int64_t h = 0; h < heads; h += kHeads) {
    const int64_t H = std::min<int64_t>(kHeads, heads - h);
    kHeadsFns[H - 1](q + h * d, d, kv, round_bf16, out + h * d, scratch.data(), n);
  }
}

}  // namespace qs
