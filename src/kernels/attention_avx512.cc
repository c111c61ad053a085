// attend's vector path (attention_simd.h) with AVX-512: one zmm register a 16-dim block. Scores and the weighted
// sum of V over bf16 and int8 rows take bf16 dot products (vdpbf16ps) where the linears use them (the same check:
// they give the canonical order's bits, linear.h's bf16_dot_products_used), otherwise f32 FMA: the same bits.
// Run only where the CPU has AVX-512 (attention.cc).
#include "kernels/linear.h"

#define QS_SIMD __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#include "kernels/attention_simd.h"

namespace qs::attention {
namespace {

using Lanes = simd::Avx512Lanes;

// 32 values of a row as bf16 from value i, in order: bf16 rows as they lie; int8 codes become bf16 exactly (|code| <=
// 127 has 7 significant bits).
template <KvDtype T>
QS_SIMD QS_INLINE __m512i bf16_chunk(const std::byte* row, int64_t i) {
  static_assert(T != KvDtype::F32, "f32 rows need not be bf16");
  if constexpr (T == KvDtype::BF16) return _mm512_loadu_si512(row + 2 * i);
  const __m128i* codes = reinterpret_cast<const __m128i*>(row + i);
  const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes)));
  const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes + 1)));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
}

// The weighted sum of V over a run of bf16 or int8 rows, by vdpbf16ps (where the weights are bf16: the
// probabilities, int8_weight's): a pair of positions is one instruction's two halves, the even position low, so it
// adds the odd one's product first, as attention.h's order does. The pair's two rows, as bf16, are woven into words
// (row 2m, row 2m + 1) of the even dimensions and of the odd ones (one vpermt2w each), which keeps FmaTile's
// even/odd layout of the sums.
template <int H, KvDtype T>
struct PairTile {
  uint32_t weights[kTile / 2][H];  // [pair][head]: the two weights' bf16, the even position's low

  QS_SIMD QS_INLINE void weigh(const KvSegment& seg, int64_t j, int64_t count, const float* probs, int64_t n,
                               bool round_bf16) {
    float scales[kTile];
    if constexpr (T == KvDtype::Int8)
      for (int64_t t = 0; t < count; ++t) scales[t] = scale_at(seg.v_scale, j + t, seg.stride_bytes);
    auto bits = [&](int h, int64_t t) {  // a weight already bf16: its high half
      float w = probs[h * n + j + t];
      if constexpr (T == KvDtype::Int8) w = int8_weight(w, scales[t], round_bf16);
      uint32_t u;
      std::memcpy(&u, &w, 4);
      return u;
    };
    for (int64_t u = 0; u < count / 2; ++u)
      for (int h = 0; h < H; ++h) weights[u][h] = (bits(h, 2 * u + 1) & 0xffff0000u) | bits(h, 2 * u) >> 16;
  }

  template <int G>
  QS_SIMD QS_INLINE void pass(const std::byte* rows, int64_t stride, int64_t count, int64_t i, int h0, float* out,
                              int64_t d, const std::byte* const (&next)[kTile]) const {
    const __m512i even_words = _mm512_set_epi16(62, 30, 60, 28, 58, 26, 56, 24, 54, 22, 52, 20, 50, 18, 48, 16,
                                                46, 14, 44, 12, 42, 10, 40, 8, 38, 6, 36, 4, 34, 2, 32, 0);
    const __m512i odd_words = _mm512_add_epi16(even_words, _mm512_set1_epi16(1));
    __m512 even[G], odd[G];
    load_sums<Lanes, G>(out, h0, d, i, even, odd);
    for (int64_t u = 0; u < count / 2; ++u) {
      for (const int64_t r : {2 * u, 2 * u + 1})
        if (next[r]) prefetch_l2(next[r] + i * kValueBytes<T>);
      const __m512i a = bf16_chunk<T>(rows + 2 * u * stride, i), b = bf16_chunk<T>(rows + (2 * u + 1) * stride, i);
      const __m512bh even_pairs = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(a, even_words, b));
      const __m512bh odd_pairs = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(a, odd_words, b));
      for (int g = 0; g < G; ++g) {
        const __m512bh w = reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(weights[u][h0 + g])));
        even[g] = _mm512_dpbf16_ps(even[g], w, even_pairs);
        odd[g] = _mm512_dpbf16_ps(odd[g], w, odd_pairs);
      }
    }
    store_sums<Lanes, G>(out, h0, d, i, even, odd);
  }
};

// A chunk of 32 values as bf16 pairs, multiplied by vdpbf16ps: q is bf16 (rounded, in a bf16 model, as the model's
// q is); rows by bf16_chunk.
struct Bf16Dots {
  template <int H, KvDtype T>
  using ValueTile = PairTile<H, T>;
  using Q = __m512i;
  using K = __m512i;
  static constexpr int64_t kQueryFloats = 16;  // 32 bf16
  static QS_SIMD QS_INLINE void prepare(const float* q, float* out) {
    const __m512bh pairs = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q));
    _mm512_storeu_si512(out, reinterpret_cast<__m512i>(pairs));
  }
  static QS_SIMD QS_INLINE Q query(const float* prepared) { return _mm512_loadu_si512(prepared); }
  static QS_SIMD QS_INLINE void pin(Q& q) { asm("" : "+v"(q)); }
  template <KvDtype T>
  static QS_SIMD QS_INLINE K load_k(const std::byte* row, int64_t i) {
    return bf16_chunk<T>(row, i);
  }
  static QS_SIMD QS_INLINE __m512 mac(__m512 acc, Q q, K k) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(q), reinterpret_cast<__m512bh>(k));
  }
};

bool dot_products(bool round_bf16) { return round_bf16 && bf16_dot_products_used(); }

}  // namespace

QS_SIMD void heads_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                          float* out, float* scores, int64_t n) {
  if (dot_products(round_bf16)) return some_heads<Lanes, Bf16Dots>(q, heads, d, kv, round_bf16, out, scores, n);
  some_heads<Lanes, FmaPairDots<Lanes>>(q, heads, d, kv, round_bf16, out, scores, n);
}

QS_SIMD void scores_avx512(const float* q, int64_t heads, int64_t d, std::span<const KvSegment> kv, bool round_bf16,
                           float* out, int64_t n) {
  if (dot_products(round_bf16)) return some_scores<Lanes, Bf16Dots>(q, heads, d, kv, round_bf16, out, n);
  some_scores<Lanes, FmaPairDots<Lanes>>(q, heads, d, kv, round_bf16, out, n);
}

QS_SIMD void weighted_v_avx512(int64_t heads, int64_t d, int64_t i0, int64_t i1, std::span<const KvSegment> kv,
                               bool round_bf16, const float* probs, int64_t n, float* out) {
  if (dot_products(round_bf16))
    return some_weighted_v<Lanes, Bf16Dots>(heads, d, i0, i1, kv, probs, n, round_bf16, out);
  some_weighted_v<Lanes, FmaPairDots<Lanes>>(heads, d, i0, i1, kv, probs, n, round_bf16, out);
}

QS_SIMD void softmax_avx512(float* scores, int64_t heads, int64_t n, bool round_bf16) {
  softmax<Lanes>(scores, heads, n, round_bf16);
}

}  // namespace qs::attention
