// The vector linear kernels (linear_simd.h) with AVX-512: V's 16 lanes are one zmm register. With bf16
// activations they multiply by vdpbf16ps where the CPU has AVX512_BF16, it computes the canonical order's bits
// (checked here once, on a table of edge cases) and it is the faster of the two here (timed once); otherwise by f32
// FMA, the same bits. Run only where the CPU has AVX-512 (linear.cc).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/linear_isa.h"

#define QS_SIMD __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#include "kernels/linear_simd.h"

namespace qs {
namespace {

QS_SIMD QS_INLINE __m512i bf16_rounded(__m512 v) {  // round to nearest even, as f32_to_bf16; NaN stays NaN
  return _mm512_castps_si512(simd::Avx512Lanes::round_bf16(v));
}

// f32 FMA: a group as its even and odd columns in two registers.
struct Avx512 : simd::FmaPairs<simd::Avx512Lanes> {
  using Level = float;
  static constexpr int kLevelStride = 16;
  static const float* level_table() { return int4_level_table(); }
  static QS_SIMD QS_INLINE G int4_group(const std::byte* group, const float* levels) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    const __m512 table = _mm512_load_ps(levels);
    // the permute reads only the index's low 4 bits
    return {_mm512_permutexvar_ps(bytes, table), _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)};
  }
  // A bf16 pair (2k, 2k + 1) is one 32-bit lane: the even column is its low half, the odd column its high half.
  static QS_SIMD QS_INLINE G bf16_group(const std::byte* pairs) {
    const __m512i v = _mm512_loadu_si512(pairs);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static QS_SIMD QS_INLINE G activation_group(const float* cols, bool round_bf16) {
    F a = _mm512_loadu_ps(cols), b = _mm512_loadu_ps(cols + 16);
    if (round_bf16) a = _mm512_castsi512_ps(bf16_rounded(a)), b = _mm512_castsi512_ps(bf16_rounded(b));
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    return {_mm512_permutex2var_ps(a, evens, b), _mm512_permutex2var_ps(a, odds, b)};
  }
};

// bf16 dot products: a group is 32 bf16 values in natural order, the column pair (2k, 2k + 1) in 32-bit lane k,
// as vdpbf16ps takes them; bf16 activations only.
struct Avx512Bf16 : simd::Avx512Lanes {
  using G = __m512i;
  using Level = uint16_t;
  static constexpr int kLevelStride = 16;
  static const uint16_t* level_table() { return int4_level_words(); }
  // A group's 32 bf16 stored densely: a block of activations or decoded rows takes half the cache of f32 pairs
  // (with 128 bytes a group, four tokens' and four rows' groups of a 1536-wide matrix missed L1: 0.5x the products).
  static constexpr int64_t kRoom = 16;
  // One register a group: 4 rows x 6 tokens of accumulators, the rows and a token's group fit the 32 registers.
  static constexpr int kTileTokens = 6;
  static constexpr int kTileCells = simd::kRows * kTileTokens;
  static constexpr bool kRowByRow = false;
  static QS_SIMD QS_INLINE G load_group(const float* p) { return _mm512_loadu_si512(p); }
  static QS_SIMD QS_INLINE void store_group(float* p, G g) { _mm512_storeu_si512(p, g); }
  static QS_SIMD QS_INLINE F mac(F acc, G w, G x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
  static QS_SIMD QS_INLINE float total(F acc) { return sum(acc); }
  // Byte k of a group holds column 2k's level (low nibble) and column 2k + 1's (high): each in its own 16-bit half
  // of lane k, then one word permute looks all 32 up in the scale's 16 bf16 levels.
  static QS_SIMD QS_INLINE G int4_group(const std::byte* group, const uint16_t* levels) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    const __m512i nibbles = _mm512_ternarylogic_epi32(bytes, _mm512_slli_epi32(bytes, 12),
                                                      _mm512_set1_epi32(0x000f000f), 0xa8);  // (a | b) & c
    const __m256i table = _mm256_load_si256(reinterpret_cast<const __m256i*>(levels));
    return _mm512_permutexvar_epi16(nibbles, _mm512_zextsi256_si512(table));  // indices 0-15 only
  }
  // A Columns line (linear.h): row r's 32 nibbles are bits 4r..4r+3 of the line's 32 words, so a shift and a mask
  // give each row's indices for the word permute.
  static QS_SIMD QS_INLINE void int4_columns(const std::byte* line, const uint16_t* const (&levels)[4], G (&rows)[4]) {
    const __m512i n = _mm512_loadu_si512(line), nibble = _mm512_set1_epi16(0x000f);
    const __m512i index[4] = {_mm512_and_si512(n, nibble), _mm512_and_si512(_mm512_srli_epi16(n, 4), nibble),
                              _mm512_and_si512(_mm512_srli_epi16(n, 8), nibble), _mm512_srli_epi16(n, 12)};
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256i table = _mm256_load_si256(reinterpret_cast<const __m256i*>(levels[r]));
      rows[r] = _mm512_permutexvar_epi16(index[r], _mm512_zextsi256_si512(table));
    }
  }
  static QS_SIMD QS_INLINE G bf16_group(const std::byte* pairs) { return _mm512_loadu_si512(pairs); }
  static QS_SIMD QS_INLINE G activation_group(const float* cols, bool /*rounded to bf16 always*/) {
    const __m512i a = bf16_rounded(_mm512_loadu_ps(cols)), b = bf16_rounded(_mm512_loadu_ps(cols + 16));
    const __m512i high_halves = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,  //
                                                 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(a, high_halves, b);
  }
};

// Whether vdpbf16ps gives the canonical order's bits here: against Avx512's two FMAs (odd product first) under
// DAZ and FTZ, lane by lane, on operands that reach every case the definition names (zeros, denormal inputs,
// results that underflow or round across the smallest normal, overflow, infinities, NaN) and ordinary ones.
QS_SIMD bool bf16_dot_products_exact() {
  uint32_t state = 0x9e3779b9u;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  auto bf16 = [&](int mode) -> uint16_t {
    const uint32_t r = next() >> 8;
    switch (mode) {
      case 0: return static_cast<uint16_t>(r);                                          // any bit pattern
      case 1: return static_cast<uint16_t>((r & 0x807f) | ((r >> 16) % 40 + 1) << 7);    // tiny normals
      case 2: return static_cast<uint16_t>(r & 0x807f);                                  // zeros and denormals
      default: return static_cast<uint16_t>((r & 0x807f) | (117 + (r >> 16) % 20) << 7);  // around one
    }
  };
  const simd::FlushDenormals canonical_rounding;
  for (int trial = 0; trial < 4096; ++trial) {
    alignas(64) uint16_t w[32], x[32];
    alignas(64) uint32_t acc[16];
    const int mode = trial % 5;
    for (int i = 0; i < 32; ++i) w[i] = bf16(mode == 4 ? 1 : mode), x[i] = bf16(mode == 4 ? 3 : (mode + i) % 4);
    const uint32_t exponent = mode == 1 || mode == 4 ? 4 : 120;  // sums near the smallest normal, or ordinary
    for (uint32_t& a : acc) a = trial % 3 == 0 ? 0 : trial % 3 == 1 ? next() : (next() & 0x80ffffffu) | exponent << 23;
    const __m512 start = _mm512_load_ps(reinterpret_cast<const float*>(acc));
    const __m512i wv = _mm512_load_si512(w), xv = _mm512_load_si512(x);
    const __m512 dot = Avx512Bf16::mac(start, wv, xv);
    const __m512 fma = Avx512::mac(start, Avx512::bf16_group(reinterpret_cast<const std::byte*>(w)),
                                   Avx512::bf16_group(reinterpret_cast<const std::byte*>(x)));
    if (_mm512_cmpneq_epi32_mask(_mm512_castps_si512(dot), _mm512_castps_si512(fma)) &
        ~_mm512_cmp_ps_mask(dot, dot, _CMP_UNORD_Q))  // NaN payloads may differ; NaN against number may not
      return false;
    if (_mm512_cmp_ps_mask(dot, dot, _CMP_UNORD_Q) != _mm512_cmp_ps_mask(fma, fma, _CMP_UNORD_Q)) return false;
  }
  return true;
}

// Seconds for the fastest of a few passes of one token through an in-cache int4 matrix, on this thread.
template <typename V>
QS_SIMD double fastest_pass(const LinearWeight& w, const std::vector<float>& x) {
  std::vector<float> packed(x.size() + 16), y(w.out);
  simd::pack_activations<V>(x.data(), w.in, 1, true, packed.data());
  double best = 1e30;
  for (int pass = 0; pass < 20; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    simd::weight_rows<V>(w, packed.data(), 1, y.data(), 0, w.out);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// Whether vdpbf16ps multiplies a decode step's int4 groups faster than f32 FMA here, timed on a 64 x 1536 matrix
// (48 KB: the compute rate, which is what differs) in alternating rounds. It replaces two lookups and two FMAs by
// one lookup and one instruction, but CPUs differ in its cost: one cycle of one pipe on AMD Zen 4, about two of
// both vector ports on Intel Emerald Rapids (measured there earlier, when f32 FMA was chosen for it).
QS_SIMD bool bf16_dot_products_faster() {
  constexpr int64_t kOut = 64, kIn = 1536;
  std::vector<uint8_t> nibbles(kOut * kIn / 2);
  std::vector<uint16_t> scales(kOut * kIn / 32);
  std::vector<float> x(kIn);
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (uint8_t& b : nibbles) b = static_cast<uint8_t>(next() >> 24);
  for (uint16_t& s : scales) s = static_cast<uint16_t>(0x3c00 + (next() >> 24));
  for (float& v : x) v = static_cast<float>(next() >> 8) / 16777216.0f - 0.5f;
  const LinearWeight w{kOut, kIn, WeightKind::Int4, reinterpret_cast<const std::byte*>(nibbles.data()),
                       reinterpret_cast<const std::byte*>(scales.data()), 32};
  const simd::FlushDenormals canonical_rounding;
  double dot = 1e30, fma = 1e30;
  for (int round = 0; round < 5; ++round)
    dot = std::min(dot, fastest_pass<Avx512Bf16>(w, x)), fma = std::min(fma, fastest_pass<Avx512>(w, x));
  return dot < fma;
}

std::atomic<Bf16Multiply>& bf16_multiply() {
  static std::atomic<Bf16Multiply> chosen{Bf16Multiply::Auto};
  return chosen;
}

}  // namespace

bool bf16_dot_products_used() {
  static const bool exact = __builtin_cpu_supports("avx512bf16") && bf16_dot_products_exact();
  switch (bf16_multiply().load(std::memory_order_relaxed)) {
    case Bf16Multiply::Fma: return false;
    case Bf16Multiply::DotProducts: return exact;
    case Bf16Multiply::Auto: break;
  }
  static const bool faster = exact && bf16_dot_products_faster();
  return faster;
}

void set_bf16_multiply(Bf16Multiply how) { bf16_multiply() = how; }

QS_SIMD void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16) {
  if (round_to_bf16 && bf16_dot_products_used()) return simd::run_jobs<Avx512Bf16>(jobs, pool, round_to_bf16);
  simd::run_jobs<Avx512>(jobs, pool, round_to_bf16);
}

}  // namespace qs
