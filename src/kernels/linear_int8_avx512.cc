// W4A8 with AVX512-VNNI: the arithmetic of linear_int8.cc's portable code, in the same order, so the same bits.
// Run only where the CPU has AVX-512 and VNNI (linear.cc); target attributes, not per-file flags (linear_simd.h).
#include <immintrin.h>

#include <cstring>

#include "kernels/linear.h"
#include "kernels/linear_int8.h"

namespace qs::int8 {
namespace {

#define QS_INLINE __attribute__((always_inline)) inline
#define QS_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

constexpr int64_t kGroup = 32;
constexpr int kTokens = 8;  // tokens per pass over a tile's groups: one accumulator each

// A tile of four rows over C tokens. Per group one 64-byte line holds the four rows' nibbles: lane 4r + j of a
// vector is row r's bytes 4j..4j+3, i.e. its columns 8j..8j+7, so one dot-product instruction over the low nibbles
// (even columns) and one over the high nibbles (odd columns) give partial j of every row.
template <int C>
QS_VNNI QS_INLINE void tile(const std::byte* nibbles, const std::byte* scales, int64_t groups, const Group* x, float* y,
                    int64_t out, int64_t ahead) {
  __m512 acc[C];
  for (int t = 0; t < C; ++t) acc[t] = _mm512_setzero_ps();
  // Word 2i + 1 of the scales' expansion takes row i / 4's bf16 scale, word 2i is zeroed: lane i = f32(scale).
  const __m512i rows = _mm512_setr_epi32(0 << 16, 0 << 16, 0 << 16, 0 << 16, 1 << 16, 1 << 16, 1 << 16, 1 << 16,
                                         2 << 16, 2 << 16, 2 << 16, 2 << 16, 3 << 16, 3 << 16, 3 << 16, 3 << 16);
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    const std::byte* line = nibbles + g * 64;
    _mm_prefetch(reinterpret_cast<const char*>(line + ahead), _MM_HINT_T1);
    if (g % 8 == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + g * 8 + ahead / 8), _MM_HINT_T1);
    const __m512i n = _mm512_loadu_si512(line);
    const __m512i even = _mm512_and_si512(n, low), odd = _mm512_and_si512(_mm512_srli_epi16(n, 4), low);
    uint64_t four;
    std::memcpy(&four, scales + g * 8, 8);
    const __m512 s = _mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xaaaaaaaau, rows, _mm512_set1_epi64(static_cast<long long>(four))));
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) {
      const Group& a = x[t * groups + g];
      __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), even,
                                        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(a.q))));
      dot = _mm512_dpbusd_epi32(dot, odd, _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(a.q + 16))));
      dot = _mm512_sub_epi32(dot, _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(a.correction))));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(a.scale)), acc[t]);
    }
  }
  for (int t = 0; t < C; ++t) {  // (p0 + p1) + (p2 + p3) in each row's four lanes
    const __m512 pairs = _mm512_add_ps(acc[t], _mm512_permute_ps(acc[t], _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512 sums = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, _MM_SHUFFLE(1, 0, 3, 2)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sums);
    for (int r = 0; r < 4; ++r) y[t * out + r] = lanes[4 * r];
  }
}

template <int C>
QS_VNNI void tile_run(const std::byte* nibbles, const std::byte* scales, int64_t groups, const Group* x, int64_t T, float* y,
              int64_t out, int64_t ahead) {
  int64_t t = 0;
  for (; t + C <= T; t += C) tile<C>(nibbles, scales, groups, x + t * groups, y + t * out, out, ahead);
  if constexpr (C > 1)
    if (t < T) tile_run<C / 2>(nibbles, scales, groups, x + t * groups, T - t, y + t * out, out, ahead);
}

}  // namespace

QS_VNNI void rows_vnni(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  const int64_t groups = w.in / kGroup, ahead = std::max<int64_t>(6144, 2 * kTileRows * w.in / 2);
  for (int64_t r = r0; r < r1; r += kTileRows)
    tile_run<kTokens>(w.values + w.nibble_offset(r, 0), w.scales + w.scale_offset(r, 0), groups, x, T, y + r, w.out,
                      ahead);
}

// rint(cols / d) clamped to +-127, as quantize does.
QS_VNNI QS_INLINE __m512i levels_of(__m512 cols, float d) {
  if (d == 0) return _mm512_setzero_si512();
  const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(cols, _mm512_set1_ps(d)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127)), _mm512_set1_ps(127)));
}

// quantize's arithmetic, sixteen columns at a time.
QS_VNNI void quantize_avx512(const float* x, int64_t in, int64_t T, Group* out) {
  const int64_t groups = in / kGroup;
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = x + t * in + g * kGroup;
      const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      Group& q = out[t * groups + g];
      q.scale = amax / 127.0f;
      const __m512i e = levels_of(_mm512_permutex2var_ps(a, evens, b), q.scale);
      const __m512i o = levels_of(_mm512_permutex2var_ps(a, odds, b), q.scale);
      _mm_store_si128(reinterpret_cast<__m128i*>(q.q), _mm512_cvtsepi32_epi8(e));
      _mm_store_si128(reinterpret_cast<__m128i*>(q.q + 16), _mm512_cvtsepi32_epi8(o));
      // 8 x (even + odd) summed over each four consecutive entries: columns 8j..8j+7.
      const __m512i both = _mm512_slli_epi32(_mm512_add_epi32(e, o), 3);
      alignas(64) int32_t s[16];
      _mm512_store_si512(s, both);
      for (int j = 0; j < 4; ++j) q.correction[j] = (s[4 * j] + s[4 * j + 1]) + (s[4 * j + 2] + s[4 * j + 3]);
      std::memset(q.unused, 0, sizeof q.unused);
    }
}

}  // namespace qs::int8
