#pragma once
// compressed-tensors "pack-quantized" int4 (W4A16): weight_packed I32 [out, in/8], where input column 8j+i
// sits in nibble i (bits 4i..4i+3) of word j, stored as level + 8 (offset binary, level in -8..7);
// weight_scale [out, in/group] one scale per group of consecutive input columns; weight_shape I64 [out, in].
// Packed words are handled as integers only: a float would round away nibbles above 2^24.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace qs {

inline constexpr int kLevelsPerWord = 8;
inline constexpr int kMinLevel = -8, kMaxLevel = 7;

inline int8_t unpack_level(uint32_t word, int i) { return static_cast<int8_t>(int((word >> (4 * i)) & 0xFu) - 8); }

// levels.size() must be words.size() * 8.
void pack_int4(std::span<const int8_t> levels, std::span<uint32_t> words);
void unpack_int4(std::span<const uint32_t> words, std::span<int8_t> levels);

class ThreadPool;

// A bf16 matrix [rows, cols] repacked in memory as W4A16 group 32: levels as weight_packed words, bf16 scales.
struct PackedInt4 {
  std::vector<uint32_t> words;   // [rows, cols / 8]
  std::vector<uint16_t> scales;  // [rows, cols / 32]
};

// The W4A16 form of a bf16 matrix, only when it is lossless: every group of 32 columns lies on a 4-bit grid (as
// QAT weights do) and bf16(level x scale) gives back every value exactly. nullopt at the first group that does
// not, or when cols is not a multiple of 32.
std::optional<PackedInt4> pack_int4_lossless(const std::byte* bf16, int64_t rows, int64_t cols, ThreadPool& pool);

}  // namespace qs
