#include "quant/w4a16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/dtype.h"
#include "util/parallel.h"

namespace qs {

// compressed-tensors and Google's own decoder agree: nibble i of word j is column 8j+i, stored as level + 8.
TEST(W4A16, NibbleOrderMatchesCompressedTensors) {
  uint32_t word = 0;
  for (uint32_t i = 0; i < 8; ++i) word |= i << (4 * i);  // stored nibbles 0..7
  std::vector<uint32_t> words = {word};
  std::vector<int8_t> levels(8);
  unpack_int4(words, levels);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(levels[i], i - 8) << "column " << i;
}

TEST(W4A16, LowNibbleFirstInFileBytes) {
  std::vector<int8_t> levels = {-8, 7, 0, 1, -1, 2, -2, 3};
  std::vector<uint32_t> words(1);
  pack_int4(levels, words);
  const auto* bytes = reinterpret_cast<const uint8_t*>(words.data());  // little-endian file bytes
  EXPECT_EQ(bytes[0], 0x0 | (0xF << 4));  // -8 -> 0 low, 7 -> 15 high
  EXPECT_EQ(bytes[1], 0x8 | (0x9 << 4));
  EXPECT_EQ(bytes[2], 0x7 | (0xA << 4));
  EXPECT_EQ(bytes[3], 0x6 | (0xB << 4));
}

TEST(W4A16, RoundTripsEveryLevelIncludingHighBit) {
  std::mt19937 rng(7);
  std::vector<int8_t> levels(8 * 37), back(8 * 37);
  for (auto& l : levels) l = static_cast<int8_t>(static_cast<int>(rng() % 16) - 8);
  levels[7] = 7;  // top nibble set: the word exceeds 2^31 and 2^24, so it must never pass through a float
  std::vector<uint32_t> words(37);
  pack_int4(levels, words);
  EXPECT_GE(words[0], 1u << 31);
  unpack_int4(words, back);
  EXPECT_EQ(levels, back);
}

}  // namespace qs

namespace qs {
namespace {

// bf16 values on a 4-bit grid: group g of row r is step(r, g) x level, level in -8..7, rounded to bf16.
std::vector<uint16_t> on_grid_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> m(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 32; ++g) {
      const float step = std::ldexp(1.0f + (rng() % 127) / 128.0f, -7 - int(rng() % 6));
      for (int i = 0; i < 32; ++i) m[r * cols + g * 32 + i] = f32_to_bf16(float(int(rng() % 16) - 8) * step);
    }
  return m;
}

}  // namespace

TEST(W4A16, LosslessPackGivesBackEveryValue) {
  const int64_t rows = 37, cols = 96;
  const auto m = on_grid_matrix(rows, cols, 3);
  auto packed = pack_int4_lossless(reinterpret_cast<const std::byte*>(m.data()), rows, cols, ThreadPool::shared());
  ASSERT_TRUE(packed);
  std::vector<int8_t> levels(rows * cols);
  unpack_int4(packed->words, levels);
  for (int64_t i = 0; i < rows * cols; ++i)
    ASSERT_EQ(f32_to_bf16(levels[i] * bf16_to_f32(packed->scales[i / 32])), m[i]) << "value " << i;
}

TEST(W4A16, LosslessPackRefusesAnyValueOffTheGrid) {
  const int64_t rows = 40, cols = 64;
  auto m = on_grid_matrix(rows, cols, 4);
  m[33 * cols + 40] = f32_to_bf16(bf16_to_f32(m[33 * cols + 40]) * 1.37f + 1e-3f);  // one value, late in the matrix
  EXPECT_FALSE(pack_int4_lossless(reinterpret_cast<const std::byte*>(m.data()), rows, cols, ThreadPool::shared()));
  EXPECT_FALSE(pack_int4_lossless(reinterpret_cast<const std::byte*>(m.data()), rows * 2, cols / 2 + 16,
                                  ThreadPool::shared()));  // not whole groups
}

}  // namespace qs
