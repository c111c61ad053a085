#include "quant/w4a16.h"

#include <atomic>
#include <cassert>

#include "formats/dtype.h"
#include "quant/qat_grid.h"
#include "util/parallel.h"

namespace qs {

void pack_int4(std::span<const int8_t> levels, std::span<uint32_t> words) {
  assert(levels.size() == words.size() * kLevelsPerWord);
  for (size_t j = 0; j < words.size(); ++j) {
    uint32_t w = 0;
    for (int i = 0; i < kLevelsPerWord; ++i)
      w |= (static_cast<uint32_t>(levels[j * kLevelsPerWord + i] + 8) & 0xFu) << (4 * i);
    words[j] = w;
  }
}

void unpack_int4(std::span<const uint32_t> words, std::span<int8_t> levels) {
  assert(levels.size() == words.size() * kLevelsPerWord);
  for (size_t j = 0; j < words.size(); ++j)
    for (int i = 0; i < kLevelsPerWord; ++i) levels[j * kLevelsPerWord + i] = unpack_level(words[j], i);
}

namespace {

// One row's groups: false at the first group without an exact grid.
bool pack_row_lossless(const std::byte* row, int64_t cols, uint32_t* words, uint16_t* scales) {
  float values[kQatGroupSize];
  int8_t levels[kQatGroupSize];
  for (int64_t g = 0; g < cols / kQatGroupSize; ++g) {
    for (int i = 0; i < kQatGroupSize; ++i)
      values[i] = bf16_to_f32(load_unaligned<uint16_t>(row + (g * kQatGroupSize + i) * 2));
    const GroupFit fit = fit_qat_group(values, levels);
    if (!fit.on_grid) return false;
    const float scale = bf16_to_f32(fit.scale_bf16);
    for (int i = 0; i < kQatGroupSize; ++i)
      if (round_to_bf16(levels[i] * scale) != values[i]) return false;
    scales[g] = fit.scale_bf16;
    pack_int4(levels, {words + g * kQatGroupSize / kLevelsPerWord, kQatGroupSize / kLevelsPerWord});
  }
  return true;
}

}  // namespace

std::optional<PackedInt4> pack_int4_lossless(const std::byte* bf16, int64_t rows, int64_t cols, ThreadPool& pool) {
  if (cols % kQatGroupSize != 0) return std::nullopt;
  PackedInt4 p{std::vector<uint32_t>(rows * cols / kLevelsPerWord), std::vector<uint16_t>(rows * cols / kQatGroupSize)};
  std::atomic<bool> exact{true};
  pool.parallel_for(rows, 256, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1 && exact.load(std::memory_order_relaxed); ++r)
      if (!pack_row_lossless(bf16 + r * cols * 2, cols, p.words.data() + r * cols / kLevelsPerWord,
                             p.scales.data() + r * cols / kQatGroupSize))
        exact = false;
  });
  if (!exact) return std::nullopt;
  return p;
}

}  // namespace qs
