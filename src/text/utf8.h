#pragma once
// UTF-8 as the tokenizer's stages read and write it, with the rules of Rust's String::from_utf8 (what the Hugging
// Face `tokenizers` library accepts): text need not be valid, so every reader says what it does with a byte that
// does not start a valid character.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qs::text {

// Returned for "no character here" by last_code_point / first_code_point.
inline constexpr uint32_t kNoCodePoint = 0xFFFFFFFF;

// Length (1..4) of the valid UTF-8 character at p[0..n) with its code point, or 0 when the bytes there do not form
// one (Rust's String::from_utf8 rules: no overlong forms, no surrogates, nothing above U+10FFFF).
// Inline: the BPE model calls it once per character of every word.
inline size_t utf8_decode(const unsigned char* p, size_t n, uint32_t& cp) {
  const unsigned c = p[0];
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) {
    if (!cont(1)) return 0;
    cp = ((c & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;
    if (c == 0xED && p[1] > 0x9F) return 0;
    cp = ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && p[1] < 0x90) return 0;
    if (c == 0xF4 && p[1] > 0x8F) return 0;
    cp = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return 4;
  }
  return 0;
}

bool valid_utf8(std::string_view s);
// Code points of a valid UTF-8 string (U+FFFD for each byte that does not start a character).
std::vector<uint32_t> code_points(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
// Last/first code point of a string (kNoCodePoint when empty or not decodable there).
uint32_t last_code_point(std::string_view s);
uint32_t first_code_point(std::string_view s);

}  // namespace qs::text
