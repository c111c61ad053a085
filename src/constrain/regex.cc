#include "constrain/regex.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"

namespace qs {
namespace {

constexpr int32_t kMaxBound = 1000;
// The parser recurses once per group: a request's pattern of 100k '(' would overflow the stack (found by
// json_schema_fuzz). Real patterns nest a few levels.
constexpr int kMaxGroupDepth = 64;

const CharSet& digits() {
  static const CharSet s = CharSet::range('0', '9');
  return s;
}
const CharSet& word() {
  static const CharSet s = CharSet::range('0', '9').add('A', 'Z').add('a', 'z').add('_', '_');
  return s;
}
const CharSet& space() {
  static const CharSet s = CharSet::range('\t', '\r').add(' ', ' ');
  return s;
}
// Every ASCII character Python's Unicode \s matches (it adds \x1c-\x1f to the usual six): what \S must avoid.
const CharSet& python_space() {
  static const CharSet s = CharSet::range('\t', '\r').add(' ', ' ').add(0x1C, 0x1F);
  return s;
}
CharSet ascii_complement(const CharSet& s) { return s.complement().intersect(CharSet::range(0, 0x7F)); }

class PatternParser {
 public:
  PatternParser(GrammarBuilder& g, std::string_view p, const CharWriter& write) : g_(g), p_(p), write_(write) {}

  GrammarBuilder::Node top() {
    std::vector<GrammarBuilder::Node> branches;
    do branches.push_back(top_branch());
    while (eat('|'));
    if (pos_ < p_.size()) fail(fmt::format("unbalanced ')' at offset {}", pos_));
    return g_.alt(std::move(branches));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    // A pattern may be as long as the request: its first 80 bytes (whole UTF-8 characters) name it.
    size_t shown = std::min<size_t>(p_.size(), 80);
    while (shown < p_.size() && shown > 0 && (static_cast<unsigned char>(p_[shown]) & 0xC0) == 0x80) --shown;
    throw Error(fmt::format("pattern \"{}{}\": {} (supported: literals, classes, . * + ? {{m,n}} | ( ) and anchors)",
                            p_.substr(0, shown), shown < p_.size() ? "..." : "", why));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek() const { return at_end() ? '\0' : p_[pos_]; }
  bool eat(char c) {
    if (peek() != c || at_end()) return false;
    ++pos_;
    return true;
  }

  // A top-level alternative: its own anchors; an unanchored side matches anything.
  GrammarBuilder::Node top_branch() {
    const bool anchored_start = eat('^');
    std::vector<GrammarBuilder::Node> parts;
    if (!anchored_start) parts.push_back(g_.star(write_(g_, CharSet::all())));
    bool anchored_end = false;
    while (!at_end() && peek() != '|') {
      if (eat('$')) {
        if (!at_end() && peek() != '|') fail("'$' is supported only at the end of a top-level alternative");
        anchored_end = true;
        break;
      }
      parts.push_back(quantified());
    }
    if (!anchored_end) parts.push_back(g_.star(write_(g_, CharSet::all())));
    return g_.seq(std::move(parts));
  }

  GrammarBuilder::Node alternation() {
    std::vector<GrammarBuilder::Node> branches;
    do {
      std::vector<GrammarBuilder::Node> parts{g_.empty()};
      while (!at_end() && peek() != '|' && peek() != ')') parts.push_back(quantified());
      branches.push_back(g_.seq(std::move(parts)));
    } while (eat('|'));
    return g_.alt(std::move(branches));
  }

  GrammarBuilder::Node quantified() {
    GrammarBuilder::Node atom_node = atom();
    int32_t min = 1, max = 1;
    if (eat('*')) min = 0, max = GrammarBuilder::kUnbounded;
    else if (eat('+')) min = 1, max = GrammarBuilder::kUnbounded;
    else if (eat('?')) min = 0, max = 1;
    else if (peek() == '{' && bounds(min, max)) {}
    else return atom_node;
    if (peek() == '?' || peek() == '+') fail("lazy and possessive quantifiers are not supported");
    if (peek() == '*' || peek() == '{') fail("a quantifier cannot follow a quantifier");
    return g_.repeat(atom_node, min, max);
  }

  // {n}, {n,}, {n,m}; a '{' that does not start one is a literal, as in Python.
  bool bounds(int32_t& min, int32_t& max) {
    size_t save = pos_++;
    auto number = [&](int32_t& out) {
      size_t start = pos_;
      int64_t v = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') v = std::min<int64_t>(v * 10 + (p_[pos_++] - '0'), 1 << 30);
      out = static_cast<int32_t>(v);
      return pos_ > start;
    };
    if (!number(min)) return pos_ = save, false;
    max = min;
    if (eat(',')) {
      if (!number(max)) max = GrammarBuilder::kUnbounded;
    }
    if (!eat('}')) return pos_ = save, false;
    if (min > kMaxBound || max > kMaxBound) fail(fmt::format("a repetition bound above {}", kMaxBound));
    if (max != GrammarBuilder::kUnbounded && max < min) fail(fmt::format("repetition {{{},{}}} has max < min", min, max));
    return true;
  }

  GrammarBuilder::Node atom() {
    const char c = peek();
    switch (c) {
      case '(': return group();
      case '[': ++pos_; return write_(g_, bracket_class());
      case '.': ++pos_; return write_(g_, CharSet::all().intersect(CharSet::range('\n', '\n').complement()));
      case '\\': ++pos_; return write_(g_, escape(false));
      case '^': case '$': fail(fmt::format("anchor '{}' inside the pattern (only at the ends)", c));
      case '*': case '+': case '?': fail(fmt::format("quantifier '{}' with nothing to repeat", c));
      case ')': fail("unbalanced ')'");
      default: {
        uint32_t cp = next_char();
        return write_(g_, CharSet::range(cp, cp));
      }
    }
  }

  GrammarBuilder::Node group() {
    if (depth_ == kMaxGroupDepth) fail(fmt::format("groups nested more than {} deep", kMaxGroupDepth));
    ++pos_;
    if (eat('?')) {
      if (!eat(':')) fail("only non-capturing groups (?:...) are supported among (?...) constructs");
    }
    ++depth_;
    GrammarBuilder::Node inner = alternation();
    --depth_;
    if (!eat(')')) fail("missing ')'");
    return inner;
  }

  // One UTF-8 character of the pattern.
  uint32_t next_char() {
    const auto b = static_cast<unsigned char>(p_[pos_]);
    const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (n == 0 || pos_ + n > p_.size()) fail(fmt::format("invalid UTF-8 at offset {}", pos_));
    uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_ + i]) & 0x3F);
    pos_ += n;
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail(fmt::format("expected {} hex digits at offset {}", digits, pos_));
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // After a backslash; `in_class` for inside [...].
  CharSet escape(bool in_class) {
    if (at_end()) fail("trailing backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 'd': return digits();
      case 'w': return word();
      case 's': return space();
      case 'D': return ascii_complement(digits());
      case 'W': return ascii_complement(word());
      case 'S': return ascii_complement(python_space());
      case 'n': return CharSet::range('\n', '\n');
      case 't': return CharSet::range('\t', '\t');
      case 'r': return CharSet::range('\r', '\r');
      case 'f': return CharSet::range('\f', '\f');
      case 'v': return CharSet::range('\v', '\v');
      case 'u': { uint32_t v = hex(4); return CharSet::range(v, v); }
      case 'x': { uint32_t v = hex(2); return CharSet::range(v, v); }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
          fail(fmt::format("escape \\{} is not supported", c));
        return CharSet::range(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
    }
  }

  // After '['.
  CharSet bracket_class() {
    const bool negated = eat('^');
    CharSet set;
    bool shorthand = false, first = true;
    while (true) {
      if (at_end()) fail("missing ']'");
      if (peek() == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (eat('\\')) {
        const char e = peek();
        CharSet s = escape(true);
        if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
          set.add(negated && e == 's' ? python_space() : s);
          shorthand = true;
          continue;
        }
        lo = s.ranges()[0].first;
      } else {
        lo = next_char();
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        if (eat('\\')) {
          CharSet s = escape(true);
          if (s.ranges().size() != 1 || s.ranges()[0].first != s.ranges()[0].second) fail("a class range ends in a class");
          hi = s.ranges()[0].first;
        } else {
          hi = next_char();
        }
        if (hi < lo) fail("a class range with its end below its start");
      }
      set.add(lo, hi);
    }
    ++pos_;  // ']'
    if (!negated) return set;
    // Python's \d \w \s are Unicode-wide: their complement is only known within ASCII.
    return shorthand ? ascii_complement(set) : set.complement();
  }

  GrammarBuilder& g_;
  std::string_view p_;
  const CharWriter& write_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_
};

}  // namespace

GrammarBuilder::Node compile_pattern(GrammarBuilder& g, std::string_view pattern, const CharWriter& write) {
  return PatternParser(g, pattern, write).top();
}

}  // namespace qs
