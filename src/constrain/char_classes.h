#pragma once
// Sets of Unicode scalar values and how one character of such a set is written as grammar bytes: plain UTF-8, or
// inside a JSON string (where '"', '\\' and control characters must be escaped), for the schema compiler and the
// regex subset.
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "constrain/grammar.h"

namespace qs {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, disjoint, non-adjacent inclusive ranges of code points; surrogates (U+D800..U+DFFF) never belong.
class CharSet {
 public:
  CharSet() = default;
  static CharSet range(uint32_t lo, uint32_t hi) { return CharSet().add(lo, hi); }
  static CharSet all() { return range(0, kMaxCodePoint); }
  CharSet& add(uint32_t lo, uint32_t hi);
  CharSet& add(const CharSet& other);
  CharSet complement() const;                            // within all scalar values
  CharSet intersect(const CharSet& other) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// Writes one character of a set as grammar bytes.
using CharWriter = std::function<GrammarBuilder::Node(GrammarBuilder&, const CharSet&)>;

// UTF-8 bytes of any character of the set.
GrammarBuilder::Node utf8_char(GrammarBuilder& g, const CharSet& set);
// A character of the set as it may appear inside a JSON string: '"', '\\' and U+0000..U+001F by their escapes
// (\" \\ \n \t \r \b \f, else \u00XX); everything else as UTF-8.
GrammarBuilder::Node json_string_char(GrammarBuilder& g, const CharSet& set);

}  // namespace qs
