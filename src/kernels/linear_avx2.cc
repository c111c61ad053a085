// The vector linear kernels (linear_simd.h) with AVX2 and FMA: V's 16 lanes are two ymm registers, lanes 0-7 and
// 8-15, so every lane sees the same operations as with AVX-512 and both give the same bits. Run only where the
// CPU has AVX2 and FMA (linear.cc).
#include <immintrin.h>

#include "kernels/linear_isa.h"

#define QS_SIMD __attribute__((target("avx2,fma")))
#include "kernels/linear_simd.h"

namespace qs {
namespace {

struct Avx2 : simd::FmaPairs<simd::Avx2Lanes> {
  using Level = uint8_t;
  static constexpr int kLevelStride = 32;
  // A (row, token) accumulator takes 2 of the 16 registers and a decoded group 4: a pass holds 4 accumulators, and
  // each row is multiplied as soon as it is decoded (4 rows decoded first spilled everything to the stack).
  static constexpr int kTileCells = 4;
  static constexpr bool kRowByRow = true;
  static const uint8_t* level_table() { return int4_level_bytes(); }
  // The lanes hold the column pairs in the order int4_group leaves them, which saves it four shuffles a group:
  // pairs 0 2 8 10 4 6 12 14 in the low vector and 1 3 9 11 5 7 13 15 in the high one. Activations and bf16
  // weights are put in that order (permute_pairs), and each sum taken in pair order (total), so every lane sees
  // the canonical operations and the bits are AVX-512's.
  static QS_SIMD QS_INLINE void permute_pairs(__m256& a, __m256& b) {  // pairs 0-7 and 8-15 -> the order above
    const __m256 low = _mm256_shuffle_ps(a, b, 0x88), high = _mm256_shuffle_ps(a, b, 0xdd);
    a = low, b = high;
  }
  static QS_SIMD QS_INLINE float total(F acc) {
    return simd::Avx2Lanes::sum({_mm256_unpacklo_ps(acc.lo, acc.hi), _mm256_unpackhi_ps(acc.lo, acc.hi)});
  }
  // A scale's 16 levels are looked up as bytes (a byte shuffle reads 16 entries; a permute only 8), the bf16's
  // low and high bytes apart, then interleaved into bf16 words. A Rows or Tiles group's bytes are first ordered so
  // that each half of the register takes bytes 0-3 and 8-11 (half 0) or 4-7 and 12-15 (half 1), their low nibbles
  // (even columns) in its first 8 bytes and their high nibbles (odd columns) in its last 8; a Lanes group holds its
  // nibbles in that order already (linear.h), so each half takes all 16 bytes, half 0 their low nibbles and half 1
  // their high ones. Each 32-bit lane of the words then holds two even (or two odd) columns' bf16, widened to f32
  // by a shift and a mask. Five in-lane shuffles a group (Lanes: four), which two ports run on Intel and on AMD Zen 4.
  static QS_SIMD QS_INLINE G int4_group(const std::byte* group, const uint8_t* levels) {
    const __m256i order = _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11,  //
                                           4, 5, 6, 7, 12, 13, 14, 15, 4, 5, 6, 7, 12, 13, 14, 15);
    return looked_up(_mm256_srlv_epi64(_mm256_shuffle_epi8(broadcast(group), order), _mm256_setr_epi64x(0, 4, 0, 4)),
                     levels);
  }
  static QS_SIMD QS_INLINE G int4_lanes_group(const std::byte* group, const uint8_t* levels) {
    return looked_up(_mm256_srlv_epi64(broadcast(group), _mm256_setr_epi64x(0, 0, 4, 4)), levels);
  }
  static QS_SIMD QS_INLINE __m256i broadcast(const std::byte* group) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
  }
  // The levels of the low nibbles of `shifted`'s 32 bytes.
  static QS_SIMD QS_INLINE G looked_up(__m256i shifted, const uint8_t* levels) {
    const __m256i nibbles = _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f));
    const __m256i low = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(levels)));
    const __m256i high = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(levels + 16)));
    const __m256i lo = _mm256_shuffle_epi8(low, nibbles), hi = _mm256_shuffle_epi8(high, nibbles);
    return {widened(_mm256_unpacklo_epi8(lo, hi)), widened(_mm256_unpackhi_epi8(lo, hi))};
  }
  // Each 32-bit lane's two bf16 words as f32: the low word in the low vector, the high word in the high one.
  static QS_SIMD QS_INLINE F widened(__m256i words) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static QS_SIMD QS_INLINE G bf16_group(const std::byte* pairs) {
    __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(pairs)),
           b = _mm256_loadu_ps(reinterpret_cast<const float*>(pairs + 32));
    permute_pairs(a, b);
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i pa = _mm256_castps_si256(a), pb = _mm256_castps_si256(b);
    return {{_mm256_castsi256_ps(_mm256_slli_epi32(pa, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(pb, 16))},
            {_mm256_castsi256_ps(_mm256_and_si256(pa, high)), _mm256_castsi256_ps(_mm256_and_si256(pb, high))}};
  }
  static QS_SIMD QS_INLINE __m256 bf16_rounded(__m256 v) {  // round to nearest even, as f32_to_bf16; NaN stays NaN
    const __m256i u = _mm256_castps_si256(v), high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), high);
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, high), _mm256_set1_epi32(0x00400000));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(quiet), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  // Columns 0-15 of a and b -> the even ones and the odd ones, in order.
  static QS_SIMD QS_INLINE void deinterleave(__m256 a, __m256 b, __m256& even, __m256& odd) {
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  }
  static QS_SIMD QS_INLINE G activation_group(const float* cols, bool round_bf16) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(cols + 8 * i);
      if (round_bf16) v[i] = bf16_rounded(v[i]);
    }
    G g;
    deinterleave(v[0], v[1], g.even.lo, g.odd.lo);
    deinterleave(v[2], v[3], g.even.hi, g.odd.hi);
    permute_pairs(g.even.lo, g.even.hi);
    permute_pairs(g.odd.lo, g.odd.hi);
    return g;
  }
};

}  // namespace

QS_SIMD void linear_forward_avx2(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16) {
  simd::run_jobs<Avx2>(jobs, pool, round_to_bf16);
}

}  // namespace qs
