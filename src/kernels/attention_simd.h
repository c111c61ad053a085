#pragma once
// attend's vector path, written once over simd_lanes.h's sixteen lanes V and compiled per instruction set:
// attention_avx512.cc and attention_avx2.cc define QS_SIMD, their target attribute, before including this. For up
// to kHeads query heads at a time, each K and V row is read once; per head the operations are ops.h's dot and
// add_scaled in their order, so the bits are the portable path's.
#include <algorithm>
#include <cstdint>
#include <span>

#include "formats/dtype.h"
#include "kernels/attention_isa.h"
#include "kernels/simd_lanes.h"

#ifndef QS_SIMD
#error "define QS_SIMD (the instruction set's target attribute) before including kernels/attention_simd.h"
#endif

namespace qs::attention {

constexpr int kValueHeads = 4;  // heads per pass over the values (four 16-dim blocks each)

template <typename V>
QS_SIMD QS_INLINE typename V::F load16(const std::byte* row, int64_t i, bool bf16) {
  return bf16 ? V::load_bf16(reinterpret_cast<const uint16_t*>(row) + i) : V::load(reinterpret_cast<const float*>(row) + i);
}

// Scores of H heads: per head sixteen lanes summing q x k over the blocks of sixteen dimensions in order, then one
// fixed tree (dot's order, with products and sums rounded separately).
template <typename V, int H>
QS_SIMD void scores(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out, int64_t n) {
  int64_t p = 0;
  for (const KvSegment& s : kv)
    for (int64_t j = 0; j < s.count; ++j, ++p) {
      const std::byte* row = s.k + j * s.stride_bytes;
      typename V::F acc[H];
      for (int h = 0; h < H; ++h) acc[h] = V::zero();
      for (int64_t i = 0; i < d; i += 16) {
        const typename V::F k = load16<V>(row, i, s.bf16);
        for (int h = 0; h < H; ++h) acc[h] = V::add(acc[h], V::mul(V::load(q + h * d + i), k));
      }
      for (int h = 0; h < H; ++h) {
        const float score = V::sum(acc[h]);
        out[h * n + p] = round_bf16 ? round_to_bf16(score) : score;
      }
    }
}

// out[h] = sum over positions, in order, of prob[h][p] x V[p] (each product and sum rounded: add_scaled's order).
// Sixty-four dimensions of up to four heads at a time (16 accumulators): each pass over the positions reads one
// contiguous run of every V row, which the prefetchers follow, rather than one line of it.
template <typename V, int H>
QS_SIMD void weighted_v(int64_t d, std::span<const KvSegment> kv, const float* probs, int64_t n, float* out) {
  for (int64_t i = 0; i < d; i += 64) {
    const int B = static_cast<int>(std::min<int64_t>(4, (d - i) / 16));  // 16-dim blocks in this run
    typename V::F acc[H][4];
    for (int h = 0; h < H; ++h)
      for (int b = 0; b < 4; ++b) acc[h][b] = V::zero();
    int64_t p = 0;
    for (const KvSegment& s : kv)
      for (int64_t j = 0; j < s.count; ++j, ++p) {
        const std::byte* row = s.v + j * s.stride_bytes;
        for (int b = 0; b < B; ++b) {
          const typename V::F v = load16<V>(row, i + 16 * b, s.bf16);
          for (int h = 0; h < H; ++h) acc[h][b] = V::add(acc[h][b], V::mul(V::set1(probs[h * n + p]), v));
        }
      }
    for (int h = 0; h < H; ++h)
      for (int b = 0; b < B; ++b) V::store(out + h * d + i + 16 * b, acc[h][b]);
  }
}

template <typename V, int H>
QS_SIMD void heads(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
                   float* probs, int64_t n) {
  scores<V, H>(q, d, kv, round_bf16, probs, n);
  softmax_rows(probs, H, n, round_bf16);
  constexpr int first = std::min(H, kValueHeads);
  weighted_v<V, first>(d, kv, probs, n, out);
  if constexpr (H > kValueHeads) weighted_v<V, H - kValueHeads>(d, kv, probs + kValueHeads * n, n, out + kValueHeads * d);
}

// heads (1..kHeads) of them.
template <typename V>
QS_SIMD void some_heads(const float* q, int64_t heads_count, int64_t d, std::span<const KvSegment> kv,
                        bool round_bf16, float* out, float* probs, int64_t n) {
  using Fn = void (*)(const float*, int64_t, std::span<const KvSegment>, bool, float*, float*, int64_t);
  constexpr Fn kFns[kHeads] = {heads<V, 1>, heads<V, 2>, heads<V, 3>, heads<V, 4>,
                               heads<V, 5>, heads<V, 6>, heads<V, 7>, heads<V, 8>};
  kFns[heads_count - 1](q, d, kv, round_bf16, out, probs, n);
}

}  // namespace qs::attention
