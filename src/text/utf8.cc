#include "text/utf8.h"

namespace qs::text {

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    size_t len = utf8_decode(p + i, s.size() - i, cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0xFFFD;
    size_t len = utf8_decode(p + i, s.size() - i, cp);
    if (len == 0) len = 1, cp = 0xFFFD;
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t last_code_point(std::string_view s) {
  if (s.empty()) return kNoCodePoint;
  size_t i = s.size() - 1;
  size_t steps = 0;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && steps < 3) --i, ++steps;
  uint32_t cp;
  size_t len = utf8_decode(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i, cp);
  return len == s.size() - i ? cp : kNoCodePoint;
}

uint32_t first_code_point(std::string_view s) {
  if (s.empty()) return kNoCodePoint;
  uint32_t cp;
  return utf8_decode(reinterpret_cast<const unsigned char*>(s.data()), s.size(), cp) ? cp : kNoCodePoint;
}

}  // namespace qs::text
