#include "quant/w4a16.h"

#include <cassert>

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

}  // namespace qs
