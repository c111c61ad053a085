// Linear layers on AVX-512: weights decoded to f32 in registers and multiplied by f32 FMA. On this CPU
// (Emerald Rapids) vfmadd231ps issues twice a cycle while vdpbf16ps takes about two cycles of both vector ports,
// so f32 FMA does 2.2x the multiply-adds of bf16 dot products; bf16 x bf16 products are exact in f32 either way.
//
// int4 weights become f32(bf16(level x scale)), the value the bf16 QAT export stores, by one permute from a table
// of all 16 levels for the group's scale, looked up by the scale's bit pattern (a load, no arithmetic), so the
// int4 and bf16 forms of one model give bit-identical results.
//
// One canonical order of operations per (output row, token), whatever the batch: group after group of 32 columns,
// first the 16 even columns of the group, then the 16 odd ones (the order the int4 nibbles come in), each lane of
// one f32 accumulator taking a column pair (2k, 2k + 1), reduced by one fixed tree at the end. A token therefore
// gets the same bits alone, in a decode batch or in a long prefill.
#include "kernels/linear_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "formats/dtype.h"
#include "kernels/linear.h"
#include "util/parallel.h"

namespace qs {
namespace {

#define QS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define QS_INLINE __attribute__((always_inline)) inline
#define QS_INLINE __attribute__((always_inline)) inline

constexpr int64_t kGroup = 32;  // columns per step: an int4 group, as 16 even and 16 odd columns
// How far ahead a row's weights are requested (into L2): the same place in the rows of the tile after next, at
// least 6 KB ahead (measured with weights far larger than the caches; a tile reads its rows side by side, so less
// than a tile ahead only requests what is being read). The hardware prefetchers alone serve several slow streams
// per core poorly.
constexpr int64_t kPrefetchTiles = 2, kMinPrefetchBytes = 6144;

int64_t groups_of(int64_t in) { return (in + kGroup - 1) / kGroup; }

// A thread's work buffer of n floats on a cache-line boundary, so that no vector load of it splits a line.
float* line_aligned(std::vector<float>& buffer, int64_t n) {
  buffer.resize(n + 16);
  auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - address % 64) % 64) / sizeof(float);
}

// f32(bf16(level x scale)) for every bf16 bit pattern of a scale and every stored nibble n (level n - 8): 16
// floats, one cache line, per scale. A model's scales take a few thousand distinct values, so the lines in use
// stay in L1/L2.
const float* level_table() {
  static const float* table = [] {
    auto* t = static_cast<float*>(std::aligned_alloc(64, 65536 * 16 * sizeof(float)));
    for (uint32_t s = 0; s < 65536; ++s) {
      const float scale = bf16_to_f32(static_cast<uint16_t>(s));
      for (int n = 0; n < 16; ++n) t[s * 16 + n] = round_to_bf16(static_cast<float>(n - 8) * scale);
    }
    return t;
  }();
  return table;
}

// --- activations: f32 rows -> per group [16 even columns, 16 odd columns], zero past `in` ---------------------

QS_AVX512 QS_INLINE __m512 bf16_rounded(__m512 v) {  // round to nearest even, as f32_to_bf16; NaN stays NaN
  const __m512i u = _mm512_castps_si512(v), high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), high);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, high), _mm512_set1_epi32(0x00400000)));
  return _mm512_castsi512_ps(r);
}

QS_AVX512 void pack_activations(const float* x, int64_t in, int64_t T, bool round_bf16, float* packed) {
  const int64_t groups = groups_of(in);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * in;
    for (int64_t g = 0; g < groups; ++g) {
      __m512 half[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t col = g * kGroup + h * 16, n = std::clamp<int64_t>(in - col, 0, 16);
        half[h] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), row + std::min(col, in));
        if (round_bf16) half[h] = bf16_rounded(half[h]);
      }
      float* out = packed + (t * groups + g) * kGroup;
      _mm512_storeu_ps(out, _mm512_permutex2var_ps(half[0], even, half[1]));
      _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(half[0], odd, half[1]));
    }
  }
}

// --- weight rows: each gives a group as two f32 vectors (even columns, odd columns) ---------------------------

struct Int4Source {
  const std::byte* nibbles;  // the row's packed levels: byte k of a group holds column 2k (low) and 2k + 1 (high)
  const std::byte* scales;   // the row's bf16 scales, one per group
  const float* table;        // level_table()
  int64_t ahead;             // prefetch distance in nibble bytes (scales: an eighth of it)
  QS_AVX512 QS_INLINE void load(int64_t g, __m512& even, __m512& odd) const {
    if (g % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(nibbles + g * 16 + ahead), _MM_HINT_T1);
    if (g % 32 == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + g * 2 + ahead / 8), _MM_HINT_T1);
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles + g * 16)));
    uint16_t scale;
    std::memcpy(&scale, scales + g * 2, 2);
    const __m512 levels = _mm512_load_ps(table + uint32_t(scale) * 16);
    even = _mm512_permutexvar_ps(bytes, levels);  // the permute reads only the index's low 4 bits
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), levels);
  }
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512& even, __m512& odd) const { load(g, even, odd); }
};

struct Bf16Source {
  const std::byte* values;  // the row's bf16 weights
  int64_t in;
  int64_t ahead;            // prefetch distance in bytes
  // A bf16 pair (2k, 2k + 1) is one 32-bit lane: the even column is its low half, the odd column its high half.
  QS_AVX512 static QS_INLINE void split(__m512i pairs, __m512& even, __m512& odd) {
    even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  QS_AVX512 QS_INLINE void load(int64_t g, __m512& even, __m512& odd) const {
    _mm_prefetch(reinterpret_cast<const char*>(values + g * 64 + ahead), _MM_HINT_T1);
    split(_mm512_loadu_si512(values + g * 64), even, odd);
  }
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512& even, __m512& odd) const {  // 1 to 31 columns left
    const int64_t n = in - g * kGroup;
    split(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << n) - 1), values + g * 64), even, odd);
  }
};

struct DecodedSource {  // a row already decoded, as a source gives it: per group 16 even then 16 odd floats
  const float* row;
  QS_AVX512 QS_INLINE void load(int64_t g, __m512& even, __m512& odd) const {
    even = _mm512_loadu_ps(row + g * kGroup);
    odd = _mm512_loadu_ps(row + g * kGroup + 16);
  }
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512& even, __m512& odd) const { load(g, even, odd); }
};

// --- the tile: R rows x C tokens, each (row, token) summed in the canonical order ------------------------------

template <int R, int C>
QS_AVX512 QS_INLINE void accumulate(__m512 (&acc)[R][C], const __m512 (&even)[R], const __m512 (&odd)[R],
                                 const float* x, int64_t groups, int64_t g) {
#pragma GCC unroll 8
  for (int t = 0; t < C; ++t) {
    const float* xg = x + (t * groups + g) * kGroup;
    const __m512 xe = _mm512_loadu_ps(xg), xo = _mm512_loadu_ps(xg + 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(odd[r], xo, _mm512_fmadd_ps(even[r], xe, acc[r][t]));
  }
}

template <int R, int C, typename Source>
QS_AVX512 void tile(const Source* rows, const float* x, int64_t in, float* y, int64_t out) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  __m512 acc[R][C], even[R], odd[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < full; ++g) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) rows[r].load(g, even[r], odd[r]);
    accumulate(acc, even, odd, x, groups, g);
  }
  if (full < groups) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) rows[r].load_last(full, even[r], odd[r]);
    accumulate(acc, even, odd, x, groups, full);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) y[t * out + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R, typename Source>
QS_AVX512 void tile_tokens(const Source* rows, const float* x, int64_t in, int64_t T, float* y, int64_t out) {
  const int64_t stride = groups_of(in) * kGroup;
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) tile<R, 4>(rows, x + t * stride, in, y + t * out, out);
  const float* xt = x + t * stride;
  float* yt = y + t * out;
  switch (T - t) {
    case 3: tile<R, 3>(rows, xt, in, yt, out); break;
    case 2: tile<R, 2>(rows, xt, in, yt, out); break;
    case 1: tile<R, 1>(rows, xt, in, yt, out); break;
    default: break;
  }
}

template <typename Source>
QS_AVX512 void tile_rows(const Source* rows, int64_t R, const float* x, int64_t in, int64_t T, float* y,
                         int64_t out) {
  switch (R) {
    case 4: tile_tokens<4>(rows, x, in, T, y, out); break;
    case 3: tile_tokens<3>(rows, x, in, T, y, out); break;
    case 2: tile_tokens<2>(rows, x, in, T, y, out); break;
    case 1: tile_tokens<1>(rows, x, in, T, y, out); break;
    default: break;
  }
}

template <typename Source>
QS_AVX512 void decode_row(const Source& source, int64_t in, float* row) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 even, odd;
    if (g < full) source.load(g, even, odd);
    else source.load_last(g, even, odd);
    _mm512_storeu_ps(row + g * kGroup, even);
    _mm512_storeu_ps(row + g * kGroup + 16, odd);
  }
}

constexpr int kRows = 4;             // rows per tile
constexpr int64_t kFewTokens = 4;    // up to this many tokens, weights are decoded in registers per tile
// Beyond, rows are decoded once per block of tokens whose activations stay in L2 (2 MB a core here).
constexpr int64_t kTokenBlockBytes = 768 << 10;

int64_t prefetch_distance(int64_t row_bytes) {
  return std::max(kMinPrefetchBytes, kPrefetchTiles * kRows * row_bytes);
}
Int4Source int4_row(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in / 2, w.scales + uint64_t(o) * (w.in / kGroup) * 2, level_table(),
          prefetch_distance(w.in / 2)};
}
Bf16Source bf16_row(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in * 2, w.in, prefetch_distance(w.in * 2)};
}

template <typename Source, typename MakeSource>
QS_AVX512 void rows_range(const LinearWeight& w, MakeSource make, const float* x, int64_t T, float* y, int64_t r0,
                          int64_t r1) {
  const int64_t stride = groups_of(w.in) * kGroup;
  if (T <= kFewTokens) {
    for (int64_t o = r0; o < r1; o += kRows) {
      const int64_t R = std::min<int64_t>(kRows, r1 - o);
      Source rows[kRows];
      for (int64_t r = 0; r < R; ++r) rows[r] = make(w, o + r);
      tile_rows(rows, R, x, w.in, T, y + o, w.out);
    }
    return;
  }
  thread_local std::vector<float> buffer;
  float* decoded = line_aligned(buffer, kRows * stride);
  const int64_t block = std::clamp<int64_t>(kTokenBlockBytes / (stride * 4), 16, 256);
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    for (int64_t o = r0; o < r1; o += kRows) {
      const int64_t R = std::min<int64_t>(kRows, r1 - o);
      DecodedSource rows[kRows];
      for (int64_t r = 0; r < R; ++r) {
        rows[r].row = decoded + r * stride;
        decode_row(make(w, o + r), w.in, decoded + r * stride);
      }
      tile_rows(rows, R, x + t0 * stride, w.in, n, y + t0 * w.out + o, w.out);
    }
  }
}

}  // namespace

bool avx512_linear_supported(const LinearWeight& w) {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return cpu && (w.kind == WeightKind::BF16 || (w.group == kGroup && w.in % kGroup == 0));
}

void linear_forward_avx512(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool,
                           bool round_to_bf16) {
  thread_local std::vector<float> buffer;
  float* xp = line_aligned(buffer, T * groups_of(w.in) * kGroup);
  pack_activations(x, w.in, T, round_to_bf16, xp);
  pool.parallel_for(w.out, 16, [&](size_t r0, size_t r1) {
    if (w.kind == WeightKind::Int4)
      rows_range<Int4Source>(w, int4_row, xp, T, y, r0, r1);
    else
      rows_range<Bf16Source>(w, bf16_row, xp, T, y, r0, r1);
  });
}

}  // namespace qs
