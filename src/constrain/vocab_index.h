#pragma once
// The bytes of every token of a vocabulary, as a byte trie in preorder, built once per tokenizer and shared by all
// requests: a mask walks it depth first and skips a whole subtree as soon as its prefix is rejected (tokens
// sharing a rejected prefix cost nothing). Token bytes: "▁" is a space, <0xXX> byte-fallback tokens are that byte,
// other pieces their decoded UTF-8. Special tokens are not in the trie: they never match as text.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qs {

class Tokenizer;

class VocabIndex {
 public:
  // vocab_size: the model's logits length (ids at or past the tokenizer's size never match).
  VocabIndex(const Tokenizer& tokenizer, size_t vocab_size);

  struct TrieNode {
    uint8_t byte;
    uint16_t depth;           // 1 for a first byte
    int32_t subtree_end;      // index past this node's last descendant
    int32_t tokens_begin, tokens_end;  // into token_ids(): the tokens whose bytes end here
  };

  size_t vocab_size() const { return vocab_size_; }
  std::span<const TrieNode> trie() const { return trie_; }
  std::span<const int32_t> token_ids() const { return trie_tokens_; }
  size_t max_depth() const { return max_depth_; }
  bool is_special(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id]; }
  // "" for special tokens, tokens without bytes and ids outside the tokenizer.
  const std::string& token_bytes(int32_t id) const { return bytes_[id]; }

 private:
  size_t vocab_size_;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  size_t max_depth_ = 0;
};

}  // namespace qs
