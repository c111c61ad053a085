// W4A8 with AVX512-VNNI on the Blocks layout: the arithmetic of linear_int8.cc's portable code, so the same bits.
// Run only where the CPU has AVX-512 and VNNI (linear.cc); target attributes, not per-file flags (linear_simd.h).
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels/linear.h"
#include "kernels/linear_int8.h"
#include "kernels/linear_isa.h"

namespace qs::int8 {
namespace {

#define QS_INLINE __attribute__((always_inline)) inline
#define QS_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

constexpr int64_t kGroup = 32;
constexpr int kTokens = 8;  // tokens per pass over a block's groups: one accumulator each
// A group's four lines of a block and its 16 scales (linear.h's Blocks layout).
constexpr int64_t kLineBytes = 64, kGroupBytes = 4 * kLineBytes, kScaleBytes = 2 * kBlockRows;

// One token's group against a block's decoded lines: lane r = row r's integer dot product, from the group's start.
// Integer sums are exact in any order, so the even and odd columns run as two chains where few tokens leave the
// dot products' latency exposed.
template <bool kTwoChains>
QS_VNNI QS_INLINE __m512i group_dot(const Group& a, const __m512i (&even)[4], const __m512i (&odd)[4]) {
  // q's four-byte words (columns 8j, 8j + 2, .. even; 8j + 1, .. odd), read by each dot product as a broadcast
  // operand: a load, where a register broadcast would take a shuffle pipe.
  using Word = int32_t __attribute__((may_alias));
  const Word* words = reinterpret_cast<const Word*>(a.q);
  __m512i e = _mm512_set1_epi32(a.start), o = kTwoChains ? _mm512_setzero_si512() : e;
  for (int j = 0; j < 4; ++j) {
    e = _mm512_dpbusd_epi32(e, even[j], _mm512_set1_epi32(words[j]));
    (kTwoChains ? o : e) = _mm512_dpbusd_epi32(kTwoChains ? o : e, odd[j], _mm512_set1_epi32(words[4 + j]));
  }
  return kTwoChains ? _mm512_add_epi32(e, o) : e;
}

// A block of sixteen rows over C tokens: per group the four lines' low nibbles (even columns) and high nibbles
// (odd columns) as unsigned bytes, the scales widened to f32, then per token eight dot products and one FMA.
template <int C>
QS_VNNI QS_INLINE void block(const std::byte* nibbles, const std::byte* scales, int64_t groups, const Group* x,
                             float* y, int64_t out, int64_t ahead) {
  __m512 acc[C];
  for (int t = 0; t < C; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    const std::byte* lines = nibbles + g * kGroupBytes;
    __m512i even[4], odd[4];
    for (int j = 0; j < 4; ++j) {
      prefetch(lines + ahead + j * kLineBytes);
      const __m512i n = _mm512_loadu_si512(lines + j * kLineBytes);
      even[j] = _mm512_and_si512(n, low), odd[j] = _mm512_and_si512(_mm512_srli_epi16(n, 4), low);
    }
    if (g % 2 == 0) prefetch(scales + g * kScaleBytes + ahead / 8);
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + g * kScaleBytes))), 16));
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) {
      const Group& a = x[t * groups + g];
      const __m512i dot = group_dot<(C < 4)>(a, even, odd);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(a.scale)), acc[t]);
    }
  }
  for (int t = 0; t < C; ++t) _mm512_storeu_ps(y + t * out, acc[t]);
}

// T tokens in passes of kTokens, the rest as one pass: a block's lines are decoded once a pass, so five tokens
// (a verify of four drafts) cost one pass, not a pass of four and one of one.
template <int... C>
QS_VNNI void block_run(const std::byte* nibbles, const std::byte* scales, int64_t groups, const Group* x, int64_t T,
                       float* y, int64_t out, int64_t ahead, std::integer_sequence<int, C...>) {
  int64_t t = 0;
  for (; t + kTokens <= T; t += kTokens)
    block<kTokens>(nibbles, scales, groups, x + t * groups, y + t * out, out, ahead);
  const int64_t rest = T - t;
  ((rest == C + 1 ? block<C + 1>(nibbles, scales, groups, x + t * groups, y + t * out, out, ahead) : void()), ...);
}

}  // namespace

QS_VNNI void rows_vnni(const LinearWeight& w, const Group* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  const int64_t groups = w.in / kGroup, ahead = prefetch_distance(w.in / 2);  // as the other int4 kernels
  for (int64_t r = r0; r < r1; r += kBlockRows)
    block_run(w.values + w.nibble_offset(r, 0), w.scales + w.scale_offset(r, 0), groups, x, T, y + r, w.out, ahead,
              std::make_integer_sequence<int, kTokens - 1>());
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
      q.start = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(e, o));
      std::memset(q.unused, 0, sizeof q.unused);
    }
}

}  // namespace qs::int8
