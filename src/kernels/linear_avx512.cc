// Linear layers on AVX-512: weights decoded to f32 in registers and multiplied by f32 FMA. On this CPU
// (Emerald Rapids) vfmadd231ps issues twice a cycle while vdpbf16ps takes about two cycles of both vector ports,
// so f32 FMA does 2.2x the multiply-adds of bf16 dot products; bf16 x bf16 products are exact in f32 either way.
//
// int4 weights become f32(bf16(level x scale)), the value the bf16 QAT export stores, by one permute from a table
// of all 16 levels for the group's scale, looked up by the scale's bit pattern (a load, no arithmetic), so the
// int4 and bf16 forms of one model give bit-identical results.
//
// Work goes by tiles of four rows (linear.h's Int4Layout::Tiles keeps a tile's rows in one stream), each tile over
// up to four tokens with weights decoded in registers, or decoded once into L1 for larger batches.
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

constexpr int kRows = kTileRows;     // rows per tile
constexpr int64_t kFewTokens = 4;    // up to this many tokens, weights are decoded in registers per tile
// Beyond, rows are decoded once per block of tokens whose activations stay in L2 (2 MB a core here).
constexpr int64_t kTokenBlockBytes = 768 << 10;

int64_t prefetch_distance(int64_t row_bytes) { return std::max(kMinPrefetchBytes, kPrefetchTiles * kRows * row_bytes); }

QS_AVX512 QS_INLINE void prefetch(const std::byte* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

// --- weight tiles: R consecutive rows, each group of each row as two f32 vectors (even columns, odd columns) ----

// int4 rows in either layout: group g of row r at nibbles + r * row_step + g * kGroupStep, its scale likewise.
// Rows: a row's 16-byte groups follow each other; Tiles: a group's four rows share one 64-byte line.
template <Int4Layout L>
struct Int4Tile {
  static constexpr bool kTiles = L == Int4Layout::Tiles;
  static constexpr int64_t kGroupStep = kTiles ? 16 * kTileRows : 16, kScaleGroupStep = kGroupStep / 8;
  const std::byte* nibbles;  // byte k of a group holds column 2k (low nibble) and 2k + 1 (high)
  const std::byte* scales;   // bf16
  const float* table;        // level_table()
  int64_t row_step, scale_row_step;
  int64_t ahead;  // prefetch distance in nibble bytes (scales: an eighth of it)

  QS_AVX512 static QS_INLINE void decode(const std::byte* group, const std::byte* scale_bits, const float* table,
                                         __m512& even, __m512& odd) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    uint16_t scale;
    std::memcpy(&scale, scale_bits, 2);
    const __m512 levels = _mm512_load_ps(table + uint32_t(scale) * 16);
    even = _mm512_permutexvar_ps(bytes, levels);  // the permute reads only the index's low 4 bits
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), levels);
  }
  template <int R>
  QS_AVX512 QS_INLINE void load(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const {
    const std::byte *n = nibbles + g * kGroupStep, *s = scales + g * kScaleGroupStep;
    if constexpr (kTiles) {
      prefetch(n + ahead);
      if (g % 8 == 0) prefetch(s + ahead / 8);
    } else {
      for (int r = 0; r < R; ++r) {
        if (g % 4 == 0) prefetch(n + r * row_step + ahead);
        if (g % 32 == 0) prefetch(s + r * scale_row_step + ahead / 8);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) decode(n + r * row_step, s + r * scale_row_step, table, even[r], odd[r]);
  }
  template <int R>
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const { load<R>(g, even, odd); }
};

struct Bf16Tile {
  const std::byte* values;  // the first row's bf16 weights
  int64_t row_step, in;
  int64_t ahead;  // prefetch distance in bytes
  // A bf16 pair (2k, 2k + 1) is one 32-bit lane: the even column is its low half, the odd column its high half.
  QS_AVX512 static QS_INLINE void split(__m512i pairs, __m512& even, __m512& odd) {
    even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  template <int R>
  QS_AVX512 QS_INLINE void load(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const std::byte* p = values + r * row_step + g * 64;
      prefetch(p + ahead);
      split(_mm512_loadu_si512(p), even[r], odd[r]);
    }
  }
  template <int R>  // 1 to 31 columns left
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const {
    const auto mask = static_cast<__mmask32>((1ull << (in - g * kGroup)) - 1);
    for (int r = 0; r < R; ++r) split(_mm512_maskz_loadu_epi16(mask, values + r * row_step + g * 64), even[r], odd[r]);
  }
};

struct DecodedTile {  // rows already decoded as a tile gives them: per group 16 even then 16 odd floats
  const float* rows;
  int64_t row_step;
  template <int R>
  QS_AVX512 QS_INLINE void load(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      even[r] = _mm512_loadu_ps(rows + r * row_step + g * kGroup);
      odd[r] = _mm512_loadu_ps(rows + r * row_step + g * kGroup + 16);
    }
  }
  template <int R>
  QS_AVX512 QS_INLINE void load_last(int64_t g, __m512 (&even)[R], __m512 (&odd)[R]) const { load<R>(g, even, odd); }
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

template <int R, int C, typename Tile>
QS_AVX512 void tile(const Tile& w, const float* x, int64_t in, float* y, int64_t out) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  __m512 acc[R][C], even[R], odd[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < full; ++g) {
    w.template load<R>(g, even, odd);
    accumulate(acc, even, odd, x, groups, g);
  }
  if (full < groups) {
    w.template load_last<R>(full, even, odd);
    accumulate(acc, even, odd, x, groups, full);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < C; ++t) y[t * out + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R, typename Tile>
QS_AVX512 void tile_tokens(const Tile& w, const float* x, int64_t in, int64_t T, float* y, int64_t out) {
  const int64_t stride = groups_of(in) * kGroup;
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) tile<R, 4>(w, x + t * stride, in, y + t * out, out);
  const float* xt = x + t * stride;
  float* yt = y + t * out;
  switch (T - t) {
    case 3: tile<R, 3>(w, xt, in, yt, out); break;
    case 2: tile<R, 2>(w, xt, in, yt, out); break;
    case 1: tile<R, 1>(w, xt, in, yt, out); break;
    default: break;
  }
}

// The R rows of a tile decoded into `rows` (row_step floats apart), for tiles over many tokens.
template <int R, typename Tile>
QS_AVX512 void decode_tile(const Tile& w, int64_t in, float* rows, int64_t row_step) {
  const int64_t groups = groups_of(in), full = in / kGroup;
  __m512 even[R], odd[R];
  for (int64_t g = 0; g < groups; ++g) {
    if (g < full) w.template load<R>(g, even, odd);
    else w.template load_last<R>(g, even, odd);
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(rows + r * row_step + g * kGroup, even[r]);
      _mm512_storeu_ps(rows + r * row_step + g * kGroup + 16, odd[r]);
    }
  }
}

// One tile of R rows over `n` tokens: decoded in registers for a few tokens, else once into `decoded`.
template <int R, typename Tile>
QS_AVX512 void tile_over_tokens(const Tile& w, const float* x, int64_t in, int64_t n, float* y, int64_t out,
                                float* decoded) {
  if (n <= kFewTokens) return tile_tokens<R>(w, x, in, n, y, out);

  const int64_t stride = groups_of(in) * kGroup;
  decode_tile<R>(w, in, decoded, stride);
  tile_tokens<R>(DecodedTile{decoded, stride}, x, in, n, y, out);
}

// Rows [r0, r1) for all T tokens. Many tokens go in blocks whose activations stay in L2 while every tile of the
// range passes (each tile decoded again per block: cheap beside the block's products).
template <typename MakeTile>
QS_AVX512 void rows_range(const LinearWeight& w, MakeTile make, const float* x, int64_t T, float* y, int64_t r0,
                          int64_t r1) {
  const int64_t stride = groups_of(w.in) * kGroup;
  thread_local std::vector<float> buffer;
  float* decoded = T > kFewTokens ? line_aligned(buffer, kRows * stride) : nullptr;
  const int64_t block = T <= kFewTokens ? T : std::clamp<int64_t>(kTokenBlockBytes / (stride * 4), 16, 256);
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    const float* xb = x + t0 * stride;
    float* yb = y + t0 * w.out;
    for (int64_t o = r0; o < r1; o += kRows) {
      const auto rows = make(w, o);
      switch (std::min<int64_t>(kRows, r1 - o)) {
        case 4: tile_over_tokens<4>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 3: tile_over_tokens<3>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 2: tile_over_tokens<2>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        case 1: tile_over_tokens<1>(rows, xb, w.in, n, yb + o, w.out, decoded); break;
        default: break;
      }
    }
  }
}

template <Int4Layout L>
Int4Tile<L> int4_tile(const LinearWeight& w, int64_t o) {
  const bool tiles = L == Int4Layout::Tiles;
  return {w.values + w.nibble_offset(o, 0), w.scales + w.scale_offset(o, 0), level_table(),
          tiles ? 16 : w.in / 2, tiles ? 2 : w.in / kGroup * 2, prefetch_distance(w.in / 2)};
}
Bf16Tile bf16_tile(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in * 2, w.in * 2, w.in, prefetch_distance(w.in * 2)};
}

void weight_rows(const LinearWeight& w, const float* x, int64_t T, float* y, int64_t r0, int64_t r1) {
  if (w.kind == WeightKind::BF16) rows_range(w, bf16_tile, x, T, y, r0, r1);
  else if (w.layout == Int4Layout::Tiles) rows_range(w, int4_tile<Int4Layout::Tiles>, x, T, y, r0, r1);
  else rows_range(w, int4_tile<Int4Layout::Rows>, x, T, y, r0, r1);
}

}  // namespace

bool avx512_linear_supported(const LinearWeight& w) {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return cpu && (w.kind == WeightKind::BF16 || (w.group == kGroup && w.in % kGroup == 0));
}

void linear_forward_avx512(std::span<const LinearJob> jobs, ThreadPool& pool, bool round_to_bf16) {
  // Every job's activations packed once into one buffer; jobs with the same input share its packing.
  std::vector<int64_t> offset(jobs.size());
  std::vector<size_t> fresh;  // the jobs whose input is packed
  int64_t floats = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const LinearJob& j = jobs[k];
    auto same = std::find_if(fresh.begin(), fresh.end(), [&](size_t f) {
      return jobs[f].x == j.x && jobs[f].T == j.T && jobs[f].w->in == j.w->in;
    });
    if (same != fresh.end()) {
      offset[k] = offset[*same];
      continue;
    }
    fresh.push_back(k);
    offset[k] = floats;
    floats += j.T * groups_of(j.w->in) * kGroup;
  }
  thread_local std::vector<float> buffer;
  float* packed = line_aligned(buffer, floats);
  for (size_t k : fresh) pack_activations(jobs[k].x, jobs[k].w->in, jobs[k].T, round_to_bf16, packed + offset[k]);
  // Work is split at tiles of four rows, so that a tiled weight's tiles stay whole.
  int64_t tiles = 0;
  for (const LinearJob& j : jobs) tiles += (j.w->out + kRows - 1) / kRows;
  pool.parallel_for(tiles, 4, [&](size_t t0, size_t t1) {
    int64_t first = 0;  // the current matrix's first tile, among the tiles of all
    for (size_t k = 0; k < jobs.size(); ++k) {
      const LinearWeight& w = *jobs[k].w;
      const int64_t n = (w.out + kRows - 1) / kRows;
      const int64_t a = std::max<int64_t>(t0, first) - first, b = std::min<int64_t>(t1, first + n) - first;
      first += n;
      if (a < b) weight_rows(w, packed + offset[k], jobs[k].T, jobs[k].y, a * kRows, std::min(b * kRows, w.out));
    }
  });
}

}  // namespace qs
