#include "constrain/vocab_index.h"

#include <algorithm>
#include <numeric>

#include "text/tokenizer.h"
#include "util/error.h"

namespace qs {
namespace {

// <0xXX> -> that byte; else -1.
int byte_token(const std::string& piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    char c = piece[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

VocabIndex::VocabIndex(const Tokenizer& tokenizer, size_t vocab_size)
    : vocab_size_(vocab_size), bytes_(vocab_size), special_(vocab_size) {
  const size_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (size_t id = 0; id < known; ++id) {
    const auto tid = static_cast<int32_t>(id);
    if (tokenizer.is_special(tid)) {
      special_[id] = 1;
      continue;
    }
    std::string piece;
    try {
      piece = tokenizer.token_piece(tid);
    } catch (const Error&) {
      continue;  // an id the tokenizer has no string for: never allowed
    }
    const int b = byte_token(piece);
    // The decoder (Replace "▁" -> " ", byte fallback) turns one token into its text; a lone byte token >= 0x80
    // would decode to U+FFFD, so byte tokens are taken from their name.
    bytes_[id] = b >= 0 ? std::string(1, static_cast<char>(b)) : tokenizer.decode(std::span(&tid, 1), false);
  }
  std::vector<int32_t> order;
  for (size_t id = 0; id < known; ++id)
    if (!bytes_[id].empty()) order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b] || (bytes_[a] == bytes_[b] && a < b); });

  // Preorder trie from the sorted strings: each string opens the nodes below its common prefix with the previous
  // one; a node closes (its subtree ends) when a later string leaves its prefix.
  std::vector<int32_t> open;  // node index per depth - 1
  const std::string* prev = nullptr;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      trie_[open.back()].subtree_end = static_cast<int32_t>(trie_.size());
      open.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    if (prev) while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    close_to(std::min(common, open.size()));
    for (size_t d = open.size(); d < s.size(); ++d) {
      open.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back({static_cast<uint8_t>(s[d]), static_cast<uint16_t>(d + 1), 0, 0, 0});
    }
    TrieNode& end = trie_[open.back()];
    if (end.tokens_begin == end.tokens_end) end.tokens_begin = end.tokens_end = static_cast<int32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    ++end.tokens_end;
    max_depth_ = std::max(max_depth_, s.size());
    prev = &s;
  }
  close_to(0);
}

}  // namespace qs
