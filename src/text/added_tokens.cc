#include "text/added_tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "text/bpe_model.h"
#include "text/normalizer.h"
#include "text/utf8.h"

namespace qs::text {
namespace {

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

// Byte offset where the trailing run of whitespace of `s` starts (regex `\s*$`).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    uint32_t cp = last_code_point(s.substr(0, end));
    if (cp == kNoCodePoint || !is_unicode_space(cp)) break;
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

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// TokenTrie

void TokenTrie::insert(std::string_view s, int32_t value) {
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

bool TokenTrie::find(std::string_view text, size_t pos, Match& m) const {
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

// ---------------------------------------------------------------------------------------------------------------
// AddedVocabulary

void AddedVocabulary::parse(const json* list, const VocabIndex& vocab, const JsonFields& fields, int64_t& max_id) {
  if (!list || list->is_null()) return;
  if (!list->is_array()) fields.fail("added_tokens must be an array");
  int64_t next_id = static_cast<int64_t>(vocab.size());
  std::unordered_map<int32_t, size_t> by_id;  // id -> index in `tokens`
  for (size_t i = 0; i < list->size(); ++i) {
    const json& t = (*list)[i];
    std::string where = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) fields.fail(where + " must be an object");
    AddedToken a;
    a.content = fields.get_string(t, "content", where);
    a.special = fields.get_bool(t, "special", false, where);
    a.single_word = fields.get_bool(t, "single_word", false, where);
    a.lstrip = fields.get_bool(t, "lstrip", false, where);
    a.rstrip = fields.get_bool(t, "rstrip", false, where);
    a.normalized = fields.get_bool(t, "normalized", !a.special, where);
    if (a.content.empty()) continue;
    int64_t id;
    if (auto it = ids.find(a.content); it != ids.end()) id = it->second;
    else if (int32_t iv = vocab.find(a.content); iv >= 0) id = iv;
    else id = next_id++;
    if (id > INT32_MAX) fields.fail(where + ": too many added tokens");
    a.id = static_cast<int32_t>(id);
    ids[a.content] = a.id;
    if (auto it = by_id.find(a.id); it != by_id.end()) {
      tokens[it->second] = std::move(a);
    } else {
      by_id[a.id] = tokens.size();
      tokens.push_back(std::move(a));
    }
    max_id = std::max<int64_t>(max_id, id);
  }
}

std::vector<std::string> AddedVocabulary::build_matchers(const Normalizer& normalizer) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& a = tokens[i];
    std::string piece = a.content;
    if (a.normalized && !normalizer.empty()) {
      std::string normed;
      normalizer.normalize(a.content, normed);
      piece = normed;
    }
    if (a.normalized) normalized_trie.insert(piece, static_cast<int32_t>(i));
    else raw_trie.insert(a.content, static_cast<int32_t>(i));
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

// tokenizers' AddedVocabulary::find_matches, lstrip/rstrip/single_word quirks included.
std::vector<AddedSplit> AddedVocabulary::split(std::string_view s, const TokenTrie& trie) const {
  std::vector<AddedSplit> splits;
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
    const AddedToken& a = tokens[m.value];
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

}  // namespace qs::text
