#include "text/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "util/error.h"

namespace qs {
namespace {

using json = nlohmann::json;

constexpr uint32_t kMetaspace = 0x2581;  // "▁"
constexpr size_t kMaxCachedChunk = 256;  // bytes; longer chunks are always merged afresh
constexpr size_t kCacheShards = 16;
constexpr size_t kCacheEntriesPerShard = 1 << 15;

// ---------------------------------------------------------------------------------------------------------------
// UTF-8

// Length (1..4) of the valid UTF-8 character at p[0..n) with its code point, or 0 when the bytes there do not form
// one (Rust's String::from_utf8 rules: no overlong forms, no surrogates, nothing above U+10FFFF).
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

// Code points of a valid UTF-8 string.
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

const std::string kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Unicode White_Space (what Rust's regex `\s` matches).
bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Rust's regex `\w` (Alphabetic, marks, decimal digits, connector punctuation, join controls). Exact for ASCII;
// outside ASCII an approximation (everything but spaces, controls and the common punctuation/symbol blocks).
// Only used for added tokens with single_word = true, which the Gemma files do not have.
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
  if (is_unicode_space(cp) || cp < 0xA0) return false;
  if (cp == 0x200C || cp == 0x200D) return true;  // join controls
  if (cp <= 0xBF) return cp == 0xAA || cp == 0xB5 || cp == 0xBA;
  if (cp == 0xD7 || cp == 0xF7) return false;
  if ((cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x3003) || (cp >= 0x3008 && cp <= 0x3020) ||
      (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF20) ||
      (cp >= 0xE000 && cp <= 0xF8FF) || (cp >= 0x1F000 && cp <= 0x1FAFF))
    return cp == 0x203F || cp == 0x2040 || cp == 0x2054;  // connector punctuation in those blocks
  return true;
}

// Last/first code point of a string (0xFFFFFFFF when empty or not decodable there).
uint32_t last_code_point(std::string_view s) {
  if (s.empty()) return 0xFFFFFFFF;
  size_t i = s.size() - 1;
  size_t steps = 0;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && steps < 3) --i, ++steps;
  uint32_t cp;
  size_t len = utf8_decode(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i, cp);
  return len == s.size() - i ? cp : 0xFFFFFFFF;
}
uint32_t first_code_point(std::string_view s) {
  if (s.empty()) return 0xFFFFFFFF;
  uint32_t cp;
  return utf8_decode(reinterpret_cast<const unsigned char*>(s.data()), s.size(), cp) ? cp : 0xFFFFFFFF;
}

// Byte offset where the trailing run of whitespace of `s` starts (regex `\s*$`).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    uint32_t cp = last_code_point(s.substr(0, end));
    if (cp == 0xFFFFFFFF || !is_unicode_space(cp)) break;
    size_t len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    end -= len;
  }
  return end;
}
// Length of the leading run of whitespace of `s` (regex `^\s*`).
size_t leading_space_len(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    size_t len = utf8_decode(p + i, s.size() - i, cp);
    if (len == 0 || !is_unicode_space(cp)) break;
    i += len;
  }
  return i;
}

// Non-overlapping occurrences of a non-empty literal, left to right (what a regex of the escaped literal finds).
std::string replace_all(std::string_view s, std::string_view pattern, std::string_view with) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(pattern, pos);
    if (hit == std::string_view::npos) break;
    out.append(s, pos, hit - pos);
    out.append(with);
    pos = hit + pattern.size();
  }
  if (pos == 0) return std::string(s);
  out.append(s, pos, std::string_view::npos);
  return out;
}

// tokenizers' ByteFallback test: a piece of exactly 6 bytes "<0x" HH ">" where HH parses as u8 in base 16
// (Rust's from_str_radix, which also takes a leading '+').
int byte_token_value(std::string_view piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (piece[3] == '+') return hex(piece[4]);
  int hi = hex(piece[3]), lo = hex(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return hash_bytes(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// String -> id for model.vocab, the strings themselves being kept by id in `strings` (open addressing; a slot holds
// a hash tag and the id). About twice as fast to build and query as an unordered_map of 262k strings.
class VocabIndex {
 public:
  explicit VocabIndex(const std::vector<std::string>* strings) : strings_(strings) {}
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
  }
  int32_t find(std::string_view s) const {
    const uint64_t h = hash_bytes(s);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id < 0) return -1;
      if (slot.tag == tag && (*strings_)[slot.id] == s) return slot.id;
    }
  }
  // Points `s` (already stored at strings[id]) at `id`; returns the id it pointed at before, or -1.
  int32_t assign(std::string_view s, int32_t id) {
    const uint64_t h = hash_bytes(s);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot = {tag, id};
        ++size_;
        return -1;
      }
      if (slot.tag == tag && (*strings_)[slot.id] == s) return std::exchange(slot.id, id);
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint32_t tag;
    int32_t id;
  };
  const std::vector<std::string>* strings_;
  std::vector<Slot> slots_{Slot{0, -1}};
  size_t mask_ = 0, size_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Byte trie of added tokens, for leftmost-longest matching.

class TokenTrie {
 public:
  void insert(std::string_view s, int32_t value) {
    uint32_t node = 0;
    for (unsigned char b : s) {
      auto& kids = nodes_[node].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == b; });
      if (it != kids.end()) {
        node = it->second;
      } else {
        uint32_t child = static_cast<uint32_t>(nodes_.size());
        kids.emplace_back(b, child);
        nodes_.emplace_back();
        node = child;
      }
    }
    nodes_[node].value = value;
    if (!s.empty()) first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }

  struct Match {
    size_t begin, end;
    int32_t value;
  };
  // Next leftmost-longest match starting at or after `pos`, or false.
  bool find(std::string_view text, size_t pos, Match& m) const {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t i = pos; i < text.size(); ++i) {
      if (!first_[p[i]]) continue;
      uint32_t node = 0;
      size_t best_len = 0;
      int32_t best = -1;
      for (size_t j = i; j < text.size(); ++j) {
        const auto& kids = nodes_[node].kids;
        auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == p[j]; });
        if (it == kids.end()) break;
        node = it->second;
        if (nodes_[node].value >= 0) best_len = j + 1 - i, best = nodes_[node].value;
      }
      if (best >= 0) {
        m = {i, i + best_len, best};
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> kids;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

// ---------------------------------------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id): open addressing, linear probing.

class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, {0, -1}});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
  }
  // Later insertions of the same pair win (as collecting tokenizers' merges into a HashMap does).
  void insert(int32_t a, int32_t b, Value v) {
    uint64_t key = pack(a, b);
    size_t i = slot(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    slots_[i] = {key, v};
  }
  const Value* find(int32_t a, int32_t b) const {
    uint64_t key = pack(a, b);
    size_t i = slot(key);
    while (true) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const {
    return shift_ >= 64 ? 0 : static_cast<size_t>(((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  struct Slot {
    uint64_t key;
    Value value;
  };
  std::vector<Slot> slots_{Slot{kEmpty, {0, -1}}};
  size_t mask_ = 0;
  int shift_ = 64;
};

// ---------------------------------------------------------------------------------------------------------------
// Streaming SAX loader: model.vocab and model.merges (~780k entries in the Gemma files) go straight into vectors;
// everything else becomes a small DOM. About 3x faster than parsing the whole file into a json value.

class LoadSax final : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool vocab_seen = false, merges_seen = false;
  std::string error;  // why parsing stopped

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab)
      return vocab_id(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is not an integer");
    return value(json(v));
  }
  bool string(string_t& s) override {
    switch (mode_) {
      case Mode::kDom:
        return value(json(std::move(s)));
      case Mode::kVocab:
        return fail("model.vocab: the id of \"" + vocab_key_ + "\" is a string, expected an integer");
      case Mode::kMerges: {
        // Legacy form "left right": exactly one space.
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return fail(fmt::format("model.merges[{}]: \"{}\" is not of the form \"left right\"", merges.size(), s));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_.size() >= 2) return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
        pair_.push_back(std::move(s));
        return true;
    }
    return false;
  }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::kDom) {
      if (!stack_.empty() && stack_.back() == model_ && key_ == "vocab") {
        mode_ = Mode::kVocab;
        vocab_seen = true;
        vocab.clear();
        return true;
      }
      return start(json::object());
    }
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is an object");
    return fail(fmt::format("model.merges[{}]: expected a pair of strings or \"left right\"", merges.size()));
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    switch (mode_) {
      case Mode::kDom:
        if (!stack_.empty() && stack_.back() == model_ && key_ == "merges") {
          mode_ = Mode::kMerges;
          merges_seen = true;
          merges.clear();
          return true;
        }
        return start(json::array());
      case Mode::kVocab:
        return fail("model.vocab: the id of \"" + vocab_key_ + "\" is an array");
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_.clear();
        return true;
      case Mode::kMergePair:
        return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
    }
    return false;
  }
  bool end_array() override {
    switch (mode_) {
      case Mode::kMergePair:
        if (pair_.size() != 2) return fail(fmt::format("model.merges[{}]: expected a pair of strings", merges.size()));
        merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        mode_ = Mode::kMerges;
        return true;
      case Mode::kMerges:
        mode_ = Mode::kDom;
        return true;
      default:
        stack_.pop_back();
        return true;
    }
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error.empty()) error = fmt::format("not valid JSON (byte {}): {}", position, ex.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool fail(std::string why) {
    error = std::move(why);
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v > INT32_MAX)
      return fail(fmt::format("model.vocab: the id of \"{}\" is {}, expected 0..{}", vocab_key_, v, INT32_MAX));
    vocab.emplace_back(std::move(vocab_key_), static_cast<int32_t>(v));
    return true;
  }
  bool value(json&& v) {
    if (mode_ == Mode::kVocab) return fail("model.vocab: the id of \"" + vocab_key_ + "\" is not an integer");
    if (mode_ != Mode::kDom)
      return fail(fmt::format("model.merges[{}]: expected a pair of strings or \"left right\"", merges.size()));
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    json* top = stack_.back();
    if (top->is_array())
      top->push_back(std::move(v));
    else
      (*top)[key_] = std::move(v);
    return true;
  }
  bool start(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      stack_.push_back(&root);
      return true;
    }
    json* top = stack_.back();
    json* child;
    if (top->is_array()) {
      top->push_back(std::move(v));
      child = &top->back();
    } else {
      child = &((*top)[key_] = std::move(v));
      if (top == &root && key_ == "model" && child->is_object()) model_ = child;
    }
    stack_.push_back(child);
    return true;
  }

  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::string key_, vocab_key_;
  json* model_ = nullptr;
  std::vector<std::string> pair_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string source;  // file name for messages

  // Model.
  std::vector<std::string> pieces;    // model.vocab strings by id ("" where none); added tokens beyond it too
  VocabIndex vocab{&pieces};          // model.vocab: string -> id
  std::vector<int32_t> cp_to_id;      // code point -> vocab id of that one-character string, or -1
  std::array<int32_t, 256> byte_ids;  // <0xXX> ids, or -1
  PairMap merges;
  int32_t unk_id = -1;
  std::string unk_token;
  bool has_unk = false, fuse_unk = false, byte_fallback = false, ignore_merges = false;
  // Word chunking: a pre-token may be cut before a "▁" that follows character c (c != "▁", c a vocab character)
  // when no vocabulary string contains c + "▁": no merge can then span that point, so BPE on the pieces gives
  // exactly BPE on the whole word, and the pieces ("▁word") repeat enough to be cached.
  bool chunking = false;
  std::vector<uint32_t> unsafe_before_metaspace;  // sorted code points c with c + "▁" inside some vocab string

  // Added tokens.
  struct Added {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
  };
  std::vector<Added> added;  // by insertion; trie values index this
  StringMap added_ids;       // content -> id
  TokenTrie raw_trie, normalized_trie;

  // Per id (size = vocab_size()). What tokenizers' id_to_token returns is pieces[id], except for added tokens whose
  // string differs from the vocabulary's (a normalized added token's normalized form): piece_override.
  enum : uint8_t { kValid = 1, kSpecial = 2, kSkipped = 4, kOverride = 8, kModel = 16 };
  std::vector<uint8_t> id_flags;
  std::unordered_map<int32_t, std::string> piece_override;
  const std::string& piece(int32_t id) const {
    return (id_flags[id] & kOverride) ? piece_override.find(id)->second : pieces[id];
  }

  // Normalizer, pre-tokenizer.
  struct NormStep {
    bool prepend;  // else Replace
    std::string pattern, content;
  };
  std::vector<NormStep> normalizer;
  struct SplitStep {
    std::string pattern;
    SplitBehavior behavior;
    bool invert;
  };
  std::vector<SplitStep> pre_tokenizer;

  // Decoder: per-token steps before the first Fuse, character-stream steps after it.
  struct DecStep {
    enum Kind { kReplace, kByteFallback, kStrip } kind;
    std::string pattern, content;  // Replace
    uint32_t strip_char = 0;       // Strip
    size_t start = 0, stop = 0;
  };
  bool has_decoder = false;
  std::vector<DecStep> token_steps, stream_steps;

  // Cache of BPE results per chunk.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<CacheShard, kCacheShards> cache;

  [[noreturn]] void fail(const std::string& why) const { throw Error(fmt::format("{}: {}", source, why)); }

  // ---- encoding ----
  struct Split {
    size_t begin, end;
    int32_t id;  // -1: not an added token
  };
  std::vector<Split> find_added(std::string_view s, const TokenTrie& trie) const;
  void normalize(std::string_view in, std::string& out) const;
  void pre_tokenize(std::string_view s, std::vector<std::string_view>& words) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_chunk(std::string_view chunk, std::vector<int32_t>& out) const;
  void bpe_chunk_uncached(std::string_view chunk, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;

  void build(LoadSax& sax);
};

// ---------------------------------------------------------------------------------------------------------------
// Loading

namespace {

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

}  // namespace

void Tokenizer::Impl::build(LoadSax& sax) {
  const json& root = sax.root;
  if (!root.is_object()) fail("expected a JSON object at the top level");
  if (const json* v = member(root, "version"); v && !v->is_null() && (!v->is_string() || *v != "1.0"))
    fail(fmt::format("version is {}, expected \"1.0\"", v->dump()));

  auto get_bool = [&](const json& obj, const char* key, bool dflt, const std::string& where) {
    const json* v = member(obj, key);
    if (!v || v->is_null()) return dflt;
    if (!v->is_boolean()) fail(fmt::format("{}.{} must be true or false, got {}", where, key, v->dump()));
    return v->get<bool>();
  };
  auto get_string = [&](const json& obj, const char* key, const std::string& where) -> std::string {
    const json* v = member(obj, key);
    if (!v || !v->is_string()) fail(fmt::format("{}.{} must be a string", where, key));
    return v->get<std::string>();
  };
  auto type_of = [&](const json& obj, const std::string& where) -> std::string {
    if (!obj.is_object()) fail(fmt::format("{} must be an object or null, got {}", where, obj.dump().substr(0, 80)));
    return get_string(obj, "type", where);
  };
  auto literal_pattern = [&](const json& obj, const std::string& where) -> std::string {
    const json* p = member(obj, "pattern");
    if (!p || !p->is_object()) fail(where + ".pattern must be an object {\"String\": ...}");
    if (p->contains("Regex"))
      fail(where + ".pattern: Regex patterns are not supported (only {\"String\": ...} literals)");
    std::string s = get_string(*p, "String", where + ".pattern");
    if (s.empty()) fail(where + ".pattern.String must not be empty");
    return s;
  };

  // ---- model ----
  const json* model = member(root, "model");
  if (!model || !model->is_object()) fail("missing \"model\" object");
  if (const json* t = member(*model, "type"); t && (!t->is_string() || *t != "BPE"))
    fail(fmt::format("model.type is {}, only \"BPE\" is supported", t->dump()));
  if (!sax.vocab_seen) {
    if (model->contains("vocab")) fail("model.vocab must be an object mapping token strings to ids");
    fail("missing model.vocab");
  }
  if (!sax.merges_seen) {
    if (model->contains("merges")) fail("model.merges must be an array");
    fail("missing model.merges");
  }
  if (const json* d = member(*model, "dropout"); d && !d->is_null()) {
    if (!d->is_number()) fail("model.dropout must be a number or null");
    if (d->get<double>() != 0.0) fail("model.dropout: BPE dropout is not supported (it is random); expected null");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, k);
    if (v && !v->is_null() && !(v->is_string() && v->get<std::string>().empty()))
      fail(fmt::format("model.{} is not supported (expected null)", k));
  }
  fuse_unk = get_bool(*model, "fuse_unk", false, "model");
  byte_fallback = get_bool(*model, "byte_fallback", false, "model");
  ignore_merges = get_bool(*model, "ignore_merges", false, "model");
  if (const json* u = member(*model, "unk_token"); u && !u->is_null()) {
    if (!u->is_string()) fail("model.unk_token must be a string or null");
    has_unk = true;
    unk_token = u->get<std::string>();
  }

  int64_t max_id = -1;
  for (const auto& [tok, id] : sax.vocab) max_id = std::max<int64_t>(max_id, id);
  if (max_id >= 2 * static_cast<int64_t>(sax.vocab.size()) + 65536)
    fail(fmt::format("model.vocab: ids go up to {} for {} entries; expected ids 0..{} (a vocabulary this sparse is not "
                     "supported)", max_id, sax.vocab.size(), sax.vocab.size() - 1));
  pieces.resize(static_cast<size_t>(max_id + 1));
  id_flags.assign(pieces.size(), 0);
  vocab.reserve(sax.vocab.size());
  for (auto& [tok, id] : sax.vocab) {
    if (id_flags[id] & kValid) {
      if (pieces[id] == tok) continue;
      fail(fmt::format("model.vocab: id {} is given to both \"{}\" and \"{}\"", id, pieces[id], tok));
    }
    pieces[id] = std::move(tok);
    id_flags[id] = kValid | kModel;
    int32_t before = vocab.assign(pieces[id], id);  // a repeated key: the last one wins, like serde
    if (before >= 0) id_flags[before] = 0, pieces[before].clear();
  }
  sax.vocab = {};

  cp_to_id.assign(0x110000, -1);
  byte_ids.fill(-1);
  std::vector<bool> unsafe(0x110000, false);
  static const std::string kMeta = "\xE2\x96\x81";
  for (int32_t id = 0; id < static_cast<int32_t>(pieces.size()); ++id) {
    if (!(id_flags[id] & kValid)) continue;
    const std::string& tok = pieces[id];
    uint32_t cp;
    size_t len = tok.empty() ? 0 : utf8_decode(reinterpret_cast<const unsigned char*>(tok.data()), tok.size(), cp);
    if (len != 0 && len == tok.size()) cp_to_id[cp] = id;
    for (size_t p = tok.find(kMeta, 1); p != std::string::npos; p = tok.find(kMeta, p + 1)) {
      uint32_t before = last_code_point(std::string_view(tok).substr(0, p));
      if (before != kMetaspace && before < 0x110000) unsafe[before] = true;
    }
  }
  for (int b = 0; b < 256; ++b) {
    byte_ids[b] = vocab.find(fmt::format("<0x{:02X}>", b));
  }
  for (uint32_t cp = 0; cp < 0x110000; ++cp)
    if (unsafe[cp]) unsafe_before_metaspace.push_back(cp);
  chunking = cp_to_id[kMetaspace] >= 0;
  if (has_unk) {
    unk_id = vocab.find(unk_token);
  }

  // Merges: rank = position in the list; both parts and their concatenation must be vocabulary strings.
  merges.reserve(sax.merges.size());
  std::string joined;
  for (size_t i = 0; i < sax.merges.size(); ++i) {
    const auto& [a, b] = sax.merges[i];
    const int32_t ia = vocab.find(a), ib = vocab.find(b);
    if (ia < 0) fail(fmt::format("model.merges[{}]: \"{}\" is not in model.vocab", i, a));
    if (ib < 0) fail(fmt::format("model.merges[{}]: \"{}\" is not in model.vocab", i, b));
    joined.assign(a).append(b);
    const int32_t ij = vocab.find(joined);
    if (ij < 0) fail(fmt::format("model.merges[{}]: the merged token \"{}\" is not in model.vocab", i, joined));
    merges.insert(ia, ib, {static_cast<uint32_t>(i), ij});
  }
  sax.merges = {};

  // ---- normalizer ----
  std::function<void(const json&, const std::string&)> parse_normalizer = [&](const json& n, const std::string& where) {
    if (n.is_null()) return;
    std::string type = type_of(n, where);
    if (type == "Sequence") {
      const json* list = member(n, "normalizers");
      if (!list || !list->is_array()) fail(where + ".normalizers must be an array");
      for (size_t i = 0; i < list->size(); ++i) parse_normalizer((*list)[i], fmt::format("{}.normalizers[{}]", where, i));
    } else if (type == "Replace") {
      normalizer.push_back({false, literal_pattern(n, where), get_string(n, "content", where)});
    } else if (type == "Prepend") {
      normalizer.push_back({true, "", get_string(n, "prepend", where)});
    } else {
      fail(fmt::format("{}: normalizer type \"{}\" is not supported (Replace with a String pattern, Prepend, Sequence)",
                       where, type));
    }
  };
  if (const json* n = member(root, "normalizer")) parse_normalizer(*n, "normalizer");

  // ---- pre-tokenizer ----
  std::function<void(const json&, const std::string&)> parse_pre = [&](const json& n, const std::string& where) {
    if (n.is_null()) return;
    std::string type = type_of(n, where);
    if (type == "Sequence") {
      const json* list = member(n, "pretokenizers");
      if (!list || !list->is_array()) fail(where + ".pretokenizers must be an array");
      for (size_t i = 0; i < list->size(); ++i) parse_pre((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i));
    } else if (type == "Split") {
      SplitStep step;
      step.pattern = literal_pattern(n, where);
      std::string b = get_string(n, "behavior", where);
      if (b == "Removed") step.behavior = SplitBehavior::kRemoved;
      else if (b == "Isolated") step.behavior = SplitBehavior::kIsolated;
      else if (b == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
      else if (b == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
      else if (b == "Contiguous") step.behavior = SplitBehavior::kContiguous;
      else fail(fmt::format("{}.behavior \"{}\" is not a split behavior", where, b));
      step.invert = get_bool(n, "invert", false, where);
      pre_tokenizer.push_back(std::move(step));
    } else {
      fail(fmt::format("{}: pre-tokenizer type \"{}\" is not supported (Split with a String pattern, Sequence)", where,
                       type));
    }
  };
  if (const json* p = member(root, "pre_tokenizer")) parse_pre(*p, "pre_tokenizer");

  // ---- decoder ----
  bool fused = false;
  std::function<void(const json&, const std::string&)> parse_dec = [&](const json& n, const std::string& where) {
    if (n.is_null()) return;
    has_decoder = true;
    std::string type = type_of(n, where);
    auto& steps = fused ? stream_steps : token_steps;
    if (type == "Sequence") {
      const json* list = member(n, "decoders");
      if (!list || !list->is_array()) fail(where + ".decoders must be an array");
      for (size_t i = 0; i < list->size(); ++i) parse_dec((*list)[i], fmt::format("{}.decoders[{}]", where, i));
    } else if (type == "Replace") {
      DecStep s{DecStep::kReplace, literal_pattern(n, where), get_string(n, "content", where)};
      steps.push_back(std::move(s));
    } else if (type == "ByteFallback") {
      if (fused) fail(where + ": ByteFallback after Fuse is not supported");
      steps.push_back({DecStep::kByteFallback, "", ""});
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip") {
      std::string c = get_string(n, "content", where);
      auto cps = code_points(c);
      if (cps.size() != 1) fail(where + ".content must be one character");
      DecStep s{DecStep::kStrip, "", ""};
      s.strip_char = cps[0];
      auto count = [&](const char* k) {
        const json* v = member(n, k);
        if (!v || !v->is_number_unsigned()) fail(fmt::format("{}.{} must be a non-negative integer", where, k));
        return v->get<size_t>();
      };
      s.start = count("start");
      s.stop = count("stop");
      steps.push_back(std::move(s));
    } else {
      fail(fmt::format("{}: decoder type \"{}\" is not supported (Replace with a String pattern, ByteFallback, Fuse, "
                       "Strip, Sequence)", where, type));
    }
  };
  if (const json* d = member(root, "decoder")) parse_dec(*d, "decoder");

  // ---- added tokens (ids assigned as tokenizers does: the vocabulary id if the string is in model.vocab, else
  // the next id from model.vocab's size; the "id" written in the file is not used) ----
  int64_t next_id = static_cast<int64_t>(vocab.size());
  std::unordered_map<int32_t, size_t> by_id;  // id -> index in `added`
  if (const json* list = member(root, "added_tokens"); list && !list->is_null()) {
    if (!list->is_array()) fail("added_tokens must be an array");
    for (size_t i = 0; i < list->size(); ++i) {
      const json& t = (*list)[i];
      std::string where = fmt::format("added_tokens[{}]", i);
      if (!t.is_object()) fail(where + " must be an object");
      Added a;
      a.content = get_string(t, "content", where);
      a.special = get_bool(t, "special", false, where);
      a.single_word = get_bool(t, "single_word", false, where);
      a.lstrip = get_bool(t, "lstrip", false, where);
      a.rstrip = get_bool(t, "rstrip", false, where);
      a.normalized = get_bool(t, "normalized", !a.special, where);
      if (a.content.empty()) continue;
      int64_t id;
      if (auto it = added_ids.find(a.content); it != added_ids.end()) id = it->second;
      else if (int32_t iv = vocab.find(a.content); iv >= 0) id = iv;
      else id = next_id++;
      if (id > INT32_MAX) fail(where + ": too many added tokens");
      a.id = static_cast<int32_t>(id);
      added_ids[a.content] = a.id;
      if (auto it = by_id.find(a.id); it != by_id.end()) {
        added[it->second] = std::move(a);
      } else {
        by_id[a.id] = added.size();
        added.push_back(std::move(a));
      }
      max_id = std::max<int64_t>(max_id, id);
    }
  }
  std::unordered_set<std::string> special_contents;
  for (const auto& a : added)
    if (a.special) special_contents.insert(a.content);

  // ---- per-id tables ----
  pieces.resize(static_cast<size_t>(max_id + 1));
  id_flags.resize(pieces.size(), 0);
  for (size_t i = 0; i < added.size(); ++i) {
    const Added& a = added[i];
    std::string piece = a.content;
    if (a.normalized && !normalizer.empty()) {
      std::string normed;
      normalize(a.content, normed);
      piece = normed;
    }
    if (a.normalized) normalized_trie.insert(piece, static_cast<int32_t>(i));
    else raw_trie.insert(a.content, static_cast<int32_t>(i));
    uint8_t& f = id_flags[a.id];
    if (!(f & kModel)) {
      pieces[a.id] = piece;
    } else if (pieces[a.id] != piece) {
      piece_override[a.id] = piece;
      f |= kOverride;
    }
    f |= kValid | (a.special ? kSpecial : 0);
  }
  for (size_t id = 0; id < pieces.size(); ++id)
    if ((id_flags[id] & kValid) && special_contents.count(piece(static_cast<int32_t>(id)))) id_flags[id] |= kSkipped;
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source_name) {
  auto impl = std::make_shared<Impl>();
  impl->source = source_name;
  LoadSax sax;
  bool ok = json::sax_parse(json_text.begin(), json_text.end(), &sax);
  if (!ok || !sax.error.empty()) impl->fail(sax.error.empty() ? "not valid JSON" : sax.error);
  impl->build(sax);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  std::ifstream f(tokenizer_json, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open tokenizer file", tokenizer_json.string()));
  std::string text;
  f.seekg(0, std::ios::end);
  auto size = f.tellg();
  if (size > 0) {
    text.resize(static_cast<size_t>(size));
    f.seekg(0);
    f.read(text.data(), size);
  }
  if (!f) throw Error(fmt::format("{}: cannot read tokenizer file", tokenizer_json.string()));
  return from_json(text, tokenizer_json.string());
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding

// tokenizers' AddedVocabulary::find_matches, lstrip/rstrip/single_word quirks included.
std::vector<Tokenizer::Impl::Split> Tokenizer::Impl::find_added(std::string_view s, const TokenTrie& trie) const {
  std::vector<Split> splits;
  if (s.empty()) return splits;
  if (trie.empty()) {
    splits.push_back({0, s.size(), -1});
    return splits;
  }
  size_t start_offset = 0;
  TokenTrie::Match m;
  size_t pos = 0;
  while (trie.find(s, pos, m)) {
    pos = m.end;
    const Added& a = added[m.value];
    size_t start = m.begin, stop = m.end;
    if (a.single_word) {
      bool start_space = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      bool stop_space = stop == s.size() || !is_word_char(first_code_point(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (a.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
    if (a.rstrip) stop += leading_space_len(s.substr(stop));
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, a.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) splits.push_back({start_offset, s.size(), -1});
  return splits;
}

void Tokenizer::Impl::normalize(std::string_view in, std::string& out) const {
  out.assign(in);
  for (const NormStep& step : normalizer) {
    if (step.prepend) {
      if (!out.empty()) out.insert(0, step.content);
    } else if (out.find(step.pattern) != std::string::npos) {
      out = replace_all(out, step.pattern, step.content);
    }
  }
}

void Tokenizer::Impl::pre_tokenize(std::string_view s, std::vector<std::string_view>& words) const {
  words.clear();
  if (!s.empty()) words.push_back(s);
  struct Piece {
    size_t b, e;
    bool flag;  // is_match, then "remove"
  };
  std::vector<std::string_view> next;
  std::vector<Piece> pieces, out;
  for (const SplitStep& step : pre_tokenizer) {
    next.clear();
    for (std::string_view w : words) {
      pieces.clear();
      size_t prev = 0;
      for (size_t hit = w.find(step.pattern); hit != std::string_view::npos;
           hit = w.find(step.pattern, hit + step.pattern.size())) {
        if (prev != hit) pieces.push_back({prev, hit, false});
        pieces.push_back({hit, hit + step.pattern.size(), true});
        prev = hit + step.pattern.size();
      }
      if (prev != w.size()) pieces.push_back({prev, w.size(), false});
      if (step.invert)
        for (auto& p : pieces) p.flag = !p.flag;
      out.clear();
      bool previous_match = false;
      switch (step.behavior) {
        case SplitBehavior::kIsolated:
          for (auto p : pieces) out.push_back({p.b, p.e, false});
          break;
        case SplitBehavior::kRemoved:
          out = pieces;
          break;
        case SplitBehavior::kContiguous:
          for (auto p : pieces) {
            if (p.flag == previous_match && !out.empty()) out.back().e = p.e;
            else out.push_back({p.b, p.e, false});
            previous_match = p.flag;
          }
          break;
        case SplitBehavior::kMergedWithPrevious:
          for (auto p : pieces) {
            if (p.flag && !previous_match && !out.empty()) out.back().e = p.e;
            else out.push_back({p.b, p.e, false});
            previous_match = p.flag;
          }
          break;
        case SplitBehavior::kMergedWithNext:
          for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
            if (it->flag && !previous_match && !out.empty()) out.back().b = it->b;
            else out.push_back({it->b, it->e, false});
            previous_match = it->flag;
          }
          std::reverse(out.begin(), out.end());
          break;
      }
      for (auto p : out)
        if (!p.flag && p.e > p.b) next.push_back(w.substr(p.b, p.e - p.b));
    }
    words.swap(next);
  }
}

namespace {
struct Symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes; 0 = merged away
};
struct HeapItem {
  uint64_t key;  // rank << 32 | position: smallest rank first, then leftmost
  int32_t new_id;
  bool operator<(const HeapItem& o) const { return key > o.key; }  // for a min-heap with std::push_heap
};
}  // namespace

void Tokenizer::Impl::bpe_chunk_uncached(std::string_view w, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<HeapItem> heap;
  sym.clear();
  heap.clear();
  auto add = [&](int32_t id, uint32_t len) {
    int32_t n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };

  // Initial symbols (tokenizers' BPE::merge_word).
  const auto* p = reinterpret_cast<const unsigned char*>(w.data());
  bool pending_unk = false;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < w.size();) {
    uint32_t cp;
    size_t len = utf8_decode(p + i, w.size() - i, cp);
    int32_t id = -1;
    if (len == 0) len = 1;  // invalid UTF-8: a byte of its own, never a vocabulary string
    else id = cp_to_id[cp];
    if (id >= 0) {
      if (pending_unk) add(unk_id, unk_len), pending_unk = false;
      add(id, static_cast<uint32_t>(len));
      i += len;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (size_t k = 0; k < len; ++k) all = all && byte_ids[p[i + k]] >= 0;
      if (all) {
        for (size_t k = 0; k < len; ++k) add(byte_ids[p[i + k]], 1);
        i += len;
        continue;
      }
    }
    if (has_unk) {
      if (unk_id < 0) fail(fmt::format("model.unk_token \"{}\" is not in model.vocab (needed to encode this text)",
                                       unk_token));
      if (pending_unk && fuse_unk) {
        unk_len += static_cast<uint32_t>(len);
      } else {
        if (pending_unk) add(unk_id, unk_len);
        pending_unk = true;
        unk_len = static_cast<uint32_t>(len);
      }
    }
    i += len;
  }
  if (pending_unk) add(unk_id, unk_len);

  // Merges by rank (tokenizers' Word::merge_all without dropout).
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (const PairMap::Value* m = merges.find(sym[i].id, sym[i + 1].id))
      heap.push_back({(uint64_t{m->rank} << 32) | i, m->new_id});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    HeapItem top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<int32_t>(top.key & 0xFFFFFFFFu);
    Symbol& cur = sym[pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t right = cur.next;
    const PairMap::Value* m = merges.find(cur.id, sym[right].id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += sym[right].len;
    cur.next = sym[right].next;
    sym[right].len = 0;
    if (cur.next >= 0) sym[cur.next].prev = pos;
    if (cur.prev >= 0) {
      if (const PairMap::Value* mp = merges.find(sym[cur.prev].id, cur.id)) {
        heap.push_back({(uint64_t{mp->rank} << 32) | static_cast<uint32_t>(cur.prev), mp->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const PairMap::Value* mn = merges.find(cur.id, sym[cur.next].id)) {
        heap.push_back({(uint64_t{mn->rank} << 32) | static_cast<uint32_t>(pos), mn->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : sym)
    if (s.len != 0) out.push_back(s.id);
}

void Tokenizer::Impl::bpe_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (chunk.size() > kMaxCachedChunk) {
    bpe_chunk_uncached(chunk, out);
    return;
  }
  const size_t h = StringHash{}(chunk);
  CacheShard& shard = cache[(h >> 7) % kCacheShards];
  {
    std::lock_guard lock(shard.mu);
    auto it = shard.map.find(chunk);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe_chunk_uncached(chunk, out);
  std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  std::lock_guard lock(shard.mu);
  if (shard.map.size() >= kCacheEntriesPerShard) shard.map.clear();
  shard.map.emplace(std::string(chunk), std::move(ids));
}

void Tokenizer::Impl::bpe_word(std::string_view w, std::vector<int32_t>& out) const {
  if (w.empty()) return;
  if (ignore_merges) {
    if (int32_t id = vocab.find(w); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (!chunking) {
    bpe_chunk(w, out);
    return;
  }
  // Cut before each "▁" whose preceding character can never be merged with it (see Impl::chunking).
  const auto* p = reinterpret_cast<const unsigned char*>(w.data());
  size_t start = 0;
  uint32_t prev = kMetaspace;  // the character before position i (kMetaspace: none, or not a boundary)
  for (size_t i = 0; i < w.size();) {
    uint32_t cp;
    size_t len = utf8_decode(p + i, w.size() - i, cp);
    if (len == 0) {  // invalid byte: never cut after it
      prev = kMetaspace;
      i += 1;
      continue;
    }
    if (cp == kMetaspace && prev != kMetaspace && cp_to_id[prev] >= 0 &&
        !std::binary_search(unsafe_before_metaspace.begin(), unsafe_before_metaspace.end(), prev)) {
      bpe_chunk(w.substr(start, i - start), out);
      start = i;
    }
    prev = cp;
    i += len;
  }
  bpe_chunk(w.substr(start), out);
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  std::string normalized;
  std::vector<std::string_view> words;
  for (const Split& raw : find_added(text, raw_trie)) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    normalize(text.substr(raw.begin, raw.end - raw.begin), normalized);
    for (const Split& part : find_added(normalized, normalized_trie)) {
      if (part.id >= 0) {
        out.push_back(part.id);
        continue;
      }
      pre_tokenize(std::string_view(normalized).substr(part.begin, part.end - part.begin), words);
      for (std::string_view w : words) bpe_word(w, out);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Decoding: one state machine serves decode() and StreamDecoder, so streaming output always adds up to decode().

struct StreamDecoder::State {
  const Tokenizer::Impl* impl;
  std::vector<std::string> byte_runs;  // per token step (ByteFallback steps buffer a run of bytes)
  struct StreamStep {
    std::string pending;         // Replace: a tail that may start a match
    size_t lead_stripped = 0;    // Strip
    bool past_lead = false;      // Strip
    size_t held = 0;             // Strip: trailing strip characters held back
  };
  std::vector<StreamStep> stream;
  bool first_token = true;
  std::string out;

  explicit State(const Tokenizer::Impl* i)
      : impl(i), byte_runs(i->token_steps.size()), stream(i->stream_steps.size()) {}

  void reset() {
    for (auto& r : byte_runs) r.clear();
    for (auto& s : stream) s = StreamStep{};
    first_token = true;
  }

  // Characters after Fuse, through stream step `k` onwards.
  void chars(size_t k, std::string_view text) {
    if (text.empty()) return;
    if (k == impl->stream_steps.size()) {
      out.append(text);
      return;
    }
    const auto& step = impl->stream_steps[k];
    StreamStep& st = stream[k];
    if (step.kind == Tokenizer::Impl::DecStep::kReplace) {
      st.pending.append(text);
      const std::string& pat = step.pattern;
      std::string emit;
      size_t i = 0;
      while (i < st.pending.size()) {
        if (st.pending.compare(i, pat.size(), pat) == 0) {
          emit += step.content;
          i += pat.size();
        } else if (st.pending.size() - i < pat.size() &&
                   pat.compare(0, st.pending.size() - i, st.pending, i, std::string::npos) == 0) {
          break;  // could still become a match
        } else {
          emit += st.pending[i++];
        }
      }
      st.pending.erase(0, i);
      chars(k + 1, emit);
      return;
    }
    // Strip on the fused text: up to `start` leading and `stop` trailing strip characters.
    std::string emit;
    std::string c;
    append_utf8(c, step.strip_char);
    for (uint32_t cp : code_points(text)) {
      if (!st.past_lead) {
        if (st.lead_stripped < step.start && cp == step.strip_char) {
          ++st.lead_stripped;
          continue;
        }
        st.past_lead = true;
      }
      if (step.stop > 0 && cp == step.strip_char) {
        if (++st.held > step.stop) emit += c, --st.held;
        continue;
      }
      for (; st.held > 0; --st.held) emit += c;
      append_utf8(emit, cp);
    }
    chars(k + 1, emit);
  }
  void finish_chars() {
    for (size_t k = 0; k < impl->stream_steps.size(); ++k) {
      StreamStep& st = stream[k];
      if (impl->stream_steps[k].kind == Tokenizer::Impl::DecStep::kReplace) {
        std::string rest = std::move(st.pending);
        st.pending.clear();
        chars(k + 1, rest);
      }
      // Strip: held trailing characters are dropped.
      st.held = 0;
    }
  }

  // A token through token step `k` onwards.
  void token(size_t k, std::string tok) {
    if (k == impl->token_steps.size()) {
      if (!impl->has_decoder) {
        if (!first_token) out += ' ';
        out += tok;
      } else {
        chars(0, tok);
      }
      first_token = false;
      return;
    }
    const auto& step = impl->token_steps[k];
    switch (step.kind) {
      case Tokenizer::Impl::DecStep::kReplace:
        if (tok.find(step.pattern) != std::string::npos) tok = replace_all(tok, step.pattern, step.content);
        token(k + 1, std::move(tok));
        return;
      case Tokenizer::Impl::DecStep::kStrip: {
        auto cps = code_points(tok);
        size_t b = 0, e = cps.size();
        while (b < std::min(step.start, cps.size()) && cps[b] == step.strip_char) ++b;
        for (size_t i = 0; i < step.stop && e > b && cps[e - 1] == step.strip_char; ++i) --e;
        std::string s;
        for (size_t i = b; i < e; ++i) append_utf8(s, cps[i]);
        token(k + 1, std::move(s));
        return;
      }
      case Tokenizer::Impl::DecStep::kByteFallback: {
        int v = byte_token_value(tok);
        if (v >= 0) {
          byte_runs[k] += static_cast<char>(v);
          return;
        }
        flush_bytes(k);
        token(k + 1, std::move(tok));
        return;
      }
    }
  }
  void flush_bytes(size_t k) {
    if (byte_runs[k].empty()) return;
    std::string run = std::move(byte_runs[k]);
    byte_runs[k].clear();
    if (valid_utf8(run)) {
      token(k + 1, std::move(run));
    } else {
      for (size_t i = 0; i < run.size(); ++i) token(k + 1, kReplacementChar);
    }
  }
  void push_id(int32_t id, bool skip_special) {
    if (id < 0 || static_cast<size_t>(id) >= impl->pieces.size()) return;
    uint8_t f = impl->id_flags[id];
    if (!(f & Tokenizer::Impl::kValid)) return;
    if (skip_special && (f & Tokenizer::Impl::kSkipped)) return;
    token(0, impl->piece(id));
  }
  void finish() {
    for (size_t k = 0; k < impl->token_steps.size(); ++k)
      if (impl->token_steps[k].kind == Tokenizer::Impl::DecStep::kByteFallback) flush_bytes(k);
    finish_chars();
    reset();
  }
};

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  StreamDecoder::State st(impl_.get());
  st.out.reserve(ids.size() * 4);
  for (int32_t id : ids) st.push_id(id, skip_special_tokens);
  st.finish();
  return std::move(st.out);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                             std::span<const std::string_view> kept_special)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens), state_(std::make_unique<State>(impl_.get())) {
  for (std::string_view piece : kept_special)
    if (auto id = tokenizer.token_id(piece)) kept_special_.push_back(*id);
}
StreamDecoder::~StreamDecoder() = default;
StreamDecoder::StreamDecoder(StreamDecoder&&) noexcept = default;
StreamDecoder& StreamDecoder::operator=(StreamDecoder&&) noexcept = default;

std::string StreamDecoder::push(int32_t id) {
  state_->out.clear();
  const bool kept = std::find(kept_special_.begin(), kept_special_.end(), id) != kept_special_.end();
  state_->push_id(id, skip_special_ && !kept);
  return std::move(state_->out);
}

std::string StreamDecoder::flush() {
  state_->out.clear();
  state_->finish();
  return std::move(state_->out);
}

// ---------------------------------------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text) const { return impl_->encode(text); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (int32_t id = impl_->vocab.find(token); id >= 0) return id;
  return std::nullopt;
}

const std::string& Tokenizer::token_piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->pieces.size() || !(impl_->id_flags[id] & Impl::kValid))
    throw Error(fmt::format("{}: token id {} is not in the vocabulary (size {})", impl_->source, id,
                            impl_->pieces.size()));
  return impl_->piece(id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->pieces.size() && (impl_->id_flags[id] & Impl::kSpecial);
}

size_t Tokenizer::vocab_size() const { return impl_->pieces.size(); }
size_t Tokenizer::model_vocab_size() const { return impl_->vocab.size(); }

void Tokenizer::clear_cache() const {
  for (auto& shard : impl_->cache) {
    std::lock_guard lock(shard.mu);
    shard.map.clear();
  }
}

}  // namespace qs
