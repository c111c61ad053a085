#include "kernels/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "formats/dtype.h"
#include "kernels/linear_bf16.h"
#include "kernels/ops.h"
#include "quant/w4a16.h"
#include "util/parallel.h"

namespace qs {
namespace {

// --- portable path: a row dequantised to f32, then dots ------------------------------------------------------

void linear_portable(const LinearWeight& w, const float* x, int64_t T, float* y, size_t r0, size_t r1) {
  std::vector<float> row(w.in);
  for (size_t o = r0; o < r1; ++o) {
    w.dequantize_row(o, row.data());
    for (int64_t t = 0; t < T; ++t) y[t * w.out + o] = dot(x + t * w.in, row.data(), w.in);
  }
}

// --- AVX-512 path: weights decoded into registers, fused with the dot products ------------------------------

#define QS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// One int4 group of 32 columns as two f32 vectors: bf16(level x scale) looked up by nibble with one permute per
// 16 weights, exactly the values the bf16 export stores.
struct Int4Row {
  const std::byte* words;   // the row's packed words
  const std::byte* scales;  // the row's bf16 scales
  QS_AVX512 inline void load(int64_t g, __m512& w0, __m512& w1) const {
    const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    float s = bf16_to_f32(load_unaligned<uint16_t>(scales + g * 2));
    __m512i p = _mm512_castps_si512(_mm512_mul_ps(levels, _mm512_set1_ps(s)));  // exact in f32
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(p, 16), _mm512_set1_epi32(1));
    __m512 lut = _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(p, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)),
                                                      _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    // Byte k of the group holds column 2k in its low nibble and 2k + 1 in its high nibble.
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words + g * 16));
    __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    w0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut);
    w1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), lut);
  }
};

struct Bf16Row {
  const std::byte* values;
  QS_AVX512 inline void load(int64_t g, __m512& w0, __m512& w1) const {
    auto widen = [](const std::byte* p) QS_AVX512 {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    };
    w0 = widen(values + g * 64);
    w1 = widen(values + g * 64 + 32);
  }
};

// y[t, o] for one row o and N tokens: each group of weights is decoded once and used for all N. The same loop
// serves bf16 and int4 rows, so both formats of one model give bit-identical results.
template <int N, typename Row>
QS_AVX512 inline void tokens_avx512(const Row& row, int64_t groups, const float* x, int64_t in, float* y,
                                    int64_t out) {
  __m512 acc0[N], acc1[N];
  for (int t = 0; t < N; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 w0, w1;
    row.load(g, w0, w1);
    for (int t = 0; t < N; ++t) {
      acc0[t] = _mm512_fmadd_ps(_mm512_loadu_ps(x + t * in + g * 32), w0, acc0[t]);
      acc1[t] = _mm512_fmadd_ps(_mm512_loadu_ps(x + t * in + g * 32 + 16), w1, acc1[t]);
    }
  }
  for (int t = 0; t < N; ++t) y[t * out] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}

template <typename Row>
QS_AVX512 void row_avx512(const Row& row, int64_t groups, const float* x, int64_t in, int64_t T, float* y,
                          int64_t out, int64_t o) {
  int64_t t = 0;
  for (; t + 4 <= T; t += 4) tokens_avx512<4>(row, groups, x + t * in, in, y + t * out + o, out);
  for (; t < T; ++t) tokens_avx512<1>(row, groups, x + t * in, in, y + t * out + o, out);
}

QS_AVX512 void linear_avx512(const LinearWeight& w, const float* x, int64_t T, float* y, size_t r0, size_t r1) {
  const int64_t groups = w.in / 32;
  for (size_t o = r0; o < r1; ++o) {
    if (w.kind == WeightKind::BF16)
      row_avx512(Bf16Row{w.values + uint64_t(o) * w.in * 2}, groups, x, w.in, T, y, w.out, o);
    else
      row_avx512(Int4Row{w.values + uint64_t(o) * w.in / 2, w.scales + uint64_t(o) * groups * 2}, groups, x, w.in, T,
                 y, w.out, o);
  }
}

const bool kHasAvx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");

}  // namespace

uint64_t LinearWeight::bytes() const {
  return kind == WeightKind::BF16 ? uint64_t(out) * in * 2 : uint64_t(out) * in / 2 + uint64_t(out) * (in / group) * 2;
}

void LinearWeight::dequantize_row(int64_t row, float* out_row) const {
  if (kind == WeightKind::BF16) {
    const std::byte* p = values + uint64_t(row) * in * 2;
    for (int64_t c = 0; c < in; ++c) out_row[c] = bf16_to_f32(load_unaligned<uint16_t>(p + c * 2));
    return;
  }
  const std::byte* words = values + uint64_t(row) * (in / kLevelsPerWord) * 4;
  const std::byte* sc = scales + uint64_t(row) * (in / group) * 2;
  for (int64_t g = 0; g < in / group; ++g) {
    float s = bf16_to_f32(load_unaligned<uint16_t>(sc + g * 2));
    for (int64_t j = 0; j < group / kLevelsPerWord; ++j) {
      uint32_t w = load_unaligned<uint32_t>(words + (g * group / kLevelsPerWord + j) * 4);
      for (int i = 0; i < kLevelsPerWord; ++i)
        out_row[g * group + j * kLevelsPerWord + i] = round_to_bf16(unpack_level(w, i) * s);
    }
  }
}

LinearWeight LinearWeight::rows(int64_t first, int64_t count) const {
  LinearWeight w = *this;
  w.out = count;
  if (kind == WeightKind::BF16) {
    w.values = values + uint64_t(first) * in * 2;
  } else {
    w.values = values + uint64_t(first) * (in / kLevelsPerWord) * 4;
    w.scales = scales + uint64_t(first) * (in / group) * 2;
  }
  return w;
}

void linear_forward(const LinearWeight& w, const float* x, int64_t T, float* y, ThreadPool& pool,
                    Activations activations) {
  if (activations == Activations::BF16 && bf16_linear_supported(w)) return linear_forward_bf16(w, x, T, y, pool);
  const bool fast = kHasAvx512 && w.in % 32 == 0 && (w.kind == WeightKind::BF16 || w.group == 32);
  pool.parallel_for(w.out, 16, [&](size_t r0, size_t r1) {
    if (fast) linear_avx512(w, x, T, y, r0, r1);
    else linear_portable(w, x, T, y, r0, r1);
  });
}

}  // namespace qs
