#include "kernels/linear.h"

#include <algorithm>
#include <vector>

#include "formats/dtype.h"
#include "kernels/linear_avx512.h"
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
  if (avx512_linear_supported(w)) return linear_forward_avx512(w, x, T, y, pool, activations == Activations::BF16);
  std::vector<float> rounded;
  if (activations == Activations::BF16) {
    rounded.assign(x, x + T * w.in);
    round_to_bf16(rounded);
    x = rounded.data();
  }
  pool.parallel_for(w.out, 16, [&](size_t r0, size_t r1) { linear_portable(w, x, T, y, r0, r1); });
}

}  // namespace qs
