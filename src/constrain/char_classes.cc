#include "constrain/char_classes.h"

#include <fmt/format.h>

#include <algorithm>

namespace qs {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

void encode(uint32_t cp, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i, cp >>= 6) out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

// Code points lo..hi that all take n UTF-8 bytes: split until each piece is a product of byte ranges (the
// classic construction: a piece whose low 6*i bits do not span a full block is cut at the block boundary).
GrammarBuilder::Node encode_band(GrammarBuilder& g, uint32_t lo, uint32_t hi, int n) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) return g.alt({encode_band(g, lo, lo | m, n), encode_band(g, (lo | m) + 1, hi, n)});
    if ((hi & m) != m) return g.alt({encode_band(g, lo, (hi & ~m) - 1, n), encode_band(g, hi & ~m, hi, n)});
  }
  uint8_t a[4], b[4];
  encode(lo, n, a);
  encode(hi, n, b);
  std::vector<GrammarBuilder::Node> parts;
  for (int k = 0; k < n; ++k) parts.push_back(g.byte_range(a[k], b[k]));
  return g.seq(std::move(parts));
}

void add_utf8_range(GrammarBuilder& g, uint32_t lo, uint32_t hi, std::vector<GrammarBuilder::Node>& out) {
  static constexpr uint32_t kBandEnd[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  uint32_t start = 0;
  for (int n = 1; n <= 4; ++n) {
    const uint32_t a = std::max(lo, start), b = std::min(hi, kBandEnd[n - 1]);
    if (a <= b) out.push_back(encode_band(g, a, b, n));
    start = kBandEnd[n - 1] + 1;
  }
}

std::string json_escape(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: return fmt::format("\\u{:04x}", c);
  }
}

}  // namespace

CharSet& CharSet::add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return *this;
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {  // cut the surrogates out
    if (lo < kSurrogateLo) add(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) add(kSurrogateHi + 1, hi);
    return *this;
  }
  ranges_.emplace_back(lo, std::min(hi, kMaxCodePoint));
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto r : ranges_) {
    // Ranges meeting across the surrogate gap stay apart, which is harmless.
    if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  ranges_ = std::move(merged);
  return *this;
}

CharSet& CharSet::add(const CharSet& other) {
  for (auto [lo, hi] : other.ranges_) add(lo, hi);
  return *this;
}

CharSet CharSet::complement() const {
  CharSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges_) {
    if (lo > next) out.add(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.add(next, kMaxCodePoint);
  return out;
}

CharSet CharSet::intersect(const CharSet& other) const { return complement().add(other.complement()).complement(); }

GrammarBuilder::Node utf8_char(GrammarBuilder& g, const CharSet& set) {
  std::vector<GrammarBuilder::Node> options;
  for (auto [lo, hi] : set.ranges()) add_utf8_range(g, lo, hi, options);
  return g.alt(std::move(options));
}

GrammarBuilder::Node json_string_char(GrammarBuilder& g, const CharSet& set) {
  static const CharSet kEscaped = CharSet::range(0, 0x1F).add('"', '"').add('\\', '\\');
  std::vector<GrammarBuilder::Node> options;
  const CharSet escaped = set.intersect(kEscaped), plain = set.intersect(kEscaped.complement());
  for (auto [lo, hi] : escaped.ranges())
    for (uint32_t c = lo; c <= hi; ++c) options.push_back(g.literal(json_escape(c)));
  for (auto [lo, hi] : plain.ranges()) add_utf8_range(g, lo, hi, options);
  return g.alt(std::move(options));
}

}  // namespace qs
