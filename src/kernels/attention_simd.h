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

template <typename V, KvDtype T>
QS_SIMD QS_INLINE typename V::F load16(const std::byte* row, int64_t i) {
  if constexpr (T == KvDtype::BF16) return V::load_bf16(reinterpret_cast<const uint16_t*>(row) + i);
  else if constexpr (T == KvDtype::Int8) return V::load_i8(reinterpret_cast<const int8_t*>(row) + i);
  else return V::load(reinterpret_cast<const float*>(row) + i);
}

// Scores of H heads over one segment, its positions at out[h * n + j]: per head sixteen lanes summing q x k over the
// blocks of sixteen dimensions in order, then one fixed tree (dot's order, with products and sums rounded
// separately), then times the position's scale (int8).
template <typename V, int H, KvDtype T>
QS_SIMD void segment_scores(const float* q, int64_t d, const KvSegment& s, bool round_bf16, float* out, int64_t n) {
  for (int64_t j = 0; j < s.count; ++j) {
    const std::byte* row = s.k + j * s.stride_bytes;
    typename V::F acc[H];
    for (int h = 0; h < H; ++h) acc[h] = V::zero();
    for (int64_t i = 0; i < d; i += 16) {
      const typename V::F k = load16<V, T>(row, i);
      for (int h = 0; h < H; ++h) acc[h] = V::add(acc[h], V::mul(V::load(q + h * d + i), k));
    }
    const float scale = T == KvDtype::Int8 ? scale_at(s.k_scale, j, s.stride_bytes) : 1.0f;
    for (int h = 0; h < H; ++h) {
      const float score = T == KvDtype::Int8 ? V::sum(acc[h]) * scale : V::sum(acc[h]);
      out[h * n + j] = round_bf16 ? round_to_bf16(score) : score;
    }
  }
}

template <typename V, int H>
QS_SIMD void scores(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out, int64_t n) {
  int64_t p = 0;
  for (const KvSegment& s : kv) {
    switch (s.dtype) {  // (a switch, not a generic lambda: a lambda would not inherit QS_SIMD's target)
      case KvDtype::F32: segment_scores<V, H, KvDtype::F32>(q, d, s, round_bf16, out + p, n); break;
      case KvDtype::BF16: segment_scores<V, H, KvDtype::BF16>(q, d, s, round_bf16, out + p, n); break;
      case KvDtype::Int8: segment_scores<V, H, KvDtype::Int8>(q, d, s, round_bf16, out + p, n); break;
    }
    p += s.count;
  }
}

// acc[h][b] += prob[h][j] x V[j] over one segment's positions, for the B 16-dim blocks from dimension i (int8: the
// probability times the position's scale, then times the codes).
template <typename V, int H, KvDtype T>
QS_SIMD QS_INLINE void segment_weighted_v(const KvSegment& s, int64_t i, int B, const float* probs, int64_t n,
                                          typename V::F (&acc)[H][4]) {
  for (int64_t j = 0; j < s.count; ++j) {
    const std::byte* row = s.v + j * s.stride_bytes;
    typename V::F weight[H];
    const float scale = T == KvDtype::Int8 ? scale_at(s.v_scale, j, s.stride_bytes) : 1.0f;
    for (int h = 0; h < H; ++h) weight[h] = V::set1(T == KvDtype::Int8 ? probs[h * n + j] * scale : probs[h * n + j]);
    for (int b = 0; b < B; ++b) {
      const typename V::F v = load16<V, T>(row, i + 16 * b);
      for (int h = 0; h < H; ++h) acc[h][b] = V::add(acc[h][b], V::mul(weight[h], v));
    }
  }
}

// out[h] = sum over positions, in order, of prob[h][p] x V[p] (each product and sum rounded: add_scaled's order),
// for dimensions [i0, i1) (i0 a multiple of 64). Sixty-four dimensions of up to four heads at a time (16
// accumulators): each pass over the positions reads one contiguous run of every V row, which the prefetchers
// follow, rather than one line of it.
template <typename V, int H>
QS_SIMD void weighted_v(int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv, const float* probs, int64_t n,
                        float* out) {
  for (int64_t i = i0; i < i1; i += 64) {
    const int B = static_cast<int>(std::min<int64_t>(4, (d - i) / 16));  // 16-dim blocks in this run
    typename V::F acc[H][4];
    for (int h = 0; h < H; ++h)
      for (int b = 0; b < 4; ++b) acc[h][b] = V::zero();
    int64_t p = 0;
    for (const KvSegment& s : kv) {
      switch (s.dtype) {
        case KvDtype::F32: segment_weighted_v<V, H, KvDtype::F32>(s, i, B, probs + p, n, acc); break;
        case KvDtype::BF16: segment_weighted_v<V, H, KvDtype::BF16>(s, i, B, probs + p, n, acc); break;
        case KvDtype::Int8: segment_weighted_v<V, H, KvDtype::Int8>(s, i, B, probs + p, n, acc); break;
      }
      p += s.count;
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
  weighted_v<V, first>(d, 0, d, kv, probs, n, out);
  if constexpr (H > kValueHeads)
    weighted_v<V, H - kValueHeads>(d, 0, d, kv, probs + kValueHeads * n, n, out + kValueHeads * d);
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

// The steps apart (attend_split): the scores of 1..kHeads heads over some positions, and the weighted sum of V of
// 1..kValueHeads heads over dimensions [i0, i1).
template <typename V>
QS_SIMD void some_scores(const float* q, int64_t heads_count, int64_t d, std::span<const KvSegment> kv,
                         bool round_bf16, float* out, int64_t n) {
  using Fn = void (*)(const float*, int64_t, std::span<const KvSegment>, bool, float*, int64_t);
  constexpr Fn kFns[kHeads] = {scores<V, 1>, scores<V, 2>, scores<V, 3>, scores<V, 4>,
                               scores<V, 5>, scores<V, 6>, scores<V, 7>, scores<V, 8>};
  kFns[heads_count - 1](q, d, kv, round_bf16, out, n);
}

template <typename V>
QS_SIMD void some_weighted_v(int64_t heads_count, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                             const float* probs, int64_t n, float* out) {
  using Fn = void (*)(int64_t, int64_t, int64_t, std::span<const KvSegment>, const float*, int64_t, float*);
  constexpr Fn kFns[kValueHeads] = {weighted_v<V, 1>, weighted_v<V, 2>, weighted_v<V, 3>, weighted_v<V, 4>};
  kFns[heads_count - 1](d, i0, i1, kv, probs, n, out);
}

}  // namespace qs::attention
