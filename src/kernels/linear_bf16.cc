// Linear layers with bf16 activations on AVX512-BF16: W4A16 as its name says. Every product is bf16 x bf16,
// exact in f32, summed in f32 by vdpbf16ps; int4 weights become bf16(level x scale) by a table lookup, so both
// checkpoint formats of one model give bit-identical results.
//
// One canonical order of operations per (output row, token), whatever the batch: the columns are taken in chunks
// of 64 (groups A and B), each chunk as two dot-product steps, first the even columns of A and B, then the odd
// ones (the order the int4 nibbles come in), into one f32 accumulator, reduced by one fixed tree. A token
// therefore gets the same bits alone, in a decode batch or in a long prefill.
#include "kernels/linear_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/linear.h"
#include "util/parallel.h"

namespace qs {
namespace {

#define QS_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int kChunk = 64;            // columns per step: two int4 groups of 32
// How far ahead a row's weights are requested (into L2), found by measurement with weights far larger than the
// caches: int4 rows 3 KB ahead, bf16 rows (the LM head) 8 rows ahead (15 -> 23 GB/s). The hardware prefetchers
// alone serve several slow streams per core poorly.
constexpr int64_t kPrefetchBytes = 3072, kPrefetchRows = 8;

int64_t chunks_of(int64_t in) { return (in + kChunk - 1) / kChunk; }

// Word k < 16 picks column 2k of group A, word 16 + k column 2k of group B, from (A, B) as 64 words.
QS_BF16 inline __m512i even_columns() {
  return _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,  //
                          30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
}
QS_BF16 inline __m512i odd_columns() { return _mm512_add_epi16(even_columns(), _mm512_set1_epi16(1)); }

// --- activations: f32 rows -> bf16 in chunk order [even A, even B, odd A, odd B], zero past `in` --------------

QS_BF16 void pack_activations(const float* x, int64_t in, int64_t T, uint16_t* packed) {
  const int64_t chunks = chunks_of(in);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * in;
    for (int64_t c = 0; c < chunks; ++c) {
      __m512 v[4];
      for (int q = 0; q < 4; ++q) {
        int64_t col = c * kChunk + q * 16;
        int64_t n = std::clamp<int64_t>(in - col, 0, 16);
        v[q] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), row + std::min(col, in));
      }
      __m512i a = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[1], v[0]));
      __m512i b = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[3], v[2]));
      uint16_t* out = packed + (t * chunks + c) * kChunk;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, even_columns(), b));
      _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(a, odd_columns(), b));
    }
  }
}

// --- weight rows: each gives a chunk as two bf16 vectors (even columns, odd columns) ------------------------

struct Int4Source {
  const std::byte* words;   // the row's packed nibbles: byte k of a group holds columns 2k (low) and 2k + 1
  const std::byte* scales;  // the row's bf16 scales, one per group of 32
  int64_t ahead;            // prefetch distance in nibble bytes (scales: an eighth of it)
  // A full chunk: groups 2c (A) and 2c + 1 (B).
  QS_BF16 inline void load(int64_t c, __m512i& even, __m512i& odd) const {
    _mm_prefetch(reinterpret_cast<const char*>(words + c * 32 + ahead), _MM_HINT_T1);
    if (c % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(scales + c * 4 + ahead / 8), _MM_HINT_T1);
    uint32_t pair;
    __builtin_memcpy(&pair, scales + c * 4, 4);
    decode(pair, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + c * 32)), even, odd);
  }
  // The last chunk of a row whose width is an odd number of groups: group A only, B reads as zeros.
  QS_BF16 inline void load_last(int64_t c, __m512i& even, __m512i& odd) const {
    uint16_t scale;
    __builtin_memcpy(&scale, scales + c * 4, 2);
    decode(scale, _mm256_maskz_loadu_epi8(0xffffu, words + c * 32), even, odd);
  }
  // The table: bf16(level x scale) for A's 16 levels in words 0-15 and B's in 16-31, each product exact in f32,
  // rounded as the bf16 export is. Word k of the indices: byte k's low nibble (even columns) or high nibble (odd
  // columns), plus 16 in B's words to select B's half of the table. (Measured against a bf16 dot-product table
  // and a byte-permute spread: this form is the fastest of the three here.)
  QS_BF16 static inline void decode(uint32_t scale_pair, __m256i bytes, __m512i& even, __m512i& odd) {
    const __m512i s = _mm512_set1_epi32(static_cast<int>(scale_pair));
    const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512 a = _mm512_mul_ps(levels, _mm512_castsi512_ps(_mm512_slli_epi32(s, 16)));
    const __m512 b = _mm512_mul_ps(levels, _mm512_castsi512_ps(_mm512_and_si512(s, _mm512_set1_epi32(~0xffff))));
    const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
    const __m512i w = _mm512_cvtepu8_epi16(bytes);
    const __m512i group_b = _mm512_maskz_set1_epi16(0xffff0000u, 16);
    even = _mm512_permutexvar_epi16(_mm512_ternarylogic_epi32(w, _mm512_set1_epi16(0x0f), group_b, 0xea), table);
    odd = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi16(w, 4), group_b), table);
  }
};

struct Bf16Source {
  const std::byte* values;  // the row's bf16 weights
  int64_t in;
  int64_t ahead;            // prefetch distance in bytes
  QS_BF16 inline void load(int64_t c, __m512i& even, __m512i& odd) const {
    _mm_prefetch(reinterpret_cast<const char*>(values + c * 128 + ahead), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(values + c * 128 + 64 + ahead), _MM_HINT_T1);
    split(_mm512_loadu_si512(values + c * 128), _mm512_loadu_si512(values + c * 128 + 64), even, odd);
  }
  QS_BF16 inline void load_last(int64_t c, __m512i& even, __m512i& odd) const {  // 1 to 63 columns left
    auto part = [&](int64_t from) QS_BF16 {
      const int64_t n = std::clamp<int64_t>(in - from, 0, 32);
      return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << n) - 1), values + std::min(from, in) * 2);
    };
    split(part(c * kChunk), part(c * kChunk + 32), even, odd);
  }
  QS_BF16 static inline void split(__m512i a, __m512i b, __m512i& even, __m512i& odd) {
    even = _mm512_permutex2var_epi16(a, even_columns(), b);
    odd = _mm512_permutex2var_epi16(a, odd_columns(), b);
  }
};

struct DecodedSource {  // a row already decoded into chunk order, as a source writes it
  const uint16_t* row;
  QS_BF16 inline void load(int64_t c, __m512i& even, __m512i& odd) const {
    even = _mm512_loadu_si512(row + c * kChunk);
    odd = _mm512_loadu_si512(row + c * kChunk + 32);
  }
  QS_BF16 inline void load_last(int64_t c, __m512i& even, __m512i& odd) const { load(c, even, odd); }
};

// --- the tile: R rows x C tokens, each (row, token) summed in the canonical order ------------------------------

template <int R, int C>
QS_BF16 inline void accumulate(__m512 (&acc)[R][C], const __m512i (&even)[R], const __m512i (&odd)[R],
                               const uint16_t* x, int64_t chunks, int64_t c) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < C; ++t) {
      const uint16_t* xc = x + (t * chunks + c) * kChunk;
      acc[r][t] = _mm512_dpbf16_ps(acc[r][t], reinterpret_cast<__m512bh>(even[r]),
                                   reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc)));
      acc[r][t] = _mm512_dpbf16_ps(acc[r][t], reinterpret_cast<__m512bh>(odd[r]),
                                   reinterpret_cast<__m512bh>(_mm512_loadu_si512(xc + 32)));
    }
}

template <int R, int C, typename Source>
QS_BF16 void tile(const Source* rows, const uint16_t* x, int64_t in, float* y, int64_t out) {
  const int64_t chunks = chunks_of(in), full = in / kChunk;
  __m512 acc[R][C];
  __m512i even[R], odd[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < C; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < full; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) rows[r].load(c, even[r], odd[r]);
    accumulate(acc, even, odd, x, chunks, c);
  }
  if (full < chunks) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) rows[r].load_last(full, even[r], odd[r]);
    accumulate(acc, even, odd, x, chunks, full);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < C; ++t) y[t * out + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R, typename Source>
QS_BF16 void tile_tokens(const Source* rows, const uint16_t* x, int64_t in, int64_t T, float* y, int64_t out) {
  const int64_t chunks = chunks_of(in);
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) tile<R, 4>(rows, x + t * chunks * kChunk, in, y + t * out, out);
  const uint16_t* xt = x + t * chunks * kChunk;
  float* yt = y + t * out;
  switch (T - t) {
    case 3: tile<R, 3>(rows, xt, in, yt, out); break;
    case 2: tile<R, 2>(rows, xt, in, yt, out); break;
    case 1: tile<R, 1>(rows, xt, in, yt, out); break;
    default: break;
  }
}

template <typename Source>
QS_BF16 void tile_rows(const Source* rows, int64_t R, const uint16_t* x, int64_t in, int64_t T, float* y,
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
QS_BF16 void decode_row(const Source& source, int64_t in, uint16_t* row) {
  const int64_t chunks = chunks_of(in);
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i even, odd;
    if ((c + 1) * kChunk <= in) source.load(c, even, odd);
    else source.load_last(c, even, odd);
    _mm512_storeu_si512(row + c * kChunk, even);
    _mm512_storeu_si512(row + c * kChunk + 32, odd);
  }
}

constexpr int kRows = 4;             // rows per tile
constexpr int64_t kFewTokens = 4;    // up to this many tokens, weights are decoded in registers per tile
// Beyond, rows are decoded once per block of tokens whose activations stay in L2 (2 MB a core here).
constexpr int64_t kTokenBlockBytes = 768 << 10;

Int4Source int4_row(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in / 2, w.scales + uint64_t(o) * (w.in / 32) * 2, kPrefetchBytes};
}
Bf16Source bf16_row(const LinearWeight& w, int64_t o) {
  return {w.values + uint64_t(o) * w.in * 2, w.in, std::max<int64_t>(kPrefetchBytes, kPrefetchRows * w.in * 2)};
}

template <typename Source, typename MakeSource>
QS_BF16 void rows_range(const LinearWeight& w, MakeSource make, const uint16_t* x, int64_t T, float* y, int64_t r0,
                        int64_t r1) {
  const int64_t chunks = chunks_of(w.in);
  if (T <= kFewTokens) {
    for (int64_t o = r0; o < r1; o += kRows) {
      const int64_t R = std::min<int64_t>(kRows, r1 - o);
      Source rows[kRows];
      for (int64_t r = 0; r < R; ++r) rows[r] = make(w, o + r);
      tile_rows(rows, R, x, w.in, T, y + o, w.out);
    }
    return;
  }
  thread_local std::vector<uint16_t> decoded;
  decoded.resize(kRows * chunks * kChunk);
  const int64_t block = std::clamp<int64_t>(kTokenBlockBytes / (chunks * kChunk * 2), 16, 256);
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    for (int64_t o = r0; o < r1; o += kRows) {
      const int64_t R = std::min<int64_t>(kRows, r1 - o);
      DecodedSource rows[kRows];
      for (int64_t r = 0; r < R; ++r) {
        rows[r].row = decoded.data() + r * chunks * kChunk;
        decode_row(make(w, o + r), w.in, decoded.data() + r * chunks * kChunk);
      }
      tile_rows(rows, R, x + t0 * chunks * kChunk, w.in, n, y + t0 * w.out + o, w.out);
    }
  }
}

}  // namespace

bool bf16_linear_supported(const LinearWeight& w) {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return cpu && (w.kind == WeightKind::BF16 || (w.group == 32 && w.in % 32 == 0));
}

void linear_forward_bf16(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool) {
  thread_local std::vector<uint16_t> packed;
  packed.resize(T * chunks_of(w.in) * kChunk);
  pack_activations(x, w.in, T, packed.data());
  const uint16_t* xp = packed.data();
  pool.parallel_for(w.out, 16, [&](size_t r0, size_t r1) {
    if (w.kind == WeightKind::Int4)
      rows_range<Int4Source>(w, int4_row, xp, T, y, r0, r1);
    else
      rows_range<Bf16Source>(w, bf16_row, xp, T, y, r0, r1);
  });
}

}  // namespace qs
