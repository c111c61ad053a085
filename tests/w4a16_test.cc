#include "quant/w4a16.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

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
