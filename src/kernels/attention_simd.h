#pragma once
// attend's vector path, written once over simd_lanes.h's sixteen lanes V and compiled per instruction set:
// attention_avx512.cc and attention_avx2.cc define QS_SIMD, their target attribute, before including this. For up
// to kHeads query heads at a time, each K and V row is read once; per head the operations are the portable path's
// in its order (attention.h), so the bits are too.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "formats/dtype.h"
#include "kernels/attention_isa.h"
#include "kernels/attention_softmax.h"
#include "kernels/simd_lanes.h"

#ifndef QS_SIMD
#error "define QS_SIMD (the instruction set's target attribute) before including kernels/attention_simd.h"
#endif

namespace qs::attention {

// Values i .. i + 31 of a row as V's pair (even ones, odd ones).
template <typename V, KvDtype T>
QS_SIMD QS_INLINE typename V::Pair load_pairs(const std::byte* row, int64_t i) {
  if constexpr (T == KvDtype::BF16) return V::load_pairs_bf16(reinterpret_cast<const uint16_t*>(row) + i);
  else if constexpr (T == KvDtype::Int8) return V::load_pairs_i8(reinterpret_cast<const int8_t*>(row) + i);
  else return V::load_pairs(reinterpret_cast<const float*>(row) + i);
}

template <KvDtype T>
constexpr int64_t kValueBytes = T == KvDtype::F32 ? 4 : T == KvDtype::BF16 ? 2 : 1;

// Rows are requested before they are read: a paged cache's blocks lie apart, so the hardware prefetchers lose the
// stream at every block (measured at depth 32K, one core: scores 1.7x, weighted V 2.5x faster with the requests
// than without). K rows, read once and in order, kScoreAhead positions ahead into L2: requests into L1 are held to
// its few miss buffers (a layer's scores from memory on 2 threads: 0.95-1.0 ms into L2, 1.9-2.6 into L1, at 32K
// positions). V rows, read in several passes over a tile, kValueAhead positions ahead into L2 likewise (Zen 4, 2
// threads, 32K positions: the weighted sum 2.2-2.4 ms so, 3.1-3.9 with the next tile's into L1).
constexpr int64_t kScoreAhead = 8;
QS_INLINE void prefetch_l2(const std::byte* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

// Where the K (or V) row `ahead` positions past position j of kv[s] lies, in a later segment when past its end;
// null past the last one. Only prefetched, never read.
inline const std::byte* row_ahead(std::span<const KvSegment> kv, size_t s, int64_t j, int64_t ahead, bool v) {
  for (j += ahead; s < kv.size(); j -= kv[s].count, ++s)
    if (j < kv[s].count) return (v ? kv[s].v : kv[s].k) + j * kv[s].stride_bytes;
  return nullptr;
}

// --- scores: per head and position, the linears' canonical order (linear_simd.h): lane k of sixteen takes the
// dimension pair (32c + 2k, 32c + 2k + 1) of each 32-dimension chunk c in order, the odd one's product first, each
// product added with one rounding (an FMA), denormals flushed (the caller holds simd::FlushDenormals); then sum's
// tree, then times the position's scale (int8). That is vdpbf16ps's definition, so where the CPU's bf16 dot
// products give those bits, bf16 q and K rows take one instruction per head and chunk instead of two FMAs. M says
// how: its Q (a head's chunk of q), load_k (a row's chunk, T's values) and mac(acc, q, k).

template <typename V, int H, KvDtype T>
struct FmaTile;  // the weighted sum of V by f32 FMA (below)

// f32 FMA on even/odd pairs: any K dtype, any instruction set.
template <typename V>
struct FmaPairDots {
  template <int H, KvDtype T>
  using ValueTile = FmaTile<V, H, T>;  // how it weighs bf16 and int8 V rows
  using Q = typename V::Pair;
  using K = typename V::Pair;
  static constexpr int64_t kQueryFloats = 32;  // floats a prepared chunk of q takes
  static QS_SIMD QS_INLINE void prepare(const float* q, float* out) {
    const Q pair = V::load_pairs(q);
    V::store(out, pair.even), V::store(out + 16, pair.odd);
  }
  static QS_SIMD QS_INLINE Q query(const float* prepared) { return {V::load(prepared), V::load(prepared + 16)}; }
  static QS_SIMD QS_INLINE void pin(Q& q) { V::pin(q.even), V::pin(q.odd); }
  template <KvDtype T>
  static QS_SIMD QS_INLINE K load_k(const std::byte* row, int64_t i) {
    return load_pairs<V, T>(row, i);
  }
  static QS_SIMD QS_INLINE typename V::F mac(typename V::F acc, const Q& q, const K& k) {
    return V::fma(q.even, k.even, V::fma(q.odd, k.odd, acc));
  }
};

// Scores of H heads over P positions from j of kv[s], at out[h * n + j + p]; q: the heads' prepared chunks
// ([head][chunk], M::kQueryFloats each). P > 1: the P rows share each load of q, and the H x P sums take V::sums's
// tree together.
template <typename V, typename M, int H, int P, KvDtype T>
QS_SIMD QS_INLINE void score_positions(const float* q, int64_t d, std::span<const KvSegment> kv, size_t s, int64_t j,
                                       bool round_bf16, float* out, int64_t n) {
  using F = typename V::F;
  const KvSegment& seg = kv[s];
  const std::byte* row = seg.k + j * seg.stride_bytes;
  const std::byte* ahead[P];
  for (int p = 0; p < P; ++p) ahead[p] = row_ahead(kv, s, j + p, kScoreAhead, false);
  const int64_t chunks = d / 32;
  F acc[H * P];
  for (F& a : acc) a = V::zero();
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t line = 0; line < 32 * kValueBytes<T>; line += 64)
      for (int p = 0; p < P; ++p)
        if (ahead[p]) prefetch_l2(ahead[p] + 32 * c * kValueBytes<T> + line);
    typename M::K k[P];
    for (int p = 0; p < P; ++p) k[p] = M::template load_k<T>(row + p * seg.stride_bytes, 32 * c);
    for (int h = 0; h < H; ++h) {
      typename M::Q qh = M::query(q + (h * chunks + c) * M::kQueryFloats);
      if constexpr (P > 1) M::pin(qh);
      for (int p = 0; p < P; ++p) acc[h * P + p] = M::mac(acc[h * P + p], qh, k[p]);
    }
  }
  auto scale = [&](int p) { return T == KvDtype::Int8 ? scale_at(seg.k_scale, j + p, seg.stride_bytes) : 1.0f; };
  if constexpr (P == 1) {
    for (int h = 0; h < H; ++h) {
      const float score = T == KvDtype::Int8 ? V::sum(acc[h]) * scale(0) : V::sum(acc[h]);
      out[h * n + j] = round_bf16 ? round_to_bf16(score) : score;
    }
  } else {
    F slots[16];
    alignas(64) float sums[16], scales[16];
    for (int m = 0; m < 16; ++m) slots[V::slot_of(m)] = m < H * P ? acc[m] : V::zero();
    F all = V::sums(slots);
    if constexpr (T == KvDtype::Int8) {
      for (int m = 0; m < 16; ++m) scales[m] = scale(m % P);
      all = V::mul(all, V::load(scales));
    }
    V::store(sums, round_bf16 ? V::round_bf16(all) : all);
    for (int h = 0; h < H; ++h) std::memcpy(out + h * n + j, sums + h * P, P * sizeof(float));
  }
}

// Positions scored together: as many as keep H x P sums in sixteen registers (up to eight rows at once), where V
// sums many vectors at once; else one.
template <typename V, int H>
constexpr int kScorePositions = V::kManySums ? std::min(8, 16 / H) : 1;

template <typename V, typename M, int H, KvDtype T>
QS_SIMD void segment_scores(const float* q, int64_t d, std::span<const KvSegment> kv, size_t s, bool round_bf16,
                            float* out, int64_t n) {
  constexpr int P = kScorePositions<V, H>;
  int64_t j = 0;
  for (; j + P <= kv[s].count; j += P) score_positions<V, M, H, P, T>(q, d, kv, s, j, round_bf16, out, n);
  for (; j < kv[s].count; ++j) score_positions<V, M, H, 1, T>(q, d, kv, s, j, round_bf16, out, n);
}

// A call's H query heads prepared for M into `out` ([head][chunk], M::kQueryFloats floats each), rounded to bf16
// first in a bf16 model (where the model's q is bf16 already: the same values).
template <typename M, int H>
QS_SIMD QS_INLINE void prepare_queries(const float* q, int64_t d, bool round_bf16, float* out) {
  const int64_t chunks = d / 32;
  for (int h = 0; h < H; ++h)
    for (int64_t c = 0; c < chunks; ++c) {
      const float* given = q + h * d + 32 * c;
      float values[32];
      for (int i = 0; i < 32; ++i) values[i] = round_bf16 ? round_to_bf16(given[i]) : given[i];
      M::prepare(values, out + (h * chunks + c) * M::kQueryFloats);
    }
}

// Scores with M where it multiplies T's rows (BF16 dot products: bf16 and int8 rows; f32 rows, which need not be
// bf16, by FmaPairDots), else with FmaPairDots: both give the canonical order's bits.
template <typename V, typename M, int H>
QS_SIMD void scores(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out, int64_t n) {
  using Fma = FmaPairDots<V>;
  constexpr bool kOnlyFma = std::is_same_v<M, Fma>;
  alignas(64) float fma_q[H * kMaxHeadDim], m_q[kOnlyFma ? 1 : H * kMaxHeadDim];
  prepare_queries<Fma, H>(q, d, round_bf16, fma_q);
  if constexpr (!kOnlyFma) prepare_queries<M, H>(q, d, round_bf16, m_q);
  const float* m_prepared = kOnlyFma ? fma_q : m_q;
  int64_t p = 0;
  for (size_t s = 0; s < kv.size(); p += kv[s].count, ++s) {
    switch (kv[s].dtype) {  // (a switch, not a generic lambda: a lambda would not inherit QS_SIMD's target)
      case KvDtype::F32: segment_scores<V, Fma, H, KvDtype::F32>(fma_q, d, kv, s, round_bf16, out + p, n); break;
      case KvDtype::BF16: segment_scores<V, M, H, KvDtype::BF16>(m_prepared, d, kv, s, round_bf16, out + p, n); break;
      case KvDtype::Int8: segment_scores<V, M, H, KvDtype::Int8>(m_prepared, d, kv, s, round_bf16, out + p, n); break;
    }
  }
}

// --- weighted V: per head and dimension, positions in pairs (2m, 2m + 1), the odd one's product added first, each
// by an FMA (attention.h). Runs of whole pairs go by tiles (up to a cache block); each tile's rows are read from
// memory once, by one pass per 32 dimensions that carries every head's sums of them, and the rows kValueAhead
// positions on are requested as the passes read these. Within a call the sums of 32 dimensions are kept as a pair
// (V::Pair: even dimensions, odd ones, as bf16 rows widen without crossing lanes) and put in order at the end. M
// says how a run of bf16 or int8 rows is weighed (M::ValueTile).

constexpr int64_t kTile = 16;  // positions
constexpr int64_t kValueAhead = 2 * kTile;

// A pass's sums: dimensions i .. i + 31 of G heads from h0 (heads' rows d apart), as a pair in place.
template <typename V, int G>
QS_SIMD QS_INLINE void load_sums(const float* out, int h0, int64_t d, int64_t i, typename V::F (&even)[G],
                                 typename V::F (&odd)[G]) {
  for (int g = 0; g < G; ++g) even[g] = V::load(out + (h0 + g) * d + i), odd[g] = V::load(out + (h0 + g) * d + i + 16);
}
template <typename V, int G>
QS_SIMD QS_INLINE void store_sums(float* out, int h0, int64_t d, int64_t i, const typename V::F (&even)[G],
                                  const typename V::F (&odd)[G]) {
  for (int g = 0; g < G; ++g) V::store(out + (h0 + g) * d + i, even[g]), V::store(out + (h0 + g) * d + i + 16, odd[g]);
}

// By f32 FMA: any row dtype, any instruction set. Weights broadcast once a tile for all its passes: [position][head]
// (int8: int8_weight).
template <typename V, int H, KvDtype T>
struct FmaTile {
  typename V::F weights[kTile][H];

  QS_SIMD QS_INLINE void weigh(const KvSegment& seg, int64_t j, int64_t count, const float* probs, int64_t n,
                               bool round_bf16) {
    for (int64_t t = 0; t < count; ++t) {
      const float scale = T == KvDtype::Int8 ? scale_at(seg.v_scale, j + t, seg.stride_bytes) : 1.0f;
      for (int h = 0; h < H; ++h) {
        const float prob = probs[h * n + j + t];
        weights[t][h] = V::set1(T == KvDtype::Int8 ? int8_weight(prob, scale, round_bf16) : prob);
      }
    }
  }

  // Dimensions i .. i + 31 of G heads (from h0) over the tile's `count` rows, continuing the sums in `out` (heads'
  // rows d apart, pairs in place); the rows kValueAhead on (`next`, null past the last) requested as these are read.
  template <int G>
  QS_SIMD QS_INLINE void pass(const std::byte* rows, int64_t stride, int64_t count, int64_t i, int h0, float* out,
                              int64_t d, const std::byte* const (&next)[kTile]) const {
    using F = typename V::F;
    F even[G], odd[G];
    load_sums<V, G>(out, h0, d, i, even, odd);
    for (int64_t t = 0; t < count; t += 2)
      for (const int64_t r : {t + 1, t}) {  // the pair's odd position first
        if (next[r]) prefetch_l2(next[r] + i * kValueBytes<T>);
        const typename V::Pair v = load_pairs<V, T>(rows + r * stride, i);
        for (int g = 0; g < G; ++g) {
          F w = weights[r][h0 + g];
          V::pin(w);
          even[g] = V::fma(w, v.even, even[g]);
          odd[g] = V::fma(w, v.odd, odd[g]);
        }
      }
    store_sums<V, G>(out, h0, d, i, even, odd);
  }
};

// Heads per pass: as many as keep their sums (two vectors a head) in half the registers.
template <typename V, int H>
constexpr int kPassHeads = std::min(H, V::kManySums ? 8 : 2);

// A run of whole pairs: by M's tile for bf16 and int8 rows, by FmaTile for f32 ones.
template <typename V, typename M, int H, KvDtype T>
QS_SIMD void weigh_run(std::span<const KvSegment> kv, const PairStep& step, int64_t i0, int64_t i1, const float* probs,
                       int64_t n, bool round_bf16, float* out, int64_t d) {
  using Tile = std::conditional_t<T == KvDtype::F32, FmaTile<V, H, T>, typename M::template ValueTile<H, T>>;
  constexpr int G = kPassHeads<V, H>;
  const size_t s = step.first.s;
  const int64_t j0 = step.first.j, count = step.run;
  probs += step.first.p - j0;  // indexed by the segment's rows
  const KvSegment& seg = kv[s];
  Tile tile;
  for (int64_t j = j0; j < j0 + count; j += kTile) {
    const int64_t rows_here = std::min(kTile, j0 + count - j);
    tile.weigh(seg, j, rows_here, probs, n, round_bf16);
    const std::byte* next[kTile];  // the rows kValueAhead on, wherever they lie
    for (int64_t t = 0; t < rows_here; ++t) next[t] = row_ahead(kv, s, j + t, kValueAhead, true);
    const std::byte* rows = seg.v + j * seg.stride_bytes;
    for (int64_t i = i0; i < i1; i += 32) {
      int h0 = 0;
      for (; h0 + G <= H; h0 += G) tile.template pass<G>(rows, seg.stride_bytes, rows_here, i, h0, out, d, next);
      if constexpr (H % G != 0) tile.template pass<H % G>(rows, seg.stride_bytes, rows_here, i, h0, out, d, next);
    }
  }
}

// Dimensions i .. i + 31 of a listed row as V's pair.
template <typename V>
QS_SIMD QS_INLINE typename V::Pair listed_values(const KvSegment& seg, int64_t j, int64_t i) {
  const std::byte* row = seg.v + j * seg.stride_bytes;
  switch (seg.dtype) {
    case KvDtype::BF16: return load_pairs<V, KvDtype::BF16>(row, i);
    case KvDtype::Int8: return load_pairs<V, KvDtype::Int8>(row, i);
    default: return load_pairs<V, KvDtype::F32>(row, i);
  }
}

// A pair across two segments, or a position alone (an absent member: a zero, 0 x 0 added in its turn), for all
// dimensions [i0, i1) of H heads. Rare: where a window starts, where this call's own rows begin.
template <typename V, int H>
QS_SIMD void weigh_lone(std::span<const KvSegment> kv, const PairStep& step, int64_t i0, int64_t i1, const float* probs,
                        int64_t n, bool round_bf16, float* out, int64_t d) {
  for (const std::optional<Listed>& m : {step.odd, step.even})
    for (int h = 0; h < H; ++h)
      for (int64_t i = i0; i < i1; i += 32) {
        float* sums = out + h * d + i;
        typename V::F even = V::load(sums), odd = V::load(sums + 16);
        if (m) {
          const KvSegment& seg = kv[m->s];
          const typename V::Pair v = listed_values<V>(seg, m->j, i);
          const typename V::F w = V::set1(listed_weight(seg, *m, probs + h * n, round_bf16));
          even = V::fma(w, v.even, even), odd = V::fma(w, v.odd, odd);
        } else {
          even = V::add(even, V::zero()), odd = V::add(odd, V::zero());  // fma(0, 0, sum)
        }
        V::store(sums, even), V::store(sums + 16, odd);
      }
}

// out[h * d + i] for H heads and dimensions [i0, i1) (multiples of 32).
template <typename V, typename M, int H>
QS_SIMD void weighted_v(int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv, const float* probs, int64_t n,
                        bool round_bf16, float* out) {
  for (int h = 0; h < H; ++h) std::fill(out + h * d + i0, out + h * d + i1, 0.0f);
  PairWalk walk(kv);
  for (PairStep step; walk.next(step);) {
    if (!step.run) {
      weigh_lone<V, H>(kv, step, i0, i1, probs, n, round_bf16, out, d);
      continue;
    }
    switch (kv[step.first.s].dtype) {
      case KvDtype::F32: weigh_run<V, M, H, KvDtype::F32>(kv, step, i0, i1, probs, n, round_bf16, out, d); break;
      case KvDtype::BF16: weigh_run<V, M, H, KvDtype::BF16>(kv, step, i0, i1, probs, n, round_bf16, out, d); break;
      case KvDtype::Int8: weigh_run<V, M, H, KvDtype::Int8>(kv, step, i0, i1, probs, n, round_bf16, out, d); break;
    }
  }
  for (int h = 0; h < H; ++h)
    for (int64_t i = i0; i < i1; i += 32) {
      float* sums = out + h * d + i;
      V::interleave(V::load(sums), V::load(sums + 16), sums);
    }
}

template <typename V, typename M, int H>
QS_SIMD void heads(const float* q, int64_t d, std::span<const KvSegment> kv, bool round_bf16, float* out,
                   float* probs, int64_t n) {
  scores<V, M, H>(q, d, kv, round_bf16, probs, n);
  softmax<V>(probs, H, n, round_bf16);
  weighted_v<V, M, H>(d, 0, d, kv, probs, n, round_bf16, out);
}

// heads (1..kHeads) of them.
template <typename V, typename M>
QS_SIMD void some_heads(const float* q, int64_t heads_count, int64_t d, std::span<const KvSegment> kv,
                        bool round_bf16, float* out, float* probs, int64_t n) {
  using Fn = void (*)(const float*, int64_t, std::span<const KvSegment>, bool, float*, float*, int64_t);
  constexpr Fn kFns[kHeads] = {heads<V, M, 1>, heads<V, M, 2>, heads<V, M, 3>, heads<V, M, 4>,
                               heads<V, M, 5>, heads<V, M, 6>, heads<V, M, 7>, heads<V, M, 8>};
  kFns[heads_count - 1](q, d, kv, round_bf16, out, probs, n);
}

// The steps apart (attend_split): the scores of 1..kHeads heads over some positions, and the weighted sum of V of
// 1..kHeads heads over dimensions [i0, i1).
template <typename V, typename M>
QS_SIMD void some_scores(const float* q, int64_t heads_count, int64_t d, std::span<const KvSegment> kv,
                         bool round_bf16, float* out, int64_t n) {
  using Fn = void (*)(const float*, int64_t, std::span<const KvSegment>, bool, float*, int64_t);
  constexpr Fn kFns[kHeads] = {scores<V, M, 1>, scores<V, M, 2>, scores<V, M, 3>, scores<V, M, 4>,
                               scores<V, M, 5>, scores<V, M, 6>, scores<V, M, 7>, scores<V, M, 8>};
  kFns[heads_count - 1](q, d, kv, round_bf16, out, n);
}

template <typename V, typename M>
QS_SIMD void some_weighted_v(int64_t heads_count, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                             const float* probs, int64_t n, bool round_bf16, float* out) {
  using Fn = void (*)(int64_t, int64_t, int64_t, std::span<const KvSegment>, const float*, int64_t, bool, float*);
  constexpr Fn kFns[kHeads] = {weighted_v<V, M, 1>, weighted_v<V, M, 2>, weighted_v<V, M, 3>, weighted_v<V, M, 4>,
                               weighted_v<V, M, 5>, weighted_v<V, M, 6>, weighted_v<V, M, 7>, weighted_v<V, M, 8>};
  kFns[heads_count - 1](d, i0, i1, kv, probs, n, round_bf16, out);
}

}  // namespace qs::attention
