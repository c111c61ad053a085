// The vector linear kernels (linear_simd.h) with AVX-512: V's 16 lanes are one zmm register. Run only where
// the CPU has AVX-512 (linear.cc).
#include <immintrin.h>

#include "kernels/linear_isa.h"

#define QS_SIMD __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#include "kernels/linear_simd.h"

namespace qs {
namespace {

struct Avx512 : simd::Avx512Lanes {
  using Level = float;
  static constexpr int kLevelStride = 16;
  static const float* level_table() { return int4_level_table(); }
  static QS_SIMD QS_INLINE void int4_group(const std::byte* group, const float* levels, F& even, F& odd) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    const __m512 table = _mm512_load_ps(levels);
    even = _mm512_permutexvar_ps(bytes, table);  // the permute reads only the index's low 4 bits
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
  }
  // A bf16 pair (2k, 2k + 1) is one 32-bit lane: the even column is its low half, the odd column its high half.
  static QS_SIMD QS_INLINE void bf16_group(const std::byte* pairs, F& even, F& odd) {
    const __m512i v = _mm512_loadu_si512(pairs);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static QS_SIMD QS_INLINE F bf16_rounded(F v) {  // round to nearest even, as f32_to_bf16; NaN stays NaN
    const __m512i u = _mm512_castps_si512(v), high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), high);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, high), _mm512_set1_epi32(0x00400000)));
    return _mm512_castsi512_ps(r);
  }
  static QS_SIMD QS_INLINE void activation_group(const float* cols, bool round_bf16, F& even, F& odd) {
    F a = _mm512_loadu_ps(cols), b = _mm512_loadu_ps(cols + 16);
    if (round_bf16) a = bf16_rounded(a), b = bf16_rounded(b);
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    even = _mm512_permutex2var_ps(a, evens, b);
    odd = _mm512_permutex2var_ps(a, _mm512_add_epi32(evens, _mm512_set1_epi32(1)), b);
  }
};

}  // namespace

QS_SIMD void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16) {
  simd::run_jobs<Avx512>(jobs, pool, round_to_bf16);
}

}  // namespace qs
