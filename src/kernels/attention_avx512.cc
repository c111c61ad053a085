// attend's vector path (attention_simd.h) with AVX-512: one zmm register a 16-dim block. Scores of bf16 and int8
// rows take bf16 dot products (vdpbf16ps) where the linears use them (the same check: they give the canonical
// order's bits, linear.h's bf16_dot_products_used), otherwise f32 FMA: the same bits. Run only where the CPU has
// AVX-512 (attention.cc).
#include "kernels/linear.h"

#define QS_SIMD __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#include "kernels/attention_simd.h"

namespace qs::attention {
namespace {

using Lanes = simd::Avx512Lanes;

// A chunk of 32 values as bf16 pairs, multiplied by vdpbf16ps: q is bf16 (rounded, in a bf16 model, as the model's
// q is), bf16 rows are loaded as they lie, int8 codes become bf16 exactly (|code| <= 127 has 7 significant bits).
struct Bf16Dots {
  using Q = __m512i;
  using K = __m512i;
  static constexpr int64_t kQueryFloats = 16;  // 32 bf16
  static QS_SIMD QS_INLINE void prepare(const float* q, float* out) {
    _mm512_storeu_si512(out, bf16_of(_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)));
  }
  static QS_SIMD QS_INLINE Q query(const float* prepared) { return _mm512_loadu_si512(prepared); }
  static QS_SIMD QS_INLINE void pin(Q& q) { asm("" : "+v"(q)); }
  template <KvDtype T>
  static QS_SIMD QS_INLINE K load_k(const std::byte* row, int64_t i) {
    static_assert(T != KvDtype::F32, "f32 rows need not be bf16: FmaPairDots");
    if constexpr (T == KvDtype::BF16) return _mm512_loadu_si512(row + 2 * i);
    const __m128i* codes = reinterpret_cast<const __m128i*>(row + i);
    return bf16_of(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes))),
                   _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes + 1))));
  }
  static QS_SIMD QS_INLINE __m512 mac(__m512 acc, Q q, K k) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(q), reinterpret_cast<__m512bh>(k));
  }
  // 32 values already bf16, in order (exact).
  static QS_SIMD QS_INLINE __m512i bf16_of(__m512 low, __m512 high) {
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
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
                               const float* probs, int64_t n, float* out) {
  some_weighted_v<Lanes>(heads, d, i0, i1, kv, probs, n, out);
}

}  // namespace qs::attention
